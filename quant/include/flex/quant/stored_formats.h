#pragma once
// Weights that checkpoints store in formats Transformers dequantizes while
// loading (no quantized compute: the model gets ordinary float tensors).
//   FP8 blocks (DeepSeek-V3, quant_method "fp8"): weight float8_e4m3fn [R, C]
//     and weight_scale_inv float32 [ceil(R / bm), ceil(C / bn)]; the weight is
//     q * scale of its block, in float32, then cast.
//   MXFP4 (gpt-oss, quant_method "mxfp4"): <name>_blocks uint8 [..., R, G, 16]
//     (two 4-bit e2m1 codes per byte, low nibble first) and <name>_scales uint8
//     [..., R, G] (a power of two, 2^(s - 127), per 32 values); the result is
//     [..., G * 32, R], the row and column dims swapped as gpt-oss's fused
//     expert tensors hold them.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace flex {

/// FP8 block dequantization; `what` names the tensor in ShapeError messages
/// (a scale grid that does not cover the weight).
at::Tensor dequantize_fp8_blocks(const at::Tensor& weight, const at::Tensor& scale_inv, int64_t block_rows,
                                 int64_t block_cols, at::ScalarType out, const std::string& what);

/// MXFP4 dequantization (see above); ShapeError naming `what` for mismatched shapes.
at::Tensor dequantize_mxfp4(const at::Tensor& blocks, const at::Tensor& scales, at::ScalarType out,
                            const std::string& what);

}  // namespace flex
