#pragma once
// Rotary position embeddings (RoPE) as Transformers 4.47 computes them: one
// model-level module (model.rotary_emb / gpt_neox.rotary_emb) returns
// (cos, sin) of shape [P, T, rotary_dim] for the position ids, and every
// attention layer rotates q and k with the rotate_half convention.
// Supported rope types: default, linear, dynamic (NTK), llama3, longrope
// (Phi-3: short or long per-frequency factors chosen by the length the
// positions reach, cos/sin scaled by the attention factor), yarn (cos/sin
// scaled by its attention factor). Architectures
// whose layers each compute RoPE (Mistral, Gemma 2, Phi-3, OLMo 2) call a
// per-attention module with the same interface.
#include <flex/hooks/module.h>
#include <flex/models/config.h>

#include <utility>

namespace flex {

/// Modules whose non-persistent buffers (causal masks, inv_freq) are derived
/// from the config rather than loaded: the loader calls reset_buffers after
/// building under EmptyInit or moving to a device.
class ComputedBuffers {
 public:
  virtual ~ComputedBuffers() = default;
  virtual void reset_buffers(const at::Device& device) = 0;
};

/// inv_freq (float32, [dim / 2]) for `rope_type`. `seq_len` only matters for
/// "dynamic" and "longrope" (0 = the config's max_position_embeddings for
/// dynamic, the short factors for longrope).
at::Tensor rope_inv_freq(const ModelConfig& cfg, int64_t dim, int64_t seq_len = 0);

/// (cos, sin) [P, T, 2 * inv_freq.size(0)] for the position ids, times
/// `scale`, in x's dtype and on x's device.
std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& inv_freq, const at::Tensor& position_ids,
                                               const at::Tensor& x, double scale = 1.0);

/// rotate_half: cat(-x[..., d/2:], x[..., :d/2]).
at::Tensor rotate_half(const at::Tensor& x);
/// x * cos + rotate_half(x) * sin, with cos/sin [P, T, D] broadcast over heads
/// (x is [B, H, T, D]).
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

/// LlamaRotaryEmbedding / GPTNeoXRotaryEmbedding. Call with (x, position_ids):
/// returns the tuple (cos, sin) in x's dtype. Holds the non-persistent buffer
/// inv_freq.
class RotaryEmbedding : public Module, public ComputedBuffers {
 public:
  RotaryEmbedding(std::string class_name, const ModelConfig& cfg, int64_t dim);
  Value forward(Inputs inputs) override;
  std::pair<at::Tensor, at::Tensor> compute(const at::Tensor& x, const at::Tensor& position_ids);
  void reset_buffers(const at::Device& device) override;

  at::Tensor inv_freq;
  int64_t dim;
  /// forward returns each frequency once ([..., dim / 2]), as gpt-oss's module does.
  bool half_tables = false;

 private:
  ModelConfig cfg_;
  int64_t max_seq_len_cached_;  // dynamic NTK: the length inv_freq was made for
};

/// The rotary module of models with a RoPE setting per layer type (Transformers
/// 5's Gemma3RotaryEmbedding, Olmo3RotaryEmbedding): call with (x,
/// position_ids, layer_type) where layer_type is "full_attention" or
/// "sliding_attention"; the base model calls it once per type present. Holds
/// full_attention_inv_freq / sliding_attention_inv_freq for the types the
/// model has (config.layer_sliding_type).
class LayerTypeRotaryEmbedding : public Module, public ComputedBuffers {
 public:
  LayerTypeRotaryEmbedding(std::string class_name, const ModelConfig& cfg, int64_t dim);
  Value forward(Inputs inputs) override;
  std::pair<at::Tensor, at::Tensor> compute(const at::Tensor& x, const at::Tensor& position_ids, bool sliding);
  void reset_buffers(const at::Device& device) override;
  /// Whether the model has a layer of that type (so a buffer for it).
  bool has_type(bool sliding) const { return sliding ? has_sliding_ : has_full_; }

  at::Tensor full_inv_freq, sliding_inv_freq;
  int64_t dim;

 private:
  ModelConfig cfg_;
  bool has_full_ = false, has_sliding_ = false;
};

/// Mixtral's rotary module in Transformers 4.47: cos/sin tables for every
/// position up to max_position_embeddings precomputed as the non-persistent
/// buffers cos_cached / sin_cached ([max_pos, dim], counted in module sizes).
/// Call with (x, seq_len): returns (cos, sin) = the first seq_len rows, in x's
/// dtype ([seq_len, dim], no batch dim); the attention picks rows by position.
/// Longer sequences extend the tables, as Transformers does.
class CachedRotaryEmbedding : public RotaryEmbedding {
 public:
  CachedRotaryEmbedding(std::string class_name, const ModelConfig& cfg, int64_t dim);
  Value forward(Inputs inputs) override;
  void reset_buffers(const at::Device& device) override;

  at::Tensor cos_cached, sin_cached;

 private:
  void build_tables(int64_t rows, const at::Device& device);
};

}  // namespace flex
