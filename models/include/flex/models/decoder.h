#pragma once
// The Llama family: decoder-only transformers with RMSNorm, rotary
// grouped-query attention and a gated MLP. Llama, Mistral, Qwen2, Qwen3,
// Gemma 2, Phi-3 and OLMo 2 are the same five classes here; a DecoderArch
// lists what one architecture does differently (where RoPE is computed,
// fused projections, q/k norms, where the norms sit, embedding scale, ...),
// and the config supplies the numbers (sliding window, soft-caps, biases).
// Every architecture's DecoderArch sits in its registry entry
// (models/src/architectures.cpp): adding the next Llama-like model is one
// entry there.
// Mixture-of-experts members (Mixtral, Qwen2-MoE) replace the MLP of their
// sparse layers with a SparseMoeBlock (flex/models/moe.h).
//
// Names and classes are Transformers 4.47's (eager attention), with the
// architecture's prefix: <P>ForCausalLM { model: <P>Model { embed_tokens,
// [embed_dropout], layers.N: <P>DecoderLayer { self_attn: <P>Attention {
// q_proj, k_proj, v_proj | qkv_proj, o_proj, [rotary_emb], [q_norm, k_norm] },
// mlp: <P>MLP { gate_proj, up_proj | gate_up_proj, down_proj, act_fn |
// activation_fn }, the norms }, norm, [rotary_emb] }, lm_head }. Each
// module is called in the architecture's own order. Hook points as in
// causal_lm.h; hook_attn_probs holds the probabilities after soft-capping,
// the causal mask, padding and the sliding window.
//
// Sliding window (Mistral, Phi-3, Gemma 2's even layers): key j is visible to
// query i iff i - window < j <= i, counted in cache positions, so decoding
// with the KV cache gives what recomputing the whole sequence gives.
#include <flex/hooks/nn.h>
#include <flex/models/causal_lm.h>
#include <flex/models/rotary.h>
#include <flex/models/staged_model.h>

#include <string>

namespace flex {

/// The class and child names of a gated MLP: down(act(gate(x)) * up(x)).
struct GatedMLPNames {
  std::string cls;  // "LlamaMLP", "MixtralBlockSparseTop2MLP", ...
  std::string gate = "gate_proj", up = "up_proj", down = "down_proj", act = "act_fn";
  bool down_before_up = false;  // registration order gate, down, up (Mixtral's w1, w2, w3)
};

/// What one Llama-family architecture does differently.
struct DecoderArch {
  /// Class-name prefix: "Llama" gives LlamaForCausalLM, LlamaModel, ...
  std::string prefix;

  /// Where cos/sin come from. Always one model.rotary_emb, called once per
  /// forward as in Transformers 5 (ModelPerLayerType: with a setting per
  /// layer type, called once per type present: Gemma 3, OLMo 3). Beside it,
  /// architectures that Transformers 4.47 gave a self_attn.rotary_emb keep
  /// that per-layer module, never called (its 4.47 tree, which the
  /// first-wave fixtures and Accelerate device maps of 4.x checkpoints
  /// name): a plain copy (Llama, Qwen2, Mistral, Gemma 2, Phi-3, OLMo 2) or
  /// its cos/sin tables (Mixtral, CachedRotaryEmbedding).
  enum class Rope { Model, ModelWithIdleLayerCopies, ModelWithIdleLayerTables, ModelPerLayerType };
  Rope rope = Rope::ModelWithIdleLayerCopies;

  /// q/k RMSNorms: over the whole projection before the head split (OLMo 2),
  /// per head over head_dim on [B, T, heads, D] before the transpose (Qwen3),
  /// or per head on [B, heads, T, D] after it (Gemma 3): the values are the
  /// same, the layout a hook sees is Transformers'.
  enum class QKNorm { None, Projection, PerHead, PerHeadTransposed };
  QKNorm qk_norm = QKNorm::None;

  /// Where the block's norms sit:
  ///   Pre:      h += attn(input_ln(h)); h += mlp(post_attention_ln(h))
  ///   Sandwich: h += post_attention_ln(attn(input_ln(h)));
  ///             h += post_feedforward_ln(mlp(pre_feedforward_ln(h)))   (Gemma 2)
  ///   Post:     h += post_attention_ln(attn(h)); h += post_feedforward_ln(mlp(h)) (OLMo 2)
  enum class Norms { Pre, Sandwich, Post };
  Norms norms = Norms::Pre;

  bool fused_qkv = false;           // qkv_proj = [q | k | v] rows (Phi-3)
  bool fused_gate_up = false;       // gate_up_proj = [gate | up] rows (Phi-3)
  bool residual_dropouts = false;   // resid_attn/mlp_dropout + idle embed_dropout (Phi-3)
  std::string act_name = "act_fn";  // the MLP's activation child ("activation_fn" in Phi-3)
  RMSNorm::Scale norm_scale = RMSNorm::Scale::Weight;
  bool scale_embeddings = false;    // embeddings * sqrt(hidden), in the hidden dtype (Gemma)
  /// Where the scale is applied: after the lookup (empty) or inside
  /// embed_tokens, a module of this class (Transformers 5's
  /// Gemma2/Gemma3TextScaledWordEmbedding), so a hook on it sees scaled embeddings.
  std::string scaled_embedding_class;
  /// Scores as q.k * scale (Gemma 2, Qwen3) instead of q.k / sqrt(head_dim):
  /// the same number up to rounding, kept to match bit for bit.
  bool multiply_scale = false;

  /// Mixture of experts (config.num_experts > 0): the sparse block's name in
  /// the layer, its experts' layout and whether a gated shared expert runs
  /// beside them (Qwen2-MoE).
  GatedMLPNames expert;
  bool shared_expert = false;
  /// Which sparse block: SparseMoeBlock (softmax, top-k, per-expert MLPs) or
  /// gpt-oss's GptOssMLP (router with bias, top-k logits then softmax, fused
  /// clamped-SwiGLU experts with biases; flex/models/gpt_oss_moe.h).
  enum class Moe { Sparse, GptOss };
  Moe moe = Moe::Sparse;
  /// Learned attention sinks: self_attn.sinks [heads], one extra logit per
  /// head in every softmax row (gpt-oss).
  bool attention_sinks = false;
  /// The model's rotary_emb returns cos/sin over half of head_dim, each
  /// frequency once (gpt-oss, whose rotation pairs the two halves); the
  /// attention uses them widened to the usual [cos, cos] layout.
  bool half_rotary_tables = false;

  /// DeepSeek's sparse blocks (SparseMoeBlock, moe.h). How the experts are
  /// chosen and weighted: softmax top-k (Mixtral, Qwen), DeepSeek-V2 (softmax,
  /// optionally limited to the best groups by their best expert, weights *
  /// routed_scaling_factor), DeepSeek-V3 (sigmoid scores, + e_score_correction_bias
  /// for the choice only, groups ranked by their top-2 sum, weights
  /// renormalised where norm_topk_prob, * routed_scaling_factor).
  enum class Routing { Softmax, DeepseekV2, DeepseekV3 };
  Routing routing = Routing::Softmax;
  std::string moe_class;      // the block's class; empty: <prefix>SparseMoeBlock
  std::string router_class;   // the gate's class (a router in float32); empty: a Linear
  bool router_after_experts = false;  // registration order experts, gate, shared (DeepSeek)
  std::string shared_expert_name = "shared_expert";  // "shared_experts" (DeepSeek)
  bool shared_expert_gated = true;  // sigmoid(shared_expert_gate(x)) * shared (Qwen2-MoE)

  /// DeepSeek's multi-head latent attention (LatentAttention,
  /// flex/models/latent_attention.h) instead of DecoderAttention; the config's
  /// mla fields give its sizes. `complex_rope`: its rotation multiplies
  /// (2i, 2i+1) pairs as complex numbers and keeps them interleaved
  /// (DeepSeek-V2); otherwise config.mla.rope_interleave decides.
  bool latent_attention = false;
  bool complex_rope = false;

  std::string cls(const std::string& suffix) const { return prefix + suffix; }
  /// The dense MLP's names (activation child act_name).
  GatedMLPNames mlp_names() const {
    GatedMLPNames n;
    n.cls = cls("MLP");
    n.act = act_name;
    return n;
  }
};

/// Which heads an attention module holds: all of them in one process, a
/// tensor-parallel rank's share otherwise. Query head q_first + i uses key/value
/// head (q_first + i) / group, stored locally at that index minus kv_first.
struct AttentionHeads {
  int64_t q_first = 0, q_count = 0, kv_first = 0, kv_count = 0;
  int64_t group = 1;  // query heads per key/value head in the whole model
  static AttentionHeads all(const ModelConfig& cfg);
};

class DecoderAttention : public Module {
 public:
  DecoderAttention(const DecoderArch& arch, const ModelConfig& cfg, int64_t layer_idx, const at::TensorOptions& opts,
                   AttentionHeads heads = {});
  Value forward(Inputs inputs) override;
  /// Null where the architecture has the fused qkv_proj instead, and the reverse.
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, qkv_proj, o_proj;
  std::shared_ptr<RMSNorm> q_norm, k_norm;      // OLMo 2, Qwen3
  std::shared_ptr<RotaryEmbedding> rotary_emb;  // null in Qwen3
  std::shared_ptr<Identity> hook_attn_probs, hook_head_out;
  at::Tensor sinks;  // [heads] where the architecture has attention sinks
  const AttentionHeads& heads() const { return heads_; }

 private:
  // A projection y [B, T, n * head_dim] of x as heads [B, n, T, head_dim], its q/k norm applied where the architecture puts it.
  at::Tensor to_heads(at::Tensor y, const std::shared_ptr<RMSNorm>& norm, const at::Tensor& x, int64_t n_heads);
  DecoderArch arch_;
  ModelConfig cfg_;
  int64_t layer_idx_;
  AttentionHeads heads_;
  at::Tensor kv_index_;  // local kv head of each local query head, when not a plain repeat
};

class DecoderMLP : public Module {
 public:
  /// `intermediate` >= 0 overrides the config's (experts, a tensor-parallel
  /// rank's share; 0: an expert another rank owns, whose output is zeros);
  /// `names` the architecture's dense MLP names.
  DecoderMLP(const DecoderArch& arch, const ModelConfig& cfg, const at::TensorOptions& opts, int64_t intermediate = -1,
             const GatedMLPNames* names = nullptr);
  Value forward(Inputs inputs) override;
  std::shared_ptr<Linear> gate_proj, up_proj, gate_up_proj, down_proj;  // gate/up or gate_up
  std::shared_ptr<Activation> act_fn;
};

class SparseMoeBlock;
class LatentAttention;

/// An embedding that multiplies its rows by a scale (non-persistent buffer
/// embed_scale, cast to the weight's dtype first): Gemma 3's embed_tokens.
class ScaledEmbedding : public Embedding {
 public:
  ScaledEmbedding(std::string class_name, int64_t num, int64_t dim, double scale, const at::TensorOptions& opts);
  Value forward(Inputs inputs) override;
  at::Tensor embed_scale;
};

class DecoderLayer : public Module {
 public:
  DecoderLayer(const DecoderArch& arch, const ModelConfig& cfg, int64_t layer_idx, const at::TensorOptions& opts);
  Value forward(Inputs inputs) override;
  std::shared_ptr<DecoderAttention> self_attn;     // null where the attention is latent ...
  std::shared_ptr<LatentAttention> latent_attn;    // ... registered as "self_attn" (DeepSeek)
  std::shared_ptr<DecoderMLP> mlp;     // null in a sparse layer
  std::shared_ptr<SparseMoeBlock> moe;  // a sparse layer's block (its mlp), else null
  std::shared_ptr<Module> other_moe;    // ... where it is not a SparseMoeBlock (gpt-oss's GptOssMLP)
  /// Null where the architecture has no such norm.
  std::shared_ptr<RMSNorm> input_layernorm, post_attention_layernorm, pre_feedforward_layernorm,
      post_feedforward_layernorm;
  std::shared_ptr<Dropout> resid_attn_dropout, resid_mlp_dropout;  // Phi-3
  std::shared_ptr<Identity> hook_resid_pre, hook_resid_mid, hook_resid_post;

 private:
  DecoderArch arch_;
};

class DecoderModel : public StagedModel {
 public:
  DecoderModel(const DecoderArch& arch, const ModelConfig& cfg, const at::TensorOptions& opts);
  Value forward(Inputs inputs) override;
  /// embed (embed_tokens and the scale), rotary_emb; the layers; norm.
  at::Tensor run_stage(const StageCall& call) override;
  /// The embedding stage: the lookup, times sqrt(hidden) where the
  /// architecture scales it (after the lookup, or inside embed_tokens).
  at::Tensor embed(const at::Tensor& input_ids);
  /// The factor embeddings are scaled by (Gemma's sqrt(hidden)); 0 where they are not.
  double embedding_scale() const;
  /// Rows of a plain lookup times embedding_scale() where the architecture
  /// scales after embed_tokens (Gemma 1/2), in the rows' dtype. Unchanged
  /// rows elsewhere.
  at::Tensor scale_embeddings(const at::Tensor& rows) const;
  /// True where the scaling follows embed_tokens (Gemma 1/2): its output is the unscaled lookup.
  bool scales_after_lookup() const;
  /// True where embed_tokens scales its own rows (Gemma 3): a hook on it sees them scaled.
  bool scales_inside_embedding() const { return !arch_.scaled_embedding_class.empty(); }
  /// (cos, sin) for every layer (one entry when all layers share it; an
  /// undefined Value where the layers compute RoPE themselves). `run_hooks`
  /// false: later pipeline stages recompute what stage 0's hooked call gave.
  std::vector<Value> position_embeddings(const at::Tensor& hidden, const at::Tensor& position_ids,
                                         bool run_hooks = true);
  std::shared_ptr<Embedding> embed_tokens;
  std::shared_ptr<Dropout> embed_dropout;  // Phi-3: exists, never called
  std::shared_ptr<ModuleList> layers;
  std::shared_ptr<RMSNorm> norm;
  /// RotaryEmbedding, LayerTypeRotaryEmbedding (Rope::ModelPerLayerType), or
  /// null where the layers compute RoPE.
  std::shared_ptr<Module> rotary_emb;
  const DecoderArch& arch() const { return arch_; }

 private:
  DecoderArch arch_;
  ModelConfig cfg_;
};

class DecoderForCausalLM : public CausalLM {
 public:
  DecoderForCausalLM(const DecoderArch& arch, const ModelConfig& cfg, const at::TensorOptions& opts = {});
  std::vector<std::string> no_split_modules() const override { return {arch_.cls("DecoderLayer")}; }
  std::string base_model_prefix() const override { return "model"; }
  std::shared_ptr<Embedding> input_embeddings() const override { return model->embed_tokens; }
  std::shared_ptr<Linear> output_embeddings() const override { return lm_head; }
  std::shared_ptr<Module> base_model() const override { return model; }
  /// The final soft-cap where the config has one (Gemma 2).
  at::Tensor finish_logits(const at::Tensor& logits) const override;
  const DecoderArch& arch() const { return arch_; }

  std::shared_ptr<DecoderModel> model;
  std::shared_ptr<Linear> lm_head;

 private:
  DecoderArch arch_;
};

/// tanh(x / cap) * cap (Gemma 2's attention and final logit soft-capping).
at::Tensor soft_cap(const at::Tensor& x, double cap);

}  // namespace flex
