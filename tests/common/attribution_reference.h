#pragma once
// An independent frozen replacement for the attribution tests: GPT-2, Llama
// (Qwen3 alike), Gemma 2 (norms after attention and MLP, (1 + w) norm
// weights, scaled embeddings, final soft cap) and Gemma 3 (Gemma 2's
// residual stream; its attention pattern optionally written out here too:
// Gemma3Attention) written out by hand from the model's weights (no module forward, no
// autograd), per-layer transcoders or a cross-layer transcoder (a layer-l
// feature adds a W_dec[l][:, l' - l] to every later MLP output l') applied by hand. A plain pass records
// the sources (token embeddings, feature activations, error vectors) and the
// frozen quantities (attention patterns, from the model's hook_attn_probs
// (the patterns are not what is under test);
// norm denominators, computed here); frozen(sources) then recomputes every
// target (feature pre-activations, logit minus mean logit) with the sources
// as inputs. The replacement is affine in the sources, so
//   edge(target, source i) = frozen(S) - frozen(S with source i zeroed)
// exactly (up to rounding), and frozen(all sources zeroed) is each target's
// bias term.
#include <flex/hooks/frozen_replacement.h>
#include <flex/models/causal_lm.h>
#include <flex/sae/cross_layer_transcoder.h>
#include <flex/sae/sparse_dictionary.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace flex_test {

/// Gemma 3's attention pattern, as Transformers 5.23 computes it, read by the
/// test from the model's config.json: per-head q/k RMSNorms with (1 + w),
/// RoPE per layer type (sliding layers their own base; full layers linear
/// scaling), scores times query_pre_attn_scalar^-1/2, no soft cap, a causal
/// mask that on sliding layers also hides keys `window` or more positions back,
/// the softmax in float32.
struct Gemma3Attention {
  std::vector<bool> sliding;  // per layer
  int64_t window = 0;
  double full_theta = 1e6, full_linear_factor = 1.0, sliding_theta = 1e4;
  double query_pre_attn_scalar = 256;

  /// Read from a Gemma 3 config.json in Transformers 5's fields (layer_types,
  /// rope_parameters per layer type: full linear-scaled, sliding default).
  static Gemma3Attention from_config(const std::string& config_json) {
    std::ifstream in(config_json);
    if (!in) throw std::runtime_error("attribution reference: cannot read " + config_json);
    const nlohmann::json cfg = nlohmann::json::parse(in);
    Gemma3Attention g;
    for (const auto& t : cfg.at("layer_types")) g.sliding.push_back(t.get<std::string>() == "sliding_attention");
    g.window = cfg.at("sliding_window").get<int64_t>();
    g.query_pre_attn_scalar = cfg.at("query_pre_attn_scalar").get<double>();
    const auto& rope = cfg.at("rope_parameters");
    if (rope.at("full_attention").at("rope_type") != "linear" || rope.at("sliding_attention").at("rope_type") != "default")
      throw std::runtime_error("attribution reference: Gemma 3 RoPE written for linear (full) and default (sliding) only");
    g.full_theta = rope.at("full_attention").at("rope_theta").get<double>();
    g.full_linear_factor = rope.at("full_attention").at("factor").get<double>();
    g.sliding_theta = rope.at("sliding_attention").at("rope_theta").get<double>();
    return g;
  }
};

struct ReferenceSources {
  at::Tensor embed;                 // [T, d]
  std::vector<at::Tensor> acts;     // per layer [T, d_sae]
  std::vector<at::Tensor> errors;   // per layer [T, d]
};

class AttributionReference {
 public:
  AttributionReference(flex::CausalLM& model, const std::vector<std::shared_ptr<flex::SparseDictionary>>& transcoders,
                       const at::Tensor& ids, bool zero_first = true, const Gemma3Attention* gemma3 = nullptr)
      : zero_first_(zero_first) {
    at::NoGradGuard ng;
    if (gemma3) gemma3_ = *gemma3, own_patterns_ = true;
    for (auto& t : transcoders) {
      Tc c;
      c.W_enc = t->W_enc.detach().to(at::kDouble);
      c.b_enc = t->b_enc.detach().to(at::kDouble);
      c.W_dec = {t->W_dec.detach().to(at::kDouble)};
      c.b_dec = t->b_dec.detach().to(at::kDouble);
      if (t->config().has_skip()) c.W_skip = t->W_skip.detach().to(at::kDouble);
      if (t->config().jump()) c.threshold = t->threshold.detach().to(at::kDouble);
      c.shift = t->config().apply_b_dec_to_input;
      tc_.push_back(c);
    }
    init(model, ids);
  }

  /// A cross-layer transcoder: layer l encodes with W_enc[l]^T, its JumpReLU
  /// is circuit-tracer's pre * (pre > threshold) (no ReLU first), and its
  /// features write W_dec[l][:, k] into layer l + k's MLP output.
  AttributionReference(flex::CausalLM& model, const flex::CrossLayerTranscoder& clt, const at::Tensor& ids,
                       bool zero_first = true)
      : zero_first_(zero_first) {
    at::NoGradGuard ng;
    for (int64_t l = 0; l < clt.n_layers(); ++l) {
      Tc c;
      c.W_enc = clt.W_enc[l].t().to(at::kDouble);
      c.b_enc = clt.b_enc[l].to(at::kDouble);
      const at::Tensor wd = clt.W_dec[l].to(at::kDouble);
      for (int64_t k = 0; k < wd.size(1); ++k) c.W_dec.push_back(wd.select(1, k));
      c.b_dec = clt.b_dec[l].to(at::kDouble);
      if (clt.jump_relu()) c.threshold = clt.threshold[l].to(at::kDouble);
      c.relu_first = false;
      c.reads_residual = clt.input_hook == "hook_resid_mid";
      tc_.push_back(c);
    }
    init(model, ids);
  }

 private:
  void init(flex::CausalLM& model, const at::Tensor& ids) {
    for (const auto& item : model.named_parameters()) w_[item.key()] = item.value().detach().to(at::kDouble);
    gpt2_ = model.base_model_prefix() == "transformer";
    gemma2_ = w_.count("model.layers.0.post_feedforward_layernorm.weight") > 0;
    const auto& cfg = model.config();
    final_cap_ = cfg.final_logit_softcapping;
    L_ = cfg.num_hidden_layers;
    H_ = cfg.num_attention_heads;
    eps_ = cfg.norm_eps;
    T_ = ids.size(0);
    // The attention patterns: the model's own, from its forward.
    std::vector<flex::HookHandle> hs;
    probs_.resize(L_);
    const std::string blocks = gpt2_ ? "transformer.h." : "model.layers.";
    const std::string attn = gpt2_ ? ".attn.hook_attn_probs" : ".self_attn.hook_attn_probs";
    for (int64_t l = 0; l < L_; ++l)
      hs.push_back(model.get_submodule(blocks + std::to_string(l) + attn)
                       ->register_forward_hook([this, l](flex::Module&, const flex::Inputs&, flex::Value& out) {
                         probs_[l] = flex::find_first_tensor(out)[0].to(at::kDouble);
                       }));
    {
      // Under the guard the norms run in float64 (plain Llama norms run in
      // float32), so the patterns carry no float32 rounding; values are the
      // plain forward's otherwise.
      flex::FreezeNonlinearities float64_norms;
      model.logits(ids.unsqueeze(0));
    }
    for (auto& h : hs) h.remove();
    embed_weight_ = gpt2_ ? w("transformer.wte.weight") : w("model.embed_tokens.weight");
    unembed_ = gpt2_ || !w_.count("lm_head.weight") ? embed_weight_ : w("lm_head.weight");
    sources.embed = embed_weight_.index_select(0, ids);
    // Gemma scales the embeddings by sqrt(d) (inside flexmodel's embedding module: the token node's value),
    // a float32 constant in Transformers (sqrt(32) rounds).
    if (gemma2_) sources.embed = sources.embed * double(float(std::sqrt(double(embed_weight_.size(1)))));
    model_probs_ = probs_;
    run(nullptr);
  }

 public:
  /// With Gemma3Attention: the largest difference between the model's
  /// patterns and the ones written out here (which the reference then uses).
  double largest_pattern_difference() const {
    double m = 0;
    for (int64_t l = 0; l < L_; ++l) m = std::max(m, (probs_[l] - model_probs_[l]).abs().max().item<double>());
    return m;
  }

  /// The recorded sources and what the plain pass saw.
  ReferenceSources sources;
  std::vector<at::Tensor> pre;      // per layer [T, d_sae]
  at::Tensor last_logits;           // [V]

  /// Every target, frozen, for `s`: pre-activations of `features` ([F, 3]
  /// layer, pos, feature) then logit[T-1, tok] - mean logit for `tokens`.
  at::Tensor targets(const ReferenceSources& s, const at::Tensor& features, const at::Tensor& tokens) {
    run(&s);
    const auto f = features.contiguous();
    std::vector<at::Tensor> out;
    for (int64_t i = 0; i < f.size(0); ++i)
      out.push_back(frozen_pre_[f[i][0].item<int64_t>()][f[i][1].item<int64_t>()][f[i][2].item<int64_t>()]);
    const at::Tensor logits = frozen_logits_;
    for (int64_t k = 0; k < tokens.size(0); ++k) out.push_back(logits[tokens[k].item<int64_t>()] - logits.mean());
    return out.empty() ? at::zeros({0}, at::kDouble) : at::stack(out);
  }

  /// The sources with every value zeroed (for the bias terms).
  ReferenceSources zeroed() const {
    ReferenceSources z{at::zeros_like(sources.embed), {}, {}};
    for (auto& a : sources.acts) z.acts.push_back(at::zeros_like(a));
    for (auto& e : sources.errors) z.errors.push_back(at::zeros_like(e));
    return z;
  }
  /// A feature edit for edited_logits(): set (or scale) the activation of
  /// `feature` at `pos` (non-negative) in `layer`.
  struct Edit {
    int64_t layer, pos, feature;
    double value;
    bool scale = false;
  };

  /// Interventions as circuit-tracer's feature_intervention makes them: the
  /// plain forward (norms recomputed, real MLPs), each edited layer's MLP
  /// output plus (target - a) W_dec[feature] at the edit's position, a the
  /// activation from this pass's MLP input. frozen_patterns: the clean
  /// run's attention patterns; else recomputed from this pass (GPT-2:
  /// causal softmax of q k^T / sqrt(D); Gemma 3 with Gemma3Attention: its
  /// pattern as written out here). Returns the logits [T, V].
  at::Tensor edited_logits(const std::vector<Edit>& edits, bool frozen_patterns) {
    at::Tensor h = sources.embed;
    if (gpt2_) h = h + w("transformer.wpe.weight").narrow(0, 0, T_);
    std::map<std::string, at::Tensor> inv;
    std::vector<at::Tensor> pending(L_);  // deltas for later layers' MLP outputs (a CLT's)
    for (int64_t l = 0; l < L_; ++l) {
      const std::string b = (gpt2_ ? "transformer.h." : "model.layers.") + std::to_string(l);
      const at::Tensor a_in = norm(h, b + (gpt2_ ? ".ln_1" : ".input_layernorm"), inv, true);
      const at::Tensor attn = attention(a_in, l, frozen_patterns ? probs_[l] : own_patterns_ ? gemma3_pattern(a_in, l) : gpt2_pattern(a_in, l));
      h = h + (gemma2_ ? norm(attn, b + ".post_attention_layernorm", inv, true) : attn);
      const at::Tensor x = norm(h, b + mlp_norm(), inv, true);
      at::Tensor out = gemma2_ ? norm(mlp(x, l), b + ".post_feedforward_layernorm", inv, true) : mlp(x, l);
      const Tc& t = tc_[l];
      for (const Edit& e : edits) {
        if (e.layer != l) continue;
        const at::Tensor xp = t.reads_residual ? h[e.pos] : x[e.pos];
        const at::Tensor p = at::dot(t.shift ? xp - t.b_dec : xp, t.W_enc.select(1, e.feature)) + t.b_enc[e.feature];
        const at::Tensor a = activation(t, p, e.feature);
        const at::Tensor target = e.scale ? a * e.value : at::full_like(a, e.value);
        for (size_t k = 0; k < t.W_dec.size(); ++k) {
          if (!pending[l + k].defined()) pending[l + k] = at::zeros_like(out);
          pending[l + k][e.pos] += (target - a) * t.W_dec[k][e.feature];
        }
      }
      if (pending[l].defined()) out = out + pending[l];
      h = h + out;
    }
    return soft_cap(at::matmul(norm(h, gpt2_ ? "transformer.ln_f" : "model.norm", inv, true), unembed_.t()));
  }

  ReferenceSources copy() const {
    ReferenceSources c{sources.embed.clone(), {}, {}};
    for (auto& a : sources.acts) c.acts.push_back(a.clone());
    for (auto& e : sources.errors) c.errors.push_back(e.clone());
    return c;
  }

 private:
  struct Tc {
    at::Tensor W_enc, b_enc, b_dec, W_skip, threshold;
    std::vector<at::Tensor> W_dec;  // W_dec[k]: written into layer l + k's MLP output
    bool shift = false;
    bool relu_first = true;  // SAELens's JumpReLU: relu(p) * (p > t); circuit-tracer's CLT: p * (p > t)
    bool reads_residual = false;  // encodes the residual before the MLP's norm (hook_resid_mid), not its output
  };

  // The activation of pre-activation p (feature f's threshold; all when f < 0).
  static at::Tensor activation(const Tc& t, const at::Tensor& p, int64_t f = -1) {
    if (!t.threshold.defined()) return at::relu(p);
    const at::Tensor thr = f < 0 ? t.threshold : t.threshold[f];
    return (t.relu_first ? at::relu(p) : p) * p.gt(thr);
  }

  at::Tensor w(const std::string& name) const { return w_.at(name); }
  std::string mlp_norm() const { return gpt2_ ? ".ln_2" : gemma2_ ? ".pre_feedforward_layernorm" : ".post_attention_layernorm"; }
  // Gemma 2's final soft cap (the model's logits, hence its probabilities).
  at::Tensor soft_cap(const at::Tensor& logits) const {
    return final_cap_ > 0 ? at::tanh(logits / final_cap_) * final_cap_ : logits;
  }

  // A norm with its denominator computed on the plain pass and reused frozen.
  at::Tensor norm(const at::Tensor& h, const std::string& prefix, std::map<std::string, at::Tensor>& inv, bool plain) {
    if (gpt2_) {
      const at::Tensor c = h - h.mean(-1, true);
      if (plain) inv[prefix] = at::rsqrt(c.pow(2).mean(-1, true) + eps_);
      return c * inv[prefix] * w(prefix + ".weight") + w(prefix + ".bias");
    }
    if (plain) inv[prefix] = at::rsqrt(h.pow(2).mean(-1, true) + eps_);
    // Gemma's (1 + w), summed in float32 as flexmodel's RMSNorm (and Transformers') sums it.
    if (gemma2_) return h * inv[prefix] * (w(prefix + ".weight").to(at::kFloat) + 1.0).to(at::kDouble);
    return h * inv[prefix] * w(prefix + ".weight");
  }

  // GPT-2's causal attention pattern [H, T, T] from the normed input a.
  at::Tensor gpt2_pattern(const at::Tensor& a, int64_t l) {
    if (!gpt2_) throw std::runtime_error("attribution reference: recomputed patterns are written for GPT-2 only");
    const std::string p = "transformer.h." + std::to_string(l) + ".attn.";
    const int64_t d = a.size(1), D = d / H_;
    const at::Tensor qkv = at::matmul(a, w(p + "c_attn.weight")) + w(p + "c_attn.bias");
    const at::Tensor q = qkv.narrow(1, 0, d).view({T_, H_, D}).permute({1, 0, 2});
    const at::Tensor k = qkv.narrow(1, d, d).view({T_, H_, D}).permute({1, 0, 2});
    at::Tensor scores = at::matmul(q, k.transpose(1, 2)) / std::sqrt(double(D));
    const at::Tensor future = at::ones({T_, T_}, at::kBool).triu(1);
    scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
    return at::softmax(scores, -1);
  }

  // Gemma 3's pattern [H, T, T] from the normed input a (Gemma3Attention).
  at::Tensor gemma3_pattern(const at::Tensor& a, int64_t l) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
    const int64_t D = w(p + "q_proj.weight").size(0) / H_, Hkv = w(p + "k_proj.weight").size(0) / D;
    auto heads = [&](const std::string& proj, int64_t n) {
      const at::Tensor x = at::matmul(a, w(p + proj + "_proj.weight").t()).view({T_, n, D}).permute({1, 0, 2});
      const at::Tensor scale = (w(p + proj + "_norm.weight").to(at::kFloat) + 1.0).to(at::kDouble);
      return x * at::rsqrt(x.pow(2).mean(-1, true) + eps_) * scale;  // [n, T, D]
    };
    const bool sliding = gemma3_.sliding.at(l);
    // RoPE in float32, as Transformers computes cos and sin.
    const double theta = sliding ? gemma3_.sliding_theta : gemma3_.full_theta;
    const double factor = sliding ? 1.0 : gemma3_.full_linear_factor;
    const at::Tensor inv_freq = at::reciprocal(at::pow(theta, at::arange(0, D, 2, at::kLong).to(at::kFloat) / double(D))) / factor;
    const at::Tensor freqs = at::outer(at::arange(T_, at::kLong).to(at::kFloat), inv_freq);
    const at::Tensor emb = at::cat({freqs, freqs}, -1);
    const at::Tensor cos = emb.cos().to(at::kDouble), sin = emb.sin().to(at::kDouble);
    auto rope = [&](const at::Tensor& x) {
      const at::Tensor half = at::cat({-x.narrow(-1, D / 2, D / 2), x.narrow(-1, 0, D / 2)}, -1);
      return x * cos + half * sin;
    };
    const at::Tensor q = rope(heads("q", H_)), k = rope(heads("k", Hkv)).repeat_interleave(H_ / Hkv, 0);
    at::Tensor scores = at::matmul(q, k.transpose(1, 2)) / std::sqrt(gemma3_.query_pre_attn_scalar);
    const at::Tensor i = at::arange(T_, at::kLong).unsqueeze(1), j = at::arange(T_, at::kLong).unsqueeze(0);
    at::Tensor hidden = j > i;
    if (sliding) hidden = hidden.logical_or(i - j >= gemma3_.window);
    scores = scores.masked_fill(hidden, -std::numeric_limits<double>::infinity());
    // The softmax in float32, as Transformers' eager attention takes it.
    return at::softmax(scores, -1, at::kFloat).to(at::kDouble);
  }

  at::Tensor attention(const at::Tensor& a, int64_t l) { return attention(a, l, probs_[l]); }
  at::Tensor attention(const at::Tensor& a, int64_t l, const at::Tensor& probs) {
    const std::string p = gpt2_ ? "transformer.h." + std::to_string(l) + ".attn."
                                : "model.layers." + std::to_string(l) + ".self_attn.";
    const int64_t d = a.size(1);
    at::Tensor v;
    if (gpt2_) {
      v = (at::matmul(a, w(p + "c_attn.weight")) + w(p + "c_attn.bias")).narrow(1, 2 * d, d);
    } else {
      v = at::matmul(a, w(p + "v_proj.weight").t());
    }
    const int64_t D = gpt2_ ? d / H_ : w(p + "q_proj.weight").size(0) / H_;
    const int64_t Hkv = v.size(1) / D;
    at::Tensor vh = v.view({T_, Hkv, D}).permute({1, 0, 2}).repeat_interleave(H_ / Hkv, 0);  // [H, T, D]
    const at::Tensor z = at::matmul(probs, vh).permute({1, 0, 2}).reshape({T_, H_ * D});
    if (gpt2_) return at::matmul(z, w(p + "c_proj.weight")) + w(p + "c_proj.bias");
    return at::matmul(z, w(p + "o_proj.weight").t());
  }

  at::Tensor mlp(const at::Tensor& x, int64_t l) {
    if (gpt2_) {
      const std::string p = "transformer.h." + std::to_string(l) + ".mlp.";
      const at::Tensor u = at::matmul(x, w(p + "c_fc.weight")) + w(p + "c_fc.bias");
      const at::Tensor g = 0.5 * u * (1.0 + at::tanh(std::sqrt(2.0 / M_PI) * (u + 0.044715 * u.pow(3))));
      return at::matmul(g, w(p + "c_proj.weight")) + w(p + "c_proj.bias");
    }
    const std::string p = "model.layers." + std::to_string(l) + ".mlp.";
    const at::Tensor gate = at::matmul(x, w(p + "gate_proj.weight").t());
    const at::Tensor act = gemma2_ ? 0.5 * gate * (1.0 + at::tanh(std::sqrt(2.0 / M_PI) * (gate + 0.044715 * gate.pow(3))))
                                   : at::silu(gate);
    return at::matmul(act * at::matmul(x, w(p + "up_proj.weight").t()), w(p + "down_proj.weight").t());
  }

  // plain: s == nullptr (records sources and frozen quantities);
  // frozen: the replacement on `s`.
  void run(const ReferenceSources* s) {
    const bool plain = s == nullptr;
    at::Tensor h = (plain ? sources.embed : s->embed);
    if (gpt2_) h = h + w("transformer.wpe.weight").narrow(0, 0, T_);
    if (plain) {
      sources.acts.assign(L_, {});
      sources.errors.assign(L_, {});
      pre.assign(L_, {});
      c0_.assign(L_, {});
    }
    frozen_pre_.assign(L_, {});
    std::vector<at::Tensor> written(L_);  // sum of what earlier and this layer's features write into layer l's output
    for (int64_t l = 0; l < L_; ++l) {
      const std::string b = (gpt2_ ? "transformer.h." : "model.layers.") + std::to_string(l);
      const at::Tensor a_in = norm(h, b + (gpt2_ ? ".ln_1" : ".input_layernorm"), inv_, plain);
      if (plain && own_patterns_) probs_[l] = gemma3_pattern(a_in, l);
      const at::Tensor attn = attention(a_in, l);
      h = h + (gemma2_ ? norm(attn, b + ".post_attention_layernorm", inv_, plain) : attn);
      const at::Tensor x = norm(h, b + mlp_norm(), inv_, plain);
      const Tc& t = tc_[l];
      const at::Tensor in = t.reads_residual ? h : x;
      const at::Tensor p = at::matmul(t.shift ? in - t.b_dec : in, t.W_enc) + t.b_enc;
      const at::Tensor skip = t.W_skip.defined() ? at::matmul(x, t.W_skip.t()) : at::zeros_like(x);
      at::Tensor out;
      at::Tensor a = plain ? activation(t, p) : s->acts[l];
      if (plain && zero_first_) a[0].zero_();
      for (size_t k = 0; k < t.W_dec.size(); ++k) {
        const at::Tensor w = at::matmul(a, t.W_dec[k]);
        written[l + k] = written[l + k].defined() ? written[l + k] + w : w;
      }
      if (plain) {
        pre[l] = p;
        // Gemma 2: the transcoder stands in for the MLP and its post norm.
        out = gemma2_ ? norm(mlp(x, l), b + ".post_feedforward_layernorm", inv_, plain) : mlp(x, l);
        at::Tensor err = out - (written[l] + t.b_dec + skip);
        c0_[l] = out[0] - skip[0];
        if (zero_first_) err[0].zero_();
        sources.acts[l] = a;
        sources.errors[l] = err;
      } else {
        frozen_pre_[l] = p;
        out = written[l] + t.b_dec + skip + s->errors[l];
        if (zero_first_) out[0] = c0_[l] + skip[0];
      }
      h = h + out;
    }
    const at::Tensor r = norm(h, gpt2_ ? "transformer.ln_f" : "model.norm", inv_, plain);
    const at::Tensor logits = at::matmul(r[T_ - 1], unembed_.t());
    if (plain) last_logits = soft_cap(logits);
    frozen_logits_ = logits;
  }

  bool zero_first_, gpt2_ = false, gemma2_ = false, own_patterns_ = false;
  Gemma3Attention gemma3_;
  double final_cap_ = 0;
  int64_t L_ = 0, H_ = 0, T_ = 0;
  double eps_ = 1e-5;
  std::map<std::string, at::Tensor> w_, inv_;
  std::vector<Tc> tc_;
  std::vector<at::Tensor> probs_, model_probs_, c0_, frozen_pre_;
  at::Tensor embed_weight_, unembed_, frozen_logits_;
};

}  // namespace flex_test
