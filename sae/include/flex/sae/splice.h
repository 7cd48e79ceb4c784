#pragma once
// A dictionary in the model's forward pass. splice_sae attaches it where it
// reads (a TransformerLens hook name, as SAELens records it, or a module
// name of ours) through a FlexModel hook, and registers it as the child
// "sae" of that module, so its inner hook points are hookable by name:
//
//   flex::FlexModel fm(model);
//   auto sae = flex::load_sae("res-jb/blocks.6.hook_resid_pre");
//   auto splice = flex::splice_sae(fm, sae, {.mode = flex::SpliceMode::ReplaceWithError});
//   fm.register_forward_hook(std::make_shared<flex::HookFunction>(
//       splice.module + ".sae.hook_sae_acts_post",
//       flex::HookFunctionOptions{.editing_function = flex::clamp_feature(1234, 8.0)}));
//
// A transcoder reads its input hook (e.g. blocks.3.ln2.hook_normalized, the
// MLP's input) and stands in for the output hook (blocks.3.hook_mlp_out).
#include <flex/flexcore/flex_model.h>
#include <flex/sae/sparse_dictionary.h>

#include <memory>
#include <string>
#include <vector>

namespace flex {

enum class SpliceMode {
  Observe,           ///< features computed (hookable), the model's activation unchanged
  Replace,           ///< the reconstruction flows on
  ReplaceWithError,  ///< reconstruction + the unedited error: unchanged output unless a feature is edited
};

/// A place in the model: a module (or hook point) name, and whether the
/// dictionary reads its input (true) or its output.
struct HookPointRef {
  std::string module;
  bool input = false;
  /// Read only: the module's (a norm's) input normalised without its weight
  /// and bias (TransformerLens's ln2.hook_normalized).
  bool normalized = false;
};

/// The place `hook_name` names in `model`: a module name of the model as it
/// is, or a TransformerLens hook holding what TransformerLens 4.3's
/// run_with_cache gives under that name (tests/data/tl_hooks): hook_embed,
/// blocks.L.hook_resid_pre/mid/post, hook_attn_out and hook_mlp_out (what
/// the block adds to the residual, after Gemma's post-norms), hook_mlp_in
/// (the MLP norm's input), ln2.hook_normalized (that input normalised
/// without the norm's weight: read only), attn.hook_z ([B, T, heads,
/// d_head]), attn.hook_pattern ([B, heads, q, k]). NotFoundError naming the
/// hook and the forms understood otherwise.
HookPointRef resolve_hook_name(Module& model, const std::string& hook_name);

/// A FlexModel hook at `at` running `edit` on the value there (at a
/// normalized place: on the normalised value, its result ignored).
HookHandle attach_at(FlexModel& fm, const HookPointRef& at, EditFn edit);

struct SpliceOptions {
  SpliceMode mode = SpliceMode::Replace;
  /// Where it reads; empty: the dictionary's own hook_name.
  std::string hook_name;
  /// A transcoder's output place; empty: its hook_name_out.
  std::string hook_name_out;
};

/// What splice_sae attached: `module` is where the dictionary sits (its inner
/// hook points are "<module>.sae.hook_sae_*"). remove() detaches the hooks
/// and the child.
struct Splice {
  std::string module;
  /// Where the dictionary's output goes (its input place for an SAE, the output place for a transcoder).
  HookPointRef place;
  std::vector<HookHandle> handles;
  std::shared_ptr<Module> parent;
  std::shared_ptr<SparseDictionary> sae;
  void remove();
};

/// Attaches `sae` to the model `fm` wraps. ConfigError when a dictionary is
/// already attached there, or for a transcoder without an output place.
Splice splice_sae(FlexModel& fm, std::shared_ptr<SparseDictionary> sae, const SpliceOptions& options = {});

}  // namespace flex
