// TransformerLens's hook names as places of flexmodel's models (tl_hook_names.h).
#include <flex/sae/tl_hook_names.h>

#include <flex/flexcore/hook_names.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/nn.h>
#include <flex/models/causal_lm.h>
#include <flex/models/decoder.h>
#include <flex/models/parallel_lm.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <regex>

namespace flex {

namespace {

bool has_module(Module& model, const std::string& name) {
  try {
    model.get_submodule(name);
    return true;
  } catch (const NotFoundError&) {
    return false;
  }
}

std::string first_existing(Module& model, const std::vector<std::string>& names) {
  for (const auto& n : names)
    if (!n.empty() && has_module(model, n)) return n;
  return "";
}

const char* kUnderstood =
    "hook_embed, hook_pos_embed, blocks.L.hook_resid_pre / hook_resid_mid / hook_resid_post / hook_attn_out / "
    "hook_mlp_out / hook_mlp_in / ln1.hook_normalized / ln2.hook_normalized / attn.hook_q / attn.hook_k / attn.hook_v / "
    "attn.hook_z / attn.hook_pattern; circuit-tracer's blocks.L.mlp.hook_in / mlp.hook_out; or a module name of the "
    "model";

// TransformerLens's hook_q/k/v: the projection's output (before rotary
// embedding and any q/k norm) split into heads; k and v with the KV heads.
HookPointRef qkv_place(Module& model, const std::string& hook_name, const std::string& attn, char which) {
  // (A model built over a mesh has the heads too, so its refusal of this name says why: decision 38.)
  auto* lm = dynamic_cast<CausalLM*>(&model);
  auto* parallel = dynamic_cast<ParallelCausalLM*>(&model);
  if (!lm && !parallel)
    throw UnsupportedError("hook '" + hook_name + "': the model is not a causal LM, so its heads are unknown");
  const ModelConfig& cfg = lm ? lm->config() : parallel->config();
  const int64_t heads = which == 'q' ? cfg.num_attention_heads
                                     : (cfg.num_key_value_heads > 0 ? cfg.num_key_value_heads : cfg.num_attention_heads);
  const std::string proj = attn + "." + which + "_proj";
  if (has_module(model, proj)) return {proj, false, false, 0, 1, heads};
  if (has_module(model, attn + ".c_attn"))  // GPT-2: one [q | k | v] projection of equal parts
    return {attn + ".c_attn", false, false, which == 'q' ? 0 : which == 'k' ? 1 : 2, 3, heads};
  throw UnsupportedError("hook '" + hook_name + "': " + model.get_submodule(attn)->class_name() +
                         " has no separate " + std::string(1, which) +
                         "_proj (q, k and v come from one fused projection, or from latent attention), so flexmodel has no value for "
                         "TransformerLens's attn.hook_" + std::string(1, which) + "; hook its projections by module name");
}

// A norm module's input normalised without its weight and bias, as the norm computes it.
at::Tensor normalized_input(Module& norm, const at::Tensor& x) {
  if (auto* ln = dynamic_cast<LayerNorm*>(&norm)) return at::layer_norm(x, {x.size(-1)}, {}, {}, ln->eps);
  if (auto* rms = dynamic_cast<RMSNorm*>(&norm)) {
    const at::Tensor f = x.to(at::kFloat);
    return (f * at::rsqrt(f.pow(2).mean({-1}, /*keepdim=*/true) + rms->eps)).to(x.scalar_type());
  }
  throw UnsupportedError("'" + norm.class_name() + "' is not a LayerNorm or RMSNorm: its normalised input is unknown");
}

}  // namespace

// What TransformerLens 4.3 puts at each name was measured on GPT-2, Gemma 2
// and Gemma 3 (tests/data/tl_hooks/README.md): hook_attn_out / hook_mlp_out
// are what the block adds to the residual (after Gemma's post-norms),
// hook_mlp_in is the MLP norm's input (the residual), ln2.hook_normalized
// that input normalised without the norm's weight and bias (ln1: the
// attention norm's, likewise).
HookPointRef resolve_hook_name(Module& model, const std::string& hook_name) {
  if (hook_name.empty()) throw ConfigError("the dictionary names no hook point (cfg.json metadata.hook_name); pass one");
  if (has_module(model, hook_name)) return {hook_name, false};
  const std::string base = first_existing(model, {"transformer", "model", "gpt_neox"});
  auto unmapped = [&] {
    return NotFoundError("hook '" + hook_name + "' is neither a module of this model nor a TransformerLens hook it maps (" +
                         kUnderstood + ")");
  };
  if (base.empty()) throw unmapped();
  if (hook_name == "hook_embed") {
    // TransformerLens's hook_embed is scaled (Gemma's sqrt(hidden)): where the
    // scaling follows embed_tokens, the first block's input holds it.
    auto decoder = std::dynamic_pointer_cast<DecoderModel>(model.get_submodule(base));
    if (decoder && decoder->scales_after_lookup() && has_module(model, base + ".layers.0.hook_resid_pre"))
      return {base + ".layers.0.hook_resid_pre", false};
    const std::string e = first_existing(model, {base + ".wte", base + ".embed_tokens", base + ".embed_in"});
    if (e.empty()) throw unmapped();
    return {e, false};
  }
  if (hook_name == "hook_pos_embed") {
    if (has_module(model, base + ".wpe")) return {base + ".wpe", false};
    throw UnsupportedError("hook 'hook_pos_embed': the model has no learnt position embedding (its positions are "
                           "rotary, inside the attention)");
  }
  std::smatch m;
  if (!std::regex_match(hook_name, m, std::regex("blocks\\.(\\d+)\\.(.+)"))) throw unmapped();
  const std::string blocks = first_existing(model, {base + ".h", base + ".layers"});
  const std::string block = blocks + "." + m[1].str();
  if (blocks.empty() || !has_module(model, block))
    throw NotFoundError("hook '" + hook_name + "': the model has no block " + m[1].str());
  const std::string rest = m[2].str();
  const std::string attn = first_existing(model, {block + ".attn", block + ".self_attn", block + ".attention"});
  const std::string ffn = first_existing(model, {block + ".mlp", block + ".block_sparse_moe", block + ".feed_forward"});
  // Norms after the sublayers (Gemma 2/3's sandwich, OLMo 2's post-norm) end
  // in post_feedforward_layernorm; post_attention_layernorm then follows the
  // attention instead of preceding the MLP.
  const bool post_norms = has_module(model, block + ".post_feedforward_layernorm");
  const std::string mlp_norm =
      first_existing(model, {block + ".ln_2", block + ".pre_feedforward_layernorm",
                             post_norms ? std::string() : block + ".post_attention_layernorm"});
  const std::string attn_norm = first_existing(model, {block + ".ln_1", block + ".input_layernorm"});
  if (rest == "hook_resid_pre" || rest == "hook_resid_mid" || rest == "hook_resid_post") {
    if (has_module(model, block + "." + rest)) return {block + "." + rest, false};
  } else if (rest == "hook_attn_out" && !attn.empty()) {
    return {post_norms ? block + ".post_attention_layernorm" : attn, false};
  } else if (rest == "hook_mlp_out" && !ffn.empty()) {
    return {post_norms ? block + ".post_feedforward_layernorm" : ffn, false};
  } else if (rest == "hook_mlp_in") {
    if (!mlp_norm.empty()) return {mlp_norm, true};
    if (!ffn.empty()) return {ffn, true};  // no norm before the MLP: its input is the residual
  } else if (rest == "mlp.hook_in" && !ffn.empty()) {
    // circuit-tracer's names for what its transcoders read and write: the
    // MLP module's own input (the norm's output) and output.
    return {ffn, true};
  } else if (rest == "mlp.hook_out" && !ffn.empty()) {
    return {ffn, false};
  } else if (rest == "ln2.hook_normalized" && !mlp_norm.empty()) {
    return {mlp_norm, true, true};
  } else if (rest == "ln1.hook_normalized" && !attn_norm.empty()) {
    return {attn_norm, true, true};
  } else if ((rest == "ln1.hook_normalized" || rest == "ln2.hook_normalized") && post_norms) {
    throw UnsupportedError("hook '" + hook_name + "': block " + m[1].str() + " normalises after its " +
                           (rest[2] == '1' ? "attention" : "MLP") + " (post-norm), not before it, so there is no "
                           "normalised input to read");
  } else if ((rest == "attn.hook_q" || rest == "attn.hook_k" || rest == "attn.hook_v") && !attn.empty()) {
    return qkv_place(model, hook_name, attn, rest.back());
  } else if (rest == "attn.hook_z" && has_module(model, attn + ".hook_head_out")) {
    return {attn + ".hook_head_out", false};
  } else if (rest == "attn.hook_pattern" && has_module(model, attn + ".hook_attn_probs")) {
    return {attn + ".hook_attn_probs", false};
  } else if (rest == "attn.hook_attn_scores" && !attn.empty()) {
    throw UnsupportedError("hook '" + hook_name + "': flexmodel's attention exposes the probabilities after the "
                           "softmax (attn.hook_pattern, at " + attn + ".hook_attn_probs), not the scores before it");
  }
  throw unmapped();
}

bool has_view(const HookPointRef& at) { return at.normalized || at.parts > 1 || at.heads > 0; }

at::Tensor view_at(const HookPointRef& at, Module& module, const at::Tensor& x) {
  if (at.normalized) return normalized_input(module, x);
  at::Tensor v = x;
  if (at.parts > 1) v = v.narrow(-1, at.part * (v.size(-1) / at.parts), v.size(-1) / at.parts);
  if (at.heads > 0) v = v.unflatten(-1, {at.heads, v.size(-1) / at.heads});
  return v;
}

at::Tensor unview_at(const HookPointRef& at, const at::Tensor& edited, const at::Tensor& x) {
  if (at.normalized) throw UnsupportedError("'" + at.module + "': a normalised input is read only");
  at::Tensor piece = at.heads > 0 ? edited.flatten(-2) : edited;
  if (at.parts <= 1) return piece;
  const int64_t width = x.size(-1) / at.parts;
  std::vector<at::Tensor> pieces;
  for (int64_t p = 0; p < at.parts; ++p) pieces.push_back(p == at.part ? piece : x.narrow(-1, p * width, width));
  return at::cat(pieces, -1);
}

std::vector<std::string> transformer_lens_names(Module& model) {
  static const char* kModel[] = {"hook_embed", "hook_pos_embed"};
  static const char* kBlock[] = {"hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out",
                                 "hook_mlp_out", "hook_mlp_in", "ln1.hook_normalized", "ln2.hook_normalized",
                                 "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_z", "attn.hook_pattern"};
  std::vector<std::string> out;
  auto add = [&](const std::string& name) {
    try {
      resolve_hook_name(model, name);
      out.push_back(name);
      return true;
    } catch (const Error&) {
      return false;
    }
  };
  for (const char* n : kModel) add(n);
  for (int64_t layer = 0;; ++layer) {
    const std::string block = "blocks." + std::to_string(layer) + ".";
    if (!add(block + "hook_resid_post")) break;
    for (const char* n : kBlock)
      if (std::string(n) != "hook_resid_post") add(block + n);
  }
  return out;
}

std::string transformer_lens_name_of(Module& model, const std::string& name) {
  if (is_transformer_lens_name(name)) return name;
  const std::string suffix = "#input";
  const bool input = name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  const std::string module = input ? name.substr(0, name.size() - suffix.size()) : name;
  std::vector<std::string> names = transformer_lens_names(model);
  // Block names before model-wide ones: Gemma's hook_embed and blocks.0.hook_resid_pre are one place.
  std::stable_partition(names.begin(), names.end(), [](const std::string& n) { return n.rfind("blocks.", 0) == 0; });
  for (const auto& tl : names) {
    const HookPointRef at = resolve_hook_name(model, tl);
    if (has_view(at) || at.input != input) continue;
    // A block's output is its hook_resid_post's (the hook point is the block's last step).
    const bool block_output = !input && tl.size() > 16 && tl.compare(tl.size() - 16, 16, ".hook_resid_post") == 0 &&
                              at.module == module + ".hook_resid_post";
    if (at.module == module || block_output) return tl;
  }
  return "";
}

bool is_transformer_lens_name(const std::string& name) {
  return name == "hook_embed" || name == "hook_pos_embed" || name.rfind("blocks.", 0) == 0;
}

void install_transformer_lens_names() {
  set_hook_name_resolver([](Module& root, const std::string& name) -> std::optional<HookPlace> {
    if (!is_transformer_lens_name(name)) return std::nullopt;
    const HookPointRef at = resolve_hook_name(root, name);
    HookPlace place;
    place.module = at.module;
    place.input = at.input;
    if (has_view(at)) {
      place.view = [at](Module& m, const at::Tensor& x) { return view_at(at, m, x); };
      if (!at.normalized)
        place.unview = [at](const at::Tensor& edited, const at::Tensor& x) { return unview_at(at, edited, x); };
    }
    return place;
  });
}

}  // namespace flex
