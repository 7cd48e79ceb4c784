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
#include <flex/sae/tl_hook_names.h>

#include <memory>
#include <string>
#include <vector>

namespace flex {

enum class SpliceMode {
  Observe,           ///< features computed (hookable), the model's activation unchanged
  Replace,           ///< the reconstruction flows on
  ReplaceWithError,  ///< reconstruction + the unedited error: unchanged output unless a feature is edited
};

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
