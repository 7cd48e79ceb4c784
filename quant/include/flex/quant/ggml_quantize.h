#pragma once
// Quantizing a float matrix into ggml's blocks (the inverse of
// flex/kernels/ggml_dequant.h), so a model loaded from flexmodel's own
// formats can keep a layer (the output head, --quantize-head) as GGUF's
// Q8_0 or Q6_K blocks computed by ggml_linear.
//
// Q8_0: per 32 values d = max|x| / 127 (stored as float16), q = round(x / d)
// half away from zero, computed as gguf-py's gguf.quants.quantize does it
// (x times the float32 reciprocal of the float32 d), so the bytes are equal
// to gguf-py's. Q6_K: per 16 values a scale s = -m / 32 (m the value of
// largest magnitude, so m lands on q = -32), the 16 scales of a 256-value
// super-block stored as int8 sc = round(s / d), d = max|s| / 127 (float16),
// q = round(x / (d * sc)) clamped to [-32, 31]. Plain round to nearest, not
// llama.cpp's searched scales; per value |x - d sc q| <= d |sc| + 16 d (half
// a step inside the range; at its ends the clamp to -32 after the scale's
// rounding adds up to 16 d, and a value of the other sign near |m| lands on
// 32 and is clamped to 31, one step), which the tests check.
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace flex {

/// Types ggml_quantize writes: Q8_0 (8) and Q6_K (14).
bool ggml_can_quantize(uint32_t type);

/// w [out, in] (any floating dtype, read as float32) as `type` blocks:
/// uint8 [out, ggml_row_bytes(type, in)]. UnsupportedError naming the type
/// for one ggml_can_quantize refuses; ShapeError when w is not 2-D or `in`
/// is not whole blocks (32 for Q8_0, 256 for Q6_K).
at::Tensor ggml_quantize(uint32_t type, const at::Tensor& w);

}  // namespace flex
