// llama.cpp's architectures as Transformers models: config keys from the
// `<arch>.*` metadata and tensor names back to Transformers' (gguf_architectures.h).
#include "gguf_architectures.h"

#include <flex/dispatch/gguf.h>
#include <flex/hooks/errors.h>
#include <flex/models/gguf_model.h>

#include <map>

namespace flex {

namespace {

// What differs between the llama.cpp architectures read: the Transformers
// model, and whether the converter permuted q/k rows (LlamaModel does, for
// llama.cpp's GPT-J-style rope; the others keep the rotate-half layout, run
// with NEOX rope).
struct GgufArch {
  const char* model_type;
  const char* causal_lm_class;
  bool permuted_qk = false;
  bool norms_plus_one = false;  // Gemma: the converter stored 1 + w for every RMSNorm weight (scaled by (1 + w))
};

const std::map<std::string, GgufArch>& gguf_archs() {
  static const std::map<std::string, GgufArch> m = {
      {"llama", {"llama", "LlamaForCausalLM", true}},
      {"qwen2", {"qwen2", "Qwen2ForCausalLM"}},
      {"qwen3", {"qwen3", "Qwen3ForCausalLM"}},  // Qwen2's layout with q/k norms
      {"phi3", {"phi3", "Phi3ForCausalLM"}},     // fused qkv / gate_up
      {"gemma2", {"gemma2", "Gemma2ForCausalLM", false, true}},
      {"gemma3", {"gemma3_text", "Gemma3ForCausalLM", false, true}},
      {"olmo2", {"olmo2", "Olmo2ForCausalLM"}},
      {"qwen2moe", {"qwen2_moe", "Qwen2MoeForCausalLM"}},
      {"qwen3moe", {"qwen3_moe", "Qwen3MoeForCausalLM"}},
      {"gpt2", {"gpt2", "GPT2LMHeadModel"}},
      {"gptneox", {"gpt_neox", "GPTNeoXForCausalLM"}},
      {"deepseek2", {"deepseek_v2", "DeepseekV2ForCausalLM"}},  // DeepSeek-V2's routing; V3's is refused
  };
  return m;
}

const GgufArch* gguf_arch(const std::string& arch) {
  auto it = gguf_archs().find(arch);
  return it == gguf_archs().end() ? nullptr : &it->second;
}

// llama.cpp's per-block tensor names -> Transformers' (the Llama family).
const std::map<std::string, std::string>& llama_block_names() {
  static const std::map<std::string, std::string> m = {
      {"attn_norm", "input_layernorm"},   {"attn_q", "self_attn.q_proj"},      {"attn_k", "self_attn.k_proj"},
      {"attn_v", "self_attn.v_proj"},     {"attn_output", "self_attn.o_proj"}, {"ffn_norm", "post_attention_layernorm"},
      {"ffn_gate", "mlp.gate_proj"},      {"ffn_up", "mlp.up_proj"},           {"ffn_down", "mlp.down_proj"},
      {"attn_q_norm", "self_attn.q_norm"}, {"attn_k_norm", "self_attn.k_norm"},  // Qwen3's, Gemma 3's, OLMo 2's
      // Qwen2-MoE / Qwen3-MoE: the router, the shared expert and its sigmoid gate.
      {"ffn_gate_inp", "mlp.gate"},       {"ffn_gate_shexp", "mlp.shared_expert.gate_proj"},
      {"ffn_up_shexp", "mlp.shared_expert.up_proj"}, {"ffn_down_shexp", "mlp.shared_expert.down_proj"},
      {"ffn_gate_inp_shexp", "mlp.shared_expert_gate"},
  };
  return m;
}

// Stacked experts [experts, rows, cols] -> mlp.experts.<e>.<projection>.
const std::map<std::string, std::string>& expert_names() {
  static const std::map<std::string, std::string> m = {
      {"ffn_gate_exps", "gate_proj"}, {"ffn_up_exps", "up_proj"}, {"ffn_down_exps", "down_proj"}};
  return m;
}

// Per architecture, the names that differ from llama_block_names.
const std::map<std::string, std::string>& block_overrides(const std::string& arch) {
  static const std::map<std::string, std::map<std::string, std::string>> m = {
      // Phi-3's fused projections: llama.cpp keeps Transformers' fused tensors
      // (qkv rows q | k | v, gate_up rows gate | up).
      {"phi3", {{"attn_qkv", "self_attn.qkv_proj"}, {"ffn_up", "mlp.gate_up_proj"}, {"attn_q", ""}, {"attn_k", ""},
                {"attn_v", ""}, {"ffn_gate", ""}}},
      // Gemma's four norms per block (its ffn_norm is the pre-feedforward one).
      {"gemma2", {{"post_attention_norm", "post_attention_layernorm"}, {"ffn_norm", "pre_feedforward_layernorm"},
                  {"post_ffw_norm", "post_feedforward_layernorm"}}},
      {"gemma3", {{"post_attention_norm", "post_attention_layernorm"}, {"ffn_norm", "pre_feedforward_layernorm"},
                  {"post_ffw_norm", "post_feedforward_layernorm"}}},
      // OLMo 2's norms come after the sublayers only.
      {"olmo2", {{"post_attention_norm", "post_attention_layernorm"}, {"post_ffw_norm", "post_feedforward_layernorm"},
                 {"attn_norm", ""}, {"ffn_norm", ""}}},
      {"gpt2", {{"attn_norm", "ln_1"}, {"attn_qkv", "attn.c_attn"}, {"attn_output", "attn.c_proj"}, {"ffn_norm", "ln_2"},
                {"ffn_up", "mlp.c_fc"}, {"ffn_down", "mlp.c_proj"}}},
      {"gptneox", {{"attn_norm", "input_layernorm"}, {"attn_qkv", "attention.query_key_value"},
                   {"attn_output", "attention.dense"}, {"ffn_norm", "post_attention_layernorm"},
                   {"ffn_up", "mlp.dense_h_to_4h"}, {"ffn_down", "mlp.dense_4h_to_h"}}},
      // DeepSeek's latent attention; attn_k_b / attn_v_b are joined into kv_b_proj (join_pieces).
      {"deepseek2", {{"attn_q_a", "self_attn.q_a_proj"}, {"attn_q_a_norm", "self_attn.q_a_layernorm"},
                     {"attn_q_b", "self_attn.q_b_proj"}, {"attn_kv_a_mqa", "self_attn.kv_a_proj_with_mqa"},
                     {"attn_kv_a_norm", "self_attn.kv_a_layernorm"}, {"attn_kv_b", "self_attn.kv_b_proj"},
                     {"attn_k_b", "self_attn.k_b_proj"}, {"attn_v_b", "self_attn.v_b_proj"},
                     {"ffn_gate_shexp", "mlp.shared_experts.gate_proj"}, {"ffn_up_shexp", "mlp.shared_experts.up_proj"},
                     {"ffn_down_shexp", "mlp.shared_experts.down_proj"}}},
  };
  static const std::map<std::string, std::string> none;
  auto it = m.find(arch);
  return it == m.end() ? none : it->second;
}

// The model's top-level names and its blocks' prefix.
struct TopNames {
  const char *embed, *norm, *head, *blocks, *positions;
};
TopNames top_names(const std::string& arch) {
  if (arch == "gpt2") return {"transformer.wte", "transformer.ln_f", "lm_head", "transformer.h.", "transformer.wpe"};
  if (arch == "gptneox") return {"gpt_neox.embed_in", "gpt_neox.final_layer_norm", "lm_head", "gpt_neox.layers.", ""};
  return {"model.embed_tokens", "model.norm", "lm_head", "model.layers.", ""};
}

// llama.cpp's converter stores each head's rows [first half | second half]
// (Transformers' rotate-half pairs i, i + d/2) as interleaved pairs: row
// 2i + j of a head is its row i + j * d/2. This puts them back.
at::Tensor unpermute_rows(const at::Tensor& w, int64_t n_head, const std::string& path, const std::string& name) {
  const int64_t rows = w.size(0);
  if (n_head <= 0 || rows % (2 * n_head) != 0)
    throw FileFormatError("GGUF file " + path + ": tensor '" + name + "' has " + std::to_string(rows) +
                          " rows, which do not split into " + std::to_string(n_head) + " heads of pairs");
  std::vector<int64_t> s = {n_head, rows / n_head / 2, 2};
  for (int64_t d = 1; d < w.dim(); ++d) s.push_back(w.size(d));
  return w.reshape(s).transpose(1, 2).reshape(w.sizes()).contiguous();
}

// GPT-NeoX: the converter regrouped query_key_value's rows [head][q|k|v][d]
// as [q|k|v][head][d] (GPT-2's order); this restores Transformers' order.
at::Tensor heads_qkv_rows(const at::Tensor& w, int64_t n_head, const std::string& path, const std::string& name) {
  const int64_t rows = w.size(0);
  if (n_head <= 0 || rows % (3 * n_head) != 0)
    throw FileFormatError("GGUF file " + path + ": tensor '" + name + "' has " + std::to_string(rows) +
                          " rows, which do not split into q, k and v of " + std::to_string(n_head) + " heads");
  std::vector<int64_t> s = {3, n_head, rows / n_head / 3};
  for (int64_t d = 1; d < w.dim(); ++d) s.push_back(w.size(d));
  return w.reshape(s).transpose(0, 1).reshape(w.sizes()).contiguous();
}

int64_t int_or(const GgufFile& f, const std::string& key, int64_t fallback) {
  return f.has(key) ? f.get_int(key) : fallback;
}
double double_or(const GgufFile& f, const std::string& key, double fallback) {
  return f.has(key) ? f.get_double(key) : fallback;
}

std::string supported_list() {
  std::string s;
  for (const auto& [name, a] : gguf_archs()) s += (s.empty() ? "'" : ", '") + name + "'";
  return s;
}

void vocab_and_ids(const GgufFile& f, const std::string& p, nlohmann::json& c) {
  if (f.has(p + "vocab_size")) {
    c["vocab_size"] = f.get_int(p + "vocab_size");
  } else if (f.has("tokenizer.ggml.tokens")) {
    c["vocab_size"] = static_cast<int64_t>(f.value("tokenizer.ggml.tokens").size());
  } else {
    c["vocab_size"] = f.tensor("token_embd.weight").shape.at(0);
  }
  c["tie_word_embeddings"] = !f.contains("output.weight");
  c["torch_dtype"] = "float32";
  if (f.has("tokenizer.ggml.bos_token_id")) c["bos_token_id"] = f.get_int("tokenizer.ggml.bos_token_id");
  if (f.has("tokenizer.ggml.eos_token_id")) c["eos_token_id"] = f.get_int("tokenizer.ggml.eos_token_id");
}

// GPT-2 and GPT-NeoX: LayerNorm models with their own config field names.
nlohmann::json layer_norm_config(const GgufFile& f, const std::string& arch) {
  const std::string p = arch + ".";
  nlohmann::json c;
  const int64_t hidden = f.get_int(p + "embedding_length"), heads = f.get_int(p + "attention.head_count");
  const double eps = f.get_double(p + "attention.layer_norm_epsilon");
  if (arch == "gpt2") {
    c["n_embd"] = hidden;
    c["n_layer"] = f.get_int(p + "block_count");
    c["n_head"] = heads;
    c["n_positions"] = f.get_int(p + "context_length");
    c["n_inner"] = f.get_int(p + "feed_forward_length");
    c["layer_norm_epsilon"] = eps;
    c["activation_function"] = "gelu_new";  // llama.cpp's GELU is the tanh approximation
  } else {
    c["hidden_size"] = hidden;
    c["num_hidden_layers"] = f.get_int(p + "block_count");
    c["num_attention_heads"] = heads;
    c["intermediate_size"] = f.get_int(p + "feed_forward_length");
    c["max_position_embeddings"] = f.get_int(p + "context_length");
    c["layer_norm_eps"] = eps;
    c["hidden_act"] = "gelu";
    c["use_parallel_residual"] = f.has(p + "use_parallel_residual") ? f.value(p + "use_parallel_residual").to_bool() : true;
    const int64_t head_dim = heads > 0 ? hidden / heads : 0;
    const int64_t rot = f.get_int(p + "rope.dimension_count");
    if (head_dim <= 0 || rot <= 0 || rot > head_dim)
      throw FileFormatError("GGUF file " + f.path() + ": metadata key '" + p + "rope.dimension_count' is " +
                            std::to_string(rot) + "; it must be between 1 and the head size " + std::to_string(head_dim));
    c["rotary_pct"] = static_cast<double>(rot) / static_cast<double>(head_dim);
    c["rope_theta"] = double_or(f, p + "rope.freq_base", 10000.0);  // llama.cpp's default when absent
    c["attention_bias"] = f.contains("blk.0.attn_qkv.bias");
  }
  return c;
}

// Whether a deepseek2 file holds DeepSeek-V3 (sigmoid gating, exp_probs_b).
bool deepseek_v3_routing(const GgufFile& f) {
  const std::string p = "deepseek2.";
  return int_or(f, p + "expert_gating_func", 1) == 2 ||
         f.contains("blk." + std::to_string(int_or(f, p + "leading_dense_block_count", 0)) + ".exp_probs_b.bias");
}

// DeepSeek-V2 / V3: latent attention sizes and routing. The converter writes
// the latent attention as MQA (head_count_kv 1, key_length kv_lora + rope);
// the per-head sizes are the *_mla keys (older files: key_length / value_length).
void deepseek2_config(const GgufFile& f, nlohmann::json& c) {
  const std::string p = "deepseek2.";
  const bool v3 = deepseek_v3_routing(f);
  const int64_t gating = int_or(f, p + "expert_gating_func", v3 ? 2 : 1);
  const bool norm = f.has(p + "expert_weights_norm") && f.value(p + "expert_weights_norm").to_bool();
  const auto refuse = [&](const std::string& what) {
    throw UnsupportedError("GGUF file " + f.path() + ": " + what +
                           "; flexmodel reads deepseek2 files of DeepSeek-V2's routing (softmax, scaled, not "
                           "renormalised) and DeepSeek-V3's (sigmoid with exp_probs_b)");
  };
  if (gating != (v3 ? 2 : 1))
    refuse("expert_gating_func is " + std::to_string(gating) + (v3 ? " with tensor exp_probs_b" : ""));
  if (!v3 && norm) refuse("expert_weights_norm is true with softmax gating");
  if (v3) {  // Transformers' DeepseekV3: noaux_tc over groups, interleaved rope as llama.cpp's
    c["topk_method"] = "noaux_tc";
    c["scoring_func"] = "sigmoid";
    c["norm_topk_prob"] = norm;
    c["rope_interleave"] = true;
  }
  c["num_key_value_heads"] = c["num_attention_heads"];  // every head has its keys (decompressed)
  c["q_lora_rank"] = f.has(p + "attention.q_lora_rank") ? nlohmann::json(f.get_int(p + "attention.q_lora_rank"))
                                                        : nlohmann::json(nullptr);
  c["kv_lora_rank"] = f.get_int(p + "attention.kv_lora_rank");
  const int64_t rope = f.get_int(p + "rope.dimension_count");
  const bool mla = f.has(p + "attention.key_length_mla");
  c["qk_rope_head_dim"] = rope;
  c["qk_nope_head_dim"] = f.get_int(p + (mla ? "attention.key_length_mla" : "attention.key_length")) - rope;
  c["v_head_dim"] = f.get_int(p + (mla ? "attention.value_length_mla" : "attention.value_length"));
  c["n_routed_experts"] = f.get_int(p + "expert_count");
  c["num_experts_per_tok"] = f.get_int(p + "expert_used_count");
  c["moe_intermediate_size"] = f.get_int(p + "expert_feed_forward_length");
  c["n_shared_experts"] = int_or(f, p + "expert_shared_count", 0);
  c["routed_scaling_factor"] = double_or(f, p + "expert_weights_scale", 1.0);
  c["first_k_dense_replace"] = int_or(f, p + "leading_dense_block_count", 0);
  const int64_t groups = int_or(f, p + "expert_group_count", 1);
  if (!v3) c["topk_method"] = groups > 1 ? "group_limited_greedy" : "greedy";
  c["n_group"] = groups;
  c["topk_group"] = int_or(f, p + "expert_group_used_count", 1);
}

// A [n] float tensor of the file (rope_freqs, rope_factors_*) as config numbers.
std::vector<double> factor_list(const GgufFile& f, const std::string& name) {
  const at::Tensor t = f.dequantize(name).reshape({-1}).to(at::kDouble).contiguous();
  return std::vector<double>(t.const_data_ptr<double>(), t.const_data_ptr<double>() + t.numel());
}

// The RoPE scaling llama.cpp's converter writes: rope.scaling.* keys (linear,
// YaRN), or tensors: Llama 3's rope_freqs (per-frequency divisors computed
// from its rope_scaling, kept as flexmodel's freq_factors) and Phi-3's
// rope_factors_long / _short (longrope, with its attention factor and
// original context from the keys).
void rope_scaling_config(const GgufFile& f, const std::string& arch, nlohmann::json& c) {
  const std::string p = arch + ".";
  const std::string kind = f.has(p + "rope.scaling.type") ? f.get_string(p + "rope.scaling.type") : "none";
  const bool freqs = f.contains("rope_freqs.weight");
  const bool longrope = f.contains("rope_factors_long.weight") || f.contains("rope_factors_short.weight");
  auto refuse = [&](const std::string& why) {
    return UnsupportedError("GGUF file " + f.path() + ": " + why);
  };
  if (freqs && longrope) throw refuse("both rope_freqs and rope_factors_* tensors; flexmodel reads one or the other");
  if (freqs) {
    if (kind != "none") throw refuse("tensor 'rope_freqs.weight' and '" + p + "rope.scaling.type' = '" + kind +
                                     "' together; flexmodel reads rope_freqs alone (Llama 3's scaling)");
    c["rope_scaling"] = {{"rope_type", "freq_factors"}, {"freq_factors", factor_list(f, "rope_freqs.weight")}};
    return;
  }
  if (longrope) {
    if (arch != "phi3") throw refuse("rope_factors_* tensors are read for phi3 (longrope), not for " + arch);
    if (kind != "none" && kind != "longrope")
      throw refuse("rope_factors_* tensors with '" + p + "rope.scaling.type' = '" + kind + "'");
    for (const char* t : {"rope_factors_long.weight", "rope_factors_short.weight"})
      if (!f.contains(t)) throw refuse("tensor '" + std::string(t) + "' is missing (Phi-3's longrope needs both)");
    nlohmann::json s = {{"rope_type", "longrope"},
                        {"long_factor", factor_list(f, "rope_factors_long.weight")},
                        {"short_factor", factor_list(f, "rope_factors_short.weight")},
                        {"original_max_position_embeddings", f.get_int(p + "rope.scaling.original_context_length")}};
    if (f.has(p + "rope.scaling.attn_factor")) s["attention_factor"] = f.get_double(p + "rope.scaling.attn_factor");
    c["rope_scaling"] = s;
    return;
  }
  if (kind == "none") return;
  if (kind == "linear") {
    c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", f.get_double(p + "rope.scaling.factor")}};
  } else if (kind == "yarn") {
    nlohmann::json s = {{"rope_type", "yarn"},
                        {"factor", f.get_double(p + "rope.scaling.factor")},
                        {"original_max_position_embeddings", f.get_int(p + "rope.scaling.original_context_length")},
                        {"beta_fast", double_or(f, p + "rope.scaling.yarn_beta_fast", 32.0)},
                        {"beta_slow", double_or(f, p + "rope.scaling.yarn_beta_slow", 1.0)}};
    if (arch == "deepseek2") {
      // DeepSeek's YaRN: the converter keeps 0.1 * mscale_all_dim as the log
      // multiplier; DeepSeek's configs give mscale equal to it.
      const double m = double_or(f, p + "rope.scaling.yarn_log_multiplier", 0.0) / 0.1;
      s["mscale"] = m;
      s["mscale_all_dim"] = m;
    }
    // Others (Qwen2/3, Llama): Transformers' default attention factor, 0.1 ln(factor) + 1.
    c["rope_scaling"] = s;
  } else {
    throw refuse("metadata key '" + p + "rope.scaling.type' is '" + kind + "'; flexmodel reads 'none', 'linear', "
                 "'yarn' and (with Phi-3's rope_factors tensors) 'longrope'");
  }
}

}  // namespace

nlohmann::json gguf_config_json(const GgufFile& f) {
  const std::string arch = f.get_string("general.architecture");
  const GgufArch* a = gguf_arch(arch);
  if (!a)
    throw UnsupportedError("GGUF file " + f.path() + ": general.architecture is '" + arch +
                           "'; flexmodel reads GGUF models of architecture " + supported_list() +
                           " ('llama' is also Mistral's)");
  const std::string p = arch + ".";
  nlohmann::json c;
  if (arch == "gpt2" || arch == "gptneox") {
    c = layer_norm_config(f, arch);
  } else {
    const int64_t hidden = f.get_int(p + "embedding_length");
    const int64_t heads = f.get_int(p + "attention.head_count");
    c["hidden_size"] = hidden;
    c["num_hidden_layers"] = f.get_int(p + "block_count");
    c["num_attention_heads"] = heads;
    c["num_key_value_heads"] = int_or(f, p + "attention.head_count_kv", heads);
    c["max_position_embeddings"] = f.get_int(p + "context_length");
    c["rms_norm_eps"] = f.get_double(p + "attention.layer_norm_rms_epsilon");
    c["rope_theta"] = double_or(f, p + "rope.freq_base", 10000.0);
    if (heads > 0 && arch != "phi3" && arch != "olmo2" && arch != "deepseek2")  // no head_dim in their configs
      c["head_dim"] = int_or(f, p + "attention.key_length", int_or(f, p + "rope.dimension_count", hidden / heads));
    rope_scaling_config(f, arch, c);
    c["hidden_act"] = "silu";
    const bool moe = arch == "qwen2moe" || arch == "qwen3moe";
    // Dense layers' width; an MoE file may carry only the experts'.
    c["intermediate_size"] = moe ? int_or(f, p + "feed_forward_length", f.get_int(p + "expert_feed_forward_length"))
                                 : f.get_int(p + "feed_forward_length");
    if (arch == "qwen3" || arch == "qwen3moe" || arch == "olmo2" || arch == "gemma3")
      c["attention_bias"] = f.contains("blk.0.attn_q.bias");
    if (arch == "phi3" && f.has(p + "attention.sliding_window"))
      c["sliding_window"] = f.get_int(p + "attention.sliding_window");
    if (arch == "llama") {  // Qwen2's q/k/v biases are part of its architecture
      c["attention_bias"] = f.contains("blk.0.attn_q.bias");
      c["mlp_bias"] = f.contains("blk.0.ffn_up.bias");
    }
    if (moe) {
      c["num_experts"] = f.get_int(p + "expert_count");
      c["num_experts_per_tok"] = f.get_int(p + "expert_used_count");
      c["moe_intermediate_size"] = f.get_int(p + "expert_feed_forward_length");
      // llama.cpp renormalises the chosen experts' weights for qwen3moe, not for qwen2moe.
      c["norm_topk_prob"] = f.has(p + "expert_weights_norm") ? f.value(p + "expert_weights_norm").to_bool()
                                                             : arch == "qwen3moe";
      c["decoder_sparse_step"] = 1;
      c["mlp_only_layers"] = nlohmann::json::array();
      if (arch == "qwen2moe")
        c["shared_expert_intermediate_size"] = f.get_int(p + "expert_shared_feed_forward_length");
    }
    if (arch == "gemma2" || arch == "gemma3") {
      c["hidden_act"] = c["hidden_activation"] = "gelu_pytorch_tanh";
      const int64_t head_dim = c.value("head_dim", int64_t{256});
      // Not in the file: llama.cpp scales queries by 1/sqrt(head_dim), or for the
      // 27B models (Gemma 2: 46 layers, Gemma 3: 62) by 1/sqrt(hidden / heads).
      const int64_t big = arch == "gemma2" ? 46 : 62;
      c["query_pre_attn_scalar"] = c["num_hidden_layers"] == big && heads > 0 ? hidden / heads : head_dim;
      c["sliding_window"] = f.get_int(p + "attention.sliding_window");
    }
    if (arch == "deepseek2") deepseek2_config(f, c);
    if (arch == "gemma2") {
      c["attn_logit_softcapping"] = f.get_double(p + "attn_logit_softcapping");
      c["final_logit_softcapping"] = f.get_double(p + "final_logit_softcapping");
    }
    if (arch == "gemma3") {
      // llama.cpp: every 6th layer global, local layers' rope base 10000,
      // rope.freq_base and any linear scaling for the global layers only.
      c["sliding_window_pattern"] = 6;
      c["rope_local_base_freq"] = 10000.0;
      c["final_logit_softcapping"] = nullptr;
      c["attn_logit_softcapping"] = nullptr;
    }
  }
  const bool v3 = arch == "deepseek2" && deepseek_v3_routing(f);  // one llama.cpp arch, two Transformers models
  c["model_type"] = v3 ? "deepseek_v3" : a->model_type;
  c["architectures"] = {v3 ? "DeepseekV3ForCausalLM" : a->causal_lm_class};
  vocab_and_ids(f, p, c);
  return c;
}

namespace gguf_detail {

GgufLayout::GgufLayout(const GgufFile& f) : arch_(f.get_string("general.architecture")), config_(gguf_config_json(f)) {
  const GgufArch* a = gguf_arch(arch_);
  permuted_qk_ = a->permuted_qk;
  norms_plus_one_ = a->norms_plus_one;
  heads_ = config_.contains("n_head") ? config_["n_head"].get<int64_t>() : config_["num_attention_heads"].get<int64_t>();
  kv_heads_ = config_.value("num_key_value_heads", heads_);
  experts_ = config_.value("num_experts", config_.value("n_routed_experts", int64_t{0}));
}

std::vector<GgufPiece> GgufLayout::pieces(const GgufFile& f, const std::string& g) const {
  auto unknown = [&] {
    return UnsupportedError("GGUF file " + f.path() + ": tensor '" + g +
                            "' has no counterpart in the Transformers model that flexmodel knows");
  };
  const TopNames top = top_names(arch_);
  const size_t last = g.rfind('.');
  if (last == std::string::npos) throw unknown();
  const std::string suffix = g.substr(last);  // ".weight" / ".bias"
  if (suffix != ".weight" && suffix != ".bias") throw unknown();
  const std::string stem = g.substr(0, last);
  GgufPiece piece;
  if (stem == "token_embd") piece.name = std::string(top.embed) + suffix;
  else if (stem == "output_norm") piece.name = std::string(top.norm) + suffix;
  else if (stem == "output") piece.name = std::string(top.head) + suffix;
  else if (stem == "position_embd" && *top.positions) piece.name = std::string(top.positions) + suffix;
  if (!piece.name.empty()) {
    piece.minus_one = norms_plus_one_ && stem == "output_norm";
    return {piece};
  }
  // RoPE frequency factors: read into the config (rope_scaling_config), no module's.
  if (suffix == ".weight" && (stem == "rope_freqs" || stem == "rope_factors_long" || stem == "rope_factors_short"))
    return {};
  if (stem.rfind("blk.", 0) != 0) throw unknown();
  const size_t dot = stem.find('.', 4);
  if (dot == std::string::npos) throw unknown();
  const std::string layer = stem.substr(4, dot - 4), part = stem.substr(dot + 1);
  if (layer.empty() || layer.find_first_not_of("0123456789") != std::string::npos) throw unknown();
  const std::string block = top.blocks + layer + ".";

  if (auto e = expert_names().find(part); e != expert_names().end() && experts_ > 0) {
    const auto& shape = f.tensor(g).shape;
    if (shape.size() != 3 || shape[0] != experts_)
      throw FileFormatError("GGUF file " + f.path() + ": tensor '" + g + "' should stack " + std::to_string(experts_) +
                            " experts' matrices ([experts, rows, cols]) but has " + std::to_string(shape.size()) +
                            " dims" + (shape.empty() ? "" : " and " + std::to_string(shape[0]) + " first"));
    std::vector<GgufPiece> out;
    for (int64_t i = 0; i < experts_; ++i) {
      GgufPiece x;
      x.name = block + "mlp.experts." + std::to_string(i) + "." + e->second + suffix;
      x.expert = i;
      out.push_back(x);
    }
    return out;
  }
  if (arch_ == "deepseek2" && part == "exp_probs_b" && suffix == ".bias")  // V3's score correction
    return {GgufPiece{block + "mlp.gate.e_score_correction_bias"}};
  std::string module;
  const auto& over = block_overrides(arch_);
  if (auto o = over.find(part); o != over.end()) {
    module = o->second;
  } else if (auto l = llama_block_names().find(part); l != llama_block_names().end()) {
    module = l->second;
  }
  if (module.empty()) throw unknown();
  piece.name = block + module + suffix;
  if (permuted_qk_ && (part == "attn_q" || part == "attn_k")) {
    piece.rows = GgufPiece::Rows::Unpermute;
    piece.heads = part == "attn_q" ? heads_ : kv_heads_;
  }
  if (arch_ == "gptneox" && part == "attn_qkv") {
    piece.rows = GgufPiece::Rows::HeadsQkv;
    piece.heads = heads_;
  }
  piece.transpose = arch_ == "gpt2" && suffix == ".weight" && f.tensor(g).shape.size() == 2 && part != "attn_norm" &&
                    part != "ffn_norm";
  piece.joined = arch_ == "deepseek2" && (part == "attn_k_b" || part == "attn_v_b");
  piece.minus_one = norms_plus_one_ && part.size() > 4 && part.compare(part.size() - 4, 4, "norm") == 0 &&
                    suffix == ".weight";
  return {piece};
}

at::Tensor GgufLayout::apply(const GgufFile& f, const std::string& g, const GgufPiece& p, at::Tensor t,
                             bool is_float) const {
  if (p.expert >= 0) t = t.select(0, p.expert);
  if (p.rows == GgufPiece::Rows::Unpermute) t = unpermute_rows(t, p.heads, f.path(), g);
  if (p.rows == GgufPiece::Rows::HeadsQkv) t = heads_qkv_rows(t, p.heads, f.path(), g);
  if (is_float && p.transpose) t = t.t().contiguous();
  if (is_float && p.minus_one) t = t - 1.0;
  return t;
}

void GgufLayout::join_pieces(const GgufFile& f, std::map<std::string, at::Tensor>& tensors,
                             std::map<std::string, std::string>& stored) const {
  if (arch_ != "deepseek2") return;
  // kv_b_proj rows per head are [k_nope | v]; the converter stored k_b as
  // [heads, kv_lora, nope] (transposed) and v_b as [heads, v, kv_lora].
  const std::string k_suffix = "self_attn.k_b_proj.weight";
  std::vector<std::string> keys;
  for (const auto& [name, t] : tensors)
    if (name.size() > k_suffix.size() && name.compare(name.size() - k_suffix.size(), k_suffix.size(), k_suffix) == 0)
      keys.push_back(name);
  for (const std::string& k_name : keys) {
    const std::string base = k_name.substr(0, k_name.size() - k_suffix.size()) + "self_attn.";
    const std::string v_name = base + "v_b_proj.weight", kv_name = base + "kv_b_proj.weight";
    auto v = tensors.find(v_name);
    if (v == tensors.end())
      throw NotFoundError("GGUF file " + f.path() + ": tensor '" + stored[k_name] + "' has no attn_v_b beside it");
    const at::Tensor k_b = tensors[k_name], v_b = v->second;
    if (k_b.dim() != 3 || v_b.dim() != 3 || k_b.size(0) != v_b.size(0) || k_b.size(1) != v_b.size(2))
      throw ShapeError("GGUF file " + f.path() + ": tensors '" + stored[k_name] + "' and '" + stored[v_name] +
                       "' do not split one kv_b_proj ([heads, kv_lora, nope] and [heads, v, kv_lora] expected)");
    tensors[kv_name] = at::cat({k_b.transpose(1, 2), v_b}, 1).reshape({-1, k_b.size(1)}).contiguous();
    stored[kv_name] = stored[k_name];
    tensors.erase(k_name);
    tensors.erase(v_name);
  }
}

}  // namespace gguf_detail
}  // namespace flex
