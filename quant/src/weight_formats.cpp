#include <flex/hooks/errors.h>
#include <flex/quant/weight_formats.h>

#include <ATen/ATen.h>

namespace flex {

namespace {
bool is_conv1d(const DenseLayer& layer) { return dynamic_cast<const Conv1D*>(&layer) != nullptr; }
}  // namespace

at::Tensor weight_out_in(const DenseLayer& layer) {
  return is_conv1d(layer) ? layer.weight.t() : layer.weight;
}

// --- 8-bit ---------------------------------------------------------------------

at::Tensor Int8Format::linear(const DenseLayer& layer, const at::Tensor& x) const {
  return int8_linear(x, layer.weight, layer.format_tensor("SCB"), layer.bias, threshold_);
}

at::Tensor Int8Format::dequantize(const DenseLayer& layer) const {
  return dequantize_int8_rowwise(layer.weight, layer.format_tensor("SCB"));
}

std::vector<std::pair<std::string, at::Tensor>> int8_tensors(const at::Tensor& w) {
  Int8Weight q = quantize_int8_rowwise(w);
  return {{"weight", q.cb}, {"SCB", q.scb}, {"weight_format", at::zeros({}, at::kByte)}};
}

void store_int8(DenseLayer& layer, const at::Tensor& w, double threshold) {
  auto t = int8_tensors(w);
  at::Tensor weight = t[0].second;
  t.erase(t.begin());
  layer.set_weight_format(std::make_shared<Int8Format>(threshold), weight, t);
}

// --- 4-bit ---------------------------------------------------------------------

FourBitFormat::FourBitFormat(FourBitWeight state, at::ScalarType compute_dtype)
    : state_(std::move(state)), compute_(compute_dtype) {
  state_.packed = state_.absmax = state_.nested_absmax = state_.nested_code = at::Tensor();
}

FourBitWeight FourBitFormat::weight_of(const DenseLayer& layer) const {
  FourBitWeight w = state_;
  w.packed = layer.weight;
  w.absmax = layer.format_tensor("weight_absmax");
  if (w.absmax.scalar_type() == at::kByte) {
    w.nested_absmax = layer.format_tensor("weight_nested_absmax");
    w.nested_code = layer.format_tensor("weight_nested_quant_map");
  }
  return w;
}

at::Tensor FourBitFormat::dequantize(const DenseLayer& layer) const {
  return dequantize_4bit(weight_of(layer)).to(compute_);
}

at::Tensor FourBitFormat::linear(const DenseLayer& layer, const at::Tensor& x) const {
  return four_bit_linear(weight_of(layer), x, layer.bias, compute_);
}

std::vector<std::pair<std::string, at::Tensor>> four_bit_tensors(const FourBitWeight& w) {
  const auto& code = four_bit_code(w.type);
  std::vector<std::pair<std::string, at::Tensor>> t{
      {"weight", w.packed},
      {"weight_absmax", w.absmax},
      {"weight_quant_map", at::from_blob(const_cast<float*>(code.data()), {16}, at::kFloat).clone()}};
  if (w.nested()) {
    t.emplace_back("weight_nested_absmax", w.nested_absmax);
    t.emplace_back("weight_nested_quant_map", w.nested_code);
  }
  t.emplace_back("weight_quant_state", quant_state_tensor(w));
  return t;
}

void store_4bit(DenseLayer& layer, const at::Tensor& w, FourBitType type, bool double_quant,
                at::ScalarType compute_dtype) {
  FourBitWeight q = quantize_4bit(w, type, double_quant);
  auto t = four_bit_tensors(q);
  at::Tensor packed = t[0].second;
  t.erase(t.begin());
  layer.set_weight_format(std::make_shared<FourBitFormat>(q, compute_dtype), packed, t);
}

// --- names -----------------------------------------------------------------------

std::string bnb_tensor_name(const std::string& local, const DenseLayer& layer) {
  if (local == "weight_quant_state") {
    auto f = std::dynamic_pointer_cast<const FourBitFormat>(layer.weight_format());
    if (!f) throw ConfigError(layer.class_name() + " holds a 4-bit quant state but is not in the 4-bit format");
    return "weight.quant_state.bitsandbytes__" + to_string(f->type());
  }
  for (const char* k : {"absmax", "quant_map", "nested_absmax", "nested_quant_map"})
    if (local == std::string("weight_") + k) return std::string("weight.") + k;
  return local;
}

std::optional<std::string> model_tensor_name(const std::string& local) {
  if (local.rfind("weight.quant_state.bitsandbytes__", 0) == 0) return std::string("weight_quant_state");
  for (const char* k : {"absmax", "quant_map", "nested_absmax", "nested_quant_map"})
    if (local == std::string("weight.") + k) return std::string("weight_") + k;
  if (local == "SCB" || local == "weight_format") return local;
  return std::nullopt;
}

}  // namespace flex
