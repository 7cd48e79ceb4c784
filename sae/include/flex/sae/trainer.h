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
#include <functional>
#include <map>
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
  /// After initialize(): continue from a trained dictionary (SAELens's
  /// from_pretrained_path): its weights, scaling unfolded with the factors
  /// initialize() estimated, fresh Adam moments and counters. ConfigError
  /// naming `where` and the field for another architecture, width, input
  /// handling or skip connection; UnsupportedError for inference-time
  /// normalisation (constant norm, layer norm).
  void start_from(SparseDictionary& sae, const std::string& where);
  /// One step: forward, loss, gradients, clipping, Adam, schedules, dead-latent counts.
  TrainStepStats step(const at::Tensor& x, const at::Tensor& y = {});
  /// The loss and gradients at `x` (raw, as step() takes it) without changing anything.
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
  Forward forward(const at::Tensor& s, const at::Tensor& t);
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

/// Where training batches come from, in an order fixed by the seed.
class ActivationSource {
 public:
  virtual ~ActivationSource() = default;
  /// Input width and (transcoders) output width.
  virtual int64_t d_in() const = 0;
  virtual int64_t d_out() const { return 0; }
  /// The next `tokens` training rows: inputs [tokens, d_in] and, for a
  /// transcoder, targets [tokens, d_out] (else undefined).
  virtual std::pair<at::Tensor, at::Tensor> next(int64_t tokens) = 0;
  /// Moves past `tokens` rows as next() would (a resumed run).
  virtual void skip(int64_t tokens) = 0;
  /// Rows never trained on, for the final evaluation (up to `tokens`).
  virtual std::pair<at::Tensor, at::Tensor> held_out(int64_t tokens) = 0;
  /// What the source is, for training.json (a resumed run must match).
  virtual nlohmann::json describe() const = 0;
};

/// The shards of `flexmodel capture --dataset` (flex/datasets/activation_shards.h):
/// each pass visits the shards in a seeded random order and each shard's
/// rows in a seeded random order (memory: one mapped shard). The last
/// `held_out_tokens` tokens of the dataset (in its own order) are never
/// trained on. NotFoundError naming the dataset and its hooks for a missing hook.
std::unique_ptr<ActivationSource> shard_source(const std::string& dir, const std::string& hook,
                                               const std::string& hook_out, int64_t held_out_tokens, uint64_t seed);

/// A training run: batches from a source, progress, metrics, checkpoints,
/// the final dictionary and its evaluation, all in `out_dir`:
///   training.json         the run's settings (a rerun with other settings is a ConfigError)
///   metrics.jsonl         one JSON line per step: tokens, loss, mse, l0, explained variance, dead, lr, ...
///   checkpoints/step-N/   cfg.json + sae_weights.safetensors (SAELens's layout) + trainer_state.*,
///                         each written under a temporary name and renamed when complete
///   cfg.json, sae_weights.safetensors   the final dictionary (loadable by sae_lens and flex::load_sae)
///   eval.json, curves.svg the held-out evaluation and the training curves
/// A rerun with the same settings continues from the last checkpoint: same
/// data order, same optimizer state, the same final weights.
struct SaeTrainRunOptions {
  SaeTrainingOptions sae;
  std::string out_dir;
  int64_t batch_tokens = 4096;
  int64_t total_tokens = 0;
  /// 0: ten checkpoints over the run.
  int64_t checkpoint_every_tokens = 0;
  /// Held-out rows for the final evaluation (the source keeps them apart).
  int64_t eval_tokens = 8192;
  /// Rows read for the scaling factor and b_dec (the first ones of the data order).
  int64_t init_tokens = 16384;
  /// A dictionary (anything flex::load_sae reads) a fresh run starts from
  /// instead of the random initialisation (SaeTrainer::start_from).
  std::string from_pretrained;
};

struct SaeTrainProgress {
  TrainStepStats step;
  int64_t tokens = 0, total_tokens = 0;
  double tokens_per_second = 0, eta_seconds = 0;
};

/// The final dictionary on held-out rows.
struct SaeEvaluation {
  int64_t tokens = 0;
  double mse = 0, explained_variance = 0, l0 = 0;
  int64_t dead_latents = 0;   // never fired on the held-out rows
  int64_t dense_latents = 0;  // fired on more than 10% of them
  nlohmann::json to_json() const;
};

struct SaeTrainResult {
  int64_t steps = 0, tokens = 0;
  int64_t resumed_from_step = -1;  // -1: a fresh run
  double tokens_per_second = 0;   // this process's training steps only
  TrainStepStats last;
  SaeEvaluation eval;
  std::shared_ptr<SparseDictionary> dictionary;
};

SaeTrainResult train_sae(ActivationSource& source, const SaeTrainRunOptions& options,
                         const std::function<void(const SaeTrainProgress&)>& on_progress = {});

/// The dictionary's MSE, explained variance, L0, dead and dense latents on (x, y).
SaeEvaluation evaluate_dictionary(SparseDictionary& sae, const at::Tensor& x, const at::Tensor& y = {});

}  // namespace flex
