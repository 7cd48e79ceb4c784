#pragma once
// Accelerate's BnbQuantizationConfig: which layers to quantize and how.
//
//   flex::BnbQuantizationConfig q;
//   q.load_in_4bit = true;
//   q.bnb_4bit_quant_type = "nf4";
//   q.bnb_4bit_compute_dtype = at::kBFloat16;
//   auto model = flex::from_pretrained(dir, {.quantization = q});
//
// 8-bit: bitsandbytes' LLM.int8(): each weight row scaled by its absmax to
// int8 (SCB = the row absmaxes); at run time the input's outlier feature
// columns (|x| >= llm_int8_threshold anywhere) multiply the dequantized
// weight columns in the compute dtype, the rest is int8 x int8 with the input
// quantized per row. 4-bit: the weight flattened in blocks of 64, each block
// scaled by its absmax onto the 16-value NF4 or FP4 code, two codes a byte;
// with double quantization the absmaxes are themselves 8-bit (blocks of 256).
#include <c10/core/ScalarType.h>

#include <optional>
#include <string>
#include <vector>

namespace flex {

struct BnbQuantizationConfig {
  bool load_in_8bit = false;
  double llm_int8_threshold = 6.0;
  bool load_in_4bit = false;
  /// "nf4" or "fp4".
  std::string bnb_4bit_quant_type = "fp4";
  bool bnb_4bit_use_double_quant = false;
  /// The dtype 4-bit layers compute (and hooks see) in.
  at::ScalarType bnb_4bit_compute_dtype = at::kHalf;
  /// The dtype of everything not quantized (norms, embeddings, biases);
  /// unset: the model's (float32 unless the checkpoint loader says otherwise).
  std::optional<at::ScalarType> torch_dtype;
  /// Modules (dotted-name prefixes or last components, as Transformers
  /// matches them) left in full precision; unset: the output head (the
  /// model's output embeddings, e.g. lm_head).
  std::optional<std::vector<std::string>> skip_modules;
  /// Modules kept in float32 whatever torch_dtype says.
  std::vector<std::string> keep_in_fp32_modules;

  bool enabled() const { return load_in_8bit || load_in_4bit; }
  /// "int8", "nf4", "fp4" (or "none").
  std::string method() const;
  /// ConfigError for contradictory settings (both bit widths, an unknown quant type).
  void validate() const;
};

/// The config `--quantize int8|nf4|fp4` means (compute dtype: `compute`).
BnbQuantizationConfig quantization_from_string(const std::string& method, at::ScalarType compute = at::kFloat);

}  // namespace flex
