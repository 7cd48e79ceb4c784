// The architecture registry (flex/models/architecture.h): every model_type
// flexmodel supports, one entry each. An entry says which family's code builds
// it, its Hugging Face class names, its stage names, Transformers' config
// defaults, and reads what only it has. For the Llama family, the DecoderArch
// beside the entry lists what the architecture does differently from Llama
// (Transformers 4.47; Qwen3 from 4.51); the numbers (window, soft-caps,
// biases, head_dim) come from its config.
#include "config_reader.h"

#include <flex/models/architecture.h>
#include <flex/models/decoder.h>

#include <cmath>

namespace flex {

namespace {

using detail::ConfigReader;
using Arch = DecoderArch;

// ---- shared pieces -------------------------------------------------------

/// An entry of the Llama family: classes <prefix>ForCausalLM and
/// <prefix>DecoderLayer, stages under "model", the model-level rotary_emb
/// the forward calls (Transformers 5).
Architecture decoder_entry(const std::string& model_type, const Arch& arch) {
  Architecture a;
  a.model_type = model_type;
  a.family = ArchFamily::Decoder;
  a.decoder = std::make_shared<const Arch>(arch);
  a.causal_lm_class = arch.cls("ForCausalLM");
  a.block_class = arch.cls("DecoderLayer");
  a.names = {"model", "embed_tokens", "", "", "layers", "norm", "lm_head", "", "self_attn"};
  a.names.rotary = "rotary_emb";
  return a;
}

/// q/k/v/o biases from attention_bias, false when absent.
void read_attention_bias(const ConfigReader& r, ModelConfig& c) {
  c.attention_bias = c.qkv_bias = r.bool_or("attention_bias", false);
}

/// No biases at all, whatever the config says (Mistral, Phi-3, Mixtral).
void no_biases(ModelConfig& c) { c.attention_bias = c.qkv_bias = false; }

/// Qwen2 and its relatives slide only under flash attention, in some layers.
void refuse_qwen_sliding(const ConfigReader& r) {
  if (r.bool_or("use_sliding_window", false))
    r.fail("use_sliding_window", "true is not supported (Qwen2/Qwen3 slide only in layers >= max_window_layers, "
                                 "and only under flash attention)");
}

// ---- GPT-2 and GPT-NeoX: their own families ------------------------------

Architecture gpt2() {
  Architecture a;
  a.model_type = "gpt2";
  a.family = ArchFamily::GPT2;
  a.causal_lm_class = "GPT2LMHeadModel";
  a.block_class = "GPT2Block";
  a.names = {"transformer", "wte", "wpe", "drop", "h", "ln_f", "lm_head", "", "attn"};
  a.defaults.act_field = "activation_function";
  a.square_mask_buffer = true;
  return a;
}

Architecture gpt_neox() {
  Architecture a;
  a.model_type = "gpt_neox";
  a.family = ArchFamily::GPTNeoX;
  a.causal_lm_class = "GPTNeoXForCausalLM";
  a.block_class = "GPTNeoXLayer";
  a.names = {"gpt_neox", "embed_in", "", "emb_dropout", "layers", "final_layer_norm", "lm_head", "rotary_emb",
             "attention"};
  // Transformers 5 calls the head lm_head; checkpoints (and 4.x) call it embed_out.
  a.checkpoint_renames = {{"embed_out.", "lm_head."}};
  a.square_mask_buffer = true;
  return a;
}

// ---- the Llama family ------------------------------------------------------

Architecture llama() {
  Arch d;
  d.prefix = "Llama";
  Architecture a = decoder_entry("llama", d);
  a.read_config = [](const ConfigReader& r, ModelConfig& c) {
    read_attention_bias(r, c);
    c.mlp_bias = r.bool_or("mlp_bias", false);
    if (r.int_or("pretraining_tp", 1) != 1)
      r.fail("pretraining_tp", "other than 1 is not supported (it only changes how HF splits matmuls)");
  };
  return a;
}

// Sliding-window attention (config.sliding_window).
Architecture mistral() {
  Arch d;
  d.prefix = "Mistral";
  Architecture a = decoder_entry("mistral", d);
  a.defaults.max_position_embeddings = 4096 * 32;
  a.read_config = [](const ConfigReader& r, ModelConfig& c) {
    no_biases(c);
    c.sliding_window = detail::window_or(r, 4096);
  };
  return a;
}

// Llama with q/k/v biases (always) and none on o_proj.
Architecture qwen2() {
  Arch d;
  d.prefix = "Qwen2";
  Architecture a = decoder_entry("qwen2", d);
  a.defaults.max_position_embeddings = 32768;
  a.read_config = [](const ConfigReader& r, ModelConfig& c) {
    c.qkv_bias = true, c.attention_bias = false;
    refuse_qwen_sliding(r);
  };
  return a;
}

// Qwen2 with per-head q/k RMSNorms and no biases; no per-layer rotary modules.
Architecture qwen3() {
  Arch d;
  d.prefix = "Qwen3";
  d.rope = Arch::Rope::Model;
  d.qk_norm = Arch::QKNorm::PerHead;
  d.multiply_scale = true;
  Architecture a = decoder_entry("qwen3", d);
  a.defaults.max_position_embeddings = 32768;
  a.defaults.head_dim = 128;
  a.read_config = [](const ConfigReader& r, ModelConfig& c) {
    read_attention_bias(r, c);
    refuse_qwen_sliding(r);
  };
  return a;
}

// Sandwich norms with (1 + w) scales, embeddings * sqrt(hidden) inside
// embed_tokens (Transformers 5's Gemma2TextScaledWordEmbedding), scores
// scaled by query_pre_attn_scalar and soft-capped, sliding window on even
// layers, final logits soft-capped (all numbers from the config).
Architecture gemma2() {
  Arch d;
  d.prefix = "Gemma2";
  d.scaled_embedding_class = "Gemma2TextScaledWordEmbedding";
  d.norms = Arch::Norms::Sandwich;
  d.norm_scale = RMSNorm::Scale::OnePlusWeight;
  d.scale_embeddings = true;
  d.multiply_scale = true;
  Architecture a = decoder_entry("gemma2", d);
  a.defaults.max_position_embeddings = 8192;
  a.defaults.head_dim = 256;
  a.defaults.tie_word_embeddings = true;
  a.defaults.act_field = "hidden_activation";
  a.defaults.act = "gelu_pytorch_tanh";
  a.read_config = [](const ConfigReader& r, ModelConfig& c) {
    read_attention_bias(r, c);
    c.sliding_window = detail::window_or(r, 4096);
    c.sliding_window_pattern = 2;
    c.query_pre_attn_scalar = r.number_or("query_pre_attn_scalar", 256);
    if (!(c.query_pre_attn_scalar > 0)) r.fail("query_pre_attn_scalar", "must be positive");
    c.attn_logit_softcapping = detail::soft_cap_or(r, "attn_logit_softcapping", 50.0);
    c.final_logit_softcapping = detail::soft_cap_or(r, "final_logit_softcapping", 30.0);
  };
  return a;
}

// Fused qkv_proj and gate_up_proj, residual dropouts, longrope scaling.
Architecture phi3() {
  Arch d;
  d.prefix = "Phi3";
  d.fused_qkv = true;
  d.fused_gate_up = true;
  d.residual_dropouts = true;
  d.act_name = "activation_fn";
  Architecture a = decoder_entry("phi3", d);
  a.defaults.max_position_embeddings = 4096;
  a.defaults.norm_eps = 1e-5;
  a.longrope = true;
  a.read_config = [](const ConfigReader& r, ModelConfig& c) {
    if (r.find("head_dim")) r.fail("head_dim", "is not a Phi-3 field (Phi-3 uses hidden_size / heads)");
    no_biases(c);
    c.sliding_window = detail::window_or(r, 0);
    if (detail::rope_number(r, "partial_rotary_factor", 1.0) != 1.0)
      r.fail("partial_rotary_factor", "other than 1 is not supported for phi3");
  };
  return a;
}

// Norms after the sublayers (no pre-norms), q/k RMSNorms over the whole projections.
Architecture olmo2() {
  Arch d;
  d.prefix = "Olmo2";
  d.norms = Arch::Norms::Post;
  d.qk_norm = Arch::QKNorm::Projection;
  d.norm_scale = RMSNorm::Scale::WeightThenCast;
  Architecture a = decoder_entry("olmo2", d);
  a.defaults.norm_eps = 1e-5;
  a.read_config = read_attention_bias;
  return a;
}

// Mistral with a sparse MoE block (mlp: experts w1 gate, w3 up, w2 down,
// top-k weights renormalised); 4.47's per-layer rotary tables kept idle. Checkpoints
// (and Transformers 4) call the block block_sparse_moe; Transformers 5 mlp.
Architecture mixtral() {
  Arch d;
  d.prefix = "Mixtral";
  d.rope = Arch::Rope::ModelWithIdleLayerTables;
  d.expert.cls = "MixtralBlockSparseTop2MLP";
  d.expert.gate = "w1", d.expert.up = "w3", d.expert.down = "w2";
  d.expert.down_before_up = true;
  Architecture a = decoder_entry("mixtral", d);
  a.checkpoint_block_renames = {{"block_sparse_moe.", "mlp."}};
  a.defaults.max_position_embeddings = 4096 * 32;
  a.defaults.norm_eps = 1e-5;
  a.defaults.rope_theta = 1e6;
  a.read_config = [](const ConfigReader& r, ModelConfig& c) {
    no_biases(c);
    c.sliding_window = detail::window_or(r, 0);
    detail::ExpertFields f;
    f.count_field = "num_local_experts", f.count = 8, f.per_token = 2, f.uniform = true;
    detail::read_experts(r, c, f);
  };
  return a;
}

// Qwen2 with a sparse MoE block (mlp) on the layers the config makes sparse:
// Qwen2MoeMLP experts plus a shared expert gated by sigmoid(shared_expert_gate).
Architecture qwen2_moe() {
  Arch d;
  d.prefix = "Qwen2Moe";
  d.expert.cls = "Qwen2MoeMLP";
  d.shared_expert = true;
  Architecture a = decoder_entry("qwen2_moe", d);
  a.defaults.max_position_embeddings = 32768;
  a.read_config = [](const ConfigReader& r, ModelConfig& c) {
    c.qkv_bias = true, c.attention_bias = false;
    refuse_qwen_sliding(r);
    detail::read_experts(r, c, detail::ExpertFields{});
  };
  return a;
}


// ---- Transformers 5 architectures ------------------------------------------
// (no 4.47 version exists: names, order and arithmetic are 5.23's)

/// Default layer types where the config has no layer_types: sliding except
/// every `period`-th layer (Gemma 3: 6, OLMo 3: 4).
void default_layer_types(ModelConfig& c, int64_t period) {
  c.sliding_layers.clear();
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) c.sliding_layers.push_back((i + 1) % period != 0);
}

// Gemma 2's sandwich norms and (1 + w) scales with per-head q/k norms, 5
// local : 1 global layers (layer_types), RoPE per layer type (local base
// rope_local_base_freq), embeddings scaled inside embed_tokens, soft-caps
// only where the config asks.
Architecture gemma3_text() {
  Arch d = *gemma2().decoder;
  d.prefix = "Gemma3";
  d.rope = Arch::Rope::ModelPerLayerType;
  d.qk_norm = Arch::QKNorm::PerHeadTransposed;  // after the transpose, as Transformers 5.23
  d.scaled_embedding_class = "Gemma3TextScaledWordEmbedding";
  Architecture a = decoder_entry("gemma3_text", d);
  a.defaults.max_position_embeddings = 131072;
  a.defaults.head_dim = 256;
  a.defaults.tie_word_embeddings = true;
  a.defaults.act_field = "hidden_activation";
  a.defaults.act = "gelu_pytorch_tanh";
  a.read_config = [](const ConfigReader& r, ModelConfig& c) {
    read_attention_bias(r, c);
    if (r.bool_or("use_bidirectional_attention", false))
      r.fail("use_bidirectional_attention", "true (EmbeddingGemma) is not supported: flexmodel runs causal LMs");
    c.sliding_window = detail::window_or(r, 4096);
    default_layer_types(c, r.int_or("sliding_window_pattern", 6));
    c.query_pre_attn_scalar = r.number_or("query_pre_attn_scalar", 256);
    if (!(c.query_pre_attn_scalar > 0)) r.fail("query_pre_attn_scalar", "must be positive");
    c.attn_logit_softcapping = detail::soft_cap_or(r, "attn_logit_softcapping", 0.0);
    c.final_logit_softcapping = detail::soft_cap_or(r, "final_logit_softcapping", 0.0);
    detail::LayerTypeRope rope;
    rope.full_theta = 1e6, rope.sliding_theta = 1e4, rope.sliding_theta_field = "rope_local_base_freq";
    detail::read_layer_type_rope(r, c, rope);
  };
  return a;
}

// OLMo 2 with sliding windows on the layers layer_types names (default: all
// but every 4th) and RoPE per layer type (legacy rope_scaling: full layers).
Architecture olmo3() {
  Arch d = *olmo2().decoder;
  d.prefix = "Olmo3";
  d.rope = Arch::Rope::ModelPerLayerType;
  Architecture a = decoder_entry("olmo3", d);
  a.defaults.norm_eps = 1e-5;
  a.defaults.rope_theta = 500000.0;
  a.read_config = [](const ConfigReader& r, ModelConfig& c) {
    read_attention_bias(r, c);
    c.sliding_window = detail::window_or(r, 4096);
    default_layer_types(c, 4);
    detail::LayerTypeRope rope;
    rope.full_theta = rope.sliding_theta = 500000.0;  // a legacy rope_theta reaches the full layers only
    detail::read_layer_type_rope(r, c, rope);
  };
  return a;
}

// Qwen3's attention with Qwen2-MoE's sparse block minus the shared expert:
// 128 experts, top-8, norm_topk_prob, decoder_sparse_step, mlp_only_layers.
Architecture qwen3_moe() {
  Arch d = *qwen3().decoder;
  d.prefix = "Qwen3Moe";
  d.expert.cls = "Qwen3MoeMLP";
  Architecture a = decoder_entry("qwen3_moe", d);
  a.defaults.max_position_embeddings = 32768;
  a.read_config = [](const ConfigReader& r, ModelConfig& c) {
    read_attention_bias(r, c);
    refuse_qwen_sliding(r);
    detail::ExpertFields f;
    f.count = 128, f.per_token = 8, f.moe_intermediate = 768, f.shared_expert = false;
    detail::read_experts(r, c, f);
  };
  return a;
}

// Gemma 3's multimodal checkpoints (Gemma3ForConditionalGeneration), loaded
// as their language model: gemma3_text read from text_config, the language
// model's keys renamed (5.x: "model.language_model.", 4.x:
// "language_model.model."), the vision tower and projector dropped.
Architecture gemma3() {
  Architecture a = gemma3_text();
  a.model_type = "gemma3";
  a.nested_config = "text_config";
  // Gemma3TextConfig's defaults for the sizes (gemma-3-4b-it's text_config omits some).
  a.nested_defaults = {{"vocab_size", 262208}, {"hidden_size", 2304}, {"intermediate_size", 9216},
                       {"num_hidden_layers", 26}, {"num_attention_heads", 8}, {"num_key_value_heads", 4},
                       {"head_dim", 256}};
  a.checkpoint_renames = {{"model.language_model.", "model."},
                          {"language_model.model.", "model."},
                          {"language_model.lm_head.", "lm_head."}};
  a.checkpoint_dropped = {"model.vision_tower.", "model.multi_modal_projector.", "vision_tower.",
                          "multi_modal_projector."};
  return a;
}

// Llama-shaped attention with biases, learned sinks and alternating sliding
// (128) / full layers; YaRN RoPE; every layer's MLP is GptOssMLP (router with
// bias, top-k then softmax, fused clamped-SwiGLU experts with biases).
Architecture gpt_oss() {
  Arch d;
  d.prefix = "GptOss";
  d.rope = Arch::Rope::Model;
  d.norm_scale = RMSNorm::Scale::WeightThenCast;
  d.moe = Arch::Moe::GptOss;
  d.attention_sinks = true;
  d.half_rotary_tables = true;
  d.multiply_scale = true;
  Architecture a = decoder_entry("gpt_oss", d);
  a.defaults.max_position_embeddings = 131072;
  a.defaults.norm_eps = 1e-5;
  a.defaults.head_dim = 64;
  a.defaults.rope_theta = 150000.0;
  a.read_config = [](const ConfigReader& r, ModelConfig& c) {
    c.attention_bias = c.qkv_bias = r.bool_or("attention_bias", true);
    c.sliding_window = detail::window_or(r, 128);
    default_layer_types(c, 2);
    detail::ExpertFields f;
    f.count_field = "num_local_experts", f.count = 128, f.per_token = 4, f.uniform = true;
    detail::read_experts(r, c, f);
    c.norm_topk_prob = false;  // the softmax runs over the chosen logits only
    c.swiglu_alpha = r.number_or("swiglu_alpha", 1.702);
    c.swiglu_limit = r.number_or("swiglu_limit", 7.0);
    if (!(c.swiglu_limit > 0)) r.fail("swiglu_limit", "must be positive");
    if (!r.find("rope_parameters") && !r.find("rope_scaling")) {
      // Transformers' default: YaRN x32 over 4096 positions, bounds not rounded.
      RopeScaling& s = c.rope_scaling;
      s.rope_type = "yarn", s.factor = 32.0, s.beta_fast = 32.0, s.beta_slow = 1.0, s.truncate = false;
      s.original_max_position_embeddings = 4096;
      s.attention_factor = 0.1 * std::log(32.0) + 1.0;
    }
  };
  return a;
}

// DeepSeek's multi-head latent attention (q_a/q_b low-rank with its norm, or
// a plain q_proj; kv_a_proj_with_mqa -> [latent | shared rope key],
// kv_a_layernorm, kv_b_proj -> [k_nope | v] per head), read into cfg.mla.
void read_latent_attention(const ConfigReader& r, ModelConfig& c, bool rope_interleave_default) {
  auto& m = c.mla;
  // Absent: Transformers' 1536; null: no q-LoRA, a plain q_proj.
  m.q_lora_rank = r.j.contains("q_lora_rank") ? r.int_or("q_lora_rank", 0) : 1536;
  m.kv_lora_rank = r.int_or("kv_lora_rank", 512);
  m.qk_nope_head_dim = r.int_or("qk_nope_head_dim", 128);
  m.qk_rope_head_dim = r.int_or("qk_rope_head_dim", 64);
  m.v_head_dim = r.int_or("v_head_dim", 128);
  m.rope_interleave = r.bool_or("rope_interleave", rope_interleave_default);
  for (auto [field, v] : {std::pair<const char*, int64_t>{"kv_lora_rank", m.kv_lora_rank},
                          {"qk_nope_head_dim", m.qk_nope_head_dim}, {"v_head_dim", m.v_head_dim}})
    if (v <= 0 || v > (int64_t{1} << 20)) r.fail(field, "must be between 1 and 2^20, got " + std::to_string(v));
  if (m.q_lora_rank < 0 || m.q_lora_rank > (int64_t{1} << 20)) r.fail("q_lora_rank", "must be positive or null");
  if (m.qk_rope_head_dim <= 0 || m.qk_rope_head_dim % 2 != 0)
    r.fail("qk_rope_head_dim", "must be positive and even, got " + std::to_string(m.qk_rope_head_dim));
  c.head_dim = m.qk_rope_head_dim;  // the rotary module's width, as Transformers sets it
  if (c.num_key_value_heads != c.num_attention_heads)
    r.fail("num_key_value_heads", "must equal num_attention_heads for latent attention (every head has its keys)");
}

// DeepSeek's mixture of experts: n_routed_experts routed experts plus
// n_shared_experts always-on ones (one MLP of moe_intermediate * n_shared),
// groups, routed_scaling_factor, dense first layers; `d` holds Transformers'
// defaults for the fields a config leaves out.
struct DeepseekMoeDefaults {
  detail::ExpertFields experts;
  int64_t n_shared = 1, first_dense = 0, n_group = 1, topk_group = 1;
  double scaling = 1.0;
};
void read_deepseek_experts(const ConfigReader& r, ModelConfig& c, const DeepseekMoeDefaults& d) {
  detail::read_experts(r, c, d.experts);
  const int64_t shared = r.int_or("n_shared_experts", d.n_shared);
  if (shared < 0) r.fail("n_shared_experts", "must not be negative");
  c.shared_expert_intermediate_size = c.moe_intermediate_size * shared;
  c.routed_scaling_factor = r.number_or("routed_scaling_factor", d.scaling);
  c.first_k_dense_replace = r.int_or("first_k_dense_replace", d.first_dense);
  if (c.first_k_dense_replace < 0) r.fail("first_k_dense_replace", "must not be negative");
  c.n_group = r.int_or("n_group", d.n_group);
  c.topk_group = r.int_or("topk_group", d.topk_group);
  if (c.n_group <= 0 || c.num_experts % c.n_group != 0)
    r.fail("n_group", "must divide n_routed_experts (" + std::to_string(c.num_experts) + "), got " +
                          std::to_string(c.n_group));
  if (c.topk_group <= 0 || c.topk_group > c.n_group)
    r.fail("topk_group", "must be between 1 and n_group (" + std::to_string(c.n_group) + "), got " +
                             std::to_string(c.topk_group));
  if (c.num_experts_per_tok > c.topk_group * (c.num_experts / c.n_group))
    r.fail("num_experts_per_tok", "exceeds the experts of topk_group (" + std::to_string(c.topk_group) + ") groups");
}

// DeepSeek-V3 (and Kimi-K2): latent attention, YaRN with mscale in the
// softmax scale, rotated pairs interleaved; MoE layers from
// first_k_dense_replace with sigmoid scores, e_score_correction_bias for
// the choice, group-limited top-k (group score: sum of its top 2),
// normalised weights * routed_scaling_factor, shared experts. Experts keep
// the checkpoint's per-expert names (Transformers 5 fuses them in memory).
Architecture deepseek_v3() {
  Arch d;
  d.prefix = "DeepseekV3";
  d.rope = Arch::Rope::Model;
  d.latent_attention = true;
  d.routing = Arch::Routing::DeepseekV3;
  d.expert.cls = "DeepseekV3MLP";
  d.shared_expert = true;
  d.shared_expert_name = "shared_experts";
  d.shared_expert_gated = false;
  d.router_after_experts = true;
  d.router_class = "DeepseekV3TopkRouter";
  d.moe_class = "DeepseekV3MoE";
  Architecture a = decoder_entry("deepseek_v3", d);
  a.defaults.max_position_embeddings = 4096;
  a.defaults.head_dim = 64;
  a.drop_extra_layers = true;  // the multi-token-prediction layer
  a.read_config = [](const ConfigReader& r, ModelConfig& c) {
    read_attention_bias(r, c);
    read_latent_attention(r, c, /*rope_interleave_default=*/true);
    DeepseekMoeDefaults d;
    d.experts.count_field = "n_routed_experts", d.experts.count = 256, d.experts.per_token = 8;
    d.experts.moe_intermediate = 2048, d.experts.shared_expert = false;  // n_shared_experts instead
    d.n_shared = 1, d.first_dense = 3, d.n_group = 8, d.topk_group = 4, d.scaling = 2.5;
    read_deepseek_experts(r, c, d);
    c.norm_topk_prob = r.bool_or("norm_topk_prob", true);
    const std::string method = r.string_or("topk_method", "noaux_tc");
    if (method != "noaux_tc") r.fail("topk_method", "'" + method + "' is not DeepSeek-V3's routing (noaux_tc)");
    const std::string scoring = r.string_or("scoring_func", "sigmoid");
    if (scoring != "sigmoid") r.fail("scoring_func", "'" + scoring + "' is not DeepSeek-V3's routing (sigmoid)");
  };
  return a;
}

// DeepSeek-V2 (and V2-Lite): V3's latent attention with the rotation on
// complex pairs (output interleaved) and softmax routing, greedy or
// group_limited_greedy (group score: its best expert), weights *
// routed_scaling_factor and never renormalised.
Architecture deepseek_v2() {
  Arch d = *deepseek_v3().decoder;
  d.prefix = "DeepseekV2";
  d.routing = Arch::Routing::DeepseekV2;
  d.expert.cls = "DeepseekV2MLP";
  d.router_class = "DeepseekV2TopkRouter";
  d.moe_class = "DeepseekV2Moe";
  d.complex_rope = true;
  Architecture a = decoder_entry("deepseek_v2", d);
  a.defaults.max_position_embeddings = 2048;
  a.defaults.head_dim = 64;
  a.drop_extra_layers = true;
  a.read_config = [](const ConfigReader& r, ModelConfig& c) {
    read_attention_bias(r, c);
    read_latent_attention(r, c, /*rope_interleave_default=*/false);
    DeepseekMoeDefaults d;
    d.experts.count_field = "n_routed_experts", d.experts.count = 64, d.experts.per_token = 6;
    d.experts.moe_intermediate = 1407, d.experts.shared_expert = false;
    d.n_shared = 2;
    read_deepseek_experts(r, c, d);
    const std::string method = r.string_or("topk_method", "greedy");
    if (method != "greedy" && method != "group_limited_greedy")
      r.fail("topk_method", "'" + method + "' is not supported (greedy, group_limited_greedy)");
    c.group_limited = method == "group_limited_greedy";
    c.norm_topk_prob = false;  // Transformers' DeepSeek-V2 router never renormalises
  };
  return a;
}

}  // namespace

const std::vector<Architecture>& architectures() {
  static const std::vector<Architecture> all = {gpt2(),  llama(), gpt_neox(), mistral(), qwen2(),    qwen3(),
                                                gemma2(), phi3(), olmo2(),    mixtral(), qwen2_moe(),
                                                gemma3_text(), gemma3(), olmo3(), qwen3_moe(), gpt_oss(),
                                                deepseek_v3(), deepseek_v2()};
  return all;
}

const Architecture* find_architecture(const std::string& model_type) {
  for (const auto& a : architectures())
    if (a.model_type == model_type) return &a;
  return nullptr;
}

const Architecture& architecture(const ModelConfig& cfg) {
  if (const Architecture* a = find_architecture(cfg.model_type)) return *a;
  throw ConfigError(cfg.source + ": model_type '" + cfg.model_type + "' is not supported (supported: " +
                    supported_model_types() + ")");
}

std::string supported_model_types() {
  std::string out;
  for (const auto& a : architectures()) out += (out.empty() ? "" : ", ") + a.model_type;
  return out;
}

std::string block_name(const Architecture& arch, int64_t i) {
  return arch.names.base + "." + arch.names.blocks + "." + std::to_string(i);
}
std::string attention_name(const Architecture& arch, int64_t i) { return block_name(arch, i) + "." + arch.names.attention; }
std::string final_norm_name(const Architecture& arch) { return arch.names.base + "." + arch.names.norm; }

std::string ModelConfig::causal_lm_class() const {
  const Architecture* a = find_architecture(model_type);
  return a ? a->causal_lm_class : "";
}

}  // namespace flex
