#pragma once
// A sparse dictionary (SAE or transcoder) as a hookable module, computing as
// SAELens 6.54 does (tests/data/sae/FORMAT.md), with SAELens's inner hook
// points as children: hook_sae_input, hook_sae_acts_pre, hook_sae_acts_post,
// hook_sae_recons, hook_sae_error, hook_sae_output. Hooking them (a FlexModel
// on the dictionary, or on a model the dictionary is attached to) reads or
// edits the features.
//
//   auto sae = flex::load_sae("gpt2-small-res-jb/blocks.8.hook_resid_pre");   // flex/sae/load_sae.h
//   at::Tensor acts = sae->encode(x);          // [..., d_sae]
//   at::Tensor y = (*sae)(x);                  // decode(encode(x)) (+ error term)
#include <flex/hooks/module.h>
#include <flex/hooks/nn.h>
#include <flex/sae/sae_config.h>

#include <map>
#include <memory>
#include <optional>
#include <string>

namespace flex {

class SparseDictionary : public Module {
 public:
  /// Parameters of the configured shapes and dtype, zero until loaded.
  explicit SparseDictionary(SaeConfig config);

  const SaeConfig& config() const { return cfg_; }

  /// Feature activations [..., d_sae] (the dictionary's dtype). Fires
  /// hook_sae_input, hook_sae_acts_pre, hook_sae_acts_post.
  at::Tensor encode(const at::Tensor& x);
  /// Reconstruction (SAE: [..., d_in], transcoder: [..., d_out]). Fires
  /// hook_sae_recons; undoes the input normalisation with the statistics of
  /// the last encode (as SAELens: decode consumes what encode measured).
  at::Tensor decode(const at::Tensor& acts);
  /// forward: decode(encode(x)); a skip transcoder adds x W_skip^T. With
  /// use_error_term (SAEs), adds x - decode(encode(x)) computed without hooks
  /// (hook_sae_error), so the output equals x up to rounding unless a hook
  /// edited the features. hook_sae_output fires on the result (SAEs).
  Value forward(Inputs inputs) override;
  bool use_error_term = false;
  /// forward(x) of the unedited dictionary: no hooks, no error term, no graph
  /// (the reconstruction an error term is measured against).
  at::Tensor clean_output(const at::Tensor& x);

  at::Tensor W_enc, W_dec, b_enc, b_dec, threshold, b_gate, b_mag, r_mag, W_skip;

  /// Fills every parameter from `tensors` (by name), cast to the config's
  /// dtype, and puts the dictionary in eval mode: the one check of a
  /// published file's weights (each format's reader calls it). `where` (the
  /// file) prefixes the errors: FileFormatError for a missing, unexpected or
  /// non-finite tensor, ShapeError with both shapes.
  void load_parameters(const std::map<std::string, at::Tensor>& tensors, const std::string& where);

 private:
  at::Tensor hook(const std::shared_ptr<Identity>& point, const at::Tensor& t);
  at::Tensor normalize(const at::Tensor& x);
  at::Tensor denormalize(const at::Tensor& y) const;
  at::Tensor activate(const at::Tensor& s);
  /// acts x W_dec, as a gather of the active rows when the code is sparse.
  at::Tensor decode_product(const at::Tensor& f);

  SaeConfig cfg_;
  std::shared_ptr<Identity> hook_sae_input_, hook_sae_acts_pre_, hook_sae_acts_post_, hook_sae_recons_,
      hook_sae_error_, hook_sae_output_;
  bool hooks_on_ = true;
  // The last encode's normalisation statistics and hook_z head size.
  at::Tensor norm_scale_, norm_mean_, norm_std_;
  std::optional<int64_t> d_head_;
};

}  // namespace flex
