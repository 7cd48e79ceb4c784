#include <flex/hooks/empty_init.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/nn.h>
#include <flex/hooks/frozen_replacement.h>
#include <flex/kernels/fused_elementwise.h>
#include <flex/kernels/linear.h>

#include <ATen/ATen.h>

#include <cmath>

namespace flex {

namespace {
// PyTorch's default Linear init: U(-1/sqrt(in), 1/sqrt(in)) for weight and bias.
void init_uniform(at::Tensor& t, int64_t fan_in) {
  if (!t.defined() || t.is_meta()) return;
  at::NoGradGuard guard;
  const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
  t.uniform_(-bound, bound);
}

void fill(at::Tensor& t, double v) {
  if (!t.defined() || t.is_meta()) return;
  at::NoGradGuard guard;
  t.fill_(v);
}

// A weight format's extra tensors (DenseLayer's and Embedding's), buffers in
// stable slots: a name seen before replaces its tensor (`set`), a new one
// gets a slot and is registered (`add`).
template <class Set, class Add>
void store_format_tensors(std::map<std::string, at::Tensor>& slots,
                          const std::vector<std::pair<std::string, at::Tensor>>& extra, Set set, Add add) {
  for (const auto& [name, t] : extra) {
    if (slots.count(name)) {
      set(name, t);
    } else {
      add(name, slots[name], t);
    }
  }
}

const at::Tensor& find_format_tensor(const std::map<std::string, at::Tensor>& slots, const std::string& name,
                                     const std::string& class_name) {
  auto it = slots.find(name);
  if (it == slots.end()) throw NotFoundError(class_name + " has no tensor '" + name + "'");
  return it->second;
}
}  // namespace

void DenseLayer::set_weight_format(std::shared_ptr<const WeightFormat> format, at::Tensor stored_weight,
                                   std::vector<std::pair<std::string, at::Tensor>> extra) {
  if (!format) throw ConfigError(class_name() + ": set_weight_format needs a format");
  replace_parameter("weight", std::move(stored_weight), false);
  store_format_tensors(
      format_tensors_, extra, [this](const std::string& n, const at::Tensor& t) { set_tensor(n, t); },
      [this](const std::string& n, at::Tensor& slot, const at::Tensor& t) { add_buffer(n, slot, t); });
  set_class_name(format->class_name());
  format_ = std::move(format);
}

const at::Tensor& DenseLayer::format_tensor(const std::string& name) const {
  return find_format_tensor(format_tensors_, name, class_name());
}

Linear::Linear(int64_t in, int64_t out, bool with_bias, const at::TensorOptions& options)
    : DenseLayer("Linear", in, out) {
  add_parameter("weight", weight, new_parameter({out, in}, options));
  init_uniform(weight, in);
  if (with_bias) {
    add_parameter("bias", bias, new_parameter({out}, options));
    init_uniform(bias, in);
  }
}

at::Tensor Linear::compute(const at::Tensor& x) const {
  if (weight_format()) return weight_format()->linear(*this, x);
  return dense_linear(x, weight, bias);
}

at::Tensor Linear::float_weight() const { return weight_format() ? weight_format()->dequantize(*this) : weight; }

Conv1D::Conv1D(int64_t out, int64_t in, const at::TensorOptions& options) : DenseLayer("Conv1D", in, out) {
  add_parameter("weight", weight, new_parameter({in, out}, options));
  if (!weight.is_meta()) {
    at::NoGradGuard guard;
    weight.normal_(0.0, 0.02);
  }
  add_parameter("bias", bias, new_parameter({out}, options));
  fill(bias, 0.0);
}

at::Tensor Conv1D::compute(const at::Tensor& x) const {
  if (weight_format()) return weight_format()->linear(*this, x);
  return dense_linear(x, weight, bias, WeightLayout::InOut);
}

at::Tensor Conv1D::float_weight() const {
  return weight_format() ? weight_format()->dequantize(*this).t() : weight;
}

Embedding::Embedding(int64_t num, int64_t dim, const at::TensorOptions& options)
    : Module("Embedding"), num_embeddings(num), embedding_dim(dim) {
  add_parameter("weight", weight, new_parameter({num, dim}, options));
  if (!weight.is_meta()) {
    at::NoGradGuard guard;
    weight.normal_(0.0, 1.0);
  }
}

void check_input_device(const Module& module, const at::Tensor& input, const at::Tensor& weight, const char* input_name) {
  if (!weight.defined() || !input.defined() || input.device() == weight.device()) return;
  throw DeviceError(module.class_name() + ": " + input_name + " is on " + input.device().str() + " but its weights are on " +
                        weight.device().str() + " (place the inputs on the device of the module that consumes them)",
                    &module);
}

Value DenseLayer::forward(Inputs inputs) {
  const at::Tensor& x = inputs.tensor(0);
  check_input_device(*this, x, weight, "the input");
  return compute(x);
}

Value Embedding::forward(Inputs inputs) {
  const at::Tensor& ids = inputs.tensor(0);
  check_input_device(*this, ids, weight, "input_ids");
  if (format_) return format_->rows(*this, ids);
  return at::embedding(weight, ids);
}

void Embedding::set_weight_format(std::shared_ptr<const EmbeddingFormat> format, at::Tensor stored_weight,
                                  std::vector<std::pair<std::string, at::Tensor>> extra) {
  if (!format) throw ConfigError(class_name() + ": set_weight_format needs a format");
  replace_parameter("weight", std::move(stored_weight), false);
  store_format_tensors(
      format_tensors_, extra, [this](const std::string& n, const at::Tensor& t) { set_tensor(n, t); },
      [this](const std::string& n, at::Tensor& slot, const at::Tensor& t) { add_buffer(n, slot, t); });
  format_ = std::move(format);
}

const at::Tensor& Embedding::format_tensor(const std::string& name) const {
  return find_format_tensor(format_tensors_, name, class_name());
}

at::Tensor Embedding::float_weight() const { return format_ ? format_->dequantize(*this) : weight; }

LayerNorm::LayerNorm(int64_t d, double e, bool affine, const at::TensorOptions& options)
    : Module("LayerNorm"), dim(d), eps(e) {
  if (affine) {
    add_parameter("weight", weight, new_parameter({d}, options));
    add_parameter("bias", bias, new_parameter({d}, options));
    fill(weight, 1.0);
    fill(bias, 0.0);
  }
}

Value LayerNorm::forward(Inputs inputs) {
  const at::Tensor& x = inputs.tensor(0);
  if (!nonlinearities_frozen()) return at::layer_norm(x, {dim}, weight, bias, eps);
  // The frozen replacement: centring stays linear, 1/std is a constant.
  const at::Tensor centred = x - x.mean(-1, /*keepdim=*/true);
  const at::Tensor inv_std = at::rsqrt(centred.pow(2).mean(-1, /*keepdim=*/true) + eps).detach();
  at::Tensor y = centred * inv_std;
  if (weight.defined()) y = y * weight;
  if (bias.defined()) y = y + bias;
  return y;
}

RMSNorm::RMSNorm(int64_t dim, double e, std::string class_name, const at::TensorOptions& options, Scale s)
    : Module(std::move(class_name)), eps(e), scale(s) {
  add_parameter("weight", weight, new_parameter({dim}, options));
  fill(weight, s == Scale::OnePlusWeight ? 0.0 : 1.0);
}

Value RMSNorm::forward(Inputs inputs) {
  const at::Tensor& x = inputs.tensor(0);
  const bool frozen = nonlinearities_frozen();  // 1/rms a constant, float64 kept (frozen_replacement.h)
  if (!frozen && fused_rms_norm_applies(x, weight))  // one pass, the same roundings (design decision 57)
    return fused_rms_norm(x, weight, eps,
                          scale == Scale::WeightThenCast  ? RmsNormScale::WeightThenCast
                          : scale == Scale::OnePlusWeight ? RmsNormScale::OnePlusWeight
                                                          : RmsNormScale::Weight);
  at::Tensor h = x.to(frozen ? at::promote_types(at::kFloat, x.scalar_type()) : at::kFloat);
  at::Tensor var = h.pow(2).mean(-1, /*keepdim=*/true);
  const at::Tensor inv_rms = at::rsqrt(var + eps);
  h = h * (frozen ? inv_rms.detach() : inv_rms);
  switch (scale) {
    case Scale::WeightThenCast: return (weight * h).to(x.scalar_type());
    case Scale::OnePlusWeight: return (h * (weight.to(at::kFloat) + 1.0)).to(x.scalar_type());
    default: return weight * h.to(x.scalar_type());
  }
}

Value Identity::forward(Inputs inputs) {
  if (inputs.args.size() == 1 && inputs.kwargs.empty()) return inputs.args[0];
  if (inputs.args.empty()) throw NotFoundError("Identity hook point '" + class_name() + "' called without input");
  return c10::ivalue::Tuple::create(inputs.args);
}

Value Dropout::forward(Inputs inputs) {
  const at::Tensor& x = inputs.tensor(0);
  if (!is_training() || p == 0.0) return x;
  return at::dropout(x, p, /*train=*/true);
}

namespace {
std::string activation_class(const std::string& kind) {
  if (kind == "gelu_new") return "NewGELUActivation";
  if (kind == "gelu") return "GELUActivation";
  if (kind == "gelu_pytorch_tanh") return "PytorchGELUTanh";
  if (kind == "relu") return "ReLU";
  if (kind == "silu" || kind == "swish") return "SiLU";
  throw ConfigError("unsupported activation function '" + kind +
                    "' (supported: gelu_new, gelu, gelu_pytorch_tanh, relu, silu)");
}
}  // namespace

Activation::Activation(const std::string& k) : Module(activation_class(k)), kind(k) {}

at::Tensor Activation::compute(const at::Tensor& x) const {
  if (kind == "gelu_new") {
    // Transformers' NewGELUActivation, same operation order.
    const double c = std::sqrt(2.0 / M_PI);
    return 0.5 * x * (1.0 + at::tanh(c * (x + 0.044715 * at::pow(x, 3.0))));
  }
  if (kind == "gelu") return at::gelu(x);
  if (kind == "gelu_pytorch_tanh") return at::gelu(x, "tanh");
  if (kind == "relu") return at::relu(x);
  return at::silu(x);
}

Value Activation::forward(Inputs inputs) { return compute(inputs.tensor(0)); }

void ModuleList::push_back(std::shared_ptr<Module> m) {
  register_module(std::to_string(items_.size()), m);
  items_.push_back(std::move(m));
}

Value ModuleList::forward(Inputs) {
  throw UnsupportedError("ModuleList is a container and cannot be called; call its items");
}

Sequential::Sequential(std::vector<std::shared_ptr<Module>> mods) : Module("Sequential") {
  for (auto& m : mods) push_back(std::move(m));
}

void Sequential::push_back(std::shared_ptr<Module> m) {
  register_module(std::to_string(items_.size()), m);
  items_.push_back(std::move(m));
}

Value Sequential::forward(Inputs inputs) {
  if (items_.empty()) return inputs.args.empty() ? Value() : inputs.args[0];
  Value v = (*items_[0])(std::move(inputs));
  for (size_t i = 1; i < items_.size(); ++i) v = (*items_[i])(Inputs{v});
  return v;
}

}  // namespace flex
