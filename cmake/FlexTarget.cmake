# flex_add_library(NAME <folder> [DEPS ...])
# Creates target flex_<folder> (alias flex::<folder>) from <folder>/src/*.cpp,
# public headers in <folder>/include, with a precompiled header of the libtorch
# pieces the sources use.
function(flex_add_library)
  cmake_parse_arguments(A "" "NAME" "SOURCES;DEPS;PCH" ${ARGN})
  set(t flex_${A_NAME})
  file(GLOB srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/*.cpp)
  if(NOT srcs AND NOT A_SOURCES)
    # A layer with headers only (so far).
    add_library(${t} INTERFACE)
    add_library(flex::${A_NAME} ALIAS ${t})
    target_include_directories(${t} INTERFACE $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>)
    target_link_libraries(${t} INTERFACE flex_base ${A_DEPS})
    return()
  endif()
  add_library(${t} SHARED ${srcs} ${A_SOURCES})
  add_library(flex::${A_NAME} ALIAS ${t})
  set_target_properties(${t} PROPERTIES OUTPUT_NAME flex_${A_NAME} EXPORT_NAME ${A_NAME})
  target_include_directories(${t} PUBLIC
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:include>)
  target_link_libraries(${t} PUBLIC flex_base ${A_DEPS})
  if(FLEX_USE_PCH)
    if(A_PCH)
      target_precompile_headers(${t} PRIVATE ${A_PCH})
    else()
      target_precompile_headers(${t} PRIVATE <torch/nn/module.h> <ATen/ATen.h>)
    endif()
  endif()
endfunction()

# flex_add_test(name SOURCES ... DEPS ...): one GoogleTest executable registered with CTest.
function(flex_add_test name)
  cmake_parse_arguments(A "" "" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${A_SOURCES})
  target_link_libraries(${name} PRIVATE ${A_DEPS} flex_test_common GTest::gtest GTest::gtest_main)
  if(FLEX_USE_PCH)
    target_precompile_headers(${name} REUSE_FROM flex_test_pch)
  endif()
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 120
    PROPERTIES ENVIRONMENT "FLEX_TEST_DATA=${PROJECT_SOURCE_DIR}/tests/data;OMP_NUM_THREADS=2;OMP_WAIT_POLICY=PASSIVE"
    LABELS "${A_LABELS}")
endfunction()
