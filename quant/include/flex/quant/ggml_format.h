#pragma once
// GGUF's quantized matrices kept as ggml blocks inside a dense layer: the
// layer's `weight` holds the stored bytes (uint8 [out, row bytes], a view of
// the memory-mapped file where the rows were not reordered) and its forward
// runs ggml_linear (flex/kernels/ggml_linear.h) on them. The layer keeps its
// class name ("Linear", as Transformers' GGUF loading builds it), its module
// name and its hooks; float_weight() gives the dequantized weight.
#include <flex/hooks/nn.h>
#include <flex/kernels/ggml_linear.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace flex {

class GgmlFormat : public WeightFormat {
 public:
  /// `type`: a ggml type ggml_linear_supports; `dtype`: the floating dtype
  /// dequantize() returns (the model's).
  GgmlFormat(uint32_t type, GgmlActivations activations, at::ScalarType dtype)
      : type_(type), activations_(activations), dtype_(dtype) {}
  std::string class_name() const override { return "Linear"; }
  at::Tensor linear(const DenseLayer& layer, const at::Tensor& x) const override;
  at::Tensor dequantize(const DenseLayer& layer) const override;
  uint32_t type() const { return type_; }
  GgmlActivations activations() const { return activations_; }

 private:
  uint32_t type_;
  GgmlActivations activations_;
  at::ScalarType dtype_;
};

/// `layers`' products of the one input x computed together
/// (ggml_linear_group: one parallel region, x quantized once), bit-equal to
/// calling each layer's format; nullopt unless x is on the CPU and every
/// layer is stored in a GgmlFormat with the same activations. The caller
/// decides that no hook is bypassed.
std::optional<std::vector<at::Tensor>> ggml_linear_together(const std::vector<const DenseLayer*>& layers,
                                                            const at::Tensor& x);

/// Stores `bytes` (uint8, out_features rows of ggml_row_bytes(type,
/// in_features) bytes) as `layer`'s weight in `type`. ShapeError naming the
/// layer's class and both sizes when the bytes are not that many.
void store_ggml(DenseLayer& layer, uint32_t type, const at::Tensor& bytes, GgmlActivations activations,
                at::ScalarType dtype);

}  // namespace flex
