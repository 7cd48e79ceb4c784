#pragma once
// Hugging Face config.json for the causal LMs of the zoo (gpt2, gpt_neox and
// the Llama family: llama, mistral, qwen2, qwen3, gemma2, phi3, olmo2, and its
// mixture-of-experts members mixtral, qwen2_moe).
//
// Each architecture's own field names are mapped to one set of parsed fields
// (GPT-2's n_embd and Llama's hidden_size both land in hidden_size). The size
// fields are required; every other field takes Transformers' default when
// absent. Errors are flex::ConfigError naming the file and the field.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace flex {

/// rope_scaling ("type" or "rope_type").
struct RopeScaling {
  std::string rope_type = "default";  // default | linear | dynamic | llama3 | longrope | yarn | freq_factors
  double factor = 1.0;
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  int64_t original_max_position_embeddings = 0;  // llama3, longrope (and dynamic's reset point)
  // longrope (Phi-3 128k): per-frequency divisors for positions within /
  // beyond original_max_position_embeddings, and the cos/sin scale.
  std::vector<double> short_factor, long_factor;
  double attention_factor = 1.0;  // longrope, yarn: cos and sin are multiplied by it
  // yarn: the ramp between extrapolated and interpolated frequencies (beta_fast,
  // beta_slow rotations, bounds rounded outwards unless truncate is false);
  // mscale / mscale_all_dim feed the attention factor (and DeepSeek's softmax scale).
  double beta_fast = 32.0, beta_slow = 1.0;
  double mscale = 0.0, mscale_all_dim = 0.0;
  bool truncate = true;
  // freq_factors (llama.cpp's rope_freqs tensor, e.g. Llama 3.1 GGUF files):
  // frequency i is base^(-2i/dim) / freq_factors[i].
  std::vector<double> freq_factors;

  /// The factor on cos and sin: the attention factor for longrope and yarn, else 1.
  double cos_sin_scale() const { return rope_type == "yarn" || rope_type == "longrope" ? attention_factor : 1.0; }
};

/// YaRN's magnitude correction 0.1 * m * ln(factor) + 1 (1 when not extending):
/// the attention factor's parts, and DeepSeek's softmax scale (squared).
double yarn_mscale(double factor, double m);

/// A RoPE base and scaling: the model's, or one layer type's where they differ.
struct RopeSettings {
  double theta = 10000.0;
  RopeScaling scaling;
};

struct ModelConfig {
  std::string model_type;  // "gpt2" | "llama" | "gpt_neox"
  std::string source;      // the file it came from, for messages
  nlohmann::json raw;      // the whole config.json

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;          // n_embd
  int64_t num_hidden_layers = 0;    // n_layer
  int64_t num_attention_heads = 0;  // n_head
  int64_t num_key_value_heads = 0;  // == heads unless GQA (llama)
  int64_t head_dim = 0;             // hidden / heads unless given (llama)
  int64_t intermediate_size = 0;    // n_inner (gpt2: 4 * hidden when null)
  int64_t max_position_embeddings = 0;  // n_positions
  double norm_eps = 1e-5;           // layer_norm_epsilon / rms_norm_eps / layer_norm_eps
  std::string hidden_act;           // activation_function / hidden_act
  bool tie_word_embeddings = false;

  // Rotary (llama, gpt_neox).
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double rotary_pct = 1.0;  // gpt_neox: fraction of each head that is rotated
  /// RoPE per layer type (Gemma 3, OLMo 3: rope_parameters keyed by
  /// "full_attention" / "sliding_attention"): the sliding layers' setting;
  /// rope_theta / rope_scaling above are the full-attention layers'.
  std::optional<RopeSettings> sliding_rope;

  // Layout switches.
  bool attention_bias = false;        // o_proj bias (and q/k/v unless qkv_bias says otherwise); gpt_neox biases
  bool qkv_bias = false;              // q/k/v projection biases (Qwen2: always)
  bool mlp_bias = false;              // llama
  bool use_parallel_residual = true;  // gpt_neox
  bool scale_attn_weights = true;     // gpt2
  bool scale_attn_by_inverse_layer_idx = false;  // gpt2
  bool reorder_and_upcast_attn = false;          // gpt2

  // Attention variants of the Llama family (0 = off).
  int64_t sliding_window = 0;         // a query sees itself and the window - 1 keys before it
  int64_t sliding_window_pattern = 1; // layer i slides iff i % pattern == 0 (Gemma 2: 2) ...
  std::vector<bool> sliding_layers;   // ... unless layer_types (Transformers 5) says per layer
  double query_pre_attn_scalar = 0;   // Gemma 2: scores * scalar^-0.5 (0: head_dim)
  double attn_logit_softcapping = 0;  // Gemma 2: tanh(s / cap) * cap on the scores
  double final_logit_softcapping = 0; // Gemma 2: the same on the logits

  // Mixture of experts (Mixtral, Qwen2-MoE; num_experts 0 = dense).
  int64_t num_experts = 0;                  // num_local_experts (Mixtral) / num_experts
  int64_t num_experts_per_tok = 0;          // top-k
  int64_t moe_intermediate_size = 0;        // each expert's (Mixtral: intermediate_size)
  int64_t shared_expert_intermediate_size = 0;  // Qwen2-MoE's shared expert (0: none)
  bool norm_topk_prob = false;              // renormalise the top-k weights to sum 1 (Mixtral: always)
  int64_t decoder_sparse_step = 1;          // Qwen2-MoE: layer i is sparse iff (i + 1) % step == 0 ...
  std::vector<int64_t> mlp_only_layers;     // ... and i is not listed here
  double swiglu_alpha = 1.702, swiglu_limit = 7.0;  // gpt-oss experts' clamped SwiGLU
  // DeepSeek routing: experts in n_group groups, tokens routed within the
  // topk_group best groups (1 / 1: no grouping), weights * routed_scaling_factor;
  // the first first_k_dense_replace layers are dense.
  int64_t n_group = 1, topk_group = 1;
  double routed_scaling_factor = 1.0;
  bool group_limited = false;  // DeepSeek-V2's topk_method: group_limited_greedy (true) or greedy
  int64_t first_k_dense_replace = 0;

  /// Multi-head latent attention (DeepSeek-V2/V3; kv_lora_rank 0 = off).
  /// head_dim is then qk_rope_head_dim (what the rotary module rotates).
  struct LatentAttention {
    int64_t q_lora_rank = 0;  // 0: a plain q_proj
    int64_t kv_lora_rank = 0;
    int64_t qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
    bool rope_interleave = false;  // DeepSeek-V3: rotated pairs (2i, 2i+1), output de-interleaved
    int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  } mla;

  std::optional<int64_t> bos_token_id, pad_token_id;
  std::vector<int64_t> eos_token_ids;  // eos_token_id may be one id or a list
  std::string torch_dtype;  // "" when absent

  /// Number of rotated dimensions per head (head_dim * rotary_pct, for gpt_neox).
  int64_t rotary_dim() const;
  /// The Hugging Face class name of the causal LM ("GPT2LMHeadModel", ...).
  std::string causal_lm_class() const;
  /// Whether layer `layer` is a sliding-attention layer by type (layer_types or the pattern) ...
  bool layer_sliding_type(int64_t layer) const {
    if (!sliding_layers.empty()) return sliding_layers[static_cast<size_t>(layer)];
    return layer % sliding_window_pattern == 0;
  }
  /// ... and whether it attends through a window (a window is configured).
  bool layer_slides(int64_t layer) const { return sliding_window > 0 && layer_sliding_type(layer); }
  /// This config with the sliding layers' RoPE setting in rope_theta / rope_scaling.
  ModelConfig with_sliding_rope() const;
  /// Whether layer `layer` has a sparse mixture-of-experts block instead of a dense MLP.
  bool layer_is_sparse(int64_t layer) const;
};

/// Reads `<dir>/config.json`, or the given .json file. Throws IOError when the
/// file is missing, FileFormatError when it is not JSON, ConfigError for an
/// unknown model_type or a missing / ill-typed / inconsistent field.
ModelConfig load_config(const std::string& dir_or_config_json);

/// The model_type values parse_config accepts, comma-separated, for messages.
std::string supported_model_types();

/// Parses an already-read config; `source` names it in messages.
ModelConfig parse_config(const nlohmann::json& j, const std::string& source = "<config>");

}  // namespace flex
