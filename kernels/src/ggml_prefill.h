#pragma once
// The prefill half of ggml_linear (more than kGgmlGemvRows input rows):
// tiles of weight rows dequantized and multiplied by a dense GEMM, each
// tile's output columns computed whole on one thread.
#include <flex/kernels/ggml_linear.h>

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace flex::kernel {

/// y [M, N] = xf [M, K] (float32, contiguous) times W^T, W [N, K] stored as
/// `type` rows of `row_bytes` at `w`. Arguments are checked by ggml_linear.
void ggml_prefill(uint32_t type, const uint8_t* w, int64_t row_bytes, int64_t N, int64_t K, const at::Tensor& xf,
                  at::Tensor& y, GgmlActivations activations);

}  // namespace flex::kernel
