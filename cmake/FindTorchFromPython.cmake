# Finds libtorch 2.x for flexmodel.
#
# Default: the libtorch inside the PyTorch package of FLEX_PYTHON (python3),
# located with torch.utils.cmake_prefix_path, so the C++ build and `import
# torch` share one library. Any other libtorch 2.x (the libtorch archive, a
# CUDA build) is used when Torch_DIR or CMAKE_PREFIX_PATH points at it.
# A libtorch older than FLEX_MIN_TORCH_VERSION stops the configure step with
# the version and place found.
set(FLEX_MIN_TORCH_VERSION 2.4)
set(FLEX_PYTHON python3 CACHE STRING "Interpreter whose PyTorch package provides libtorch")

if(NOT Torch_DIR AND NOT DEFINED ENV{Torch_DIR})
  execute_process(
    COMMAND ${FLEX_PYTHON} -c "import torch.utils; print(torch.utils.cmake_prefix_path, end='')"
    OUTPUT_VARIABLE flex_torch_prefix ERROR_VARIABLE flex_torch_error RESULT_VARIABLE flex_torch_rc)
  if(flex_torch_rc EQUAL 0 AND EXISTS "${flex_torch_prefix}/Torch")
    set(Torch_DIR "${flex_torch_prefix}/Torch" CACHE PATH "libtorch's CMake config (from ${FLEX_PYTHON}'s torch)")
  else()
    message(STATUS "flexmodel: no PyTorch package in ${FLEX_PYTHON} (${flex_torch_error}); "
                   "looking for libtorch on CMAKE_PREFIX_PATH")
  endif()
endif()

find_package(Torch REQUIRED)
if(NOT Torch_VERSION)
  set(Torch_VERSION "${TORCH_VERSION}")
endif()
if(Torch_VERSION VERSION_LESS FLEX_MIN_TORCH_VERSION)
  message(FATAL_ERROR
    "flexmodel needs libtorch ${FLEX_MIN_TORCH_VERSION} or newer; found ${Torch_VERSION} in ${Torch_DIR}. "
    "Install PyTorch (bash scripts/install-deps.sh) or give -DTorch_DIR=<libtorch>/share/cmake/Torch.")
endif()
# libtorch 2.14's headers need C++20 (ATen.h stops anything older); up to 2.13
# they take C++17, which the build keeps there.
if(Torch_VERSION VERSION_GREATER_EQUAL 2.14 AND CMAKE_CXX_STANDARD LESS 20)
  set(CMAKE_CXX_STANDARD 20)
endif()
message(STATUS "flexmodel: libtorch ${Torch_VERSION} from ${Torch_DIR} (C++${CMAKE_CXX_STANDARD})")
