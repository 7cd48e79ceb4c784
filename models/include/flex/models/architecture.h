#pragma once
// The architecture registry: one entry per Hugging Face model_type, the one
// place that says everything flexmodel knows about it: the class names, the
// config defaults and what only this type reads or checks, which family's
// code builds it (and so its tensor-parallel plan), and the names of its
// stages (embedding, blocks, final norm, head) that the single-process model,
// the pipeline stages and the tools use. Entries are in
// models/src/architectures.cpp; docs/adding-an-architecture.md walks through
// adding one.
#include <flex/models/config.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace flex {

struct DecoderArch;
namespace detail {
struct ConfigReader;
}

/// The code that builds and shards a model: GPT-2's, GPT-NeoX's, or the
/// Llama-family decoder whose per-architecture switches are a DecoderArch.
enum class ArchFamily { GPT2, GPTNeoX, Decoder };

/// Where a causal LM's stages sit. `base` is the base model's attribute on the
/// causal LM; embed, pos_embed, embed_dropout, blocks, norm and rotary are
/// children of the base model; head is a child of the causal LM. Empty: the
/// architecture has no such module (or never calls it).
struct StageNames {
  std::string base;           // "transformer", "model", "gpt_neox"
  std::string embed;          // "wte", "embed_tokens", "embed_in"
  std::string pos_embed;      // learnt positions ("wpe")
  std::string embed_dropout;  // dropout the forward applies to the embeddings
  std::string blocks;         // the ModuleList of blocks ("h", "layers")
  std::string norm;           // final norm ("ln_f", "norm", "final_layer_norm")
  std::string head;           // output projection ("lm_head")
  std::string rotary;         // a base-model rotary module the forward calls once
  std::string attention;      // each block's attention child ("attn", "attention", "self_attn")
};

/// Transformers' defaults for fields a config leaves out.
struct ConfigDefaults {
  double norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  int64_t head_dim = 0;  // 0: hidden_size / num_attention_heads
  int64_t max_position_embeddings = 2048;
  double rope_theta = 10000.0;
  const char* act_field = "hidden_act";
  const char* act = "silu";
};

/// Everything about one model_type.
struct Architecture {
  std::string model_type;       // "llama"
  std::string causal_lm_class;  // "LlamaForCausalLM"
  std::string block_class;      // never split across devices ("LlamaDecoderLayer")
  ArchFamily family = ArchFamily::Decoder;
  StageNames names;
  ConfigDefaults defaults;
  /// The decoder's switches (family Decoder), else null.
  std::shared_ptr<const DecoderArch> decoder;
  /// Reads and checks what only this type has (biases, windows, soft-caps,
  /// experts, ...), after the family's common fields; may be null.
  void (*read_config)(const detail::ConfigReader&, ModelConfig&) = nullptr;
  /// rope_scaling kinds beyond default / linear / dynamic / llama3.
  bool longrope = false;  // Phi-3's longrope ("su")
  /// Each block holds a [n_positions, n_positions] causal-mask buffer, which
  /// bounds max_position_embeddings tighter (GPT-2, GPT-NeoX).
  bool square_mask_buffer = false;
  /// Checkpoint keys as stored -> as the model names them (stored prefix,
  /// model prefix; the first match applies), and stored parts that are not
  /// the causal LM (flex/models/model_checkpoint.h).
  std::vector<std::pair<std::string, std::string>> checkpoint_renames;
  /// The same inside every block: stored child prefix -> the model's
  /// (Mixtral's block_sparse_moe. -> mlp., Transformers 5's name).
  std::vector<std::pair<std::string, std::string>> checkpoint_block_renames;
  std::vector<std::string> checkpoint_dropped;
  /// Blocks past num_hidden_layers in the checkpoint are skipped (DeepSeek-V3's MTP layer).
  bool drop_extra_layers = false;
  /// The config's model fields sit in this sub-object (Gemma 3's multimodal
  /// "text_config"); empty: at the top level.
  std::string nested_config;
  /// Transformers' defaults for that sub-object's fields (the published
  /// gemma-3-4b-it text_config leaves out vocab_size and other sizes).
  nlohmann::json nested_defaults;
};

/// The entry for `model_type`, or null when it is not supported.
const Architecture* find_architecture(const std::string& model_type);
/// The entry for cfg.model_type; ConfigError naming the file and the
/// supported types when there is none.
const Architecture& architecture(const ModelConfig& cfg);
/// Every entry, in the order the README lists them.
const std::vector<Architecture>& architectures();

/// Full names in a model of `arch`: block i ("model.layers.3"), its attention
/// ("model.layers.3.self_attn") and the final norm ("model.norm").
std::string block_name(const Architecture& arch, int64_t i);
std::string attention_name(const Architecture& arch, int64_t i);
std::string final_norm_name(const Architecture& arch);

}  // namespace flex
