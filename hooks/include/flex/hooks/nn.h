#pragma once
// Basic hookable layers, named (class and parameters) as PyTorch and
// Hugging Face name them so checkpoints and hook names carry over.
#include <flex/hooks/module.h>

#include <string>
#include <vector>

namespace flex {

/// y = x W^T + b, weight (out, in).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true,
         const at::TensorOptions& options = {});
  Value forward(Inputs inputs) override;
  at::Tensor compute(const at::Tensor& x) const;
  at::Tensor weight, bias;
  int64_t in_features, out_features;
};

/// GPT-2's Conv1D: y = x W + b with weight stored (in, out).
class Conv1D : public Module {
 public:
  Conv1D(int64_t out_features, int64_t in_features, const at::TensorOptions& options = {});
  Value forward(Inputs inputs) override;
  at::Tensor compute(const at::Tensor& x) const;
  at::Tensor weight, bias;
  int64_t in_features, out_features;
};

class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, const at::TensorOptions& options = {});
  Value forward(Inputs inputs) override;
  at::Tensor weight;
  int64_t num_embeddings, embedding_dim;
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
