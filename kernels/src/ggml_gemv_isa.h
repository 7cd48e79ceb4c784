#pragma once
// The per-instruction-set entry points of ggml_linear's kernels
// (ggml_gemv_avx512.cpp, ggml_gemv_avx2.cpp: one body, two targets), called
// by ggml_linear.cpp after cpu_isa() picks one. Plain types only cross this
// line, so no header code is compiled for a wider target than the build's.
#include <cstdint>

namespace flex {

/// Input rows quantized to int8 per 32 values (Q8 activations).
struct Q8Rows {
  const int8_t* q;     // [M, K] codes in -127..127
  const float* d;      // [M, K / 32] the scale of each 32 codes
  const int32_t* s16;  // [M, K / 16] the sum of each 16 codes
  const float* ds16;   // [M, K / 16] that sum times its block's scale
  const float* ds32;   // [M, K / 32] the sum of each 32 codes times their scale
  // [M, K] the codes again, per 4 blocks (128 values) in the order of 4
  // blocks' nibbles (ggml_gemv_q8_avx512.inc): the 16 first values of each
  // block, then the 16 last of each. Null where K / 32 is not a multiple of 8.
  const int8_t* qn;
  // [M, K] the codes per 256 in the order of Q4_K's nibbles, 32 at a time:
  // sub-blocks 0, 2, 1, 3, 4, 6, 5, 7. Null where K is not whole 256s.
  const int8_t* qk;
  int64_t M;
};

/// Where Q8 quantization writes (Q8Rows' arrays; qn, qk may be null).
struct Q8Out {
  int8_t* q;
  float* d;
  int32_t* s16;
  float* ds16;
  float* ds32;
  int8_t* qn;
  int8_t* qk;
};
/// Offsets in Q8Rows::qn / ::qk of the 16 codes of block i's half h.
int64_t q8_nibble_at(int64_t i, int h);
int64_t q8_kquant_at(int64_t i, int h);

#define FLEX_GGML_ISA_ENTRY_POINTS                                                                                     \
  /* y[m, j] = x[m] . W[j] for rows j in [r0, r1), float inputs x [M, K]. */                                         \
  void gemv(uint32_t type, const uint8_t* w, int64_t row_bytes, int64_t N, int64_t K, const float* x, int64_t M,       \
            float* y, int64_t r0, int64_t r1);                                                                        \
  /* The same from Q8 inputs. */                                                                                     \
  void gemv_q8(uint32_t type, const uint8_t* w, int64_t row_bytes, int64_t N, int64_t K, const Q8Rows& x, float* y,   \
               int64_t r0, int64_t r1);                                                                               \
  /* Rows [r0, r1) of W dequantized into out [r1 - r0, K]. */                                                        \
  void dequantize(uint32_t type, const uint8_t* w, int64_t row_bytes, int64_t K, int64_t r0, int64_t r1, float* out);

namespace ggml_avx512 {
FLEX_GGML_ISA_ENTRY_POINTS
/* `blocks` blocks of 32 floats at x quantized as the scalar reference does, bit for bit. */
void quantize_q8(const float* x, int64_t blocks, const Q8Out& out);
}
namespace ggml_avx2 {
FLEX_GGML_ISA_ENTRY_POINTS
}

#undef FLEX_GGML_ISA_ENTRY_POINTS

}  // namespace flex
