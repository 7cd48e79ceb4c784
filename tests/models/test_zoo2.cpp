// The second-wave Llama family beyond the golden captures: the sliding window,
// soft-capping and q/k norms checked against independent computations, Qwen3
// (no golden data) against a forward written here from its Transformers
// definition, Phi-3's longrope against its formula, and config errors.
#include "golden_util.h"

#include <flex/hooks/errors.h>
#include <flex/models/decoder.h>

#include <cmath>
#include <filesystem>
#include <fstream>

using namespace flex;
using models_test::close;

namespace {

// A fixture folder with config.json edited by `edit` (weights copied).
std::string edited_copy(const flex_test::TempDir& dir, const std::string& model,
                        const std::function<void(nlohmann::json&)>& edit) {
  auto cfg = models_test::read_json(models_test::model_dir(model) + "/config.json");
  edit(cfg);
  std::ofstream(dir.str("config.json")) << cfg.dump();
  std::filesystem::copy_file(models_test::model_dir(model) + "/model.safetensors", dir.str("model.safetensors"),
                             std::filesystem::copy_options::overwrite_existing);
  return dir.str();
}

at::Tensor logits_of(const std::string& dir) {
  at::NoGradGuard g;
  return load_pretrained(dir, at::kFloat)->logits(models_test::golden_inputs());
}

at::Tensor rotate_half_ref(const at::Tensor& x) {
  const int64_t h = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, h, h), x.narrow(-1, 0, h)}, -1);
}

// [B, T, H*D] -> [B, H, T, D], rotated with cos/sin [1, T, D].
at::Tensor heads_rotated(const at::Tensor& proj, int64_t heads, const at::Tensor& cos, const at::Tensor& sin) {
  at::Tensor x = proj.view({proj.size(0), proj.size(1), heads, -1}).transpose(1, 2);
  return x * cos.unsqueeze(1) + rotate_half_ref(x) * sin.unsqueeze(1);
}

TEST(SlidingWindow, IgnoringTheWindowChangesOnlyPositionsPastIt) {
  for (const std::string name : {"mistral", "gemma2"}) {
    flex_test::TempDir dir;
    at::Tensor golden = models_test::golden_tensors(name)->get("logits");
    at::Tensor windowless = logits_of(edited_copy(dir, name, [](nlohmann::json& c) { c["sliding_window"] = 4096; }));
    // Queries 0..3 see at most 4 keys either way; 4..7 lose their early keys in the window.
    EXPECT_TRUE(close(windowless.narrow(1, 0, 4), golden.narrow(1, 0, 4), name + " positions inside the window"));
    for (int64_t t = 4; t < 8; ++t)
      EXPECT_GT((windowless.select(1, t) - golden.select(1, t)).abs().max().item<double>(), 0.1) << name << " t=" << t;
  }
}

// Gemma 2's attention probabilities recomputed from the golden projections
// and rotary tables: scores * 24^-0.5, tanh soft-cap 5, causal mask plus the
// window of 4 on layer 0 (global on layer 1), softmax.
TEST(Gemma2, AttentionProbsAreSoftCappedAndWindowedAsTheFormulaSays) {
  auto model = load_pretrained(models_test::model_dir("gemma2"), at::kFloat);
  auto gt = models_test::golden_tensors("gemma2");
  std::map<int, at::Tensor> probs;
  std::vector<HookHandle> hs;
  for (int l = 0; l < 2; ++l) {
    auto attn = std::dynamic_pointer_cast<DecoderAttention>(model->get_submodule("model.layers." + std::to_string(l) + ".self_attn"));
    ASSERT_TRUE(attn);
    hs.push_back(attn->hook_attn_probs->register_forward_hook(
        [&probs, l](Module&, const Inputs&, Value& out) { probs[l] = out.toTensor(); }));
  }
  at::NoGradGuard g;
  model->logits(models_test::golden_inputs());
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
    at::Tensor cos = gt->get(p + "rotary_emb"), sin = gt->get(p + "rotary_emb#out1");
    at::Tensor q = heads_rotated(gt->get(p + "q_proj"), 4, cos, sin);
    at::Tensor k = heads_rotated(gt->get(p + "k_proj"), 2, cos, sin).repeat_interleave(2, 1);
    at::Tensor s = at::matmul(q, k.transpose(2, 3)) * std::pow(24.0, -0.5);
    s = at::tanh(s / 5.0) * 5.0;
    at::Tensor i = at::arange(8).unsqueeze(1), j = at::arange(8).unsqueeze(0);
    at::Tensor visible = j.le(i);
    if (l == 0) visible = visible.logical_and(j.gt(i - 4));
    at::Tensor expected = at::softmax(s.masked_fill(visible.logical_not(), -1e30), -1);
    EXPECT_TRUE(close(probs[l], expected, "layer " + std::to_string(l) + " probs", 1e-6, 1e-5));
    if (l == 0) {
      EXPECT_EQ(probs[l].masked_select(visible.logical_not()).abs().max().item<float>(), 0.0f);
    }
  }
}

TEST(Gemma2, SoftCapsAreAppliedAndCanBeSwitchedOff) {
  auto gt = models_test::golden_tensors("gemma2");
  flex_test::TempDir a, b;
  // Without the final cap the logits are lm_head's output.
  EXPECT_TRUE(close(logits_of(edited_copy(a, "gemma2", [](nlohmann::json& c) { c["final_logit_softcapping"] = nullptr; })),
                    gt->get("lm_head"), "uncapped logits vs lm_head"));
  at::Tensor no_attn_cap =
      logits_of(edited_copy(b, "gemma2", [](nlohmann::json& c) { c["attn_logit_softcapping"] = nullptr; }));
  EXPECT_GT((no_attn_cap - gt->get("logits")).abs().max().item<double>(), 0.01);
}

// OLMo 2's q_norm normalises the whole projected q (64 wide), not each head.
TEST(Olmo2, QNormIsOverTheWholeProjection) {
  auto model = load_pretrained(models_test::model_dir("olmo2"), at::kFloat);
  auto gt = models_test::golden_tensors("olmo2");
  at::Tensor q = gt->get("model.layers.0.self_attn.q_proj");
  at::Tensor w = get_module_tensor(*model, "model.layers.0.self_attn.q_norm.weight");
  at::Tensor expected = w * (q * at::rsqrt(q.pow(2).mean(-1, true) + 1e-6));
  EXPECT_TRUE(close(gt->get("model.layers.0.self_attn.q_norm"), expected, "golden q_norm = formula"));
  at::NoGradGuard g;
  EXPECT_TRUE(close((*model->get_submodule("model.layers.0.self_attn.q_norm"))(Inputs{q}).toTensor(), expected, "q_norm"));
}

// ---------------------------------------------------------------------------
// Qwen3: written from Transformers' modeling_qwen3 (4.51); no golden data, so
// the reference is a plain-ATen forward of the same definition.

struct Qwen3Ref {
  int64_t vocab = 50, hidden = 32, layers = 2, heads = 4, kv = 2, head_dim = 16, inter = 48;
  double eps = 1e-6, theta = 1e6;
  std::map<std::string, at::Tensor> w;

  static at::Tensor rms(const at::Tensor& x, const at::Tensor& weight, double eps) {
    return weight * (x * at::rsqrt(x.pow(2).mean(-1, true) + eps));
  }

  at::Tensor forward(const at::Tensor& ids) {
    const int64_t b = ids.size(0), t = ids.size(1);
    at::Tensor h = at::embedding(w.at("model.embed_tokens.weight"), ids);
    at::Tensor inv = 1.0 / at::pow(theta, at::arange(0, head_dim, 2, at::kDouble) / head_dim);
    at::Tensor freqs = at::arange(t, at::kDouble).unsqueeze(1) * inv.unsqueeze(0);
    at::Tensor cos = at::cat({freqs, freqs}, -1).cos().to(at::kFloat), sin = at::cat({freqs, freqs}, -1).sin().to(at::kFloat);
    auto rope = [&](const at::Tensor& x) { return x * cos + rotate_half_ref(x) * sin; };
    at::Tensor causal = at::ones({t, t}, at::kBool).tril();
    for (int64_t l = 0; l < layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      at::Tensor x = rms(h, w.at(p + "input_layernorm.weight"), eps);
      auto proj = [&](const std::string& n) { return at::matmul(x, w.at(p + "self_attn." + n + ".weight").t()); };
      at::Tensor q = rms(proj("q_proj").view({b, t, heads, head_dim}), w.at(p + "self_attn.q_norm.weight"), eps).transpose(1, 2);
      at::Tensor k = rms(proj("k_proj").view({b, t, kv, head_dim}), w.at(p + "self_attn.k_norm.weight"), eps).transpose(1, 2);
      at::Tensor v = proj("v_proj").view({b, t, kv, head_dim}).transpose(1, 2);
      q = rope(q);
      k = rope(k).repeat_interleave(heads / kv, 1);
      v = v.repeat_interleave(heads / kv, 1);
      at::Tensor s = at::matmul(q, k.transpose(2, 3)) / std::sqrt(static_cast<double>(head_dim));
      at::Tensor a = at::matmul(at::softmax(s.masked_fill(causal.logical_not(), -1e30), -1), v);
      a = a.transpose(1, 2).reshape({b, t, heads * head_dim});
      h = h + at::matmul(a, w.at(p + "self_attn.o_proj.weight").t());
      x = rms(h, w.at(p + "post_attention_layernorm.weight"), eps);
      at::Tensor g = at::silu(at::matmul(x, w.at(p + "mlp.gate_proj.weight").t()));
      at::Tensor u = at::matmul(x, w.at(p + "mlp.up_proj.weight").t());
      h = h + at::matmul(g * u, w.at(p + "mlp.down_proj.weight").t());
    }
    h = rms(h, w.at("model.norm.weight"), eps);
    return at::matmul(h, w.at("model.embed_tokens.weight").t());  // tied head
  }

  // A Hugging Face folder: config.json + model.safetensors (no lm_head: tied).
  void write(const std::string& dir) {
    at::manual_seed(31);
    auto lin = [](int64_t out, int64_t in) { return at::randn({out, in}) / std::sqrt(static_cast<double>(in)); };
    w["model.embed_tokens.weight"] = at::randn({vocab, hidden}) * 0.5;
    for (int64_t l = 0; l < layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      w[p + "self_attn.q_proj.weight"] = lin(heads * head_dim, hidden);
      w[p + "self_attn.k_proj.weight"] = lin(kv * head_dim, hidden);
      w[p + "self_attn.v_proj.weight"] = lin(kv * head_dim, hidden);
      w[p + "self_attn.o_proj.weight"] = lin(hidden, heads * head_dim);
      w[p + "self_attn.q_norm.weight"] = 1 + 0.2 * at::randn({head_dim});
      w[p + "self_attn.k_norm.weight"] = 1 + 0.2 * at::randn({head_dim});
      w[p + "mlp.gate_proj.weight"] = lin(inter, hidden);
      w[p + "mlp.up_proj.weight"] = lin(inter, hidden);
      w[p + "mlp.down_proj.weight"] = lin(hidden, inter);
      w[p + "input_layernorm.weight"] = 1 + 0.2 * at::randn({hidden});
      w[p + "post_attention_layernorm.weight"] = 1 + 0.2 * at::randn({hidden});
    }
    w["model.norm.weight"] = 1 + 0.2 * at::randn({hidden});
    std::vector<std::pair<std::string, at::Tensor>> v(w.begin(), w.end());
    save_safetensors(dir + "/model.safetensors", v, {{"format", "pt"}});
    nlohmann::json cfg = {{"architectures", {"Qwen3ForCausalLM"}},
                          {"model_type", "qwen3"},
                          {"vocab_size", vocab},
                          {"hidden_size", hidden},
                          {"num_hidden_layers", layers},
                          {"num_attention_heads", heads},
                          {"num_key_value_heads", kv},
                          {"head_dim", head_dim},
                          {"intermediate_size", inter},
                          {"rms_norm_eps", eps},
                          {"rope_theta", theta},
                          {"attention_bias", false},
                          {"tie_word_embeddings", true},
                          {"use_sliding_window", false},
                          {"torch_dtype", "float32"}};
    std::ofstream(dir + "/config.json") << cfg.dump(2);
  }
};

TEST(Qwen3, ForwardEqualsAnIndependentComputation) {
  flex_test::TempDir dir;
  Qwen3Ref ref;
  ref.write(dir.str());
  auto model = load_pretrained(dir.str(), at::kFloat);
  at::Tensor ids = at::randint(0, ref.vocab, {2, 7}, at::kLong);
  at::NoGradGuard g;
  EXPECT_TRUE(close(model->logits(ids), ref.forward(ids), "qwen3 logits"));
  EXPECT_EQ(model->class_name(), "Qwen3ForCausalLM");
  EXPECT_EQ(model->no_split_modules(), std::vector<std::string>{"Qwen3DecoderLayer"});
  // Names and classes in Transformers' registration order (hook points left out).
  std::vector<std::string> names;
  for (auto& [n, m] : model->named_flex_modules())
    if (!is_hook_point_name(n) && n.find("layers.1") == std::string::npos) names.push_back(n + ":" + m->class_name());
  const std::vector<std::string> expected = {
      ":Qwen3ForCausalLM", "model:Qwen3Model", "model.embed_tokens:Embedding", "model.layers:ModuleList",
      "model.layers.0:Qwen3DecoderLayer", "model.layers.0.self_attn:Qwen3Attention",
      "model.layers.0.self_attn.q_proj:Linear", "model.layers.0.self_attn.k_proj:Linear",
      "model.layers.0.self_attn.v_proj:Linear", "model.layers.0.self_attn.o_proj:Linear",
      "model.layers.0.self_attn.q_norm:Qwen3RMSNorm", "model.layers.0.self_attn.k_norm:Qwen3RMSNorm",
      "model.layers.0.mlp:Qwen3MLP", "model.layers.0.mlp.gate_proj:Linear", "model.layers.0.mlp.up_proj:Linear",
      "model.layers.0.mlp.down_proj:Linear", "model.layers.0.mlp.act_fn:SiLU",
      "model.layers.0.input_layernorm:Qwen3RMSNorm", "model.layers.0.post_attention_layernorm:Qwen3RMSNorm",
      "model.norm:Qwen3RMSNorm", "model.rotary_emb:Qwen3RotaryEmbedding", "lm_head:Linear"};
  EXPECT_EQ(names, expected);
  // The per-head norms are hooked with [B, T, heads, head_dim].
  at::Tensor qn;
  auto h = model->get_submodule("model.layers.0.self_attn.q_norm")->register_forward_hook(
      [&](Module&, const Inputs&, Value& out) { qn = out.toTensor(); });
  model->logits(ids);
  EXPECT_EQ(qn.sizes(), (std::vector<int64_t>{2, 7, 4, 16}));
}

// ---------------------------------------------------------------------------
// Phi-3 longrope: short factors while the positions stay within
// original_max_position_embeddings, long ones past it, cos/sin scaled by
// sqrt(1 + ln(max / original) / ln(original)).
TEST(Phi3, LongropeFollowsItsFormula) {
  flex_test::TempDir dir;
  const std::vector<double> short_f = {1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8};
  const std::vector<double> long_f = {1.0, 1.5, 2.5, 4.0, 6.0, 9.0, 13.0, 18.0};
  edited_copy(dir, "phi3", [&](nlohmann::json& c) {
    c["rope_scaling"] = {{"type", "longrope"}, {"short_factor", short_f}, {"long_factor", long_f}};
    c["original_max_position_embeddings"] = 4;
  });
  auto model = load_pretrained(dir.str(), at::kFloat);
  // Transformers 5 computes it once in model.rotary_emb (4.47's per-layer
  // Phi3LongRoPEScaledRotaryEmbedding stays, never called).
  EXPECT_EQ(model->get_submodule("model.layers.0.self_attn.rotary_emb")->class_name(), "Phi3LongRoPEScaledRotaryEmbedding");
  auto rot = model->get_submodule("model.rotary_emb");
  EXPECT_EQ(rot->class_name(), "Phi3RotaryEmbedding");
  at::Tensor cos;
  auto h = rot->register_forward_hook([&](Module&, const Inputs&, Value& out) { cos = out.toTupleRef().elements()[0].toTensor(); });
  const double scale = std::sqrt(1.0 + std::log(64.0 / 4.0) / std::log(4.0));
  at::NoGradGuard g;
  for (int64_t t : {3, 8}) {
    model->logits(models_test::golden_inputs().narrow(1, 0, t));
    const auto& f = t > 4 ? long_f : short_f;
    at::Tensor inv = at::empty({8}, at::kDouble);
    for (int64_t i = 0; i < 8; ++i) inv[i] = 1.0 / (f[i] * std::pow(10000.0, 2.0 * i / 16.0));
    at::Tensor freqs = at::arange(t, at::kDouble).unsqueeze(1) * inv.unsqueeze(0);
    at::Tensor expected = (at::cat({freqs, freqs}, -1).cos() * scale).unsqueeze(0);
    EXPECT_TRUE(close(cos, expected, "cos for " + std::to_string(t) + " positions", 1e-5, 1e-4));
  }
}

// ---------------------------------------------------------------------------
// What we do not implement fails at load, naming the file and the field.
TEST(ZooConfig, UnsupportedVariantsAndAbsurdSizesAreTypedErrors) {
  const std::vector<std::tuple<std::string, std::function<void(nlohmann::json&)>, std::string>> rows = {
      {"mistral", [](nlohmann::json& c) { c["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 4}}; }, "rope_scaling.rope_type"},
      {"qwen2", [](nlohmann::json& c) { c["use_sliding_window"] = true; }, "use_sliding_window"},
      {"gemma2", [](nlohmann::json& c) { c["attn_implementation"] = "flex_attention"; }, "attn_implementation"},
      {"phi3", [](nlohmann::json& c) { c["rope_scaling"] = {{"type", "longrope"}, {"short_factor", {1.0}}, {"long_factor", {1.0}}}; },
       "rope_scaling.short_factor"},
      {"phi3", [](nlohmann::json& c) { c["rope_scaling"] = {{"type", "linear"}, {"factor", 2}}; }, "rope_scaling.type"},
      {"phi3", [](nlohmann::json& c) { c["partial_rotary_factor"] = 0.75; }, "partial_rotary_factor"},
      {"olmo2", [](nlohmann::json& c) { c["num_hidden_layers"] = 200000000; }, "num_hidden_layers"},
      {"mistral", [](nlohmann::json& c) { c["vocab_size"] = int64_t{1} << 40; }, "vocab_size"},
      {"gemma2", [](nlohmann::json& c) { c["sliding_window"] = -3; }, "sliding_window"},
      {"gpt2", [](nlohmann::json& c) { c["n_layer"] = 200000000; }, "n_layer"},
      {"llama", [](nlohmann::json& c) { c["hidden_size"] = 1 << 19; c["intermediate_size"] = 1 << 23; c["num_hidden_layers"] = 4096;
                  c["num_attention_heads"] = 4096; c["num_key_value_heads"] = 4096; },
       "num_hidden_layers"},
  };
  for (const auto& [model, edit, field] : rows) {
    flex_test::TempDir dir;
    edited_copy(dir, model, edit);
    try {
      load_pretrained(dir.str(), at::kFloat);
      ADD_FAILURE() << model << ": no error for " << field;
    } catch (const ConfigError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("'" + field + "'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("config.json"), std::string::npos) << msg;
    }
  }
}

}  // namespace
