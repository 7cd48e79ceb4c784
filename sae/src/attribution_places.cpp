#include "attribution_places.h"

#include <flex/dispatch/align_devices_hook.h>
#include <flex/hooks/errors.h>
#include <flex/models/decoder.h>
#include <flex/sae/splice.h>

#include <regex>

namespace flex::detail {

namespace {

bool attribution_has_module(Module& m, const std::string& path) {
  try {
    m.get_submodule(path);
    return true;
  } catch (const NotFoundError&) {
    return false;
  }
}

std::string attribution_dims_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::string transcoder_name(const SparseDictionary& t, size_t l) {
  const std::string& src = t.config().source;
  return "transcoder " + std::to_string(l) + (src.empty() ? std::string() : " (" + src + ")");
}

}  // namespace

std::function<at::Tensor(const at::Tensor&, at::Tensor*, at::Tensor*)> base_model_run(std::shared_ptr<Module> base) {
  return [base](const at::Tensor& ids, at::Tensor*, at::Tensor*) { return find_first_tensor((*base)(Inputs{Value(ids)})); };
}

AttributionPlaces attribution_places(CausalLM& model) {
  AttributionPlaces p;
  attribution_block_places(model, model.class_name(), model.base_model_prefix(), model.config().num_hidden_layers, p);
  p.base = model.base_model();
  // Scaled embeddings (Gemma): the embedding module's output is the scaled
  // one, so a token node's value and gradient are both taken after the scale.
  p.embed = model.input_embeddings();
  std::shared_ptr<Linear> head = model.output_embeddings();
  p.logits = [&model, head](const at::Tensor& hidden) { return model.finish_logits((*head)(hidden)); };
  p.unembedding = [head, embed = p.embed] {
    auto read = [&head] {
      at::Tensor w = head->weight.detach();
      return at::isFloatingType(w.scalar_type()) ? w : head->float_weight();
    };
    if (!head->weight.is_meta()) return read();
    // Offloaded (CPU or disk, decision 41): the weight is on meta between
    // calls; load it for the read, through the head's own offload hook or,
    // for a head tied to the embedding, the embedding's.
    AlignModuleDevice loaded(*head);
    if (!head->weight.is_meta()) return read().clone();
    AlignModuleDevice loaded_embedding(*embed);
    if (head->weight.is_meta())
      throw NotFoundError("attribution: the output head's weight is on the meta device and no offload hook loads it");
    return read().clone();
  };
  p.hidden_size = model.config().hidden_size;
  p.run = base_model_run(p.base);
  return p;
}

void attribution_block_places(Module& model, const std::string& class_name, const std::string& base, int64_t n,
                              AttributionPlaces& p) {
  const std::string who = "attribution: " + class_name;
  std::string blocks;
  if (base == "transformer" && attribution_has_module(model, "transformer.h")) {
    blocks = "transformer.h";
  } else if (base == "model" && attribution_has_module(model, "model.layers")) {
    blocks = "model.layers";
  } else {
    throw UnsupportedError(who + " is neither GPT-2 nor a pre-norm decoder (Llama, Qwen2, Mistral): not supported yet");
  }
  // Gemma 3 takes Gemma 2's path: its q/k norms, sliding/global layers and
  // per-layer-type RoPE all feed only the attention pattern, which the frozen
  // replacement detaches (decision 49).
  for (int64_t l = 0; l < n; ++l) {
    const std::string block = blocks + "." + std::to_string(l);
    const std::string mlp = block + ".mlp";
    // Gemma 2 and 3: pre_feedforward_layernorm -> MLP -> post_feedforward_layernorm.
    const bool post_norm = attribution_has_module(model, block + ".post_feedforward_layernorm");
    const std::string norm = blocks == "transformer.h" ? block + ".ln_2"
                             : post_norm               ? block + ".pre_feedforward_layernorm"
                                                       : block + ".post_attention_layernorm";
    if (!attribution_has_module(model, mlp) || !attribution_has_module(model, norm))
      throw UnsupportedError(who + ": layer " + std::to_string(l) + " has no " + mlp + " after " + norm);
    auto m = model.get_submodule(mlp);
    if (m->class_name().find("Moe") != std::string::npos || m->class_name().find("MoE") != std::string::npos)
      throw UnsupportedError(who + ": " + mlp + " is a mixture of experts (" + m->class_name() + "): not supported yet");
    p.mlp_names.push_back(mlp);
    p.norm_names.push_back(norm);
    p.mlps.push_back(m);
    p.norms.push_back(model.get_submodule(norm));
    p.out_names.push_back(post_norm ? block + ".post_feedforward_layernorm" : mlp);
    p.outs.push_back(post_norm ? model.get_submodule(block + ".post_feedforward_layernorm") : m);
  }
}

void check_transcoders(Module& model, const AttributionPlaces& places,
                       const std::vector<std::shared_ptr<SparseDictionary>>& transcoders) {
  const size_t n = places.mlps.size();
  if (transcoders.size() != n)
    throw ConfigError("attribution: " + std::to_string(transcoders.size()) + " transcoders for a model of " +
                      std::to_string(n) + " layers (one per layer needed)");
  const int64_t d = places.hidden_size;
  for (size_t l = 0; l < n; ++l) {
    if (!transcoders[l]) throw ConfigError("attribution: no transcoder for layer " + std::to_string(l));
    const SparseDictionary& t = *transcoders[l];
    const SaeConfig& c = t.config();
    const std::string who = "attribution: " + transcoder_name(t, l);
    if (!c.transcoder())
      throw ConfigError(who + " is a " + c.class_name() + ", not a transcoder");
    if (c.normalization != SaeNormalization::None || c.hook_z || c.rescale_acts_by_decoder_norm)
      throw UnsupportedError(who + ": input normalisation, hook_z or decoder-norm rescaling is not supported");
    if (t.W_enc.size(0) != d || t.W_dec.size(1) != d)
      throw ShapeError(who + ": W_enc " + attribution_dims_text(t.W_enc.sizes().vec()) + " and W_dec " +
                       attribution_dims_text(t.W_dec.sizes().vec()) + " do not fit layer " + std::to_string(l) + "'s MLP of width " +
                       std::to_string(d) + " (W_enc [" + std::to_string(d) + ", d_sae], W_dec [d_sae, " +
                       std::to_string(d) + "] needed)");
    if (c.has_skip() && (t.W_skip.size(0) != d || t.W_skip.size(1) != d))
      throw ShapeError(who + ": W_skip " + attribution_dims_text(t.W_skip.sizes().vec()) + " does not fit width " + std::to_string(d));
    const std::string layer = std::to_string(l);
    // Where it reads: the MLP's input (the norm's output); circuit-tracer's
    // blocks.L.mlp.hook_in says the same.
    if (!c.hook_name.empty() && c.hook_name != "blocks." + layer + ".mlp.hook_in") {
      HookPointRef in;
      try {
        in = resolve_hook_name(model, c.hook_name);
      } catch (const NotFoundError& e) {
        throw ConfigError(who + " reads '" + c.hook_name + "', which this model does not have (" + e.what() + ")");
      }
      const bool fits = !in.normalized && ((in.module == places.mlp_names[l] && in.input) ||
                                           (in.module == places.norm_names[l] && !in.input));
      if (!fits)
        throw ConfigError(who + " reads '" + c.hook_name + "' but attribution needs layer " + layer +
                          "'s MLP input (" + places.norm_names[l] + "'s output, blocks." + layer + ".mlp.hook_in)");
    }
    if (!c.hook_name_out.empty() && c.hook_name_out != "blocks." + layer + ".mlp.hook_out") {
      HookPointRef out;
      try {
        out = resolve_hook_name(model, c.hook_name_out);
      } catch (const NotFoundError& e) {
        throw ConfigError(who + " writes '" + c.hook_name_out + "', which this model does not have (" + e.what() + ")");
      }
      if (out.module != places.out_names[l] || out.input)
        throw ConfigError(who + " writes '" + c.hook_name_out + "' but attribution needs layer " + layer +
                          "'s MLP output (" + places.out_names[l] + ", blocks." + layer + ".hook_mlp_out)");
    }
  }
}

}  // namespace flex::detail
