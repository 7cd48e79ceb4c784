#pragma once
// TransformerLens's hook names (blocks.3.hook_resid_post, ...), which SAELens
// releases, Neuronpedia and most tutorials use, as places of flexmodel's
// models: the one mapping, used by dictionaries (splice_sae, training
// sources) and, once installed, by FlexModel wherever a module name is
// (capture --hook, HookFunction, groups, tracing).
#include <flex/hooks/module.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace flex {

/// A place in the model: a module (or hook point) name, whether the value is
/// its input (true) or its output, and what of that value the name stands for.
struct HookPointRef {
  std::string module;
  bool input = false;
  /// Read only: the module's (a norm's) input normalised without its weight
  /// and bias (TransformerLens's ln1/ln2.hook_normalized).
  bool normalized = false;
  /// Piece `part` of `parts` equal pieces of the last dim (GPT-2's fused
  /// c_attn: q, k, v), then, with heads > 0, the last dim split into
  /// [heads, d_head] (TransformerLens's attn.hook_q / hook_k / hook_v).
  int64_t part = 0, parts = 1, heads = 0;
};

/// The place `hook_name` names in `model`: a module name of the model as it
/// is, or a TransformerLens hook holding what TransformerLens 4.3's
/// run_with_cache gives under that name (tests/data/tl_hooks): hook_embed,
/// hook_pos_embed ([1, T, d]: not broadcast over the batch),
/// blocks.L.hook_resid_pre/mid/post, hook_attn_out and hook_mlp_out (what
/// the block adds to the residual, after Gemma's post-norms), hook_mlp_in
/// (the MLP norm's input), ln1/ln2.hook_normalized (the attention / MLP norm's
/// input normalised without the norm's weight: read only), attn.hook_q/k/v
/// ([B, T, heads, d_head] before rotary embedding, k/v with the KV heads),
/// attn.hook_z ([B, T, heads, d_head]), attn.hook_pattern ([B, heads, q, k]);
/// and circuit-tracer's blocks.L.mlp.hook_in / mlp.hook_out (the MLP module's
/// own input and output, where its transcoders read and write).
/// NotFoundError naming the hook and the forms understood otherwise;
/// UnsupportedError naming the hook and why where the model has no such value
/// (attn.hook_attn_scores; q/k/v of a fused per-head projection).
HookPointRef resolve_hook_name(Module& model, const std::string& hook_name);

/// What the name at `at` stands for, from the module's value `x` (x itself for a plain place).
at::Tensor view_at(const HookPointRef& at, Module& module, const at::Tensor& x);
/// Whether view_at computes something (then `at` is not a plain module value).
bool has_view(const HookPointRef& at);
/// x with its view replaced by `edited` (not for a normalised place: that value is read only).
at::Tensor unview_at(const HookPointRef& at, const at::Tensor& edited, const at::Tensor& x);

/// Every TransformerLens name `model` has a place for (hook_embed, blocks.0.hook_resid_pre, ...), model-wide
/// ones first, then block by block.
std::vector<std::string> transformer_lens_names(Module& model);

/// The TransformerLens name of a module's output (or, as "<module>#input", its input) in `model`: the name
/// resolving to exactly that value (a block's output is its hook_resid_post); `name` itself when it has
/// TransformerLens's form already; "" when TransformerLens has no name for it.
std::string transformer_lens_name_of(Module& model, const std::string& name);

/// Whether `name` has TransformerLens's form (hook_embed, hook_pos_embed, blocks.L....).
bool is_transformer_lens_name(const std::string& name);

/// Makes FlexModel take TransformerLens names wherever a module name is
/// (flex/flexcore/hook_names.h), captured under the name given. Once per process.
void install_transformer_lens_names();

}  // namespace flex
