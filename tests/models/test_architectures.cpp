// The architecture registry agrees with the models it describes: for every
// entry, a small model built from a config of that type has the entry's class
// names, and its stage names (embedding, blocks, attention, final norm, head,
// rotary) name modules that exist in the built tree. Unknown types are refused
// with the list of supported ones.
#include <flex/hooks/errors.h>
#include <flex/models/architecture.h>
#include <flex/models/auto_model.h>

#include <gtest/gtest.h>
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
      break;
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
      if (!child.empty()) EXPECT_TRUE(has_module(*model, n.base + "." + child)) << n.base + "." + child;
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
