#include <flex/sae/sparse_dictionary.h>

#include <flex/hooks/errors.h>
#include <flex/hooks/shape_text.h>
#include <flex/sae/sparse_code.h>

#include "bounded_top_k.h"

#include <ATen/ATen.h>

#include <cmath>

namespace flex {

namespace {

at::Tensor zeros(std::initializer_list<int64_t> shape, at::ScalarType dtype) {
  return at::zeros(shape, at::TensorOptions().dtype(dtype));
}

}  // namespace

SparseDictionary::SparseDictionary(SaeConfig config) : Module(config.class_name()), cfg_(std::move(config)) {
  const auto t = cfg_.dtype;
  add_parameter("W_enc", W_enc, zeros({cfg_.d_in, cfg_.d_sae}, t));
  add_parameter("W_dec", W_dec, zeros({cfg_.d_sae, cfg_.d_out}, t));
  add_parameter("b_dec", b_dec, zeros({cfg_.d_out}, t));
  if (cfg_.architecture == SaeArchitecture::Gated) {
    add_parameter("b_gate", b_gate, zeros({cfg_.d_sae}, t));
    add_parameter("b_mag", b_mag, zeros({cfg_.d_sae}, t));
    add_parameter("r_mag", r_mag, zeros({cfg_.d_sae}, t));
  } else {
    add_parameter("b_enc", b_enc, zeros({cfg_.d_sae}, t));
  }
  if (cfg_.jump()) add_parameter("threshold", threshold, zeros({cfg_.d_sae}, t));
  if (cfg_.has_skip()) add_parameter("W_skip", W_skip, zeros({cfg_.d_out, cfg_.d_in}, t));
  hook_sae_input_ = add("hook_sae_input", std::make_shared<Identity>("HookPoint"));
  hook_sae_acts_pre_ = add("hook_sae_acts_pre", std::make_shared<Identity>("HookPoint"));
  hook_sae_acts_post_ = add("hook_sae_acts_post", std::make_shared<Identity>("HookPoint"));
  hook_sae_recons_ = add("hook_sae_recons", std::make_shared<Identity>("HookPoint"));
  hook_sae_error_ = add("hook_sae_error", std::make_shared<Identity>("HookPoint"));
  hook_sae_output_ = add("hook_sae_output", std::make_shared<Identity>("HookPoint"));
}

void SparseDictionary::load_parameters(const std::map<std::string, at::Tensor>& tensors, const std::string& where) {
  auto own = named_parameters(/*recurse=*/false);
  for (const auto& [name, t] : tensors)
    if (!own.contains(name)) throw FileFormatError(where + ": unexpected tensor '" + name + "' for a " + class_name());
  at::NoGradGuard no_grad;
  for (const auto& kv : own) {
    const std::string& name = kv.key();
    auto it = tensors.find(name);
    if (it == tensors.end()) throw FileFormatError(where + ": tensor '" + name + "' is missing for a " + class_name());
    const at::Tensor& t = it->second;
    if (t.sizes() != kv.value().sizes())
      throw ShapeError(where + ": tensor '" + name + "' has shape " + shape_text(t.sizes()) + ", d_in " +
                       std::to_string(cfg_.d_in) + " / d_sae " + std::to_string(cfg_.d_sae) + " need " +
                       shape_text(kv.value().sizes()));
    if (!at::isfinite(t.to(at::kFloat)).all().item<bool>())
      throw FileFormatError(where + ": tensor '" + name + "' holds NaN or infinite values");
    set_tensor(name, t.to(cfg_.dtype).clone().set_requires_grad(false));
  }
  eval();
}

at::Tensor SparseDictionary::hook(const std::shared_ptr<Identity>& point, const at::Tensor& t) {
  return hooks_on_ ? (*point)(t) : t;
}

at::Tensor SparseDictionary::normalize(const at::Tensor& x) {
  switch (cfg_.normalization) {
    case SaeNormalization::None:
      return x;
    case SaeNormalization::ConstantNormRescale:
      norm_scale_ = std::sqrt(static_cast<double>(cfg_.d_in)) / x.norm(2, {-1}, /*keepdim=*/true);
      return x * norm_scale_;
    case SaeNormalization::LayerNorm: {
      norm_mean_ = x.mean({-1}, /*keepdim=*/true);
      const at::Tensor centred = x - norm_mean_;
      norm_std_ = centred.std({-1}, /*unbiased=*/true, /*keepdim=*/true);
      return centred / (norm_std_ + 1e-5);
    }
  }
  return x;
}

at::Tensor SparseDictionary::denormalize(const at::Tensor& y) const {
  if (cfg_.transcoder()) return y;  // SAELens never de-normalises a transcoder's output
  switch (cfg_.normalization) {
    case SaeNormalization::None:
      return y;
    case SaeNormalization::ConstantNormRescale:
      if (!norm_scale_.defined()) throw ConfigError(class_name() + ": decode before any encode (constant_norm_rescale)");
      return y / norm_scale_;
    case SaeNormalization::LayerNorm:
      if (!norm_std_.defined()) throw ConfigError(class_name() + ": decode before any encode (layer_norm)");
      return y * norm_std_ + norm_mean_;
  }
  return y;
}

at::Tensor SparseDictionary::activate(const at::Tensor& s) {
  switch (cfg_.architecture) {
    case SaeArchitecture::Gated: {
      const at::Tensor gate = (at::matmul(s, W_enc) + b_gate).gt(0).to(s.scalar_type());
      const at::Tensor magnitude = hook(hook_sae_acts_pre_, at::matmul(s, W_enc * r_mag.exp()) + b_mag);
      return gate * at::relu(magnitude);
    }
    case SaeArchitecture::TopK:
    case SaeArchitecture::AbsTopK: {
      at::Tensor h = hook(hook_sae_acts_pre_, at::matmul(s, W_enc) + b_enc);
      if (cfg_.rescale_acts_by_decoder_norm) h = h * W_dec.norm(2, {-1});
      const bool by_magnitude = cfg_.architecture == SaeArchitecture::AbsTopK;
      auto [values, indices] = (by_magnitude ? h.abs() : h).topk(cfg_.k, -1, /*largest=*/true, /*sorted=*/false);
      const at::Tensor kept = by_magnitude ? h.gather(-1, indices) : at::relu(values);
      return at::zeros_like(h).scatter_(-1, indices, kept);
    }
    default: {
      const at::Tensor h = hook(hook_sae_acts_pre_, at::matmul(s, W_enc) + b_enc);
      if (cfg_.jump()) return at::relu(h) * h.gt(threshold);
      return at::relu(h);
    }
  }
}

struct SparseDictionary::BoundedCache {
  const void* data = nullptr;
  int64_t version = 0;
  detail::BoundedEncoder enc;
};

SparseDictionary::Features SparseDictionary::encode_features(const at::Tensor& x, bool want_dense, bool want_code) {
  if (cfg_.hook_z && x.dim() < 2)
    throw ShapeError(class_name() + ": a hook_z dictionary takes [..., heads, d_head], got " + std::to_string(x.dim()) +
                     " dims");
  at::Tensor s = x.to(cfg_.dtype);
  if (cfg_.hook_z) {
    d_head_ = s.size(-1);
    s = s.flatten(-2);
  }
  if (s.size(-1) != cfg_.d_in)
    throw ShapeError(class_name() + ": input has " + std::to_string(s.size(-1)) + " features, the dictionary d_in " +
                     std::to_string(cfg_.d_in));
  s = normalize(hook(hook_sae_input_, s));
  if (cfg_.apply_b_dec_to_input) s = s - b_dec;
  Features f;
  const bool graph = at::GradMode::is_enabled() && (W_enc.requires_grad() || s.requires_grad());
  if (cfg_.architecture == SaeArchitecture::TopK && !cfg_.rescale_acts_by_decoder_norm && !graph &&
      s.scalar_type() == at::kFloat && s.device().is_cpu()) {
    // The k features go straight into a code: no dense topk, scatter and re-scan.
    const at::Tensor rows = s.reshape({-1, cfg_.d_in});
    if (!want_dense && !hooked(hook_sae_acts_pre_) && !hooked(hook_sae_acts_post_) && detail::bounded_top_k_pays() &&
        W_enc.scalar_type() == at::kFloat && rows.size(0) > 0 && at::isfinite(rows).all().item<bool>()) {
      if (!bounded_ || bounded_->data != W_enc.data_ptr() || bounded_->version != W_enc._version()) {
        bounded_ = std::make_shared<BoundedCache>();
        bounded_->enc = detail::make_bounded_encoder(W_enc);
        bounded_->data = W_enc.data_ptr();
        bounded_->version = W_enc._version();
      }
      f.code = detail::bounded_top_k_code(bounded_->enc, rows, b_enc, cfg_.k);
      return f;
    }
    std::vector<int64_t> shape(s.sizes().begin(), s.sizes().end() - 1);
    shape.push_back(cfg_.d_sae);
    const at::Tensor h = hook(hook_sae_acts_pre_, at::addmm(b_enc, rows, W_enc).view(shape));
    SparseCode code = top_k_code(h, cfg_.k);
    if (!want_dense && !hooked(hook_sae_acts_post_)) {
      f.code = std::move(code);
      return f;
    }
    f.dense = densify(code).view(shape);
    if (hooked(hook_sae_acts_post_)) {
      f.dense = hook(hook_sae_acts_post_, f.dense);  // a hook may edit it: the code is re-read below
    } else {
      f.code = std::move(code);
      return f;
    }
  } else {
    f.dense = hook(hook_sae_acts_post_, activate(s));
  }
  if (want_code) f.code = sparse_code(f.dense.detach());
  return f;
}

bool SparseDictionary::hooked(const std::shared_ptr<Identity>& point) const {
  return hooks_on_ && (point->num_registered_hooks() > 0 || point->model_hook());
}

bool SparseDictionary::hooked_inside() const {
  return hooked(hook_sae_input_) || hooked(hook_sae_acts_pre_) || hooked(hook_sae_acts_post_) ||
         hooked(hook_sae_recons_);
}

void SparseDictionary::notify(const Features& f) {
  if (observers_->empty()) return;
  const SparseCode code = f.code ? *f.code : sparse_code(f.dense.detach());
  for (const auto& [id, fn] : *observers_) fn(code);
}

HookHandle SparseDictionary::on_features(std::function<void(const SparseCode&)> fn) {
  const int64_t id = next_observer_++;
  (*observers_)[id] = std::move(fn);
  std::weak_ptr<Observers> observers = observers_;
  return HookHandle([observers, id] {
    if (auto o = observers.lock()) o->erase(id);
  });
}

at::Tensor SparseDictionary::encode(const at::Tensor& x) { return encode_features(x, true, false).dense; }

void SparseDictionary::observe(const at::Tensor& x) {
  at::NoGradGuard no_grad;
  if (!cfg_.transcoder() && (hooked(hook_sae_recons_) || hooked(hook_sae_error_) || hooked(hook_sae_output_))) {
    // A hook on what decoding gives (hook_sae_recons / error / output) would otherwise never fire: run the
    // whole dictionary, with the error term so that hook_sae_error has its value; its output is not used.
    const bool error_term = use_error_term;
    use_error_term = true;
    try {
      (void)(*this)(x);
    } catch (...) {
      use_error_term = error_term;
      throw;
    }
    use_error_term = error_term;
    return;
  }
  notify(encode_features(x, false, !observers_->empty()));
}

at::Tensor SparseDictionary::decode(const at::Tensor& acts) { return decode_with(acts, nullptr); }

at::Tensor SparseDictionary::decode_with(const at::Tensor& acts, const SparseCode* code) {
  if (acts.size(-1) != cfg_.d_sae)
    throw ShapeError(class_name() + ": feature activations have " + std::to_string(acts.size(-1)) +
                     " features, the dictionary d_sae " + std::to_string(cfg_.d_sae));
  at::Tensor f = acts.to(cfg_.dtype);
  // SAELens multiplies by the reciprocal of the norms (not a division: the bits differ).
  if (cfg_.rescale_acts_by_decoder_norm) {
    f = f * W_dec.norm(2, {-1}).reciprocal();
    code = nullptr;
  }
  at::Tensor y = denormalize(hook(hook_sae_recons_, decode_product(f, code) + b_dec));
  if (cfg_.hook_z && d_head_) y = y.unflatten(-1, {y.size(-1) / *d_head_, *d_head_});
  return y;
}

at::Tensor SparseDictionary::decode_product(const at::Tensor& f, const SparseCode* known) {
  // Codes are mostly zeros: gather the active decoder rows instead of the
  // dense product, unless autograd needs the graph or too many are active
  // for the gather to win.
  const bool graph = at::GradMode::is_enabled() && (W_dec.requires_grad() || f.requires_grad());
  if (!graph && f.device().is_cpu() && f.dim() >= 1 && f.numel() > 0) {
    const SparseCode code = known ? *known : sparse_code(f);
    if (code.nnz() * kDenseFraction <= f.numel()) {
      std::vector<int64_t> shape(f.sizes().begin(), f.sizes().end() - 1);
      shape.push_back(W_dec.size(1));
      return decode_sparse(code, W_dec).view(shape);
    }
  }
  return at::matmul(f, W_dec);
}

at::Tensor SparseDictionary::clean_output(const at::Tensor& x) {
  at::NoGradGuard no_grad;
  hooks_on_ = false;
  at::Tensor y;
  try {
    const Features f = encode_features(x, true, false);
    y = decode_with(f.dense, f.code ? &*f.code : nullptr);
  } catch (...) {
    hooks_on_ = true;
    throw;
  }
  hooks_on_ = true;
  if (cfg_.has_skip()) y = y + at::matmul(x, W_skip.t());
  return y;
}

Value SparseDictionary::forward(Inputs inputs) {
  const at::Tensor x = inputs.tensor(0);
  const bool editable = hooked_inside();
  const Features f = encode_features(x, true, !observers_->empty());
  notify(f);
  at::Tensor y = decode_with(f.dense, f.code ? &*f.code : nullptr);
  if (cfg_.transcoder()) {
    if (cfg_.has_skip()) y = y + at::matmul(x, W_skip.t());
    return y;
  }
  // The reconstruction error of the unedited dictionary, so that only edits
  // made at the inner hooks change the output. Without hooks inside, this
  // pass is the clean one.
  if (use_error_term) y = y + hook(hook_sae_error_, x - (editable ? clean_output(x) : y.detach()));
  return hook(hook_sae_output_, y);
}

}  // namespace flex
