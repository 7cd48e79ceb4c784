#include <flex/hooks/errors.h>
#include <flex/kernels/ggml_dequant.h>
#include <flex/quant/ggml_format.h>

#include <ATen/ATen.h>

namespace flex {

at::Tensor GgmlFormat::linear(const DenseLayer& layer, const at::Tensor& x) const {
  return ggml_linear(type_, layer.weight, layer.out_features, layer.in_features, x, layer.bias, activations_);
}

at::Tensor GgmlFormat::dequantize(const DenseLayer& layer) const {
  at::Tensor w = at::empty({layer.out_features, layer.in_features}, at::kFloat);
  dequantize_ggml(type_, layer.weight.contiguous().data_ptr<uint8_t>(), w.data_ptr<float>(), w.numel());
  return w.to(dtype_);
}

std::optional<std::vector<at::Tensor>> ggml_linear_together(const std::vector<const DenseLayer*>& layers,
                                                            const at::Tensor& x) {
  if (layers.empty() || !x.device().is_cpu()) return std::nullopt;
  std::vector<GgmlWeight> weights;
  std::optional<GgmlActivations> activations;
  for (const DenseLayer* layer : layers) {
    const auto* f = dynamic_cast<const GgmlFormat*>(layer->weight_format().get());
    if (!f || layer->in_features != layers.front()->in_features || !layer->weight.device().is_cpu() ||
        (activations && *activations != f->activations()))
      return std::nullopt;
    activations = f->activations();
    weights.push_back({f->type(), layer->weight, layer->out_features, layer->bias});
  }
  return ggml_linear_group(weights, layers.front()->in_features, x, *activations);
}

void store_ggml(DenseLayer& layer, uint32_t type, const at::Tensor& bytes, GgmlActivations activations,
                at::ScalarType dtype) {
  const int64_t row = ggml_row_bytes(type, layer.in_features);
  if (bytes.scalar_type() != at::kByte || bytes.numel() != layer.out_features * row)
    throw ShapeError(layer.class_name() + " [" + std::to_string(layer.out_features) + ", " +
                     std::to_string(layer.in_features) + "] in " + ggml_type_name(type) + " needs " +
                     std::to_string(layer.out_features * row) + " bytes; got " + std::to_string(bytes.numel()));
  layer.set_weight_format(std::make_shared<GgmlFormat>(type, activations, dtype),
                          bytes.contiguous().view({layer.out_features, row}), {});
}

}  // namespace flex
