// `--quantize` on the command line: capture's logits are the library's
// quantized model's, convert writes a bitsandbytes folder that loads back to
// the same model, inspect sizes the quantized layers, bad values are usage errors.
#include "cli_util.h"

#include <flex/dispatch/checkpoint.h>
#include <flex/dispatch/safetensors.h>
#include <flex/models/from_pretrained.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "test_util.h"

namespace {

const std::string kInputs = flex_test::fixture("golden/inputs.safetensors");

at::Tensor inputs() { return flex::SafetensorsFile::open(kInputs)->get("input_ids"); }

at::Tensor library_logits(const std::string& dir, const std::string& method) {
  flex::PretrainedOptions o;
  o.quantization = flex::quantization_from_string(method);
  return flex::from_pretrained(dir, o)->logits(inputs());
}

TEST(CliQuantize, CaptureAndConvertGiveTheLibrarysQuantizedModel) {
  flex_test::TempDir tmp;
  const std::string model = flex_test::fixture("models/llama");
  for (const std::string method : {"int8", "nf4"}) {
    auto r = cli_test::run({"capture", model, "--input-ids", kInputs, "--hook", "model.layers.0.mlp", "--quantize",
                            method, "--out", tmp.str(method + ".safetensors")});
    ASSERT_EQ(r.code, 0) << r.err;
    const at::Tensor expect = library_logits(model, method);
    EXPECT_TRUE(flex_test::equal(flex::SafetensorsFile::open(tmp.str(method + ".safetensors"))->get("logits"), expect))
        << method;
    // convert --quantize: bitsandbytes' layout, loading back without the flag.
    r = cli_test::run({"convert", model, "--quantize", method, "--out", tmp.str(method + "-dir")});
    ASSERT_EQ(r.code, 0) << r.err;
    std::ifstream in(tmp.str(method + "-dir/config.json"));
    std::stringstream ss;
    ss << in.rdbuf();
    const auto cfg = nlohmann::json::parse(ss.str());
    EXPECT_EQ(cfg["quantization_config"]["quant_method"], "bitsandbytes");
    EXPECT_EQ(cfg["quantization_config"]["load_in_8bit"], method == "int8");
    auto ck = flex::Checkpoint::open(tmp.str(method + "-dir"));
    EXPECT_TRUE(ck.contains(method == "int8" ? "model.layers.0.mlp.down_proj.SCB"
                                             : "model.layers.0.mlp.down_proj.weight.quant_state.bitsandbytes__nf4"));
    EXPECT_FALSE(ck.contains("lm_head.SCB"));
    EXPECT_TRUE(flex_test::equal(flex::from_pretrained(tmp.str(method + "-dir"))->logits(inputs()), expect)) << method;
  }
}

TEST(CliQuantize, InspectSizesTheQuantizedLayers) {
  const std::string model = flex_test::fixture("models/llama");
  auto plain = cli_test::run({"inspect", model, "--json"});
  auto q = cli_test::run({"inspect", model, "--json", "--quantize", "nf4"});
  ASSERT_EQ(plain.code, 0) << plain.err;
  ASSERT_EQ(q.code, 0) << q.err;
  const auto a = nlohmann::json::parse(plain.out), b = nlohmann::json::parse(q.out);
  // q_proj 64 x 64 float32 = 16384 bytes; nf4: 2048 packed + 256 absmax + 64 code + the JSON state.
  const double fp = a["module_sizes"]["model.layers.0.self_attn.q_proj"].get<double>();
  const double nf4 = b["module_sizes"]["model.layers.0.self_attn.q_proj"].get<double>();
  EXPECT_EQ(fp, 16384.0);
  EXPECT_GT(nf4, 2048.0 + 256 + 64);
  EXPECT_LT(nf4, 2048.0 + 256 + 64 + 200);
  EXPECT_EQ(a["module_sizes"]["lm_head"], b["module_sizes"]["lm_head"]);
}

TEST(CliQuantize, UnknownMethodIsAUsageError) {
  auto r = cli_test::run({"capture", flex_test::fixture("models/llama"), "--input-ids", kInputs, "--hook", "lm_head",
                          "--quantize", "int4", "--out", "/tmp/never.safetensors"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--quantize"), std::string::npos) << r.err;
}

// --quantize-head: capture's logits are the library's model with that head
// (and lm_head still captured by name); a bad format is a usage error.
TEST(CliQuantize, QuantizeHeadGivesTheLibrarysModel) {
  flex_test::TempDir tmp;
  const std::string model = flex_test::fixture("models/llama");
  for (const std::string head : {"q8_0", "nf4"}) {
    auto r = cli_test::run({"capture", model, "--input-ids", kInputs, "--hook", "lm_head", "--quantize-head", head,
                            "--out", tmp.str(head + ".safetensors")});
    ASSERT_EQ(r.code, 0) << r.err;
    flex::PretrainedOptions o;
    o.quantize_head = head;
    const at::Tensor expect = flex::from_pretrained(model, o)->logits(inputs());
    auto f = flex::SafetensorsFile::open(tmp.str(head + ".safetensors"));
    EXPECT_TRUE(flex_test::equal(f->get("logits"), expect)) << head;
    EXPECT_FALSE(flex_test::equal(expect, flex::from_pretrained(model)->logits(inputs()))) << head;
  }
  auto r = cli_test::run({"capture", model, "--input-ids", kInputs, "--hook", "lm_head", "--quantize-head", "q4_k",
                          "--out", tmp.str("never.safetensors")});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--quantize-head"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("q6_k"), std::string::npos) << r.err;
}

// --quantize-embeddings: the embedding's capture (model.embed_tokens, by
// name) and the logits are the library's model with that table; a bad
// format is a usage error.
TEST(CliQuantize, QuantizeEmbeddingsGivesTheLibrarysModel) {
  flex_test::TempDir tmp;
  const std::string model = flex_test::fixture("models/llama");
  auto r = cli_test::run({"capture", model, "--input-ids", kInputs, "--hook", "model.embed_tokens",
                          "--quantize-embeddings", "int8", "--out", tmp.str("int8.safetensors")});
  ASSERT_EQ(r.code, 0) << r.err;
  flex::PretrainedOptions o;
  o.quantize_embeddings = "int8";
  auto lm = flex::from_pretrained(model, o);
  auto f = flex::SafetensorsFile::open(tmp.str("int8.safetensors"));
  EXPECT_TRUE(flex_test::equal(f->get("logits"), lm->logits(inputs())));
  const at::Tensor rows = lm->input_embeddings()->float_weight().index_select(0, inputs().reshape({-1}));
  EXPECT_TRUE(flex_test::equal(f->get("model.embed_tokens").reshape({-1, rows.size(1)}), rows));
  r = cli_test::run({"capture", model, "--input-ids", kInputs, "--hook", "model.embed_tokens", "--quantize-embeddings",
                     "q4_k", "--out", tmp.str("never.safetensors")});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--quantize-embeddings"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("q6_k"), std::string::npos) << r.err;
}

}  // namespace
