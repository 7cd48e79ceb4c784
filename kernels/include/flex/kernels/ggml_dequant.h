#pragma once
// ggml's tensor types (the element formats of GGUF files): each type's
// number, name and block geometry, and dequantization of its blocks to
// float32. dequantize_ggml_reference is the scalar reference, one block at a
// time, written from ggml's block layouts; dequantize_ggml runs the same code
// over threads (blocks are independent, so any thread count gives the same
// bits). Both round as gguf-py's numpy dequantizer does (float32 products
// and sums, no fused multiply-add), so the results are bit-equal to it.
#include <cstdint>
#include <string>

namespace flex {

/// One ggml type: `block` elements are stored in `block_bytes` bytes.
struct GgmlTypeInfo {
  uint32_t id;        // the number stored in GGUF tensor infos
  const char* name;   // "Q4_K"
  int64_t block;      // elements per block (1 for plain types)
  int64_t block_bytes;
  bool dequantizable;  // whether dequantize_ggml takes it
};

/// The type with number `id`, or nullptr for a number ggml does not define.
const GgmlTypeInfo* ggml_type_info(uint32_t id);

/// "Q4_K", or "type 99" for an unknown number.
std::string ggml_type_name(uint32_t id);

/// Types dequantize_ggml takes: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
/// Q5_1, Q4_K, Q5_K, Q6_K.
bool ggml_can_dequantize(uint32_t id);

/// `n` elements (a multiple of the type's block) stored at `src` in type
/// `id`, as float32 into `dst`. UnsupportedError naming the type for a type
/// ggml_can_dequantize refuses, ShapeError when n is not whole blocks.
void dequantize_ggml_reference(uint32_t id, const uint8_t* src, float* dst, int64_t n);

/// The same values as dequantize_ggml_reference, split over at::parallel_for.
void dequantize_ggml(uint32_t id, const uint8_t* src, float* dst, int64_t n);

}  // namespace flex
