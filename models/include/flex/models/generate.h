#pragma once
// Text generation with a causal LM: greedy or seeded sampling (temperature,
// top-k, top-p), stop tokens, max_new_tokens, batched prompts left-padded,
// KV cache. Every step goes through the model's operator(), so hooks fire.
#include <flex/models/causal_lm.h>

#include <ATen/core/Generator.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <optional>
#include <utility>
#include <vector>

namespace flex {

struct GenerateOptions {
  int64_t max_new_tokens = 20;
  bool do_sample = false;   // false: greedy (argmax)
  double temperature = 1.0;  // > 0; sampling only
  int64_t top_k = 0;         // 0: off
  double top_p = 1.0;        // in (0, 1]; 1: off
  uint64_t seed = 0;         // sampling is reproducible for a given seed
  /// A row stops after emitting one of these; unset: the config's eos ids.
  std::optional<std::vector<int64_t>> stop_tokens;
  /// Written after a row has stopped; unset: config pad, else the first stop token, else 0.
  std::optional<int64_t> pad_token_id;
  bool use_cache = true;  // false: recompute the whole sequence every step
  /// The static decode step (design decision 51): after the prompt, every
  /// step has the same shapes (a KV cache of static_capacity slots written at
  /// a device position, attention over all of them with the unwritten ones
  /// masked) and reads no value back to the host. Run eagerly here; the
  /// tokens are the normal decode's, the logits equal within rounding.
  bool static_step = false;
  /// The static step recorded once as a CUDA graph and replayed per token
  /// (implies static_step). The model must sit on one CUDA device:
  /// UnsupportedError naming the device otherwise (a CPU model, a CPU-only
  /// build). Registered hooks are recorded too, so they must be device-only
  /// tensor code (the built-in steer / ablate / SAE edits are); host code in
  /// a hook (a FlexModel capture's save) runs only while recording, so
  /// capture with `taps` instead.
  bool cuda_graph = false;
  /// KV slots of the static step; 0: the smallest power of two >= 256 that
  /// holds the prompt and max_new_tokens (one graph per bucket).
  int64_t static_capacity = 0;
  /// Modules whose output (its first tensor) each model call copies out into
  /// GenerateOutput::taps; with cuda_graph a graph node copies into a static
  /// buffer that is read after each replay.
  std::vector<std::string> taps;
};

struct GenerateOutput {
  at::Tensor sequences;       // [B, T + n]: the (padded) prompts, then the new tokens
  at::Tensor attention_mask;  // [B, T + n]
  int64_t prompt_length = 0;  // T
  std::vector<int64_t> num_generated;  // per row, the stop token included
  /// Per opts.taps name, one tensor per model call (the prompt's [B, T, ...],
  /// then each step's [B, 1, ...]), on the model's device.
  std::map<std::string, std::vector<at::Tensor>> taps;
  /// Row b's new tokens (without the padding after its stop).
  std::vector<int64_t> new_tokens(int64_t row) const;
};

/// Generates for the batch `input_ids` [B, T] (int64). `attention_mask`
/// [B, T] marks real tokens (1) and left padding (0); undefined means no
/// padding. Positions follow the mask (cumsum - 1), as Transformers does, so
/// a padded row generates what it would alone. ConfigError for bad options,
/// ShapeError for bad inputs.
GenerateOutput generate(CausalLM& model, const at::Tensor& input_ids, const at::Tensor& attention_mask = {},
                        const GenerateOptions& opts = {});
/// One model step of generate(): the logits [B, T', V] for `in` (the whole
/// sequence so far, or only the newest position when in.past_key_values is set).
using LogitsFn = std::function<at::Tensor(const LMInputs& in)>;
/// generate() over any model step, e.g. a FlexModel-wrapped or parallel model
/// (with opts.use_cache = false when it keeps no KV cache). `cfg` gives the
/// stop and pad tokens.
GenerateOutput generate(const LogitsFn& step, const ModelConfig& cfg, const at::Tensor& input_ids,
                        const at::Tensor& attention_mask = {}, const GenerateOptions& opts = {});

/// Left-pads token lists into (input_ids [B, max_len], attention_mask [B, max_len]).
std::pair<at::Tensor, at::Tensor> pad_left(const std::vector<std::vector<int64_t>>& prompts, int64_t pad_id);

/// The next token of every row from last-position logits [B, V]: argmax, or
/// a draw from softmax after temperature, top-k and top-p filtering
/// (Transformers' order). Exposed for tests.
at::Tensor choose_next_tokens(const at::Tensor& logits, const GenerateOptions& opts, at::Generator& gen);

/// A CPU generator seeded with `seed`.
at::Generator make_cpu_generator(uint64_t seed);

}  // namespace flex
