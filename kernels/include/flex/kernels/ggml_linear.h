#pragma once
// x W^T + b with W kept in ggml's block formats (GGUF's quantized types), so
// a quantized GGUF model reads its quantized bytes at decode time, not a
// float copy. Decode shapes (at most kGgmlGemvRows input rows): each weight
// block is decoded in registers and multiplied into every input row while it
// is there (AVX-512, AVX2, or the scalar reference, chosen by cpu_isa()).
// Prefill shapes (more rows): tiles of rows dequantized into a per-thread
// buffer and multiplied by a library GEMM (kernels/src/ggml_prefill.cpp).
// Every output column is computed whole by one thread (the reduction is
// never split), so any thread count gives the same bits.
//
// Activations: Float (the default) multiplies the dequantized weights with
// the float inputs, float32 accumulation (prefill: the float32 GEMM
// dense_linear uses, oneDNN on AMD). Q8 at decode shapes quantizes each input
// row to 8 bits per 32 values (a float scale per block, round to nearest, as
// llama.cpp's Q8_0 activations) and takes integer dot products per block
// (AVX-512 VNNI vpdpbusd, AVX2 vpmaddubsw), faster and further from float.
// Q8 at prefill shapes, where the CPU has AVX512_BF16: inputs and weight
// tiles rounded to bfloat16 and oneDNN's bfloat16 GEMM (float32 sums, each
// output rounded to bfloat16), 1.8x the float tiles' speed; each output off
// the float64 product by at most 2^-7 sum|w x| + 2^-8 |y| (plus float32
// accumulation), on random data max|error| / max|y| 3.4-3.8e-3 against the
// decode Q8 kernel's 4.9-5.5e-3 (bench_ggml_kernels --prefill). Elsewhere it
// takes the float tiles.
#include <flex/kernels/cpu_isa.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace flex {

/// Input rows taken by the block-decoding GEMV; more float rows go the tiled way.
constexpr int64_t kGgmlGemvRows = 8;

enum class GgmlActivations { Float, Q8 };

/// Types ggml_linear computes on: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K.
bool ggml_linear_supports(uint32_t type);

/// Bytes of one stored row of `in` elements; ShapeError naming the type when
/// `in` is not whole blocks.
int64_t ggml_row_bytes(uint32_t type, int64_t in);

/// x [..., in] times W^T (+ bias [out]) for W [out, in] stored as `type`
/// blocks in `weight` (uint8, contiguous, out * ggml_row_bytes bytes). The
/// result has x's floating dtype (computed in float32). UnsupportedError for
/// a type ggml_linear_supports refuses, ShapeError naming the sizes that
/// disagree.
at::Tensor ggml_linear(uint32_t type, const at::Tensor& weight, int64_t out, int64_t in, const at::Tensor& x,
                       const at::Tensor& bias, GgmlActivations activations = GgmlActivations::Float);

/// One weight of a ggml_linear_group: W [out, in] as `type` blocks in
/// `weight` (as ggml_linear takes it), and an optional bias [out].
struct GgmlWeight {
  uint32_t type;
  at::Tensor weight;
  int64_t out;
  at::Tensor bias;
};

/// x [..., in] through each weight, as one ggml_linear call per weight would
/// give, bit for bit. At decode shapes they share one parallel region (the
/// rows of all weights dealt out together) and, with Q8 activations, one
/// quantization of x: a decode step's q/k/v and gate/up products are then
/// one call each, not five calls whose small matrices (k and v: 256 rows in
/// a 1.1B Llama) are mostly thread start and tail.
std::vector<at::Tensor> ggml_linear_group(const std::vector<GgmlWeight>& weights, int64_t in, const at::Tensor& x,
                                          GgmlActivations activations = GgmlActivations::Float);

/// The block-decoding kernel at one instruction set, for tests: rows
/// [r0, r1) of W times the `m` float rows of x [m, in] into y [m, out]
/// (columns r0..r1 written). `isa` above the CPU's is lowered to it.
void ggml_gemv(Isa isa, uint32_t type, const uint8_t* weight, int64_t out, int64_t in, const float* x, int64_t m,
               float* y, int64_t r0, int64_t r1, GgmlActivations activations = GgmlActivations::Float);

}  // namespace flex
