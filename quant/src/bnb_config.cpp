#include <flex/hooks/errors.h>
#include <flex/quant/bnb_config.h>
#include <flex/quant/quantize.h>

namespace flex {

std::string BnbQuantizationConfig::method() const {
  if (load_in_8bit) return "int8";
  if (load_in_4bit) return bnb_4bit_quant_type;
  return "none";
}

void BnbQuantizationConfig::validate() const {
  if (load_in_8bit && load_in_4bit) throw ConfigError("load_in_8bit and load_in_4bit cannot both be set");
  if (load_in_4bit) four_bit_type(bnb_4bit_quant_type);
  if (load_in_8bit && llm_int8_threshold < 0)
    throw ConfigError("llm_int8_threshold must be >= 0, got " + std::to_string(llm_int8_threshold));
  if (!at::isFloatingType(bnb_4bit_compute_dtype))
    throw ConfigError("bnb_4bit_compute_dtype must be a floating-point dtype");
}

BnbQuantizationConfig quantization_from_string(const std::string& method, at::ScalarType compute) {
  BnbQuantizationConfig c;
  if (method == "int8") {
    c.load_in_8bit = true;
  } else if (method == "nf4" || method == "fp4") {
    c.load_in_4bit = true;
    c.bnb_4bit_quant_type = method;
    c.bnb_4bit_compute_dtype = compute;
  } else {
    throw ConfigError("quantization must be int8, nf4 or fp4, got '" + method + "'");
  }
  return c;
}

}  // namespace flex
