#include <flex/hooks/empty_init.h>
#include <flex/hooks/errors.h>
#include <flex/kernels/fused_elementwise.h>
#include <flex/models/rotary.h>

#include <ATen/ATen.h>

#include <cmath>

namespace flex {

namespace {

// 1 / base^(2i / dim), in float32 with the same operation order as
// Transformers, so the buffer matches theirs bit for bit.
at::Tensor default_inv_freq(double base, int64_t dim, const at::Device& device) {
  at::Tensor exps = at::arange(0, dim, 2, at::TensorOptions().dtype(at::kLong).device(device)).to(at::kFloat).div(dim);
  return at::reciprocal(at::pow(base, exps));
}

// Llama 3: long wavelengths are slowed down by `factor`, short ones kept,
// and the band between is interpolated.
at::Tensor llama3_inv_freq(const at::Tensor& inv_freq, const RopeScaling& s) {
  const double old_len = static_cast<double>(s.original_max_position_embeddings);
  const double low_wavelen = old_len / s.low_freq_factor;
  const double high_wavelen = old_len / s.high_freq_factor;
  at::Tensor wavelen = at::reciprocal(inv_freq) * (2.0 * M_PI);
  at::Tensor scaled = at::where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq);
  at::Tensor smooth = (at::reciprocal(wavelen) * old_len - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  at::Tensor smoothed = (1.0 - smooth) * scaled / s.factor + smooth * scaled;
  at::Tensor medium = at::logical_not(wavelen < high_wavelen).logical_and(at::logical_not(wavelen > low_wavelen));
  return at::where(medium, smoothed, scaled);
}

// Phi-3 longrope: each frequency divided by its short- or long-context factor.
at::Tensor longrope_inv_freq(const ModelConfig& cfg, int64_t dim, bool long_context) {
  const auto& f = long_context ? cfg.rope_scaling.long_factor : cfg.rope_scaling.short_factor;
  at::Tensor ext = at::tensor(f, at::kDouble).to(at::kFloat);
  at::Tensor exps = at::arange(0, dim, 2, at::TensorOptions().dtype(at::kLong)).to(at::kFloat).div(dim);
  return at::reciprocal(ext * at::pow(cfg.rope_theta, exps));
}

// llama.cpp's rope_freqs: each frequency divided by its factor, in
// longrope's order of operations (the same quantity).
at::Tensor divided_inv_freq(double base, int64_t dim, const std::vector<double>& factors) {
  if (static_cast<int64_t>(factors.size()) != dim / 2)
    throw ConfigError("rope freq_factors has " + std::to_string(factors.size()) + " entries for a rotary size of " +
                      std::to_string(dim) + " (it needs " + std::to_string(dim / 2) + ")");
  at::Tensor f = at::tensor(factors, at::kDouble).to(at::kFloat);
  at::Tensor exps = at::arange(0, dim, 2, at::TensorOptions().dtype(at::kLong)).to(at::kFloat).div(dim);
  return at::reciprocal(f * at::pow(base, exps));
}

// YaRN: frequencies that rotate fewer than beta_slow times over the original
// context are interpolated (divided by factor), those that rotate more than
// beta_fast times kept, with a linear ramp between, in Transformers' float32
// order of operations.
at::Tensor yarn_inv_freq(double base, int64_t dim, const RopeScaling& s) {
  const double d = static_cast<double>(dim);
  const double orig = static_cast<double>(s.original_max_position_embeddings);
  auto correction_dim = [&](double rotations) {
    return d * std::log(orig / (rotations * 2.0 * M_PI)) / (2.0 * std::log(base));
  };
  double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
  if (s.truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0), high = std::min(high, d - 1.0);
  if (low == high) high += 0.001;  // no zero-width ramp
  const at::Tensor exps = at::arange(0, dim, 2, at::TensorOptions().dtype(at::kLong)).to(at::kFloat).div(dim);
  const at::Tensor pos_freqs = at::pow(base, exps);
  const at::Tensor extrapolation = at::reciprocal(pos_freqs);
  const at::Tensor interpolation = at::reciprocal(pos_freqs * s.factor);
  const at::Tensor ramp = at::clamp((at::arange(dim / 2, at::TensorOptions().dtype(at::kFloat)) - low) / (high - low), 0, 1);
  const at::Tensor keep = 1.0 - ramp;  // the extrapolation's share
  return interpolation * (1.0 - keep) + extrapolation * keep;
}

}  // namespace

at::Tensor rope_inv_freq(const ModelConfig& cfg, int64_t dim, int64_t seq_len) {
  const RopeScaling& s = cfg.rope_scaling;
  const at::Device cpu(at::kCPU);
  if (s.rope_type == "default") return default_inv_freq(cfg.rope_theta, dim, cpu);
  if (s.rope_type == "linear") return default_inv_freq(cfg.rope_theta, dim, cpu) / s.factor;
  if (s.rope_type == "llama3") return llama3_inv_freq(default_inv_freq(cfg.rope_theta, dim, cpu), s);
  if (s.rope_type == "longrope") return longrope_inv_freq(cfg, dim, seq_len > s.original_max_position_embeddings);
  if (s.rope_type == "yarn") return yarn_inv_freq(cfg.rope_theta, dim, s);
  if (s.rope_type == "freq_factors") return divided_inv_freq(cfg.rope_theta, dim, s.freq_factors);
  if (s.rope_type == "dynamic") {
    const double max_pos = static_cast<double>(cfg.max_position_embeddings);
    const double len = seq_len > cfg.max_position_embeddings ? static_cast<double>(seq_len) : max_pos;
    const double base = cfg.rope_theta * std::pow(s.factor * len / max_pos - (s.factor - 1.0),
                                                  static_cast<double>(dim) / static_cast<double>(dim - 2));
    return default_inv_freq(base, dim, cpu);
  }
  throw ConfigError(cfg.source + ": rope type '" + s.rope_type + "' is not supported");
}

at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, x.size(-1) - half), x.narrow(-1, 0, half)}, -1);
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  // One pass with the ops' roundings, bit for bit (design decision 57).
  if (fused_rotary_applies(x, cos, sin)) return fused_rotary(x, cos, sin);
  at::Tensor c = cos.unsqueeze(1), s = sin.unsqueeze(1);
  return x * c + rotate_half(x) * s;
}

RotaryEmbedding::RotaryEmbedding(std::string class_name, const ModelConfig& cfg, int64_t d)
    : Module(std::move(class_name)),
      dim(d),
      cfg_(cfg),
      max_seq_len_cached_(cfg.rope_scaling.rope_type == "longrope" ? 0 : cfg.max_position_embeddings) {
  add_buffer("inv_freq", inv_freq, rope_inv_freq(cfg_, dim), /*persistent=*/false);
}

void RotaryEmbedding::reset_buffers(const at::Device& device) {
  max_seq_len_cached_ = cfg_.rope_scaling.rope_type == "longrope" ? 0 : cfg_.max_position_embeddings;
  set_tensor("inv_freq", rope_inv_freq(cfg_, dim).to(device));
}

std::pair<at::Tensor, at::Tensor> RotaryEmbedding::compute(const at::Tensor& x, const at::Tensor& position_ids) {
  // A model wholly on meta runs shapes only (how the tests find a CPU tensor
  // made mid-forward without a GPU); meta frequencies under real activations
  // are a model that was never loaded.
  if (inv_freq.is_meta() && !x.is_meta())
    throw UnsupportedError(class_name() + ": inv_freq is on the meta device; load the model (or call reset_buffers) first");
  if (position_ids.is_meta()) return rope_cos_sin(inv_freq, position_ids, x, cfg_.rope_scaling.cos_sin_scale());
  if (cfg_.rope_scaling.rope_type == "dynamic") {
    // Dynamic NTK: grow the base once positions pass the trained length, and
    // go back to the original frequencies for short inputs again.
    const int64_t seq_len = position_ids.numel() ? position_ids.max().item<int64_t>() + 1 : 0;
    if (seq_len > max_seq_len_cached_) {
      set_tensor("inv_freq", rope_inv_freq(cfg_, dim, seq_len).to(inv_freq.device()));
      max_seq_len_cached_ = seq_len;
    }
    if (seq_len < cfg_.max_position_embeddings && max_seq_len_cached_ > cfg_.max_position_embeddings) {
      set_tensor("inv_freq", rope_inv_freq(cfg_, dim).to(inv_freq.device()));
      max_seq_len_cached_ = cfg_.max_position_embeddings;
    }
  }
  if (cfg_.rope_scaling.rope_type == "longrope") {
    // Short or long factors by the length the positions reach (as Phi-3 does
    // per call); cos/sin are scaled by the attention factor.
    const int64_t seq_len = position_ids.numel() ? position_ids.max().item<int64_t>() + 1 : 0;
    const bool want_long = seq_len > cfg_.rope_scaling.original_max_position_embeddings;
    if (want_long != (max_seq_len_cached_ > cfg_.rope_scaling.original_max_position_embeddings)) {
      set_tensor("inv_freq", rope_inv_freq(cfg_, dim, seq_len).to(inv_freq.device()));
      max_seq_len_cached_ = want_long ? seq_len : 0;
    }
  }
  return rope_cos_sin(inv_freq, position_ids, x, cfg_.rope_scaling.cos_sin_scale());
}

std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& inv_freq, const at::Tensor& position_ids,
                                               const at::Tensor& x, double scale) {
  at::Tensor pos = position_ids.to(inv_freq.device(), at::kFloat);
  at::Tensor freqs = pos.unsqueeze(-1) * inv_freq.to(at::kFloat);  // [P, T, dim/2]
  at::Tensor emb = at::cat({freqs, freqs}, -1);
  at::Tensor cos = emb.cos(), sin = emb.sin();
  if (scale != 1.0) cos = cos * scale, sin = sin * scale;
  return {cos.to(x.device(), x.scalar_type()), sin.to(x.device(), x.scalar_type())};
}

// ---------------------------------------------------------------------------
// One rotary module, a setting per layer type


LayerTypeRotaryEmbedding::LayerTypeRotaryEmbedding(std::string class_name, const ModelConfig& cfg, int64_t d)
    : Module(std::move(class_name)), dim(d), cfg_(cfg) {
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) (cfg.layer_sliding_type(i) ? has_sliding_ : has_full_) = true;
  // Transformers registers the types in sorted order: full, then sliding.
  if (has_full_) add_buffer("full_attention_inv_freq", full_inv_freq, rope_inv_freq(cfg_, dim), false);
  if (has_sliding_)
    add_buffer("sliding_attention_inv_freq", sliding_inv_freq, rope_inv_freq(cfg_.with_sliding_rope(), dim), false);
}

void LayerTypeRotaryEmbedding::reset_buffers(const at::Device& device) {
  if (has_full_) set_tensor("full_attention_inv_freq", rope_inv_freq(cfg_, dim).to(device));
  if (has_sliding_) set_tensor("sliding_attention_inv_freq", rope_inv_freq(cfg_.with_sliding_rope(), dim).to(device));
}

std::pair<at::Tensor, at::Tensor> LayerTypeRotaryEmbedding::compute(const at::Tensor& x, const at::Tensor& position_ids,
                                                                    bool sliding) {
  const at::Tensor& inv = sliding ? sliding_inv_freq : full_inv_freq;
  if (!has_type(sliding))
    throw NotFoundError(class_name() + ": the model has no " + (sliding ? "sliding" : "full") + "-attention layer");
  if (inv.is_meta() && !x.is_meta())  // as RotaryEmbedding::compute: a meta model runs shapes only
    throw UnsupportedError(class_name() + ": inv_freq is on the meta device; load the model (or call reset_buffers) first");
  const RopeScaling& s = sliding && cfg_.sliding_rope ? cfg_.sliding_rope->scaling : cfg_.rope_scaling;
  return rope_cos_sin(inv, position_ids, x, s.cos_sin_scale());
}

Value LayerTypeRotaryEmbedding::forward(Inputs inputs) {
  const at::Tensor& x = inputs.tensor(0);
  at::Tensor pos = inputs.args.size() > 1 && inputs.args[1].isTensor() ? inputs.args[1].toTensor()
                                                                       : inputs.tensor_or("position_ids");
  const Value* type = inputs.args.size() > 2 ? &inputs.args[2] : inputs.find("layer_type");
  if (!pos.defined() || !type || !type->isString())
    throw NotFoundError(class_name() + " needs (x, position_ids, layer_type) with layer_type a string");
  const std::string t = type->toStringRef();
  if (t != "full_attention" && t != "sliding_attention")
    throw ShapeError(class_name() + ": layer_type must be full_attention or sliding_attention, got '" + t + "'");
  auto cs = compute(x, pos, t == "sliding_attention");
  return c10::ivalue::Tuple::create({cs.first, cs.second});
}

Value RotaryEmbedding::forward(Inputs inputs) {
  const at::Tensor& x = inputs.tensor(0);
  at::Tensor pos;
  if (inputs.args.size() > 1 && inputs.args[1].isTensor())
    pos = inputs.args[1].toTensor();
  else
    pos = inputs.tensor_or("position_ids");
  if (!pos.defined()) throw NotFoundError(class_name() + " needs position_ids (argument 1 or keyword)");
  auto cs = compute(x, pos);
  if (half_tables) {  // the tables hold [f, f]: the first half is each frequency once
    const int64_t half = cs.first.size(-1) / 2;
    return c10::ivalue::Tuple::create({cs.first.narrow(-1, 0, half), cs.second.narrow(-1, 0, half)});
  }
  return c10::ivalue::Tuple::create({cs.first, cs.second});
}

CachedRotaryEmbedding::CachedRotaryEmbedding(std::string class_name, const ModelConfig& cfg, int64_t d)
    : RotaryEmbedding(std::move(class_name), cfg, d) {
  const at::Tensor placeholder = at::empty({0}, at::TensorOptions().device(at::kMeta));
  add_buffer("cos_cached", cos_cached, placeholder, /*persistent=*/false);
  add_buffer("sin_cached", sin_cached, placeholder, /*persistent=*/false);
  build_tables(cfg.max_position_embeddings, inv_freq.device());
}

void CachedRotaryEmbedding::build_tables(int64_t rows, const at::Device& device) {
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(device);
  if (device.is_meta()) {
    set_tensor("cos_cached", at::empty({rows, dim}, opts));
    set_tensor("sin_cached", at::empty({rows, dim}, opts));
    return;
  }
  const at::Tensor pos = at::arange(rows, opts.dtype(at::kLong)).unsqueeze(0);
  auto cs = compute(at::empty({0}, opts), pos);
  set_tensor("cos_cached", cs.first.squeeze(0));
  set_tensor("sin_cached", cs.second.squeeze(0));
}

void CachedRotaryEmbedding::reset_buffers(const at::Device& device) {
  RotaryEmbedding::reset_buffers(device);
  build_tables(std::max<int64_t>(cos_cached.size(0), 1), device);
}

Value CachedRotaryEmbedding::forward(Inputs inputs) {
  const at::Tensor& x = inputs.tensor(0);
  const Value* len = inputs.args.size() > 1 ? &inputs.args[1] : inputs.find("seq_len");
  if (!len || !len->isInt()) throw NotFoundError(class_name() + " needs seq_len (argument 1 or keyword) as an integer");
  const int64_t n = len->toInt();
  if (n < 0) throw ShapeError(class_name() + ": seq_len must be >= 0, got " + std::to_string(n));
  if (cos_cached.is_meta())
    throw UnsupportedError(class_name() + ": cos_cached is on the meta device; load the model (or call reset_buffers) first");
  if (n > cos_cached.size(0)) build_tables(n, cos_cached.device());
  return c10::ivalue::Tuple::create(
      {cos_cached.narrow(0, 0, n).to(x.scalar_type()), sin_cached.narrow(0, 0, n).to(x.scalar_type())});
}

}  // namespace flex
