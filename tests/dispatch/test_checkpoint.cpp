// Checkpoint resolution (file, index, legacy index, folder) and torch .bin reading.
#include <flex/dispatch/atomic_file.h>
#include <flex/dispatch/checkpoint.h>
#include <flex/dispatch/safetensors.h>
#include <flex/hooks/errors.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "expect_error.h"
#include "test_util.h"

namespace fs = std::filesystem;
using flex_test::data_path;
using flex_test::fixture;

namespace {

using flex_test::expect_error;


std::string abs(const std::string& p) { return fs::absolute(p).lexically_normal().string(); }

}  // namespace

TEST(Checkpoint, FolderWithModelSafetensors) {
  auto c = flex::Checkpoint::open(fixture("models/llama"));
  EXPECT_TRUE(c.is_safetensors());
  ASSERT_EQ(c.files().size(), 1u);
  EXPECT_EQ(c.files()[0], abs(fixture("models/llama/model.safetensors")));
  EXPECT_EQ(c.keys().size(), 21u);
  EXPECT_EQ(c.dtype("model.norm.weight"), at::kFloat);
  EXPECT_EQ(c.shape("model.layers.0.self_attn.k_proj.weight"), (std::vector<int64_t>{32, 64}));  // GQA: 2 kv heads x 16
  EXPECT_FALSE(c.contains("lm_head.bias"));
  expect_error<flex::NotFoundError>([&] { c.get("model.layers.0.mlp.up_proj.weights"); },
                                    {"up_proj.weights", "'model.layers.0.mlp.up_proj.weight'"});
}

// The sharded fixture, opened through its folder and through its index, holds
// exactly the llama tensors.
TEST(Checkpoint, ShardedIndexGivesTheSameTensorsAsTheSingleFile) {
  auto single = flex::Checkpoint::open(fixture("models/llama/model.safetensors"));
  for (const std::string& src : {fixture("models/llama-sharded"),
                                 fixture("models/llama-sharded/model.safetensors.index.json")}) {
    SCOPED_TRACE(src);
    auto sharded = flex::Checkpoint::open(src);
    EXPECT_EQ(sharded.source(), abs(fixture("models/llama-sharded/model.safetensors.index.json")));
    std::vector<std::string> expect_files;
    for (int i = 1; i <= 3; ++i)
      expect_files.push_back(abs(fixture("models/llama-sharded/model-0000" + std::to_string(i) + "-of-00003.safetensors")));
    EXPECT_EQ(sharded.files(), expect_files);
    EXPECT_EQ(sharded.keys(), single.keys());
    for (const auto& k : single.keys()) {
      EXPECT_TRUE(flex_test::equal(sharded.get(k), single.get(k))) << k;
      EXPECT_EQ(sharded.dtype(k), single.dtype(k));
    }
    // From the index file: lm_head.weight is in shard 3, embed_tokens in shard 1.
    EXPECT_EQ(sharded.file_of("lm_head.weight"), expect_files[2]);
    EXPECT_EQ(sharded.file_of("model.embed_tokens.weight"), expect_files[0]);
    auto in1 = sharded.keys_in(expect_files[0]);
    EXPECT_EQ(in1.size(), 6u);
  }
}

TEST(Checkpoint, LegacyFlatIndex) {
  flex_test::TempDir tmp;
  std::string idx = tmp.str("flat.index.json");
  std::ofstream(idx) << "{\"model.norm.weight\": \"" << abs(fixture("models/llama-sharded/model-00003-of-00003.safetensors"))
                     << "\", \"model.embed_tokens.weight\": \""
                     << abs(fixture("models/llama-sharded/model-00001-of-00003.safetensors")) << "\"}";
  auto c = flex::Checkpoint::open(idx);
  EXPECT_EQ(c.files().size(), 2u);
  // Whole shards are loaded, as Accelerate does: every key of both shards.
  EXPECT_EQ(c.keys().size(), 6u + 6u);
  auto single = flex::Checkpoint::open(fixture("models/llama/model.safetensors"));
  EXPECT_TRUE(flex_test::equal(c.get("model.norm.weight"), single.get("model.norm.weight")));
}

TEST(Checkpoint, IndexErrors) {
  flex_test::TempDir tmp;
  // Missing shard.
  std::ofstream(tmp.str("a.index.json")) << R"({"weight_map": {"x": "model-00001-of-00002.safetensors"}})";
  expect_error<flex::NotFoundError>([&] { flex::Checkpoint::open(tmp.str("a.index.json")); },
                                    {"a.index.json", "model-00001-of-00002.safetensors", "does not exist"});
  // A key the named shard lacks.
  fs::copy_file(fixture("models/llama-sharded/model-00003-of-00003.safetensors"), tmp.str("s.safetensors"));
  std::ofstream(tmp.str("b.index.json")) << R"({"weight_map": {"not.there": "s.safetensors"}})";
  expect_error<flex::FileFormatError>([&] { flex::Checkpoint::open(tmp.str("b.index.json")); },
                                      {"b.index.json", "'not.there'", "s.safetensors"});
  // Bad JSON and a non-string entry.
  std::ofstream(tmp.str("c.index.json")) << "{\"weight_map\": ";
  expect_error<flex::FileFormatError>([&] { flex::Checkpoint::open(tmp.str("c.index.json")); }, {"c.index.json", "JSON"});
  std::ofstream(tmp.str("d.index.json")) << R"({"weight_map": {"x": 3}})";
  expect_error<flex::FileFormatError>([&] { flex::Checkpoint::open(tmp.str("d.index.json")); }, {"d.index.json", "'x'"});
  // The same key in two shards.
  fs::copy_file(fixture("models/llama-sharded/model-00003-of-00003.safetensors"), tmp.str("t.safetensors"));
  std::ofstream(tmp.str("e.index.json")) << R"({"weight_map": {"model.norm.weight": "s.safetensors", "lm_head.weight": "t.safetensors"}})";
  expect_error<flex::FileFormatError>([&] { flex::Checkpoint::open(tmp.str("e.index.json")); }, {"two shards"});
}

TEST(Checkpoint, FolderResolutionErrors) {
  flex_test::TempDir tmp;
  expect_error<flex::NotFoundError>([&] { flex::Checkpoint::open(tmp.str()); }, {tmp.str(), "no checkpoint"});
  std::ofstream(tmp.str("a.index.json")) << "{}";
  std::ofstream(tmp.str("b.index.json")) << "{}";
  expect_error<flex::FileFormatError>([&] { flex::Checkpoint::open(tmp.str()); },
                                      {tmp.str(), "a.index.json", "b.index.json"});
  expect_error<flex::IOError>([&] { flex::Checkpoint::open(tmp.str("nothing")); }, {"nothing", "does not exist"});
}

// Accelerate tries pytorch_model.bin before model.safetensors.
TEST(Checkpoint, FolderPrefersPytorchModelBin) {
  flex_test::TempDir tmp;
  fs::copy_file(data_path("files/torch-bin/pytorch_model.bin"), tmp.str("pytorch_model.bin"));
  fs::copy_file(fixture("models/llama/model.safetensors"), tmp.str("model.safetensors"));
  auto c = flex::Checkpoint::open(tmp.str());
  EXPECT_FALSE(c.is_safetensors());
  EXPECT_EQ(c.files(), std::vector<std::string>{abs(tmp.str("pytorch_model.bin"))});
}

// A torch.save(OrderedDict state_dict with _metadata) file written by PyTorch
// 1.13; expected values are the generating formulas.
TEST(TorchBin, ReadsAnOrderedDictStateDict) {
  auto sd = flex::load_torch_bin(data_path("files/torch-bin/pytorch_model.bin"));
  std::vector<std::string> names;
  for (const auto& kv : sd) names.push_back(kv.first);
  EXPECT_EQ(names, (std::vector<std::string>{"layer.weight", "layer.bias", "emb.bf16", "ids.i64", "scalar.f64",
                                             "mask.bool", "half.f16", "view.strided"}));
  auto c = flex::Checkpoint::open(data_path("files/torch-bin"));
  EXPECT_TRUE(flex_test::equal(c.get("layer.weight"), at::arange(24, at::kFloat).reshape({4, 6}) * 0.25 - 1.0));
  EXPECT_TRUE(flex_test::equal(c.get("layer.bias"), at::arange(4, at::kFloat) * -0.5));
  EXPECT_EQ(c.dtype("emb.bf16"), at::kBFloat16);
  EXPECT_TRUE(
      flex_test::equal(c.get("emb.bf16"), (at::arange(6, at::kFloat) * 0.125).to(at::kBFloat16).reshape({2, 3})));
  EXPECT_TRUE(flex_test::equal(c.get("ids.i64"), at::arange(5, at::kLong) * 1000000007));
  EXPECT_EQ(c.get("scalar.f64").dim(), 0);
  EXPECT_EQ(c.get("scalar.f64").item<double>(), 2.5);
  EXPECT_TRUE(flex_test::equal(c.get("mask.bool"), at::tensor({1, 0, 1}, at::kByte).to(at::kBool)));
  EXPECT_TRUE(flex_test::equal(c.get("half.f16"), at::tensor({1.5f, -2.0f, 65504.0f}).to(at::kHalf)));
  // big = arange(30); big[2:].reshape(4, 7)[:, ::2]: a strided view at offset 2.
  at::Tensor v = c.get("view.strided");
  EXPECT_EQ(v.sizes(), at::IntArrayRef({4, 4}));
  EXPECT_TRUE(flex_test::equal(v, at::arange(30, at::kFloat).slice(0, 2).reshape({4, 7}).slice(1, 0, 7, 2)));
  EXPECT_EQ(c.shape("view.strided"), (std::vector<int64_t>{4, 4}));
}

TEST(TorchBin, ShardedBinWithIndexParameterAndPlainDict) {
  auto c = flex::Checkpoint::open(data_path("files/torch-bin-sharded"));
  EXPECT_FALSE(c.is_safetensors());
  EXPECT_EQ(c.keys(), (std::vector<std::string>{"a.bias", "a.weight", "b.weight"}));
  EXPECT_TRUE(flex_test::equal(c.get("a.weight"), at::full({2, 2}, 3.0f)));  // saved as nn.Parameter
  EXPECT_TRUE(flex_test::equal(c.get("a.bias"), at::tensor({1.0f, 2.0f})));
  EXPECT_TRUE(flex_test::equal(c.get("b.weight"), at::eye(3)));             // saved as a plain dict
  EXPECT_EQ(c.keys_in(c.file_of("b.weight")), std::vector<std::string>{"b.weight"});
}

TEST(TorchBin, BadFiles) {
  flex_test::TempDir tmp;
  std::ofstream(tmp.str("legacy.bin")) << "\x80\x02not a zip";
  expect_error<flex::UnsupportedError>([&] { flex::load_torch_bin(tmp.str("legacy.bin")); }, {"legacy.bin", "zip"});
  std::string good = flex::read_file(data_path("files/torch-bin/pytorch_model.bin"));
  std::ofstream(tmp.str("cut.bin"), std::ios::binary) << good.substr(0, good.size() / 2);
  expect_error<flex::FileFormatError>([&] { flex::load_torch_bin(tmp.str("cut.bin")); }, {"cut.bin"});
  expect_error<flex::IOError>([&] { flex::load_torch_bin(tmp.str("none.bin")); }, {"none.bin"});
}

// A view: renamed prefixes, dropped parts, computed tensors replacing their sources.
TEST(CheckpointView, RenamesDropsAndComputesThroughTheModelsNames) {
  const fs::path dir = fs::temp_directory_path() / "flex_ckpt_view";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const at::Tensor a = at::arange(6, at::kFloat).view({2, 3}), b = at::full({3}, 2.0f), s = at::full({1}, 10.0f);
  flex::save_safetensors((dir / "model.safetensors").string(),
                         {{"language_model.model.a", a}, {"language_model.model.b", b}, {"language_model.model.b_scale", s},
                          {"vision_tower.w", at::zeros({4})}});
  const flex::Checkpoint stored = flex::Checkpoint::open(dir.string());
  flex::CheckpointView v;
  v.renames = {{"language_model.model.", "model."}};
  v.dropped = {"vision_tower."};
  flex::CheckpointView::Computed c;
  c.name = "model.b";
  c.sources = {"language_model.model.b", "language_model.model.b_scale"};
  c.shape = {3};
  c.compute = [](const std::vector<at::Tensor>& in) { return in[0] * in[1]; };
  v.computed = {c};
  const flex::Checkpoint ck = stored.with_view(v);
  EXPECT_EQ(ck.keys(), (std::vector<std::string>{"model.a", "model.b"}));
  EXPECT_EQ(ck.keys_in(ck.files()[0]).size(), 2u);
  EXPECT_TRUE(flex_test::equal(ck.get("model.a"), a));
  EXPECT_TRUE(flex_test::equal(ck.get("model.b"), at::full({3}, 20.0f)));
  EXPECT_EQ(ck.stored_name("model.a"), "language_model.model.a");
  EXPECT_TRUE(ck.is_computed("model.b"));
  EXPECT_EQ(ck.shape("model.b"), (std::vector<int64_t>{3}));
  EXPECT_FALSE(ck.contains("language_model.model.a"));
  expect_error<flex::NotFoundError>([&] { ck.get("model.c"); }, {"model.c"});
  // Two stored keys for one name.
  flex::CheckpointView clash;
  clash.renames = {{"language_model.model.a", "x"}, {"language_model.model.b", "x"}};
  expect_error<flex::FileFormatError>([&] { stored.with_view(clash); }, {"'x'"});
  fs::remove_all(dir);
}
