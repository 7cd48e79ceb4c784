// The architecture registry agrees with the models it describes: for every
// entry, a small model built from a config of that type has the entry's class
// names, and its stage names (embedding, blocks, attention, final norm, head,
// rotary) name modules that exist in the built tree. Unknown types are refused
// with the list of supported ones.
#include <flex/hooks/errors.h>
#include <flex/models/architecture.h>
#include <flex/models/auto_model.h>
#include <flex/models/decoder.h>

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

using namespace flex;

namespace {

/// The smallest config of `arch`'s family (two layers, so block 1 exists).
nlohmann::json small_config(const Architecture& arch) {
  nlohmann::json j = {{"model_type", arch.model_type}, {"vocab_size", 32}};
  switch (arch.family) {
    case ArchFamily::GPT2:
      j.update({{"n_embd", 16}, {"n_layer", 2}, {"n_head", 2}, {"n_positions", 16}});
      break;
    case ArchFamily::GPTNeoX:
      j.update({{"hidden_size", 16}, {"num_hidden_layers", 2}, {"num_attention_heads", 2}, {"intermediate_size", 32},
                {"max_position_embeddings", 16}, {"rotary_pct", 0.5}});
      break;
    case ArchFamily::Decoder:
      j.update({{"hidden_size", 16}, {"num_hidden_layers", 2}, {"num_attention_heads", 2}, {"num_key_value_heads", 1},
                {"intermediate_size", 32}, {"max_position_embeddings", 16}, {"num_experts", 4},
                {"num_local_experts", 4}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 8},
                {"shared_expert_intermediate_size", 8}});
      if (arch.decoder->latent_attention)  // DeepSeek: every head has its keys; small latent sizes
        j.update({{"num_key_value_heads", 2}, {"n_routed_experts", 4}, {"n_group", 2}, {"topk_group", 1},
                  {"first_k_dense_replace", 1}, {"q_lora_rank", 8}, {"kv_lora_rank", 8}, {"qk_nope_head_dim", 4},
                  {"qk_rope_head_dim", 4}, {"v_head_dim", 4}});
      break;
  }
  if (!arch.nested_config.empty()) {  // a multimodal config: the language model's fields in a sub-object
    nlohmann::json text = j;
    text.erase("model_type");
    return {{"model_type", arch.model_type}, {arch.nested_config, text}};
  }
  return j;
}

bool has_module(CausalLM& m, const std::string& name) {
  for (const auto& item : m.named_modules())
    if (item.key() == name) return true;
  return false;
}

TEST(Architectures, EveryEntryDescribesTheModelItBuilds) {
  ASSERT_GE(architectures().size(), 11u);
  for (const Architecture& arch : architectures()) {
    SCOPED_TRACE(arch.model_type);
    const ModelConfig cfg = parse_config(small_config(arch), arch.model_type + "/config.json");
    EXPECT_EQ(&architecture(cfg), &arch);
    EXPECT_EQ(cfg.causal_lm_class(), arch.causal_lm_class);
    auto model = build_causal_lm(cfg);
    EXPECT_EQ(model->class_name(), arch.causal_lm_class);
    EXPECT_EQ(model->no_split_modules(), std::vector<std::string>{arch.block_class});
    EXPECT_EQ(model->base_model_prefix(), arch.names.base);
    const StageNames& n = arch.names;
    for (const std::string& child : {n.embed, n.pos_embed, n.embed_dropout, n.blocks, n.norm, n.rotary})
      if (!child.empty()) {
        EXPECT_TRUE(has_module(*model, n.base + "." + child)) << n.base + "." + child;
      }
    EXPECT_TRUE(has_module(*model, n.head)) << n.head;
    for (int64_t i : {0, 1}) {
      EXPECT_TRUE(has_module(*model, block_name(arch, i))) << block_name(arch, i);
      EXPECT_EQ(model->get_submodule(block_name(arch, i))->class_name(), arch.block_class);
      EXPECT_TRUE(has_module(*model, attention_name(arch, i))) << attention_name(arch, i);
    }
    EXPECT_TRUE(has_module(*model, final_norm_name(arch)));
    EXPECT_NE(supported_model_types().find(arch.model_type), std::string::npos);
  }
}

TEST(Architectures, UnknownTypeNamesTheSupportedOnes) {
  EXPECT_EQ(find_architecture("no_such_model"), nullptr);
  try {
    parse_config(nlohmann::json{{"model_type", "no_such_model"}}, "x/config.json");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("x/config.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'no_such_model' is not supported"), std::string::npos) << msg;
    for (const Architecture& arch : architectures()) EXPECT_NE(msg.find(arch.model_type), std::string::npos) << msg;
  }
}

}  // namespace

namespace {

// Gemma 3's older config form: the global base in rope_theta, the local one in
// rope_local_base_freq, rope_scaling for the global layers only; the layer
// types from sliding_window_pattern; a multimodal config's text_config.
TEST(Architectures, Gemma3ReadsRopePerLayerTypeFromEitherForm) {
  nlohmann::json text = {{"vocab_size", 32}, {"hidden_size", 16}, {"num_hidden_layers", 7},
                         {"num_attention_heads", 2}, {"num_key_value_heads", 1}, {"head_dim", 8},
                         {"intermediate_size", 32}, {"rope_theta", 1000000.0}, {"rope_local_base_freq", 10000.0},
                         {"rope_scaling", {{"rope_type", "linear"}, {"factor", 8.0}}}, {"sliding_window", 4}};
  nlohmann::json j = {{"model_type", "gemma3"}, {"text_config", text}, {"eos_token_id", 1}};
  const ModelConfig c = parse_config(j, "gemma3/config.json");
  EXPECT_EQ(c.rope_theta, 1000000.0);
  EXPECT_EQ(c.rope_scaling.rope_type, "linear");
  EXPECT_EQ(c.rope_scaling.factor, 8.0);
  ASSERT_TRUE(c.sliding_rope.has_value());
  EXPECT_EQ(c.sliding_rope->theta, 10000.0);
  EXPECT_EQ(c.sliding_rope->scaling.rope_type, "default");
  for (int64_t i = 0; i < 7; ++i) EXPECT_EQ(c.layer_slides(i), i != 5) << "layer " << i;
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{1});

  nlohmann::json flat = text;
  flat["model_type"] = "gemma3_text";
  flat.erase("rope_scaling");
  flat["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5.0}};
  try {
    parse_config(flat, "g/config.json");
    FAIL() << "a flat rope_parameters was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("rope_parameters"), std::string::npos) << e.what();
  }
  try {
    parse_config(nlohmann::json{{"model_type", "gemma3"}}, "g/config.json");
    FAIL() << "a gemma3 config without text_config was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("text_config"), std::string::npos) << e.what();
  }
}

// YaRN: Transformers' attention factor 0.1 ln(factor) + 1, or the ratio of
// the mscale terms when both are given.
TEST(Architectures, YarnAttentionFactorFollowsMscale) {
  nlohmann::json j = {{"model_type", "gpt_oss"}, {"vocab_size", 32}, {"hidden_size", 16}, {"num_hidden_layers", 2},
                      {"num_attention_heads", 2}, {"num_key_value_heads", 1}, {"head_dim", 8},
                      {"intermediate_size", 8}, {"num_local_experts", 4}, {"num_experts_per_tok", 2}};
  const ModelConfig d = parse_config(j, "o/config.json");  // Transformers' default rope for gpt-oss
  EXPECT_EQ(d.rope_scaling.rope_type, "yarn");
  EXPECT_NEAR(d.rope_scaling.attention_factor, 0.1 * std::log(32.0) + 1.0, 1e-12);
  EXPECT_FALSE(d.rope_scaling.truncate);
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 40.0}, {"mscale", 1.0}, {"mscale_all_dim", 0.5},
                          {"original_max_position_embeddings", 4096}, {"rope_theta", 10000.0}};
  const ModelConfig m = parse_config(j, "o/config.json");
  EXPECT_NEAR(m.rope_scaling.attention_factor, (0.1 * std::log(40.0) + 1.0) / (0.05 * std::log(40.0) + 1.0), 1e-12);
  EXPECT_EQ(m.rope_scaling.beta_fast, 32.0);
  EXPECT_EQ(m.rope_scaling.original_max_position_embeddings, 4096);
}

}  // namespace
