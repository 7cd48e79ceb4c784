#pragma once
// Training sparse autoencoders and transcoders, as sae-lens 6.54 trains them
// (docs/design.md, decision 31, lists where and why this differs):
//
//   flex::SaeTrainingOptions o;
//   o.architecture = flex::TrainArchitecture::TopK;
//   o.d_in = 768; o.d_sae = 16 * 768; o.k = 64;
//   flex::SaeTrainer trainer(o);
//   trainer.initialize(first_batch);            // scaling factor, b_dec from the data
//   for (...) auto stats = trainer.step(x);      // one Adam step on a batch [N, d_in]
//   auto sae = trainer.dictionary();             // the inference SparseDictionary
//
// The gradients are written out by hand, not taken from autograd, so that
// TopK / BatchTopK (and sparse JumpReLU / ReLU codes) touch only the decoder
// and encoder rows of the features a batch uses; the test checks them against
// a float64 autograd computation of SAELens's formulas.
#include <flex/sae/sparse_dictionary.h>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace flex {

enum class TrainArchitecture { TopK, BatchTopK, JumpReLU, Standard };
/// "topk", "batchtopk", "jumprelu", "standard" (ConfigError otherwise).
TrainArchitecture parse_train_architecture(const std::string& name);
std::string to_string(TrainArchitecture a);

enum class BDecInit { Mean, GeometricMedian, Zeros };

struct SaeTrainingOptions {
  TrainArchitecture architecture = TrainArchitecture::TopK;
  int64_t d_in = 0, d_sae = 0;
  /// Transcoders: the output width (0: an SAE, d_out = d_in).
  int64_t d_out = 0;
  bool transcoder = false;
  /// Transcoders: add x W_skip^T (starts at zero).
  bool skip_connection = false;
  /// TopK: features per token; BatchTopK: per token on average over a batch.
  double k = 64;
  /// TopK / BatchTopK: select and decode as if decoder rows had unit norm.
  bool rescale_acts_by_decoder_norm = true;
  double aux_loss_coefficient = 1.0;  // TopK / BatchTopK: AuxK on dead latents
  double topk_threshold_lr = 0.01;    // BatchTopK: EMA of the smallest kept activation
  double l1_coefficient = 5.0;        // Standard: L1 of the decoder-norm-weighted acts
  double l0_coefficient = 1.0;        // JumpReLU: L0 through the straight-through step
  double jumprelu_init_threshold = 0.01, jumprelu_bandwidth = 0.05;
  /// The sparsity coefficient ramps linearly from 0 over this many steps.
  int64_t coefficient_warm_up_steps = 0;
  double lr = 3e-4, adam_beta1 = 0.9, adam_beta2 = 0.999, adam_eps = 1e-8;
  /// Linear warm-up from lr / warm_up_steps, and linear decay to 0 over the last decay_steps.
  int64_t lr_warm_up_steps = 0, lr_decay_steps = 0;
  int64_t total_steps = 0;  // for the decay
  double max_grad_norm = 1.0;
  /// A latent is dead after this many steps without firing.
  int64_t dead_feature_window = 1000;
  double decoder_init_norm = 0.1;
  BDecInit b_dec_init = BDecInit::Mean;
  /// SAELens's expected_average_only_in: inputs scaled to norm sqrt(d_in) on
  /// average (folded into the saved weights).
  bool normalize_activations = true;
  /// Encoder product in bfloat16 (weights kept in float32), as SAELens's autocast.
  bool bf16_encoder = false;
  uint64_t seed = 0;
  /// Recorded in the saved cfg.json.
  std::string hook_name, hook_name_out, model_name;
  int64_t context_size = 0;
};

/// What one step measured (on the scaled inputs).
struct TrainStepStats {
  double loss = 0, mse = 0, sparsity_loss = 0, aux_loss = 0;
  double l0 = 0, explained_variance = 0, grad_norm = 0, lr = 0;
  int64_t dead = 0, step = 0;
};

/// The loss and the gradient of every parameter (before clipping), as the
/// step uses them; for tests and checks.
struct TrainGradients {
  double loss = 0, mse = 0, sparsity_loss = 0, aux_loss = 0;
  at::Tensor W_enc, b_enc, W_dec, b_dec, threshold, W_skip;  // W_enc [d_in, d_sae]
};

class SaeTrainer {
 public:
  /// ConfigError for sizes or coefficients out of range (k > d_sae, ...),
  /// UnsupportedError for a TopK transcoder (SAELens has no format for it).
  explicit SaeTrainer(SaeTrainingOptions options);
  const SaeTrainingOptions& options() const { return o_; }

  /// Random init from the seed (W_dec rows of norm decoder_init_norm, W_enc =
  /// W_dec^T), then the scaling factor and b_dec from `x` ([N, d_in]) and,
  /// for transcoders, `y` ([N, d_out]).
  void initialize(const at::Tensor& x, const at::Tensor& y = {});
  /// One step: forward, loss, gradients, clipping, Adam, schedules, dead-latent counts.
  TrainStepStats step(const at::Tensor& x, const at::Tensor& y = {});
  /// The loss and gradients at `x` (already scaled) without changing anything.
  TrainGradients gradients(const at::Tensor& x, const at::Tensor& y = {});

  /// The inference dictionary: scaling folded in, TopK decoder norms folded,
  /// BatchTopK saved as JumpReLU with its threshold (as SAELens saves it).
  std::shared_ptr<SparseDictionary> dictionary() const;
  /// SAELens's cfg.json for dictionary().
  nlohmann::json saelens_config() const;

  int64_t steps() const { return step_; }
  double scaling_factor_in() const { return scale_in_; }
  double scaling_factor_out() const { return scale_out_; }
  /// Steps since each latent last fired [d_sae], and the dead mask.
  const at::Tensor& steps_since_fired() const { return since_fired_; }
  at::Tensor dead_mask() const;
  /// Fraction of tokens each latent fired on since the start (or restore).
  at::Tensor firing_frequency() const;
  double lr_at(int64_t step) const;

  /// Everything a resumed run needs (parameters, Adam moments, counters,
  /// scaling, BatchTopK threshold) as named tensors (copies) and JSON.
  std::map<std::string, at::Tensor> state_tensors() const;
  nlohmann::json state_json() const;
  void load_state(const std::map<std::string, at::Tensor>& tensors, const nlohmann::json& json,
                  const std::string& where);

  /// Raw (training) parameters, W_enc stored transposed [d_sae, d_in].
  at::Tensor W_encT, b_enc, W_dec, b_dec, threshold, W_skip;
  double topk_threshold = 0;  // BatchTopK

 private:
  struct Forward;
  Forward forward(const at::Tensor& s, const at::Tensor& t, bool for_grad);
  TrainGradients backward(const at::Tensor& s, const at::Tensor& t, Forward& f);
  double coefficient() const;
  at::Tensor scale_in(const at::Tensor& x) const;
  at::Tensor target(const at::Tensor& x, const at::Tensor& y) const;

  SaeTrainingOptions o_;
  int64_t d_out_ = 0;
  int64_t step_ = 0;
  double scale_in_ = 1.0, scale_out_ = 1.0;
  at::Tensor m_[6], v_[6];  // Adam moments, parameter order W_encT, b_enc, W_dec, b_dec, threshold, W_skip
  at::Tensor since_fired_, fired_count_;
  int64_t tokens_seen_ = 0;
};

}  // namespace flex
