// A llama GGUF as a flexmodel model: scripts/golden/make_gguf.py saved a
// random Llama with Transformers 5.23 (tests/data/gguf/llama-tiny/), its F32
// GGUF laid out as llama.cpp's converter lays it out (q/k rows permuted),
// and Transformers' logits for fixed ids. The GGUF model's config, weights
// and logits are checked against those.
#include <flex/dispatch/atomic_file.h>
#include <flex/dispatch/gguf.h>
#include <flex/dispatch/safetensors.h>
#include <flex/hooks/errors.h>
#include <flex/models/from_pretrained.h>
#include <flex/models/gguf_model.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>

#include "expect_error.h"
#include "test_util.h"

using flex_test::data_path;

namespace {

using flex_test::expect_error;

std::string gguf_path() { return data_path("gguf/llama-tiny.gguf"); }
std::string hf_dir() { return data_path("gguf/llama-tiny"); }


}  // namespace

TEST(GgufModel, ConfigFromMetadataMatchesTransformers) {
  auto f = flex::GgufFile::open(gguf_path());
  const nlohmann::json c = flex::gguf_config_json(*f);
  std::ifstream in(hf_dir() + "/config.json");
  const nlohmann::json hf = nlohmann::json::parse(in);
  for (const char* k : {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                        "num_key_value_heads", "max_position_embeddings", "vocab_size", "head_dim",
                        "tie_word_embeddings", "attention_bias", "mlp_bias", "hidden_act", "bos_token_id",
                        "eos_token_id"})
    EXPECT_EQ(c.at(k), hf.at(k)) << k;
  // float32 in the file: compare as float32.
  EXPECT_EQ(static_cast<float>(c.at("rms_norm_eps").get<double>()), static_cast<float>(hf.at("rms_norm_eps").get<double>()));
  EXPECT_EQ(c.at("rope_theta").get<double>(), hf.at("rope_parameters").at("rope_theta").get<double>());
}

// Every weight equals the safetensors checkpoint's (q/k un-permuted).
TEST(GgufModel, WeightsEqualTheSafetensorsCheckpoint) {
  auto f = flex::GgufFile::open(gguf_path());
  auto st = flex::SafetensorsFile::open(hf_dir() + "/model.safetensors");
  // The file's q/k rows are in llama.cpp's order, not Transformers'.
  EXPECT_FALSE(at::equal(f->dequantize("blk.0.attn_q.weight"), st->get("model.layers.0.self_attn.q_proj.weight")));
  EXPECT_FALSE(at::equal(f->dequantize("blk.1.attn_k.weight"), st->get("model.layers.1.self_attn.k_proj.weight")));
  auto sd = flex::gguf_state_dict(*f);
  ASSERT_EQ(sd.size(), st->names().size());
  for (const auto& [name, t] : sd) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(st->contains(name));
    EXPECT_TRUE(flex_test::equal(t, st->get(name)));
  }
}

// from_pretrained("x.gguf"): logits equal Transformers' and the same model
// loaded from its safetensors folder, within 1e-5.
TEST(GgufModel, LogitsEqualTransformersAndSafetensorsModel) {
  auto ref = flex::SafetensorsFile::open(data_path("gguf/llama-tiny.logits.safetensors"));
  const at::Tensor ids = ref->get("input_ids");
  const at::Tensor want = ref->get("logits");
  at::NoGradGuard no_grad;
  auto g = flex::from_pretrained(gguf_path());
  auto s = flex::from_pretrained(hf_dir());
  const at::Tensor lg = g->logits(ids), ls = s->logits(ids);
  EXPECT_TRUE(flex_test::close(lg, want, 0, 1e-5)) << "GGUF model vs Transformers";
  EXPECT_TRUE(flex_test::close(lg, ls, 0, 1e-5)) << "GGUF model vs safetensors model";
  // Not merely close by accident: the logits are far from zero.
  EXPECT_GT(want.abs().max().item<double>(), 0.5);
  flex::PretrainedOptions copy;
  copy.mmap = false;
  copy.torch_dtype = "auto";
  EXPECT_TRUE(flex_test::close(flex::from_pretrained(gguf_path(), copy)->logits(ids), want, 0, 1e-5));
}

// A Q8_0 GGUF (gguf-py quantized every matrix of whole 32-blocks): logits
// equal Transformers' with the weights gguf-py dequantizes from the file.
TEST(GgufModel, Q8_0LogitsEqualTransformersWithGgufPyDequantizedWeights) {
  const std::string path = data_path("gguf/llama-tiny-q8_0.gguf");
  auto f = flex::GgufFile::open(path);
  int q8 = 0;
  for (const auto& n : f->tensor_names()) q8 += f->tensor(n).type == 8;
  EXPECT_GE(q8, 10);
  auto ref = flex::SafetensorsFile::open(data_path("gguf/llama-tiny-q8_0.logits.safetensors"));
  at::NoGradGuard no_grad;
  const at::Tensor lg = flex::from_pretrained(path)->logits(ref->get("input_ids"));
  EXPECT_TRUE(flex_test::close(lg, ref->get("logits"), 0, 1e-5));
}

// Tied embeddings: no output.weight in the file; the head is the embedding.
TEST(GgufModel, TiedEmbeddingsLogitsEqualTransformers) {
  const std::string path = data_path("gguf/llama-tiny-tied-q8_0.gguf");
  auto f = flex::GgufFile::open(path);
  EXPECT_FALSE(f->contains("output.weight"));
  EXPECT_TRUE(flex::gguf_config_json(*f).at("tie_word_embeddings").get<bool>());
  auto ref = flex::SafetensorsFile::open(data_path("gguf/llama-tiny-tied-q8_0.logits.safetensors"));
  at::NoGradGuard no_grad;
  auto m = flex::from_pretrained(path);
  EXPECT_TRUE(flex_test::close(m->logits(ref->get("input_ids")), ref->get("logits"), 0, 1e-5));
}

// Qwen2 (arch qwen2: q/k/v biases, tied embeddings, q/k rows not permuted
// by llama.cpp's converter), Q8_0: logits equal Transformers' on gguf-py's weights.
TEST(GgufModel, Qwen2LogitsEqualTransformers) {
  const std::string path = data_path("gguf/qwen2-tiny-q8_0.gguf");
  auto f = flex::GgufFile::open(path);
  const nlohmann::json c = flex::gguf_config_json(*f);
  EXPECT_EQ(c.at("model_type"), "qwen2");
  EXPECT_TRUE(f->contains("blk.0.attn_q.bias"));
  auto ref = flex::SafetensorsFile::open(data_path("gguf/qwen2-tiny-q8_0.logits.safetensors"));
  at::NoGradGuard no_grad;
  auto m = flex::from_pretrained(path);
  EXPECT_EQ(m->class_name(), "Qwen2ForCausalLM");
  EXPECT_TRUE(flex_test::close(m->logits(ref->get("input_ids")), ref->get("logits"), 0, 1e-5));
}

// Qwen3 (arch qwen3: q/k norms per head, head_dim from attention.key_length, no q/k permutation).
TEST(GgufModel, Qwen3LogitsEqualTransformers) {
  const std::string path = data_path("gguf/qwen3-tiny-q8_0.gguf");
  auto f = flex::GgufFile::open(path);
  const nlohmann::json c = flex::gguf_config_json(*f);
  EXPECT_EQ(c.at("model_type"), "qwen3");
  EXPECT_EQ(c.at("head_dim"), 32);
  EXPECT_EQ(c.at("hidden_size"), 64);
  auto ref = flex::SafetensorsFile::open(data_path("gguf/qwen3-tiny-q8_0.logits.safetensors"));
  at::NoGradGuard no_grad;
  auto m = flex::from_pretrained(path);
  EXPECT_EQ(m->class_name(), "Qwen3ForCausalLM");
  m->get_submodule("model.layers.1.self_attn.k_norm");  // present (NotFoundError otherwise)
  EXPECT_TRUE(flex_test::close(m->logits(ref->get("input_ids")), ref->get("logits"), 0, 1e-5));
}

// Phi-3 (arch phi3: fused attn_qkv / ffn_up as Transformers' qkv_proj / gate_up_proj; no head_dim in its config).
TEST(GgufModel, Phi3LogitsEqualTransformers) {
  const std::string path = data_path("gguf/phi3-tiny-q8_0.gguf");
  auto f = flex::GgufFile::open(path);
  const nlohmann::json c = flex::gguf_config_json(*f);
  EXPECT_EQ(c.at("model_type"), "phi3");
  EXPECT_FALSE(c.contains("head_dim"));
  auto ref = flex::SafetensorsFile::open(data_path("gguf/phi3-tiny-q8_0.logits.safetensors"));
  at::NoGradGuard no_grad;
  auto m = flex::from_pretrained(path);
  EXPECT_EQ(m->class_name(), "Phi3ForCausalLM");
  m->get_submodule("model.layers.0.self_attn.qkv_proj");  // present (NotFoundError otherwise)
  m->get_submodule("model.layers.1.mlp.gate_up_proj");
  EXPECT_TRUE(flex_test::close(m->logits(ref->get("input_ids")), ref->get("logits"), 0, 1e-5));
}

// Gemma 2 (arch gemma2: norms stored as 1 + w, four norms per block, softcaps and the window from the
// metadata, query_pre_attn_scalar = head_dim as llama.cpp assumes; tied embeddings).
TEST(GgufModel, Gemma2LogitsEqualTransformers) {
  const std::string path = data_path("gguf/gemma2-tiny-q8_0.gguf");
  auto f = flex::GgufFile::open(path);
  const nlohmann::json c = flex::gguf_config_json(*f);
  EXPECT_EQ(c.at("model_type"), "gemma2");
  EXPECT_EQ(c.at("sliding_window"), 4);
  EXPECT_EQ(c.at("query_pre_attn_scalar"), 32);
  EXPECT_EQ(c.at("final_logit_softcapping").get<double>(), 30.0);
  auto ref = flex::SafetensorsFile::open(data_path("gguf/gemma2-tiny-q8_0.logits.safetensors"));
  at::NoGradGuard no_grad;
  auto m = flex::from_pretrained(path);
  EXPECT_EQ(m->class_name(), "Gemma2ForCausalLM");
  m->get_submodule("model.layers.1.post_feedforward_layernorm");  // present (NotFoundError otherwise)
  EXPECT_TRUE(flex_test::close(m->logits(ref->get("input_ids")), ref->get("logits"), 0, 1e-5));
}

TEST(GgufModel, Errors) {
  flex_test::TempDir dir;
  std::string b = flex::read_file(gguf_path());
  // general.architecture "llama" -> "llamb" (same length).
  std::string needle = std::string("\x05\0\0\0\0\0\0\0llama", 13);
  const size_t at = b.find(needle);
  ASSERT_NE(at, std::string::npos);
  b[at + 12] = 'b';
  const std::string bad = dir.str("llamb.gguf");
  std::ofstream(bad, std::ios::binary) << b;
  expect_error<flex::UnsupportedError>([&] { flex::from_pretrained(bad); }, {bad, "'llamb'"});
  flex::PretrainedOptions o;
  o.device_map_strategy = "auto";
  expect_error<flex::UnsupportedError>([&] { flex::from_pretrained(gguf_path(), o); }, {gguf_path(), "device maps"});
  // A tensor renamed to one llama has no place for; a block's tensor moved to
  // a block past block_count; a metadata size the tensors do not have.
  auto patched = [&](const std::string& name, const std::string& from, const std::string& to) {
    std::string c = flex::read_file(gguf_path());
    const size_t i = c.find(from);
    EXPECT_NE(i, std::string::npos) << from;
    c.replace(i, from.size(), to);
    const std::string p = dir.str(name);
    std::ofstream(p, std::ios::binary) << c;
    return p;
  };
  const std::string odd = patched("odd.gguf", "blk.1.ffn_up.weight", "blk.1.ffn_uq.weight");
  expect_error<flex::UnsupportedError>([&] { flex::from_pretrained(odd); }, {odd, "'blk.1.ffn_uq.weight'"});
  const std::string moved = patched("moved.gguf", "blk.1.ffn_up.weight", "blk.7.ffn_up.weight");
  expect_error<flex::NotFoundError>([&] { flex::from_pretrained(moved); }, {moved, "model.layers.1.mlp.up_proj.weight"});
  std::string ff = std::string("llama.feed_forward_length") + std::string("\x04\0\0\0", 4);
  const std::string sized = patched("sized.gguf", ff + std::string("\x30", 1), ff + std::string("\x40", 1));
  expect_error<flex::ShapeError>([&] { flex::from_pretrained(sized); }, {sized, "'blk.0.ffn_gate.weight'", "[48, 32]", "[64, 32]"});
  EXPECT_TRUE(flex::is_gguf_file(gguf_path()));
  EXPECT_FALSE(flex::is_gguf_file(hf_dir()));
  EXPECT_FALSE(flex::is_gguf_file(hf_dir() + "/config.json"));
}
