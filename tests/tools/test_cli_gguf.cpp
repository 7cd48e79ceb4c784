// The flexmodel command line on a GGUF file (tests/data/gguf, written by
// scripts/golden/make_gguf.py): `capture` gives the captures of the
// safetensors folder the GGUF was converted from, and `convert` writes the
// GGUF back as that Transformers folder.
#include "cli_util.h"

#include <flex/dispatch/safetensors.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>

#include "test_util.h"

using cli_test::run;
using flex_test::data_path;

namespace {

const std::string kGguf = data_path("gguf/llama-tiny.gguf");
const std::string kFolder = data_path("gguf/llama-tiny");
const std::string kIds = data_path("gguf/llama-tiny.logits.safetensors");  // holds input_ids

}  // namespace

TEST(CliGguf, CaptureEqualsTheSafetensorsFolders) {
  flex_test::TempDir tmp;
  auto g = run({"capture", kGguf, "--input-ids", kIds, "--hook", "all", "--out", tmp.str("g.safetensors")});
  ASSERT_EQ(g.code, 0) << g.err;
  auto s = run({"capture", kFolder, "--input-ids", kIds, "--hook", "all", "--out", tmp.str("s.safetensors")});
  ASSERT_EQ(s.code, 0) << s.err;
  auto fg = flex::SafetensorsFile::open(tmp.str("g.safetensors"));
  auto fs = flex::SafetensorsFile::open(tmp.str("s.safetensors"));
  ASSERT_EQ(fg->names(), fs->names());
  EXPECT_GE(fg->names().size(), 20u);
  for (const auto& n : fs->names()) {
    SCOPED_TRACE(n);
    const at::Tensor a = fg->get(n), b = fs->get(n);
    if (a.is_floating_point())
      EXPECT_TRUE(flex_test::close(a, b, 0, 1e-5));
    else
      EXPECT_TRUE(flex_test::equal(a, b));
  }
}

TEST(CliGguf, ConvertWritesTheTransformersFolder) {
  flex_test::TempDir tmp;
  auto r = run({"convert", kGguf, "--out", tmp.str("out")});
  ASSERT_EQ(r.code, 0) << r.err;
  auto got = flex::SafetensorsFile::open(tmp.str("out/model.safetensors"));
  auto want = flex::SafetensorsFile::open(kFolder + "/model.safetensors");
  ASSERT_EQ(got->names().size(), want->names().size());
  for (const auto& n : want->names()) {
    SCOPED_TRACE(n);
    EXPECT_TRUE(flex_test::equal(got->get(n), want->get(n)));
  }
  std::ifstream a(tmp.str("out/config.json")), b(kFolder + "/config.json");
  const auto ca = nlohmann::json::parse(a), cb = nlohmann::json::parse(b);
  for (const char* k : {"model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                        "num_key_value_heads", "vocab_size", "head_dim", "tie_word_embeddings"})
    EXPECT_EQ(ca.at(k), cb.at(k)) << k;
  // The written folder is a model folder: a capture on it runs.
  auto c = run({"capture", tmp.str("out"), "--input-ids", kIds, "--hook", "model.layers.1", "--out", tmp.str("c.safetensors")});
  EXPECT_EQ(c.code, 0) << c.err;
  auto q = run({"convert", kGguf, "--out", tmp.str("q"), "--quantize", "int8"});
  EXPECT_NE(q.code, 0);
  EXPECT_NE(q.err.find("GGUF"), std::string::npos) << q.err;
}

TEST(CliGguf, InspectEqualsTheFolders) {
  auto g = run({"inspect", kGguf});
  ASSERT_EQ(g.code, 0) << g.err;
  auto s = run({"inspect", kFolder});
  ASSERT_EQ(s.code, 0) << s.err;
  EXPECT_EQ(g.out, s.out);
  EXPECT_NE(g.out.find("LlamaForCausalLM"), std::string::npos) << g.out;
}

// --fast-activations on a GGUF whose layers are quantized (llama-mixed.gguf:
// every quantized type), on a 5-token input (decode-shaped: longer inputs
// take the float prefill either way): captures stay within the error docs/gguf.md gives
// (3e-2 of each tensor's largest value), differ from the faithful ones, and
// generate runs; on a safetensors folder the flag is a usage error.
TEST(CliGguf, FastActivations) {
  const std::string mixed = data_path("gguf/llama-mixed.gguf");
  flex_test::TempDir tmp;
  const std::string ids = tmp.str("ids.safetensors");
  flex::save_safetensors(ids, {{"input_ids", at::tensor({1, 7, 19, 42, 3}, at::kLong).view({1, 5})}});
  auto a = run({"capture", mixed, "--input-ids", ids, "--hook", "all", "--out", tmp.str("a.safetensors")});
  ASSERT_EQ(a.code, 0) << a.err;
  auto b = run({"capture", mixed, "--input-ids", ids, "--hook", "all", "--out", tmp.str("b.safetensors"),
                "--fast-activations"});
  ASSERT_EQ(b.code, 0) << b.err;
  auto fa = flex::SafetensorsFile::open(tmp.str("a.safetensors"));
  auto fb = flex::SafetensorsFile::open(tmp.str("b.safetensors"));
  ASSERT_EQ(fa->names(), fb->names());
  for (const char* n : {"lm_head", "model.layers.0.mlp.down_proj", "model.layers.0.self_attn.q_proj"}) {
    SCOPED_TRACE(n);
    const at::Tensor x = fa->get(n), y = fb->get(n);
    EXPECT_TRUE(flex_test::close(y, x, 0, 3e-2 * x.abs().max().item<double>()));
    EXPECT_FALSE(at::equal(x, y));
  }
  auto g = run({"generate", mixed, "--input-ids", ids, "--max-new-tokens", "4", "--fast-activations"});
  EXPECT_EQ(g.code, 0) << g.err;
  auto bad = run({"capture", kFolder, "--input-ids", kIds, "--hook", "lm_head", "--out", tmp.str("c.safetensors"),
                  "--fast-activations"});
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("GGUF"), std::string::npos) << bad.err;
}

// A GGUF whose only tokenizer is its tokenizer.ggml.* metadata (llama-bpe family,
// add_bos_token): --prompt is tokenized as the `tokenizers` package tokenizes it,
// and generate prints the text of Transformers' greedy tokens (make_gguf.py).
TEST(CliGguf, PromptTokenizedFromTheGgufVocabulary) {
  const std::string model = data_path("gguf/llama-bpe-tiny-q8_0.gguf");
  nlohmann::json e;
  std::ifstream(data_path("gguf/llama-bpe-tiny-q8_0.expected.json")) >> e;
  const std::string prompt = e["prompt"];
  flex_test::TempDir tmp;
  auto c = run({"capture", model, "--prompt", prompt, "--hook", "model.layers.1", "--out", tmp.str("c.safetensors")});
  ASSERT_EQ(c.code, 0) << c.err;
  const at::Tensor ids = flex::SafetensorsFile::open(tmp.str("c.safetensors"))->get("input_ids");
  const std::vector<int64_t> want = e["prompt_ids"];
  ASSERT_EQ(ids.numel(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(ids.flatten()[i].item<int64_t>(), want[i]) << "position " << i;
  auto g = run({"generate", model, "--prompt", prompt, "--max-new-tokens", "4"});
  ASSERT_EQ(g.code, 0) << g.err;
  EXPECT_EQ(g.out, e["text"].get<std::string>() + "\n");
}
