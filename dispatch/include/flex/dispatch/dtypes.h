#pragma once
// Dtype names of the file formats we read and write: safetensors ("F32"),
// numpy as Accelerate's offload index writes them ("float32", "bfloat16").
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

namespace flex {

/// Width in bits of a safetensors dtype string (F4 = 4, F6_E2M3 = 6, ...), or
/// 0 when the string is not a safetensors dtype at all.
int safetensors_dtype_bits(const std::string& name);

/// The libtorch dtype for a safetensors dtype string. Valid strings that this
/// project does not map (U16, U32, U64, F8_*, F4, F6_*, C64) give
/// UnsupportedError, unknown strings FileFormatError; `what` (say "tensor 'x'
/// in file f") goes into the message.
at::ScalarType safetensors_to_scalar_type(const std::string& name, const std::string& what);

/// "F32" for kFloat, ...; UnsupportedError naming `what` for dtypes outside
/// F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL.
std::string safetensors_dtype_name(at::ScalarType dtype, const std::string& what = "tensor");

/// The upstream writer's order key: smaller sorts first (U64 = 0, ..., BOOL = 14).
int safetensors_alignment_rank(const std::string& name);

/// numpy's dtype name as Accelerate writes it ("float32", "bool", "bfloat16").
std::string numpy_dtype_name(at::ScalarType dtype, const std::string& what = "tensor");

/// Inverse of numpy_dtype_name; UnsupportedError naming `what` otherwise.
at::ScalarType numpy_to_scalar_type(const std::string& name, const std::string& what);

/// Bytes per element (bool = 1).
size_t dtype_item_size(at::ScalarType dtype);

}  // namespace flex
