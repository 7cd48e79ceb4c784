#pragma once
// Function attributes that compile one function for a wider instruction set
// than the rest of the build (which targets any x86-64), so one binary
// carries the AVX2 and AVX-512 kernels and cpu_isa() picks at run time.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FLEX_HAVE_X86_KERNELS 1
#define FLEX_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define FLEX_TARGET_AVX512 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")))
#define FLEX_TARGET_AVX512_BF16 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni,avx512bf16")))
#include <immintrin.h>
#else
#define FLEX_HAVE_X86_KERNELS 0
#endif
