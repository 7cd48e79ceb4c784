#pragma once
// The two bitsandbytes weight formats as flex::WeightFormat (hooks/nn.h):
// a Linear (or GPT-2 Conv1D) keeps its name and hooks; its tensors hold
// bitsandbytes' stored form, named as bitsandbytes saves them except that a
// dot inside a name becomes '_' (module tensors cannot hold dots):
//
//   Linear8bitLt  weight int8 [out, in], SCB float32 [out], weight_format uint8 [] (0 = row)
//   Linear4bit    weight uint8 [(n+1)/2, 1], weight_absmax, weight_quant_map,
//                 [weight_nested_absmax, weight_nested_quant_map,]
//                 weight_quant_state (the packed JSON quant state)
//
// bnb_tensor_name / model_tensor_name translate to and from the checkpoint
// names ("weight.absmax", "weight.quant_state.bitsandbytes__nf4", ...).
#include <flex/hooks/nn.h>
#include <flex/quant/quantize.h>

#include <optional>
#include <string>

namespace flex {

class Int8Format : public WeightFormat {
 public:
  explicit Int8Format(double threshold) : threshold_(threshold) {}
  std::string class_name() const override { return "Linear8bitLt"; }
  at::Tensor linear(const DenseLayer& layer, const at::Tensor& x) const override;
  at::Tensor dequantize(const DenseLayer& layer) const override;
  double threshold() const { return threshold_; }

 private:
  double threshold_;
};

class FourBitFormat : public WeightFormat {
 public:
  /// `state`: the quant state's scalars (type, blocksize, shape, dtype, offset);
  /// its tensors are read from the layer.
  FourBitFormat(FourBitWeight state, at::ScalarType compute_dtype);
  std::string class_name() const override { return "Linear4bit"; }
  at::Tensor linear(const DenseLayer& layer, const at::Tensor& x) const override;
  at::Tensor dequantize(const DenseLayer& layer) const override;
  /// The layer's tensors with this format's scalars.
  FourBitWeight weight_of(const DenseLayer& layer) const;
  at::ScalarType compute_dtype() const { return compute_; }
  FourBitType type() const { return state_.type; }

 private:
  FourBitWeight state_;  // scalars only
  at::ScalarType compute_;
};

/// Stores `layer`'s weight [out, in] (Conv1D: transposed first) as 8-bit.
void store_int8(DenseLayer& layer, const at::Tensor& weight_out_in, double threshold);
/// Stores it as 4-bit.
void store_4bit(DenseLayer& layer, const at::Tensor& weight_out_in, FourBitType type, bool double_quant,
                at::ScalarType compute_dtype);
/// The tensors (model names, relative to the layer) store_int8 / store_4bit
/// would set, computed from `weight_out_in` without touching a layer.
std::vector<std::pair<std::string, at::Tensor>> int8_tensors(const at::Tensor& weight_out_in);
std::vector<std::pair<std::string, at::Tensor>> four_bit_tensors(const FourBitWeight& w);

/// "weight_absmax" -> "weight.absmax", "weight_quant_state" ->
/// "weight.quant_state.bitsandbytes__nf4" (the layer's quant type), others unchanged.
std::string bnb_tensor_name(const std::string& local, const DenseLayer& layer);
/// The inverse for a checkpoint's local name; nullopt for names that are not
/// bitsandbytes' ("bias", ...).
std::optional<std::string> model_tensor_name(const std::string& bnb_local);

/// The weight [out, in] of a plain (unquantized) layer in floating point.
at::Tensor weight_out_in(const DenseLayer& layer);

}  // namespace flex
