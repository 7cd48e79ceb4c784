#pragma once
// The prefill half of ggml_linear (more than kGgmlGemvRows input rows):
// tiles of weight rows dequantized and multiplied by a library GEMM, each
// tile's output columns computed whole on one thread. Float activations:
// float32 tiles and the float32 GEMM dense_linear picks. Q8 activations on
// a CPU with AVX512_BF16: bfloat16 inputs and tiles, oneDNN's bfloat16 GEMM
// (the error this adds: flex/kernels/ggml_linear.h, design decision 58).
#include <flex/kernels/ggml_linear.h>

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace flex::kernel {

/// y [M, N] = xf [M, K] (float32, contiguous) times W^T, W [N, K] stored as
/// `type` rows of `row_bytes` at `w`. Arguments are checked by ggml_linear.
void ggml_prefill(uint32_t type, const uint8_t* w, int64_t row_bytes, int64_t N, int64_t K, const at::Tensor& xf,
                  at::Tensor& y, GgmlActivations activations);

}  // namespace flex::kernel
