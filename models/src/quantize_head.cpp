// --quantize-head: the output head quantized after loading (from_pretrained.h).
#include <flex/hooks/errors.h>
#include <flex/models/from_pretrained.h>
#include <flex/quant/ggml_format.h>
#include <flex/quant/ggml_quantize.h>
#include <flex/quant/quantize_model.h>
#include <flex/quant/weight_formats.h>

#include <ATen/ATen.h>

namespace flex {

namespace {
constexpr const char* kAllowed = "none, int8, nf4, q8_0, q6_k";
}  // namespace

void check_quantize_head(const std::string& f) {
  if (f != "none" && f != "int8" && f != "nf4" && f != "q8_0" && f != "q6_k")
    throw ConfigError("quantize_head (--quantize-head): unknown format '" + f + "'; allowed: " + kAllowed);
}

void quantize_output_head(CausalLM& model, const std::string& f) {
  check_quantize_head(f);
  if (f == "none") return;
  const std::string name = output_head_name(model);
  auto m = model.get_submodule(name);
  auto* layer = dynamic_cast<DenseLayer*>(m.get());
  if (!layer) throw ConfigError("quantize_head: the output head '" + name + "' is a " + m->class_name() + ", not a Linear");
  if (layer->weight_format())
    throw ConfigError("quantize_head: the output head '" + name + "' is quantized already (" + layer->class_name() + ")");
  if (layer->weight.is_meta() || !layer->weight.device().is_cpu())
    throw UnsupportedError("quantize_head: the output head '" + name + "' must be on the CPU with its weights loaded");
  if (f == "int8" || f == "nf4") {
    // bitsandbytes' quantizers (quantize_model); 4-bit computes in the model's dtype.
    quantize_model(model, quantization_from_string(f, layer->weight.scalar_type()), {name});
    return;
  }
  at::NoGradGuard no_grad;
  const uint32_t type = f == "q8_0" ? 8u : 14u;
  const at::ScalarType dtype = layer->weight.scalar_type();
  // A fresh tensor replaces the head's weight only: a tied input embedding keeps the float table.
  const at::Tensor bytes = ggml_quantize(type, weight_out_in(*layer));
  store_ggml(*layer, type, bytes, GgmlActivations::Float, dtype);
}

}  // namespace flex
