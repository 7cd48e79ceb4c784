// flexmodel generate (edits through HookFunctions) and convert, run as a
// separate process, checked against independent computations: a steering
// vector or patch on the logits forces known tokens, ablating a head equals
// zeroing that head's rows of the output projection in the checkpoint, and
// converted checkpoints equal the fixtures Transformers/Accelerate wrote.
#include "../models/golden_util.h"
#include "cli_util.h"
#include "tiny_gpt2_folder.h"
#include "hf_folder.h"

#include <flex/dispatch/checkpoint.h>
#include <flex/dispatch/offload_folder.h>
#include <flex/dispatch/safetensors.h>
#include <flex/models/generate.h>
#include <flex/tokenizers/tokenizer.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>

#include "test_util.h"

using cli_test::run;
namespace fs = std::filesystem;

namespace {

const std::string& tiny_model() { return cli_test::tiny_gpt2_folder(); }

void save_vector(const std::string& path, const std::string& name, const at::Tensor& t) {
  flex::save_safetensors(path, {{name, t}});
}

std::string greedy_in_process(const std::string& dir, const std::string& prompt, int64_t n) {
  auto model = flex::load_pretrained(dir);
  auto tok = flex::load_tokenizer(dir);
  auto ids = tok->encode(prompt);
  flex::GenerateOptions g;
  g.max_new_tokens = n;
  at::NoGradGuard ng;
  auto out = flex::generate(*model, at::tensor(ids, at::kLong).unsqueeze(0), {}, g);
  return prompt + tok->decode(out.new_tokens(0)) + "\n";
}

}  // namespace

TEST(CliGenerate, GreedyEqualsLibraryGenerate) {
  auto r = run({"generate", tiny_model(), "--prompt", "the cat", "--max-new-tokens", "6"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, greedy_in_process(tiny_model(), "the cat", 6));
  // Weights copied into memory instead of mapped: the same text.
  auto copied = run({"generate", tiny_model(), "--prompt", "the cat", "--max-new-tokens", "6", "--no-mmap"});
  ASSERT_EQ(copied.code, 0) << copied.err;
  EXPECT_EQ(copied.out, r.out);
}

/// Greedy continuation of `ids` by full recomputation and argmax (no cache, no generate()).
std::vector<int64_t> greedy_by_argmax(const std::string& dir, std::vector<int64_t> ids, int n) {
  auto model = flex::load_pretrained(dir);
  at::NoGradGuard ng;
  for (int i = 0; i < n; ++i) {
    at::Tensor logits = model->logits(at::tensor(ids, at::kLong).unsqueeze(0));
    ids.push_back(logits[0][-1].argmax().item<int64_t>());
  }
  return ids;
}

std::string joined(const std::vector<int64_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? " " : "") + std::to_string(ids[i]);
  return s + "\n";
}

TEST(CliGenerate, InputIdsWorkWithoutATokenizer) {
  flex_test::TempDir tmp;
  // The model folder without its tokenizer files.
  fs::create_directories(tmp.str("bare"));
  for (const char* f : {"config.json", "model.safetensors"})
    fs::copy_file(fs::path(tiny_model()) / f, tmp.path() / "bare" / f);
  const std::vector<int64_t> a = {5, 17, 3, 40}, b = {9, 2};
  // Row 1 left-padded to row 0's length: it must continue as it would alone.
  flex::save_safetensors(tmp.str("ids.safetensors"),
                         {{"input_ids", at::tensor(std::vector<int64_t>{5, 17, 3, 40, 0, 0, 9, 2}).view({2, 4})},
                          {"attention_mask", at::tensor(std::vector<int64_t>{1, 1, 1, 1, 0, 0, 1, 1}).view({2, 4})}});
  auto r = run({"generate", tmp.str("bare"), "--input-ids", tmp.str("ids.safetensors"), "--max-new-tokens", "5"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, joined(greedy_by_argmax(tmp.str("bare"), a, 5)) + joined(greedy_by_argmax(tmp.str("bare"), b, 5)));
  // With a tokenizer the rows are decoded; a prompt without one is an error naming the folder.
  r = run({"generate", tiny_model(), "--input-ids", tmp.str("ids.safetensors"), "--max-new-tokens", "5"});
  ASSERT_EQ(r.code, 0) << r.err;
  auto tok = flex::load_tokenizer(tiny_model());
  EXPECT_EQ(r.out, tok->decode(greedy_by_argmax(tiny_model(), a, 5)) + "\n" + tok->decode(greedy_by_argmax(tiny_model(), b, 5)) + "\n");
  r = run({"generate", tmp.str("bare"), "--prompt", "hi"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("has no tokenizer"), std::string::npos) << r.err;
  r = run({"generate", tmp.str("bare"), "--prompt", "hi", "--input-ids", tmp.str("ids.safetensors")});
  EXPECT_EQ(r.code, 2) << r.err;
}

TEST(CliGenerate, SteeringTheLogitsForcesAToken) {
  flex_test::TempDir tmp;
  const int64_t z = 'Z';  // the tiny tokenizer's id of byte 'Z'
  save_vector(tmp.str("v.safetensors"), "vector", at::one_hot(at::tensor(z), flex_examples::tiny_vocab_size()).to(at::kFloat));
  auto r = run({"generate", tiny_model(), "--prompt", "the cat", "--max-new-tokens", "5", "--steer",
                "lm_head=" + tmp.str("v.safetensors") + ":1000"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "the catZZZZZ\n");
}

TEST(CliGenerate, AblatingTheLogitsGivesTokenZero) {
  auto r = run({"generate", tiny_model(), "--prompt", "hi", "--max-new-tokens", "3", "--ablate", "lm_head"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, std::string("hi") + std::string(3, '\0') + "\n");
}

TEST(CliGenerate, AblatingAHeadEqualsZeroingItsOutputProjectionRows) {
  flex_test::TempDir tmp;
  // Copy the folder, zero rows [16, 32) of transformer.h.0.attn.c_proj.weight
  // (Conv1D: (in, out); head 1 of 4 x 16 feeds those input rows).
  const std::string edited = tmp.str("edited");
  fs::create_directories(edited);
  for (const auto& e : fs::directory_iterator(tiny_model())) fs::copy_file(e.path(), edited + "/" + e.path().filename().string());
  auto f = flex::SafetensorsFile::open(tiny_model() + "/model.safetensors");
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& n : f->names()) {
    at::Tensor t = f->get(n).clone();
    if (n == "transformer.h.0.attn.c_proj.weight") t.narrow(0, 16, 16).zero_();
    tensors.emplace_back(n, t);
  }
  flex::save_safetensors(edited + "/model.safetensors", tensors, {{"format", "pt"}});
  const std::string want = greedy_in_process(edited, "the sea", 8);
  auto r = run({"generate", tiny_model(), "--prompt", "the sea", "--max-new-tokens", "8", "--ablate", "transformer.h.0.attn:1"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, want);
  // The edit is not a no-op: the edited checkpoint's logits differ from the original's.
  at::NoGradGuard ng;
  at::Tensor ids = at::tensor(flex::load_tokenizer(tiny_model())->encode("the sea"), at::kLong).unsqueeze(0);
  EXPECT_FALSE(at::allclose(flex::load_pretrained(edited)->logits(ids), flex::load_pretrained(tiny_model())->logits(ids)));
}

TEST(CliGenerate, PatchingThePromptLogitsForcesTheFirstToken) {
  flex_test::TempDir tmp;
  const int64_t y = 'Y';
  // "ab": two byte tokens; the patch covers positions 0 and 1 of the prompt only.
  at::Tensor p = 1000 * at::one_hot(at::full({1, 2}, y, at::kLong), flex_examples::tiny_vocab_size()).to(at::kFloat);
  save_vector(tmp.str("p.safetensors"), "lm_head", p);
  auto r = run({"generate", tiny_model(), "--prompt", "ab", "--max-new-tokens", "1", "--patch", "lm_head=" + tmp.str("p.safetensors")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "abY\n");
  // Later steps are not patched: the continuation after Y is the model's own.
  auto r3 = run({"generate", tiny_model(), "--prompt", "ab", "--max-new-tokens", "3", "--patch", "lm_head=" + tmp.str("p.safetensors")});
  ASSERT_EQ(r3.code, 0) << r3.err;
  EXPECT_EQ(r3.out.substr(0, 3), "abY");
  EXPECT_EQ(r3.out, greedy_in_process(tiny_model(), "abY", 2));
}

TEST(CliGenerate, BadEditSpecs) {
  flex_test::TempDir tmp;
  auto r = run({"generate", tiny_model(), "--prompt", "x", "--steer", "lm_head"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("NAME=VECTOR.safetensors:ALPHA"), std::string::npos) << r.err;
  r = run({"generate", tiny_model(), "--prompt", "x", "--ablate", "transformer.h.0.mlp:1"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("not an attention module"), std::string::npos) << r.err;
  r = run({"generate", tiny_model(), "--prompt", "x", "--ablate", "transformer.h.9.attn"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("transformer.h.9.attn"), std::string::npos) << r.err;
  save_vector(tmp.str("v.safetensors"), "vector", at::ones({7}));
  r = run({"generate", tiny_model(), "--prompt", "x", "--steer", "transformer.h.0=" + tmp.str("v.safetensors") + ":2"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("7 elements"), std::string::npos) << r.err;
}

// --- convert -------------------------------------------------------------------------

TEST(CliConvert, Bf16EqualsTransformersBf16Checkpoint) {
  flex_test::TempDir tmp;
  auto r = run({"convert", flex_test::fixture("models/llama"), "--out", tmp.str("bf16"), "--dtype", "bf16"});
  ASSERT_EQ(r.code, 0) << r.err;
  auto ours = flex::Checkpoint::open(tmp.str("bf16"));
  auto ref = flex::Checkpoint::open(flex_test::fixture("models/llama-bf16"));
  EXPECT_EQ(ours.keys(), ref.keys());
  for (const auto& k : ref.keys()) {
    EXPECT_EQ(ours.dtype(k), at::kBFloat16) << k;
    EXPECT_TRUE(flex_test::equal(ours.get(k), ref.get(k))) << k;
  }
  const auto cfg = models_test::read_json(tmp.str("bf16/config.json"));
  EXPECT_EQ(cfg["torch_dtype"], "bfloat16");
  EXPECT_TRUE(fs::exists(tmp.str("bf16/generation_config.json")));
}

TEST(CliConvert, ReshardKeepsEveryTensorAndCaptureStillMatchesGolden) {
  flex_test::TempDir tmp;
  auto r = run({"convert", flex_test::fixture("models/llama"), "--out", tmp.str("sh"), "--max-shard-size", "150KB"});
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_TRUE(fs::exists(tmp.str("sh/model.safetensors.index.json")));
  auto ours = flex::Checkpoint::open(tmp.str("sh"));
  auto ref = flex::Checkpoint::open(flex_test::fixture("models/llama"));
  EXPECT_GE(ours.files().size(), 3u);
  for (const auto& file : ours.files()) {
    auto keys = ours.keys_in(file);
    if (keys.size() > 1) {
      EXPECT_LE(fs::file_size(file), 150000u + 4096u) << file;  // data <= limit, plus the header
    }
  }
  EXPECT_EQ(ours.keys(), ref.keys());
  for (const auto& k : ref.keys()) EXPECT_TRUE(flex_test::equal(ours.get(k), ref.get(k))) << k;
  auto c = run({"capture", tmp.str("sh"), "--input-ids", flex_test::fixture("golden/inputs.safetensors"), "--hook",
                "model.layers.1", "--out", tmp.str("cap.safetensors")});
  ASSERT_EQ(c.code, 0) << c.err;
  auto cap = flex::SafetensorsFile::open(tmp.str("cap.safetensors"));
  auto golden = models_test::golden_tensors("llama");
  EXPECT_TRUE(models_test::close(cap->get("model.layers.1"), golden->get("model.layers.1"), "layer 1"));
}

TEST(CliConvert, OffloadFolderIsByteIdenticalToAccelerates) {
  flex_test::TempDir tmp;
  auto r = run({"convert", flex_test::fixture("models/llama"), "--out", tmp.str("off"), "--offload-folder"});
  ASSERT_EQ(r.code, 0) << r.err;
  auto ours = flex::OffloadFolder::open(tmp.str("off"));
  auto ref = flex::OffloadFolder::open(flex_test::fixture("offload/llama"));
  auto on = ours.names(), rn = ref.names();
  std::sort(on.begin(), on.end());
  std::sort(rn.begin(), rn.end());
  EXPECT_EQ(on, rn);
  for (const auto& n : rn) {
    EXPECT_EQ(cli_test::slurp(tmp.str("off/" + n + ".dat")), cli_test::slurp(flex_test::fixture("offload/llama/" + n + ".dat")))
        << n;
    EXPECT_EQ(ours.index().find(n)->dtype, ref.index().find(n)->dtype);
    EXPECT_EQ(ours.index().find(n)->shape, ref.index().find(n)->shape);
  }
  EXPECT_TRUE(fs::exists(tmp.str("off/config.json")));
}
