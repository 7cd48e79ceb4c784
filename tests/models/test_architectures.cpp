// The architecture registry agrees with the models it describes: for every
// entry, a small model built from a config of that type has the entry's class
// names, and its stage names (embedding, blocks, attention, final norm, head,
// rotary) name modules that exist in the built tree. Unknown types are refused
// with the list of supported ones.
#include <flex/hooks/errors.h>
#include <flex/models/architecture.h>
#include <flex/models/auto_model.h>
#include <flex/models/decoder.h>
#include <flex/kernels/fused_elementwise.h>

#include <ATen/ATen.h>

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "kernel_test_util.h"
#include "test_util.h"

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

// The gated MLP's act_fn(gate) * up: one pass (flex::silu_mul) where act_fn
// is SiLU without a hook, against float64; a hooked act_fn is still called.
// Llama (gate_proj and up_proj) and Phi-3 (gate_up_proj).
TEST(Architectures, GatedMlpMatchesFloat64AndAHookedActivationIsStillCalled) {
  at::manual_seed(0);
  at::NoGradGuard no_grad;
  for (const char* type : {"llama", "phi3"}) {
    SCOPED_TRACE(type);
    const nlohmann::json j = {{"model_type", type},        {"vocab_size", 32},         {"hidden_size", 16},
                              {"num_hidden_layers", 1},    {"num_attention_heads", 2}, {"num_key_value_heads", 1},
                              {"intermediate_size", 40},   {"max_position_embeddings", 16}};
    auto model = build_causal_lm(parse_config(j, std::string(type) + "/config.json"));
    auto mlp = std::dynamic_pointer_cast<DecoderMLP>(model->get_submodule("model.layers.0.mlp"));
    ASSERT_TRUE(mlp);
    for (const auto& p : mlp->parameters()) p.copy_(at::randn(p.sizes()) * 0.3);
    const at::Tensor x = at::randn({2, 3, 16}) * 2.0;
    // float64: down(silu(gate x) * up x)
    const at::Tensor xd = x.to(at::kDouble);
    at::Tensor gate, up;
    if (mlp->gate_up_proj) {
      const at::Tensor gu = at::matmul(xd, mlp->gate_up_proj->weight.to(at::kDouble).t());
      gate = gu.narrow(-1, 0, 40), up = gu.narrow(-1, 40, 40);
    } else {
      gate = at::matmul(xd, mlp->gate_proj->weight.to(at::kDouble).t());
      up = at::matmul(xd, mlp->up_proj->weight.to(at::kDouble).t());
    }
    const at::Tensor expected =
        at::matmul(gate / (1.0 + at::exp(-gate)) * up, mlp->down_proj->weight.to(at::kDouble).t()).to(at::kFloat);
    EXPECT_TRUE(flex_test::close((*mlp)(x), expected, 1e-4, 1e-5));
    int calls = 0;
    HookHandle h = mlp->act_fn->register_forward_hook([&](Module&, const Inputs&, Value&) { ++calls; });
    EXPECT_TRUE(flex_test::close((*mlp)(x), expected, 1e-4, 1e-5));
    EXPECT_EQ(calls, 1);
  }
}

// silu_mul itself, on each ISA level it runs at, on the values where exp is
// delicate (both overflow sides, +-inf, NaN) and a length with tails after
// 8- and 16-wide steps, float32 and bf16,
// against float64 rounded where the two ops round and against the two ops
// (the same bits); 1 and 2 threads bit-equal.
TEST(Architectures, SiluTimesUpKernelMatchesFloat64) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> special = {-inf, -105.0f, -100.5f, -88.8f, -88.6f, -17.5f, -1e-3f, 0.0f,
                                      std::numeric_limits<float>::quiet_NaN(), 17.5f, 30.0f, 88.8f, 100.5f,
                                      105.0f, inf, -0.0f};
  int levels = 0;
  for (const Isa isa : flex_test::isa_levels()) {
    ScopedIsa cap(isa);
    if (!silu_mul_applies(at::zeros({1}), at::zeros({1}))) continue;  // below AVX2: the two ops run
    ++levels;
    at::manual_seed(2);
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      SCOPED_TRACE(::testing::Message() << to_string(isa) << " " << dtype);
      at::Tensor g = at::randn({3, 37}) * 8.0;
      g[0].narrow(0, 0, 16).copy_(at::tensor(special));
      g = g.to(dtype);
      const at::Tensor u = (at::randn({3, 37}) * 4.0).to(dtype);
      if (!silu_mul_applies(g, u)) continue;  // bf16 below AVX-512
      const at::Tensor y = silu_mul(g, u);
      const at::Tensor gd = g.to(at::kDouble);
      const at::Tensor silu = (gd / (1.0 + at::exp(-gd))).to(dtype).to(at::kDouble);  // rounded as at::silu's result
      const at::Tensor expected = (silu * u.to(at::kDouble)).to(dtype);
      // NaN where g is NaN or -inf (-inf / inf); elsewhere finite values
      const at::Tensor nan = expected.isnan();
      EXPECT_TRUE(flex_test::equal(y.isnan(), nan));
      const at::Tensor yv = y.masked_fill(nan, 0.0), ev = expected.masked_fill(nan, 0.0);
      if (dtype == at::kFloat) {
        EXPECT_TRUE(flex_test::close(yv, ev, 1e-6, 1e-30));
      } else {
        EXPECT_TRUE(flex_test::close(yv, ev, 1.0 / 128, 1e-30));
        EXPECT_GE(yv.eq(ev).to(at::kDouble).mean().item<double>(), 0.97) << "share bit-equal to float64 rounded";
      }
      // and the two libtorch ops it replaces, bit for bit (exp as at::silu's)
      const at::Tensor ops = at::silu(g) * u;
      EXPECT_TRUE(flex_test::equal(ops.isnan(), y.isnan()));
      EXPECT_TRUE(flex_test::equal(y.masked_fill(y.isnan(), 0.0), ops.masked_fill(ops.isnan(), 0.0)));
    }
    const at::Tensor g = at::randn({64, 1000}), u = at::randn({64, 1000});
    at::Tensor one;
    {
      flex_test::ThreadsGuard threads(1);
      one = silu_mul(g, u);
    }
    flex_test::ThreadsGuard threads(2);
    EXPECT_TRUE(flex_test::equal(silu_mul(g, u), one));
  }
  if (levels == 0) GTEST_SKIP() << "silu_mul needs an AVX2 CPU";
}

}  // namespace
