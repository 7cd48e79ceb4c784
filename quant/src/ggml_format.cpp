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
