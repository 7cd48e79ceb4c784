#pragma once
// Basic hookable layers, named (class and parameters) as PyTorch and
// Hugging Face name them so checkpoints and hook names carry over.
#include <flex/hooks/module.h>

#include <string>
#include <vector>

namespace flex {

class DenseLayer;

/// How a dense layer computes from a weight stored in another form (8-bit
/// or 4-bit: flex/quant/weight_formats.h). The layer's `weight` then holds
/// the stored form (bitsandbytes' bytes, no gradient) and the format's own
/// tensors sit beside it; forward and hooks see the compute dtype.
class WeightFormat {
 public:
  virtual ~WeightFormat() = default;
  /// The class name a layer in this format shows ("Linear8bitLt", "Linear4bit").
  virtual std::string class_name() const = 0;
  /// x W^T + b, W [out, in] being `layer`'s stored weight.
  virtual at::Tensor linear(const DenseLayer& layer, const at::Tensor& x) const = 0;
  /// W [out, in] in the compute dtype.
  virtual at::Tensor dequantize(const DenseLayer& layer) const = 0;
};

/// What Linear and Conv1D share: a weight, an optional bias, and optionally
/// a WeightFormat the weight is stored in.
class DenseLayer : public Module {
 public:
  at::Tensor weight, bias;
  int64_t in_features, out_features;

  virtual at::Tensor compute(const at::Tensor& x) const = 0;
  /// compute() after check_input_device (a DeviceError, not libtorch's message, for a misplaced input).
  Value forward(Inputs inputs) override;

  /// Null for a plain floating-point weight.
  const std::shared_ptr<const WeightFormat>& weight_format() const { return format_; }
  /// Stores the weight in `format`: `stored_weight` replaces the weight
  /// (no gradient), `extra` are the format's tensors (persistent buffers,
  /// names without dots, e.g. "weight_absmax"); the class name becomes the
  /// format's. Under EmptyInit the stored weight goes to meta (the extra
  /// tensors too with EmptyInit(include_buffers)).
  void set_weight_format(std::shared_ptr<const WeightFormat> format, at::Tensor stored_weight,
                         std::vector<std::pair<std::string, at::Tensor>> extra);
  /// Swaps the format, keeping the stored tensors (its scalars changed).
  void reset_weight_format(std::shared_ptr<const WeightFormat> format) { format_ = std::move(format); }
  /// A tensor set_weight_format added; NotFoundError when absent.
  const at::Tensor& format_tensor(const std::string& name) const;
  /// The weight as the layer's own layout would hold it in floating point
  /// (Linear [out, in], Conv1D [in, out]): dequantized when stored in a format.
  virtual at::Tensor float_weight() const = 0;

 protected:
  DenseLayer(std::string class_name, int64_t in, int64_t out) : Module(std::move(class_name)), in_features(in), out_features(out) {}

 private:
  std::shared_ptr<const WeightFormat> format_;
  std::map<std::string, at::Tensor> format_tensors_;  // stable slots for the buffers
};

/// y = x W^T + b, weight (out, in).
class Linear : public DenseLayer {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true,
         const at::TensorOptions& options = {});
  at::Tensor compute(const at::Tensor& x) const override;
  at::Tensor float_weight() const override;
};

/// GPT-2's Conv1D: y = x W + b with weight stored (in, out); a format holds W^T.
class Conv1D : public DenseLayer {
 public:
  Conv1D(int64_t out_features, int64_t in_features, const at::TensorOptions& options = {});
  at::Tensor compute(const at::Tensor& x) const override;
  at::Tensor float_weight() const override;
};

/// Throws flex::DeviceError naming `module`'s class, both devices and what
/// `input` is, when `input` is on another device than `weight` (one device
/// comparison: the first module that consumes a misplaced tensor says so).
void check_input_device(const Module& module, const at::Tensor& input, const at::Tensor& weight, const char* input_name);

class Embedding;

/// How an Embedding's table is stored when it is not a floating-point
/// tensor (quantized embeddings: flex/models/quantized_embedding.h). Only
/// the rows looked up are decoded.
class EmbeddingFormat {
 public:
  virtual ~EmbeddingFormat() = default;
  /// "Q8_0", "int8", ...: what messages call the stored format.
  virtual std::string name() const = 0;
  /// weight[ids] in the compute dtype: ids' shape + [embedding_dim].
  virtual at::Tensor rows(const Embedding& e, const at::Tensor& ids) const = 0;
  /// The whole table [num_embeddings, embedding_dim] in the compute dtype.
  virtual at::Tensor dequantize(const Embedding& e) const = 0;
};

class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, const at::TensorOptions& options = {});
  Value forward(Inputs inputs) override;
  at::Tensor weight;
  int64_t num_embeddings, embedding_dim;

  /// Null for a plain floating-point table.
  const std::shared_ptr<const EmbeddingFormat>& weight_format() const { return format_; }
  /// Stores the table in `format`: `stored_weight` replaces `weight` (no
  /// gradient), `extra` are the format's tensors (persistent buffers, names
  /// without dots). The module name, class name and hooks stay.
  void set_weight_format(std::shared_ptr<const EmbeddingFormat> format, at::Tensor stored_weight,
                         std::vector<std::pair<std::string, at::Tensor>> extra);
  /// A tensor set_weight_format added; NotFoundError when absent.
  const at::Tensor& format_tensor(const std::string& name) const;
  /// The table [num_embeddings, embedding_dim] in floating point: `weight`,
  /// or the stored format dequantized (a new tensor).
  at::Tensor float_weight() const;

 private:
  std::shared_ptr<const EmbeddingFormat> format_;
  std::map<std::string, at::Tensor> format_tensors_;  // stable slots for the buffers
};

class LayerNorm : public Module {
 public:
  LayerNorm(int64_t dim, double eps = 1e-5, bool affine = true, const at::TensorOptions& options = {});
  Value forward(Inputs inputs) override;
  at::Tensor weight, bias;
  int64_t dim;
  double eps;
};

/// RMSNorm: x * rsqrt(mean(x^2) + eps) computed in float32, then scaled. The
/// architectures differ in where the result goes back to x's dtype and in the
/// scale (visible only below float32):
///   Weight:          w * n.to(dtype)             (Llama, Mistral, Qwen, Phi-3)
///   WeightThenCast:  (w * n).to(dtype)           (OLMo 2)
///   OnePlusWeight:   (n * (1 + w.float())).to(dtype), w starts at 0 (Gemma)
class RMSNorm : public Module {
 public:
  enum class Scale { Weight, WeightThenCast, OnePlusWeight };
  RMSNorm(int64_t dim, double eps = 1e-6, std::string class_name = "LlamaRMSNorm",
          const at::TensorOptions& options = {}, Scale scale = Scale::Weight);
  Value forward(Inputs inputs) override;
  at::Tensor weight;
  double eps;
  Scale scale;
};

/// Returns its input: a named hook point (FlexModel's DummyModule).
class Identity : public Module {
 public:
  explicit Identity(std::string class_name = "Identity") : Module(std::move(class_name)) {}
  Value forward(Inputs inputs) override;
};

/// Dropout: the identity in eval mode.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.0) : Module("Dropout"), p(p) {}
  Value forward(Inputs inputs) override;
  double p;
};

/// Pointwise activation by Hugging Face name: "gelu_new", "gelu", "gelu_pytorch_tanh",
/// "relu", "silu". The class name follows Transformers (NewGELUActivation, ...).
class Activation : public Module {
 public:
  explicit Activation(const std::string& kind);
  Value forward(Inputs inputs) override;
  at::Tensor compute(const at::Tensor& x) const;
  std::string kind;
};

/// A list of children named "0", "1", ...; not callable (as nn.ModuleList).
class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  void push_back(std::shared_ptr<Module> m);
  size_t size() const { return items_.size(); }
  const std::shared_ptr<Module>& operator[](size_t i) const { return items_.at(i); }
  const std::vector<std::shared_ptr<Module>>& items() const { return items_; }
  Value forward(Inputs inputs) override;

 private:
  std::vector<std::shared_ptr<Module>> items_;
};

/// Children "0", "1", ... applied in order; the output of one is the input of the next.
class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  explicit Sequential(std::vector<std::shared_ptr<Module>> mods);
  void push_back(std::shared_ptr<Module> m);
  size_t size() const { return items_.size(); }
  Value forward(Inputs inputs) override;

 private:
  std::vector<std::shared_ptr<Module>> items_;
};

}  // namespace flex
