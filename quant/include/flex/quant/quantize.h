#pragma once
// bitsandbytes' quantization arithmetic on ATen tensors (any device), as
// its CUDA kernels compute it, so checkpoints written here load there and
// the reverse:
//
//  - LLM.int8() weights: the weight (via float16) scaled per row by its
//    absmax SCB onto [-127, 127], rounded half to even.
//  - 4-bit weights: the flattened weight cut in blocks (64), each scaled by
//    its absmax and mapped to the nearest of 16 code values (NF4, the QLoRA
//    paper's normal-float code, or bitsandbytes' FP4 e2m1 code), two codes a
//    byte, the first in the high nibble.
//  - Double quantization: the 4-bit absmaxes minus their mean, quantized in
//    blocks of 256 onto bitsandbytes' signed 8-bit dynamic code.
#include <ATen/core/Tensor.h>

#include <array>
#include <string>
#include <vector>

namespace flex {

enum class FourBitType { NF4, FP4 };
/// "nf4" / "fp4"; ConfigError otherwise.
FourBitType four_bit_type(const std::string& name);
std::string to_string(FourBitType t);

/// The 16 code values indexed by the 4-bit code (FP4 in bit order: sign bit 3).
const std::array<float, 16>& four_bit_code(FourBitType t);
/// bitsandbytes' signed dynamic 8-bit code (256 sorted values, -0.99296875 .. 1).
const std::array<float, 256>& dynamic_code();

/// LLM.int8() row-wise weights.
struct Int8Weight {
  at::Tensor cb;   // int8 [out, in]
  at::Tensor scb;  // float32 [out]: each row's absmax (of the float16 weight)
};
Int8Weight quantize_int8_rowwise(const at::Tensor& weight);
/// cb * scb / 127 in float32.
at::Tensor dequantize_int8_rowwise(const at::Tensor& cb, const at::Tensor& scb);
/// LLM.int8()'s matmul x W^T + bias: input feature columns holding an
/// element with |x| >= threshold (threshold > 0) use the dequantized weight
/// columns in float; the rest is int8 x int8 (exact int32 sums) with x
/// quantized per row via float16. The result has x's dtype. One pass over
/// the int8 weight (int8_linear.cpp), vectorised for the CPU (cpu_isa.h).
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& cb, const at::Tensor& scb, const at::Tensor& bias,
                       double threshold);

/// Blockwise 8-bit quantization onto a sorted 256-value code (ties of the
/// float32 midpoints go to the even index, as bitsandbytes' binary search).
struct Blockwise8 {
  at::Tensor codes;   // uint8, x's shape
  at::Tensor absmax;  // float32 [ceil(numel / blocksize)]
};
Blockwise8 quantize_blockwise_8bit(const at::Tensor& x, const at::Tensor& code, int64_t blocksize = 256);
at::Tensor dequantize_blockwise_8bit(const at::Tensor& codes, const at::Tensor& absmax, const at::Tensor& code,
                                     int64_t blocksize = 256);

/// A 4-bit weight with its quantization state (bitsandbytes' QuantState).
struct FourBitWeight {
  at::Tensor packed;         // uint8 [(n + 1) / 2, 1]
  at::Tensor absmax;         // float32 [blocks], or uint8 [blocks] when nested
  at::Tensor nested_absmax;  // float32 [ceil(blocks / 256)] (nested only)
  at::Tensor nested_code;    // float32 [256] (nested only)
  double offset = 0;         // mean of the absmaxes (nested only)
  FourBitType type = FourBitType::NF4;
  int64_t blocksize = 64;
  std::vector<int64_t> shape;         // the weight's shape
  at::ScalarType dtype = at::kFloat;  // the weight's dtype when quantized
  bool nested() const { return nested_absmax.defined(); }
};
FourBitWeight quantize_4bit(const at::Tensor& weight, FourBitType type, bool double_quant, int64_t blocksize = 64);
/// The weight in float32, shaped as it was.
at::Tensor dequantize_4bit(const FourBitWeight& w);
/// x W^T + bias for a 2-D 4-bit weight, computed in `compute` (x and bias
/// are cast to it first, as bitsandbytes does) and returned in x's dtype:
/// within float rounding of at::linear on dequantize_4bit(w), without ever
/// holding the whole dequantized weight (four_bit_linear.cpp).
at::Tensor four_bit_linear(const FourBitWeight& w, const at::Tensor& x, const at::Tensor& bias,
                           at::ScalarType compute);
/// The packed 4-bit codes (n values, high nibble first) unpacked to uint8.
at::Tensor unpack_4bit(const at::Tensor& packed, int64_t n);

/// bitsandbytes' packed quant-state JSON ("quant_type", "blocksize",
/// "dtype", "shape"[, "nested_blocksize", "nested_dtype", "nested_offset"]),
/// byte for byte as Python's json.dumps writes it.
std::string quant_state_json(const FourBitWeight& w);
/// Reads the JSON back into `w` (type, blocksize, dtype, shape, offset);
/// ConfigError naming `where` for missing or malformed fields.
void read_quant_state_json(const std::string& json, FourBitWeight& w, const std::string& where);
/// The JSON as bitsandbytes stores it: a uint8 tensor of its bytes, and back.
at::Tensor quant_state_tensor(const FourBitWeight& w);
void read_quant_state_tensor(const at::Tensor& bytes, FourBitWeight& w, const std::string& where);

}  // namespace flex
