// config.json parsing, checkpoint loading (EmptyInit vs direct, dtypes,
// missing / mis-shaped keys, prefix-less checkpoints), hidden states and
// Accelerate-style dispatch of the zoo's models.
#include "golden_util.h"

#include <flex/dispatch/checkpoint.h>
#include <flex/dispatch/load_checkpoint.h>
#include <flex/hooks/empty_init.h>
#include <flex/hooks/errors.h>

#include <filesystem>
#include <fstream>

#include "test_util.h"

using namespace flex;
using models_test::close;
namespace fs = std::filesystem;

namespace {

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

template <typename E>
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  return "<no error>";
}

bool mentions(const std::string& msg, const std::string& what) { return msg.find(what) != std::string::npos; }

TEST(Config, ParsesEachArchitecture) {
  ModelConfig g = load_config(models_test::model_dir("gpt2"));
  EXPECT_EQ(g.model_type, "gpt2");
  EXPECT_EQ(g.hidden_size, 64);
  EXPECT_EQ(g.num_attention_heads, 4);
  EXPECT_EQ(g.head_dim, 16);
  EXPECT_EQ(g.intermediate_size, 256);  // n_inner null -> 4 * n_embd
  EXPECT_EQ(g.max_position_embeddings, 64);
  EXPECT_TRUE(g.tie_word_embeddings);
  EXPECT_EQ(g.hidden_act, "gelu_new");
  EXPECT_EQ(g.eos_token_ids, std::vector<int64_t>{255});
  EXPECT_EQ(g.causal_lm_class(), "GPT2LMHeadModel");

  ModelConfig l = load_config(models_test::model_dir("llama3-rope-tied") + "/config.json");
  EXPECT_EQ(l.num_key_value_heads, 2);
  EXPECT_EQ(l.rope_scaling.rope_type, "llama3");
  EXPECT_EQ(l.rope_scaling.factor, 8.0);
  EXPECT_EQ(l.rope_scaling.original_max_position_embeddings, 64);
  EXPECT_EQ(l.rope_theta, 500000.0);
  EXPECT_EQ(l.norm_eps, 1e-5);
  EXPECT_TRUE(l.tie_word_embeddings);

  ModelConfig n = load_config(models_test::model_dir("gpt-neox"));
  EXPECT_EQ(n.rotary_dim(), 4);
  EXPECT_TRUE(n.use_parallel_residual);
  EXPECT_TRUE(n.attention_bias);
  EXPECT_EQ(n.hidden_act, "gelu");
}

// Transformers 5 writes rope_theta, the rope scaling and partial_rotary_factor
// inside "rope_parameters", and torch_dtype as "dtype" (the forms below are
// what LlamaConfig / GPTNeoXConfig / MixtralConfig(...).to_dict() give in
// 5.23). They must parse to what the Transformers 4 forms give.
TEST(Config, ReadsTransformers5RopeParameters) {
  const nlohmann::json sizes = {{"vocab_size", 32}, {"hidden_size", 16}, {"num_hidden_layers", 2},
                                {"num_attention_heads", 2}, {"intermediate_size", 32}, {"max_position_embeddings", 128}};
  nlohmann::json v4 = sizes, v5 = sizes;
  v4.update({{"model_type", "llama"}, {"rope_theta", 500000.0}, {"torch_dtype", "bfloat16"},
             {"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                               {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64}}}});
  v5.update({{"model_type", "llama"}, {"dtype", "bfloat16"},
             {"rope_parameters", {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                                  {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64},
                                  {"rope_theta", 500000.0}}}});
  for (const auto& j : {v4, v5}) {
    const ModelConfig c = parse_config(j, "llama/config.json");
    EXPECT_EQ(c.rope_theta, 500000.0);
    EXPECT_EQ(c.rope_scaling.rope_type, "llama3");
    EXPECT_EQ(c.rope_scaling.factor, 8.0);
    EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 64);
    EXPECT_EQ(c.torch_dtype, "bfloat16");
  }
  // Mixtral's default theta is 1e6; a v5 config states it.
  nlohmann::json mixtral = sizes;
  mixtral.update({{"model_type", "mixtral"}, {"rope_parameters", {{"rope_theta", 250000.0}, {"rope_type", "default"}}}});
  const ModelConfig m = parse_config(mixtral, "mixtral/config.json");
  EXPECT_EQ(m.rope_theta, 250000.0);
  EXPECT_EQ(m.rope_scaling.rope_type, "default");
  // GPT-NeoX: rotary_pct and rotary_emb_base became partial_rotary_factor and rope_theta.
  nlohmann::json neox = sizes;
  neox.update({{"model_type", "gpt_neox"},
               {"rope_parameters", {{"rope_theta", 20000.0}, {"partial_rotary_factor", 0.5}, {"rope_type", "default"}}}});
  const ModelConfig n = parse_config(neox, "neox/config.json");
  EXPECT_EQ(n.rotary_pct, 0.5);
  EXPECT_EQ(n.rope_theta, 20000.0);
  nlohmann::json neox4 = sizes;
  neox4.update({{"model_type", "gpt_neox"}, {"rotary_pct", 0.5}, {"rotary_emb_base", 20000.0}});
  const ModelConfig n4 = parse_config(neox4, "neox/config.json");
  EXPECT_EQ(n4.rotary_pct, 0.5);
  EXPECT_EQ(n4.rope_theta, 20000.0);
  // A bad value names the field where it is.
  nlohmann::json bad = v5;
  bad["rope_parameters"]["rope_theta"] = "fast";
  const std::string msg = error_of<ConfigError>([&] { parse_config(bad, "bad/config.json"); });
  EXPECT_TRUE(mentions(msg, "bad/config.json") && mentions(msg, "rope_parameters.rope_theta")) << msg;
}

// layer_types (Transformers 5) says which layers slide, over the pattern.
TEST(Config, LayerTypesChooseTheSlidingLayers) {
  nlohmann::json j = {{"model_type", "gemma2"}, {"vocab_size", 32}, {"hidden_size", 16}, {"num_hidden_layers", 3},
                      {"num_attention_heads", 2}, {"intermediate_size", 32}, {"sliding_window", 4}};
  const ModelConfig pattern = parse_config(j, "gemma2/config.json");
  EXPECT_TRUE(pattern.layer_slides(0));
  EXPECT_FALSE(pattern.layer_slides(1));
  EXPECT_TRUE(pattern.layer_slides(2));
  j["layer_types"] = {"full_attention", "sliding_attention", "sliding_attention"};
  const ModelConfig typed = parse_config(j, "gemma2/config.json");
  EXPECT_FALSE(typed.layer_slides(0));
  EXPECT_TRUE(typed.layer_slides(1));
  EXPECT_TRUE(typed.layer_slides(2));
  j["layer_types"] = {"full_attention", "sliding_attention"};
  std::string msg = error_of<ConfigError>([&] { parse_config(j, "gemma2/config.json"); });
  EXPECT_TRUE(mentions(msg, "'layer_types'") && mentions(msg, "num_hidden_layers (3)")) << msg;
  j["layer_types"] = {"full_attention", "chunked_attention", "full_attention"};
  msg = error_of<ConfigError>([&] { parse_config(j, "gemma2/config.json"); });
  EXPECT_TRUE(mentions(msg, "'layer_types'") && mentions(msg, "chunked_attention")) << msg;
}

TEST(Config, ErrorsNameTheFileAndTheField) {
  flex_test::TempDir dir;
  const std::string path = dir.str("config.json");
  write_text(path, R"({"model_type": "bert", "vocab_size": 10})");
  std::string msg = error_of<ConfigError>([&] { load_config(dir.str()); });
  EXPECT_TRUE(mentions(msg, path) && mentions(msg, "bert")) << msg;

  write_text(path, R"({"model_type": "gpt2", "vocab_size": 10, "n_layer": 1, "n_head": 2, "n_positions": 8})");
  msg = error_of<ConfigError>([&] { load_config(path); });
  EXPECT_TRUE(mentions(msg, path) && mentions(msg, "'n_embd'")) << msg;

  write_text(path, R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
                       "num_attention_heads": "two", "intermediate_size": 16})");
  msg = error_of<ConfigError>([&] { load_config(path); });
  EXPECT_TRUE(mentions(msg, "'num_attention_heads'") && mentions(msg, "two")) << msg;

  write_text(path, R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "num_key_value_heads": 3, "intermediate_size": 16})");
  msg = error_of<ConfigError>([&] { load_config(path); });
  EXPECT_TRUE(mentions(msg, "'num_key_value_heads'")) << msg;

  write_text(path, R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "intermediate_size": 16, "rope_scaling": {"rope_type": "longrope", "factor": 2}})");
  msg = error_of<ConfigError>([&] { load_config(path); });
  EXPECT_TRUE(mentions(msg, "rope_scaling") && mentions(msg, "longrope")) << msg;

  write_text(path, "{not json");
  EXPECT_THROW(load_config(path), FileFormatError);
  EXPECT_THROW(load_config(dir.str("absent")), IOError);
}

void expect_same_weights(CausalLM& a, CausalLM& b) {
  auto sa = state_dict(a), sb = state_dict(b);
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].first, sb[i].first);
    EXPECT_TRUE(flex_test::equal(sa[i].second, sb[i].second)) << sa[i].first;
  }
}

TEST(Loading, EmptyInitThenLoadEqualsDirectBuildThenLoad) {
  for (const std::string name : {"gpt2", "llama", "gpt-neox", "llama3-rope-tied"}) {
    const ModelConfig cfg = load_config(models_test::model_dir(name));
    std::shared_ptr<CausalLM> empty;
    {
      EmptyInit scope(/*include_buffers=*/true);
      empty = build_causal_lm(cfg);
    }
    for (auto& [k, t] : state_dict(*empty)) EXPECT_TRUE(t.is_meta()) << k;
    load_weights(*empty, models_test::model_dir(name));
    auto direct = build_causal_lm(cfg);  // random weights, real buffers
    load_weights(*direct, models_test::model_dir(name));
    expect_same_weights(*empty, *direct);
    for (auto& [n, mod] : empty->named_flex_modules())
      for (const auto& b : mod->named_buffers(false))
        EXPECT_TRUE(flex_test::equal(b.value(), get_module_tensor(*direct, (n.empty() ? "" : n + ".") + b.key()))) << n;
    at::NoGradGuard g;
    const at::Tensor ids = models_test::golden_inputs();
    EXPECT_TRUE(flex_test::equal(empty->logits(ids), direct->logits(ids))) << name;
  }
}

TEST(Loading, LoadCheckpointAndDispatchMatchesDirectLoading) {
  at::NoGradGuard g;
  const at::Tensor ids = models_test::golden_inputs();
  for (const std::string name : {"gpt2", "llama"}) {
    auto direct = load_pretrained(models_test::model_dir(name), at::kFloat);
    const at::Tensor expected = direct->logits(ids);
    const ModelConfig cfg = load_config(models_test::model_dir(name));
    {  // Everything on CPU.
      std::shared_ptr<CausalLM> m;
      {
        EmptyInit scope;
        m = build_causal_lm(cfg);
      }
      LoadAndDispatchOptions o;
      o.no_split_module_classes = m->no_split_modules();
      load_checkpoint_and_dispatch(*m, models_test::model_dir(name), o);
      m->tie_weights();
      EXPECT_TRUE(flex_test::equal(m->logits(ids), expected)) << name << " cpu";
    }
    {  // CPU + disk under a budget, as the golden end-to-end run.
      std::shared_ptr<CausalLM> m;
      {
        EmptyInit scope;
        m = build_causal_lm(cfg);
      }
      m->eval();
      flex_test::TempDir offload;
      LoadAndDispatchOptions o;
      o.device_map_strategy = "auto";
      MaxMemory mm;
      mm.set("cpu", name == "gpt2" ? "290001" : "256000");
      o.max_memory = mm;
      o.no_split_module_classes = m->no_split_modules();
      o.offload_folder = offload.str();
      std::ostringstream log;
      o.log = &log;
      load_checkpoint_and_dispatch(*m, models_test::model_dir(name), o);
      auto map = hf_device_map(*m);
      ASSERT_TRUE(map.has_value()) << name;
      int on_disk = 0;
      for (const auto& e : map->entries()) on_disk += e.second.is_disk();
      EXPECT_GT(on_disk, 0) << name << ": the budget should push some modules to disk";
      EXPECT_TRUE(flex_test::equal(m->logits(ids), expected)) << name << " cpu+disk";
    }
  }
}

TEST(Loading, DtypeOnLoad) {
  at::NoGradGuard g;
  const at::Tensor ids = models_test::golden_inputs();
  auto ckpt = Checkpoint::open(models_test::model_dir("llama"));
  // f32 checkpoint as bf16: every weight rounded once.
  auto bf = load_pretrained(models_test::model_dir("llama"), "bfloat16");
  for (auto& [k, t] : state_dict(*bf)) {
    EXPECT_EQ(t.scalar_type(), at::kBFloat16) << k;
    EXPECT_TRUE(flex_test::equal(t, ckpt.get(k).to(at::kBFloat16))) << k;
  }
  at::Tensor logits = bf->logits(ids);
  EXPECT_EQ(logits.scalar_type(), at::kBFloat16);
  const at::Tensor golden = models_test::golden_tensors("llama")->get("logits");
  EXPECT_TRUE(close(logits.to(at::kFloat), golden, "bf16 logits", 0.1, 0.05));
  EXPECT_GT(logits.argmax(-1).eq(golden.argmax(-1)).to(at::kFloat).mean().item<float>(), 0.9f);

  // bf16 checkpoint: "auto" keeps bf16, float32 upcasts exactly.
  auto ck16 = Checkpoint::open(models_test::model_dir("llama-bf16"));
  auto autom = load_pretrained(models_test::model_dir("llama-bf16"), "auto");
  for (auto& [k, t] : state_dict(*autom)) EXPECT_EQ(t.scalar_type(), at::kBFloat16) << k;
  auto up = load_pretrained(models_test::model_dir("llama-bf16"), at::kFloat);
  for (auto& [k, t] : state_dict(*up)) {
    EXPECT_EQ(t.scalar_type(), at::kFloat) << k;
    EXPECT_TRUE(flex_test::equal(t, ck16.get(k).to(at::kFloat))) << k;
  }
  // "auto" on an f32 config stays f32.
  auto f = load_pretrained(models_test::model_dir("gpt2"), "auto");
  EXPECT_EQ(f->input_embeddings()->weight.scalar_type(), at::kFloat);
  EXPECT_THROW(load_pretrained(models_test::model_dir("gpt2"), "int8"), ConfigError);
}

// A writable copy of a fixture model with its tensors rewritten by `edit`.
std::string copy_model(const flex_test::TempDir& dir, const std::string& name,
                       const std::function<void(std::vector<std::pair<std::string, at::Tensor>>&)>& edit,
                       const std::string& config_text = "") {
  auto ckpt = Checkpoint::open(models_test::model_dir(name));
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& k : ckpt.keys()) tensors.emplace_back(k, ckpt.get(k));
  edit(tensors);
  save_safetensors(dir.str("model.safetensors"), tensors, {{"format", "pt"}});
  if (config_text.empty())
    fs::copy_file(models_test::model_dir(name) + "/config.json", dir.str("config.json"));
  else
    write_text(dir.str("config.json"), config_text);
  return dir.str();
}

TEST(Loading, MissingAndMisShapedKeysAreNamed) {
  flex_test::TempDir missing;
  copy_model(missing, "llama", [](auto& ts) {
    ts.erase(std::remove_if(ts.begin(), ts.end(), [](auto& p) { return p.first == "model.norm.weight"; }), ts.end());
  });
  std::string msg = error_of<NotFoundError>([&] { load_pretrained(missing.str(), at::kFloat); });
  EXPECT_TRUE(mentions(msg, "model.norm.weight")) << msg;

  flex_test::TempDir shaped;
  copy_model(shaped, "llama", [](auto& ts) {
    for (auto& p : ts)
      if (p.first == "model.layers.1.mlp.up_proj.weight") p.second = p.second.narrow(0, 0, 100).clone();
  });
  msg = error_of<ShapeError>([&] { load_pretrained(shaped.str(), at::kFloat); });
  EXPECT_TRUE(mentions(msg, "model.layers.1.mlp.up_proj.weight") && mentions(msg, "[100, 64]") &&
              mentions(msg, "[128, 64]"))
      << msg;
}

TEST(Loading, BaseModelCheckpointWithoutPrefixLoads) {
  // The original GPT-2 files name tensors "h.0.attn.c_attn.weight", "wte.weight".
  flex_test::TempDir dir;
  copy_model(dir, "gpt2", [](auto& ts) {
    for (auto& p : ts) p.first = p.first.substr(std::string("transformer.").size());
  });
  auto m = load_pretrained(dir.str(), at::kFloat);
  at::NoGradGuard g;
  EXPECT_TRUE(close(m->logits(models_test::golden_inputs()), models_test::golden_tensors("gpt2")->get("logits"),
                    "prefix-less gpt2 logits"));
}

TEST(Loading, HiddenStatesAreEmbeddingsBlocksAndFinalNorm) {
  at::NoGradGuard g;
  struct C {
    std::string name, first, block, last;
  };
  for (const C& c : {C{"gpt2", "transformer.drop", "transformer.h.", "transformer.ln_f"},
                     C{"llama", "model.embed_tokens", "model.layers.", "model.norm"},
                     C{"gpt-neox", "gpt_neox.emb_dropout", "gpt_neox.layers.", "gpt_neox.final_layer_norm"}}) {
    auto m = load_pretrained(models_test::model_dir(c.name), at::kFloat);
    auto gt = models_test::golden_tensors(c.name);
    LMInputs in;
    in.input_ids = models_test::golden_inputs();
    in.output_hidden_states = true;
    LMOutput out = m->run(in);
    ASSERT_EQ(out.hidden_states.size(), 3u) << c.name;
    EXPECT_TRUE(close(out.hidden_states[0], gt->get(c.first), c.name + " hidden 0"));
    EXPECT_TRUE(close(out.hidden_states[1], gt->get(c.block + "0"), c.name + " hidden 1"));
    EXPECT_TRUE(close(out.hidden_states[2], gt->get(c.last), c.name + " hidden 2"));
    EXPECT_TRUE(close(out.logits, gt->get("logits"), c.name + " logits"));
    EXPECT_FALSE(out.past_key_values);
  }
}

TEST(Loading, ArchitectureFacts) {
  auto g = load_pretrained(models_test::model_dir("gpt2"), at::kFloat);
  EXPECT_EQ(g->no_split_modules(), std::vector<std::string>{"GPT2Block"});
  EXPECT_EQ(g->class_name(), "GPT2LMHeadModel");
  EXPECT_TRUE(g->output_embeddings()->weight.is_same(g->input_embeddings()->weight));
  auto n = load_pretrained(models_test::model_dir("gpt-neox"), at::kFloat);
  EXPECT_EQ(n->no_split_modules(), std::vector<std::string>{"GPTNeoXLayer"});
  EXPECT_FALSE(n->output_embeddings()->weight.is_same(n->input_embeddings()->weight));
  auto l = load_pretrained(models_test::model_dir("llama"), at::kFloat);
  EXPECT_EQ(l->no_split_modules(), std::vector<std::string>{"LlamaDecoderLayer"});
  EXPECT_EQ(l->base_model_prefix(), "model");
}

}  // namespace
