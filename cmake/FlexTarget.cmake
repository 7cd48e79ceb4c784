# flex_unity(target): unity batches (FLEX_UNITY_BUILD). Sources of one target
# then share a translation unit, so their file-local helpers need distinct names.
function(flex_unity target)
  if(FLEX_UNITY_BUILD)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
    # A source's own types in an anonymous namespace are fine as members of
    # its Impl; GCC warns only because the unity file #includes the source.
    target_compile_options(${target} PRIVATE $<$<CXX_COMPILER_ID:GNU>:-Wno-subobject-linkage>)
  endif()
endfunction()

# flex_add_library(NAME <folder> [NO_TORCH] [DEPS ...])
# Creates target flex_<folder> (alias flex::<folder>) from <folder>/src/*.cpp,
# public headers in <folder>/include, with a precompiled header of the libtorch
# pieces the sources use. NO_TORCH: a library that neither includes nor links
# libtorch (flex_base_core instead of flex_base, no precompiled torch header).
function(flex_add_library)
  cmake_parse_arguments(A "NO_TORCH" "NAME" "SOURCES;DEPS;PCH" ${ARGN})
  set(t flex_${A_NAME})
  set(base flex_base)
  if(A_NO_TORCH)
    set(base flex_base_core)
  endif()
  file(GLOB srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/*.cpp)
  if(NOT srcs AND NOT A_SOURCES)
    # A layer with headers only (so far).
    add_library(${t} INTERFACE)
    add_library(flex::${A_NAME} ALIAS ${t})
    target_include_directories(${t} INTERFACE $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>)
    target_link_libraries(${t} INTERFACE ${base} ${A_DEPS})
    return()
  endif()
  add_library(${t} SHARED ${srcs} ${A_SOURCES})
  add_library(flex::${A_NAME} ALIAS ${t})
  set_target_properties(${t} PROPERTIES OUTPUT_NAME flex_${A_NAME} EXPORT_NAME ${A_NAME})
  flex_unity(${t})
  target_include_directories(${t} PUBLIC
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:include>)
  target_link_libraries(${t} PUBLIC ${base} ${A_DEPS})
  if(FLEX_USE_PCH AND NOT A_NO_TORCH)
    if(A_PCH)
      target_precompile_headers(${t} PRIVATE ${A_PCH})
    else()
      target_precompile_headers(${t} PRIVATE <torch/nn/module.h> <ATen/ATen.h>)
    endif()
  endif()
endfunction()

# flex_add_test(name SOURCES ... DEPS ... [LABELS ...] [SHARDS n] [COST s] [ENV VAR=value ...]):
# one GoogleTest executable registered with CTest as one test (all its cases
# in one process), or as n shards (GoogleTest's GTEST_TOTAL_SHARDS /
# GTEST_SHARD_INDEX) named <name>_shard<i>of<n>. One process per case would
# pay libtorch's start-up (about a second of CPU: ~290 shared libraries and
# its operator registry) 700 times over, a third of the suite's time on 2
# cores. COST (seconds, a guess) makes a parallel ctest start the long ones
# first. The failing case's name is in the output ctest prints on failure;
# run one case with --gtest_filter.
#
# NO_TORCH: a test of a library without libtorch; it does not reuse the tests'
# precompiled torch header, so nothing of libtorch reaches it.
function(flex_add_test name)
  cmake_parse_arguments(A "NO_TORCH" "SHARDS;COST" "SOURCES;DEPS;LABELS;ENV" ${ARGN})
  add_executable(${name} ${A_SOURCES})
  target_link_libraries(${name} PRIVATE ${A_DEPS} flex_test_common GTest::gtest GTest::gtest_main)
  if(FLEX_USE_PCH AND NOT A_NO_TORCH)
    target_precompile_headers(${name} REUSE_FROM flex_test_pch)
  endif()
  if(NOT A_SHARDS)
    set(A_SHARDS 1)
  endif()
  if(NOT A_COST)
    set(A_COST 2)
  endif()
  # Two OpenMP threads (our parallel code runs as users run it), MKL's own GEMM
  # threading off: with MKL's AVX-512 kernels on two threads the first matrix
  # products of a process sometimes differ (up to 2e-4 in one batch row of a
  # tiny GPT-2's logits: 4 of 150 runs of the KV-cache test, 1 of 30 of the
  # golden test; a dataset capture's first batch in the last bits, ~1 in 6).
  # Never with MKL on one thread (0 of 120) nor with MKL_CBWR=AVX2 (0 of 200,
  # 1.65x slower GEMMs). The tests check our arithmetic against tight
  # references, so MKL computes single-threaded in them (docs/design.md,
  # Known limits).
  set(env "FLEX_TEST_DATA=${PROJECT_SOURCE_DIR}/tests/data;OMP_NUM_THREADS=2;MKL_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE;${A_ENV}")
  math(EXPR last "${A_SHARDS} - 1")
  foreach(i RANGE ${last})
    if(A_SHARDS EQUAL 1)
      set(test ${name})
      set(shard_env "")
    else()
      set(test ${name}_shard${i}of${A_SHARDS})
      set(shard_env ";GTEST_TOTAL_SHARDS=${A_SHARDS};GTEST_SHARD_INDEX=${i}")
    endif()
    add_test(NAME ${test} COMMAND ${name} WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
    set_tests_properties(${test} PROPERTIES ENVIRONMENT "${env}${shard_env}" LABELS "${A_LABELS}"
                         COST ${A_COST} TIMEOUT 1200)
  endforeach()
endfunction()
