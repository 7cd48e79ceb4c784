// Sharded safetensors writing, against the fixture Transformers wrote with
// save_pretrained(max_shard_size="150KB").
#include <flex/dispatch/atomic_file.h>
#include <flex/dispatch/checkpoint.h>
#include <flex/dispatch/safetensors.h>
#include <flex/dispatch/sharded_writer.h>
#include <flex/hooks/errors.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>

#include "test_util.h"

namespace fs = std::filesystem;
using flex_test::fixture;

// The llama state dict in PyTorch's state_dict() order (golden/llama.json),
// split at 150,000 bytes, reproduces every file of models/llama-sharded.
TEST(ShardedWriter, ReproducesTransformersShardsByteForByte) {
  auto golden = nlohmann::json::parse(flex::read_file(fixture("golden/llama.json")));
  auto model = flex::SafetensorsFile::open(fixture("models/llama/model.safetensors"));
  std::vector<std::pair<std::string, at::Tensor>> sd;
  for (const auto& k : golden["state_dict_keys"]) sd.emplace_back(k.get<std::string>(), model->get(k.get<std::string>()));
  ASSERT_EQ(sd.size(), 21u);
  flex_test::TempDir tmp;
  auto r = flex::save_sharded_safetensors(tmp.str("out"), sd, 150000);
  EXPECT_EQ(r.files.size(), 3u);
  EXPECT_EQ(r.total_size, 427264u);
  for (const char* name : {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                           "model-00003-of-00003.safetensors", "model.safetensors.index.json"}) {
    EXPECT_TRUE(flex::read_file(tmp.str(std::string("out/") + name)) ==
                flex::read_file(fixture(std::string("models/llama-sharded/") + name)))
        << name;
  }
  EXPECT_EQ(r.index_path, fs::absolute(tmp.str("out/model.safetensors.index.json")).string());
  EXPECT_EQ(flex::Checkpoint::open(tmp.str("out")).keys().size(), 21u);
}

TEST(ShardedWriter, OversizedTensorGetsItsOwnShard) {
  std::vector<std::pair<std::string, at::Tensor>> sd = {
      {"a", at::zeros({10})}, {"big", at::zeros({100})}, {"b", at::zeros({10})}, {"c", at::zeros({10})}};
  uint64_t total = 0;
  auto plan = flex::plan_shards(sd, 100, &total);  // a, b, c are 40 bytes; big is 400
  EXPECT_EQ(plan, (std::vector<std::vector<size_t>>{{0}, {1}, {2, 3}}));
  EXPECT_EQ(total, 40u + 400 + 40 + 40);
  flex_test::TempDir tmp;
  auto r = flex::save_sharded_safetensors(tmp.str(), sd, 100);
  EXPECT_EQ(r.weight_map.at("big"), "model-00002-of-00003.safetensors");
  auto idx = nlohmann::json::parse(flex::read_file(r.index_path));
  EXPECT_EQ(idx["metadata"]["total_size"], 520);
  EXPECT_EQ(idx["weight_map"]["c"], "model-00003-of-00003.safetensors");
  auto c = flex::Checkpoint::open(tmp.str());
  EXPECT_EQ(c.keys_in(c.file_of("big")), std::vector<std::string>{"big"});
}

TEST(ShardedWriter, TiedTensorsStayTogetherAndCountOnce) {
  at::Tensor w = at::ones({10});
  std::vector<std::pair<std::string, at::Tensor>> sd = {
      {"emb", w}, {"x", at::zeros({20})}, {"y", at::zeros({20})}, {"head", w}};
  uint64_t total = 0;
  auto plan = flex::plan_shards(sd, 150, &total);  // emb 40 + x 80 fit; y (80) starts shard 2
  EXPECT_EQ(plan, (std::vector<std::vector<size_t>>{{0, 1, 3}, {2}}));
  EXPECT_EQ(total, 40u + 80 + 80);
}

TEST(ShardedWriter, SingleShardIsPlainModelSafetensors) {
  flex_test::TempDir tmp;
  auto r = flex::save_sharded_safetensors(tmp.str(), {{"a", at::ones({2})}}, 1 << 20);
  EXPECT_TRUE(r.index_path.empty());
  EXPECT_TRUE(fs::exists(tmp.str("model.safetensors")));
  EXPECT_FALSE(fs::exists(tmp.str("model.safetensors.index.json")));
  EXPECT_EQ(flex::SafetensorsFile::open(tmp.str("model.safetensors"))->metadata().at("format"), "pt");
  EXPECT_THROW(flex::plan_shards({{"a", at::ones({1})}}, 0), flex::ConfigError);
}
