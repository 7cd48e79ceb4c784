#pragma once
// What a sparse dictionary is, read from SAELens's cfg.json: its
// architecture, sizes, dtype and input handling, and where in a model it
// reads (TransformerLens hook names, as SAELens records them). Both the
// sae-lens 6 layout and the older one (renamed keys, activation_fn "topk",
// boolean normalize_activations) are read; tests/data/sae/FORMAT.md has the
// details.
#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace flex {

enum class SaeArchitecture {
  Standard,                // relu(s W_enc + b_enc)
  Gated,                   // gate (s W_enc + b_gate > 0) x relu(s (W_enc exp(r_mag)) + b_mag)
  JumpReLU,                // relu(h) where h > threshold (also BatchTopK saved for inference)
  TopK,                    // the k largest pre-activations, relu'd
  AbsTopK,                 // the k largest by magnitude, signed
  Transcoder,              // ReLU, input hook -> output hook
  SkipTranscoder,          // + x W_skip^T
  JumpReLUTranscoder,
  JumpReLUSkipTranscoder,
};

/// Input normalisation that acts at inference. (SAELens's
/// expected_average_only_in and covariance_whitening are folded into the
/// weights when saved and read as None.)
enum class SaeNormalization { None, ConstantNormRescale, LayerNorm };

struct SaeConfig {
  SaeArchitecture architecture = SaeArchitecture::Standard;
  int64_t d_in = 0, d_sae = 0;
  /// Output width: d_in for SAEs, the output hook's width for transcoders.
  int64_t d_out = 0;
  at::ScalarType dtype = at::kFloat;
  bool apply_b_dec_to_input = true;
  SaeNormalization normalization = SaeNormalization::None;
  /// Input [..., heads, d_head] flattened to heads*d_head (attention hook_z SAEs).
  bool hook_z = false;
  int64_t k = 100;  // TopK / AbsTopK
  bool rescale_acts_by_decoder_norm = false;
  /// Where it reads (and, for a transcoder, where its output goes), as SAELens names it.
  std::string hook_name, hook_name_out, model_name;
  std::optional<int64_t> hook_head_index;
  nlohmann::json metadata = nlohmann::json::object();
  /// The folder or file it was read from (named in errors); empty when built in code.
  std::string source;

  bool transcoder() const;
  bool has_skip() const;
  bool jump() const;  // has a threshold
  bool top_k() const;
  /// SAELens's class name ("JumpReLUSAE", "SkipTranscoder", ...).
  std::string class_name() const;
};

/// Reads a cfg.json object; `source` names it in errors (ConfigError naming
/// the field for a missing or ill-typed one, UnsupportedError for an
/// architecture outside the list above).
SaeConfig parse_sae_config(const nlohmann::json& cfg, const std::string& source);

}  // namespace flex
