#include <flex/sae/splice.h>

#include <flex/hooks/errors.h>
#include <flex/hooks/nn.h>
#include <flex/hooks/shape_text.h>
#include <flex/models/decoder.h>

#include <ATen/ATen.h>

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
    if (has_module(model, n)) return n;
  return "";
}

const char* kUnderstood =
    "hook_embed, hook_pos_embed, blocks.L.hook_resid_pre / hook_resid_mid / hook_resid_post / hook_attn_out / hook_mlp_out / "
    "hook_mlp_in / ln2.hook_normalized / attn.hook_z / attn.hook_pattern, or a module name of the model";
// The dictionary computes where the activation is: moved (once, its tensors
// with it) to the activation's device the first time it sees one elsewhere,
// so a dictionary loaded on the CPU splices into a model on a GPU or split
// over devices without the caller placing it.
void follow_device(SparseDictionary& sae, const at::Tensor& x) {
  for (const auto& p : sae.parameters()) {
    if (p.device() != x.device()) sae.to(x.device());
    return;
  }
}

}  // namespace

// What TransformerLens 4.3 puts at each name was measured on GPT-2, Gemma 2
// and Gemma 3 (tests/data/tl_hooks/README.md): hook_attn_out / hook_mlp_out
// are what the block adds to the residual (after Gemma's post-norms),
// hook_mlp_in is the MLP norm's input (the residual), ln2.hook_normalized
// that input normalised without the norm's weight and bias.
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
  if (hook_name == "hook_pos_embed" && has_module(model, base + ".wpe")) return {base + ".wpe", false};
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
  if (rest == "hook_resid_pre" || rest == "hook_resid_mid" || rest == "hook_resid_post") {
    if (has_module(model, block + "." + rest)) return {block + "." + rest, false};
  } else if (rest == "hook_attn_out" && !attn.empty()) {
    return {post_norms ? block + ".post_attention_layernorm" : attn, false};
  } else if (rest == "hook_mlp_out" && !ffn.empty()) {
    return {post_norms ? block + ".post_feedforward_layernorm" : ffn, false};
  } else if (rest == "hook_mlp_in") {
    if (!mlp_norm.empty()) return {mlp_norm, true};
    if (!ffn.empty()) return {ffn, true};  // no norm before the MLP: its input is the residual
  } else if (rest == "ln2.hook_normalized" && !mlp_norm.empty()) {
    return {mlp_norm, true, true};
  } else if (rest == "attn.hook_z" && has_module(model, attn + ".hook_head_out")) {
    return {attn + ".hook_head_out", false};
  } else if (rest == "attn.hook_pattern" && has_module(model, attn + ".hook_attn_probs")) {
    return {attn + ".hook_attn_probs", false};
  }
  throw unmapped();
}

namespace {

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

HookHandle attach_at(FlexModel& fm, const HookPointRef& at, EditFn edit) {
  HookFunctionOptions o;
  o.save = false;
  if (at.normalized) {
    // Read only: the edit sees the normalised value; the norm's input flows on as it was.
    o.editing_function = [edit](Module& m, const at::Tensor& x, SaveContext& c, TrainableModules& t) {
      edit(m, normalized_input(m, x), c, t);
      return x;
    };
  } else {
    o.editing_function = std::move(edit);
  }
  return fm.register_hook_function(std::make_shared<HookFunction>(at.module, o),
                                   at.input ? HookType::ForwardPre : HookType::Forward);
}

namespace {

// Unregisters `sae` from `parent` if it is still its child "sae" (idempotent:
// Splice::remove and the FlexModel's restore both call it).
void detach(const std::shared_ptr<Module>& parent, const std::shared_ptr<SparseDictionary>& sae) {
  if (!parent) return;
  for (const auto& [name, child] : parent->named_flex_children())
    if (name == "sae" && child == sae) {
      parent->unregister_module("sae");
      return;
    }
}

}  // namespace

void Splice::remove() {
  for (auto& h : handles) h.remove();
  handles.clear();
  detach(parent, sae);
  parent.reset();
}

namespace {

// Registers `sae` as the child "sae" of `module` (where its hook points are found by name).
std::shared_ptr<Module> adopt(Module& model, const std::string& module, const std::shared_ptr<SparseDictionary>& sae) {
  auto parent = model.get_submodule(module);
  for (const auto& [name, _] : parent->named_flex_children())
    if (name == "sae") throw ConfigError("a dictionary is already spliced at '" + module + "'");
  parent->register_module("sae", sae);
  return parent;
}

// The child goes when the FlexModel restores the model, with the hooks.
void undo_on_restore(FlexModel& fm, const Splice& s) {
  std::weak_ptr<Module> parent = s.parent;
  std::weak_ptr<SparseDictionary> sae = s.sae;
  fm.on_restore([parent, sae] { detach(parent.lock(), sae.lock()); });
}

std::string describe(const HookPointRef& at) {
  return at.module + (at.normalized ? " (its input, normalised)" : at.input ? " (input)" : "");
}

// The dictionary's d_in against the activation's width at `place` (a hook_z
// dictionary reads [..., heads, d_head] flattened), before any arithmetic.
void check_width(const SaeConfig& cfg, const at::Tensor& x, const std::string& place) {
  const int64_t width = cfg.hook_z && x.dim() >= 2 ? x.size(-1) * x.size(-2) : (x.dim() >= 1 ? x.size(-1) : 0);
  if (width != cfg.d_in)
    throw ShapeError("dictionary " + (cfg.source.empty() ? cfg.class_name() : "'" + cfg.source + "'") + " has d_in " +
                     std::to_string(cfg.d_in) + ", but '" + place + "' gives activations of width " +
                     std::to_string(width) + " (shape " + shape_text(x.sizes()) + ")");
}


}  // namespace

Splice splice_sae(FlexModel& fm, std::shared_ptr<SparseDictionary> sae, const SpliceOptions& o) {
  Module& model = *fm.module();
  const SaeConfig& cfg = sae->config();
  const HookPointRef in = resolve_hook_name(model, o.hook_name.empty() ? cfg.hook_name : o.hook_name);
  const SpliceMode mode = o.mode;
  Splice s;
  s.sae = sae;
  if (!cfg.transcoder()) {
    s.module = in.module;
    s.place = in;
    s.parent = adopt(model, in.module, sae);
    undo_on_restore(fm, s);
    const std::string place = describe(in);
    if (in.normalized && mode != SpliceMode::Observe)
      throw UnsupportedError("'" + (o.hook_name.empty() ? cfg.hook_name : o.hook_name) +
                             "' is a value computed from " + place + ", not one the model passes on: a dictionary "
                             "there can observe only (SpliceMode::Observe)");
    s.handles.push_back(attach_at(fm, in, [sae, mode, place](Module&, const at::Tensor& x, SaveContext&, TrainableModules&) {
      check_width(sae->config(), x, place);
      follow_device(*sae, x);
      if (mode == SpliceMode::Observe) {
        sae->observe(x);  // features only: nothing is decoded
        return x;
      }
      sae->use_error_term = mode == SpliceMode::ReplaceWithError;
      return (*sae)(x).to(x.scalar_type());
    }));
    return s;
  }
  const std::string out_name = o.hook_name_out.empty() ? cfg.hook_name_out : o.hook_name_out;
  if (out_name.empty()) throw ConfigError("a transcoder needs the place it writes (cfg.json metadata.hook_name_out)");
  const HookPointRef out = resolve_hook_name(model, out_name);
  if (out.input) throw ConfigError("a transcoder writes a module's output; '" + out_name + "' is an input");
  s.module = out.module;
  s.place = out;
  s.parent = adopt(model, out.module, sae);
  undo_on_restore(fm, s);
  // The input place runs first (the MLP's input, then its output): keep its activation for the output hook.
  auto input = std::make_shared<at::Tensor>();
  try {
    const std::string place = describe(in);
    s.handles.push_back(attach_at(fm, in, [input, sae, place](Module&, const at::Tensor& x, SaveContext&, TrainableModules&) {
      check_width(sae->config(), x, place);
      follow_device(*sae, x);
      *input = x;
      return x;
    }));
    s.handles.push_back(attach_at(fm, out, [sae, mode, input, out_name](Module&, const at::Tensor& y, SaveContext&,
                                                                       TrainableModules&) {
      if (!input->defined())
        throw ConfigError("transcoder output place '" + out_name + "' ran before its input place");
      const at::Tensor x = *input;
      *input = at::Tensor();
      if (y.dim() < 1 || y.size(-1) != sae->config().d_out)
        throw ShapeError("transcoder " + (sae->config().source.empty() ? sae->config().class_name() : "'" + sae->config().source + "'") +
                         " has d_out " + std::to_string(sae->config().d_out) + ", but '" + out_name +
                         "' gives activations of shape " + shape_text(y.sizes()));
      if (mode == SpliceMode::Observe) {
        sae->observe(x);
        return y;
      }
      const bool edited = sae->hooked_inside();
      const at::Tensor t = (*sae)(x).to(y.scalar_type());
      if (mode == SpliceMode::Replace) return t;
      // The error of the unedited transcoder (this pass, when no hook inside could edit it).
      return t + (y - (edited ? sae->clean_output(x).to(y.scalar_type()) : t.detach()));
    }));
  } catch (...) {
    s.remove();
    throw;
  }
  return s;
}

}  // namespace flex
