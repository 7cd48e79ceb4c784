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
#include <flex/hooks/handle.h>
#include <flex/sae/sae_config.h>
#include <flex/sae/sparse_code.h>

#include <functional>

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
  /// True when a hook on an inner point before the output (input, acts_pre,
  /// acts_post, recons) could make forward differ from clean_output.
  bool hooked_inside() const;

  /// Observe mode's call: the features of x (their hooks fire, on_features
  /// observers get the code), nothing decoded. A TopK dictionary selects its
  /// k features straight into the code (flex/sae/sparse_code.h: top_k_code)
  /// and makes the dense activations only if a hook on hook_sae_acts_post
  /// needs them. Where the CPU has AVX512_BF16 and no hook needs the
  /// pre-activations, the encoder product is taken in bfloat16 with a proven
  /// error bound, and only the features that bound leaves in contention get
  /// exact float32 values: the same k features, 2-3x less encoder time.
  /// With a hook on hook_sae_recons, hook_sae_error or hook_sae_output (an
  /// SAE's), the whole forward runs instead (error term included), so that
  /// those hooks see their values; x still flows on unchanged.
  void observe(const at::Tensor& x);
  /// Calls `fn` with the features ([N tokens, d_sae], after the hooks on
  /// hook_sae_acts_post) of every forward and observe: how capture records
  /// features without scanning a dense tensor. Remove with the handle.
  HookHandle on_features(std::function<void(const SparseCode&)> fn);

  at::Tensor W_enc, W_dec, b_enc, b_dec, threshold, b_gate, b_mag, r_mag, W_skip;

  /// Fills every parameter from `tensors` (by name), cast to the config's
  /// dtype, and puts the dictionary in eval mode: the one check of a
  /// published file's weights (each format's reader calls it). `where` (the
  /// file) prefixes the errors: FileFormatError for a missing, unexpected or
  /// non-finite tensor, ShapeError with both shapes.
  void load_parameters(const std::map<std::string, at::Tensor>& tensors, const std::string& where);

 private:
  // encode's result: the dense activations and/or their sparse code, as asked.
  struct Features {
    at::Tensor dense;
    std::optional<SparseCode> code;
  };
  Features encode_features(const at::Tensor& x, bool want_dense, bool want_code);
  /// decode of `acts`, whose code is `code` when the caller has it.
  at::Tensor decode_with(const at::Tensor& acts, const SparseCode* code);
  void notify(const Features& f);
  bool hooked(const std::shared_ptr<Identity>& point) const;
  at::Tensor hook(const std::shared_ptr<Identity>& point, const at::Tensor& t);
  at::Tensor normalize(const at::Tensor& x);
  at::Tensor denormalize(const at::Tensor& y) const;
  at::Tensor activate(const at::Tensor& s);
  /// acts x W_dec, as a gather of the active rows when the code is sparse.
  at::Tensor decode_product(const at::Tensor& f, const SparseCode* code);

  SaeConfig cfg_;
  std::shared_ptr<Identity> hook_sae_input_, hook_sae_acts_pre_, hook_sae_acts_post_, hook_sae_recons_,
      hook_sae_error_, hook_sae_output_;
  bool hooks_on_ = true;
  // The last encode's normalisation statistics and hook_z head size.
  at::Tensor norm_scale_, norm_mean_, norm_std_;
  std::optional<int64_t> d_head_;
  // TopK's bounded bfloat16 encoder (bounded_top_k.h), made on first use and
  // remade when W_enc changes.
  struct BoundedCache;
  std::shared_ptr<BoundedCache> bounded_;
  using Observers = std::map<int64_t, std::function<void(const SparseCode&)>>;
  std::shared_ptr<Observers> observers_ = std::make_shared<Observers>();
  int64_t next_observer_ = 0;
};

}  // namespace flex
