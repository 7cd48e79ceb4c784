// The Transformers 5 architectures (model zoo III) against Transformers 5.23
// (tests/data/golden5/manifest_zoo3.json, made by
// scripts/golden/make_golden_zoo3.py, checked by an independent plain-torch
// reimplementation, check_golden_zoo3.py): checkpoints in their published
// layouts (per-expert keys, gpt-oss's fused experts, MXFP4 blocks, FP8 blocks,
// a multimodal Gemma 3) load, and a left-padded batch gives 5.23's logits and
// every block's, attention's, MLP's and router's output at the positions the
// mask keeps, within atol 1e-5 / rtol 1e-4 (fp32).
#include "golden_util.h"

#include <flex/models/architecture.h>

#include <map>

#include "test_util.h"

using namespace flex;
using models_test::close;
using models_test::golden5;
using models_test::kept;

namespace {

class GoldenZoo3 : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenZoo3, EveryModuleMatchesTransformers5) {
  const std::string name = GetParam();
  const auto m = models_test::read_json(golden5("manifest_zoo3.json"));
  ASSERT_EQ(m["transformers"], "5.23.0");
  const auto& info = m["cases"][name];
  const std::string type = models_test::read_json(golden5(name + "/config.json"))["model_type"];
  if (!find_architecture(type)) GTEST_SKIP() << "model_type '" << type << "' is not implemented yet";
  auto gt = SafetensorsFile::open(golden5(name + ".golden.safetensors"));
  auto model = load_pretrained(golden5(name), at::kFloat);
  // A multimodal checkpoint loads as its language model, whose names the manifest maps.
  const bool renamed = info.contains("causal_lm_names");
  auto ours = [&](const std::string& n) { return renamed ? info["causal_lm_names"][n].get<std::string>() : n; };
  if (!renamed) {
    EXPECT_EQ(model->class_name(), info["class"].get<std::string>());
  }

  const std::map<std::string, std::string> hooked = models_test::zoo3_hooked(info);
  std::map<std::string, at::Tensor> outputs;
  const auto handles = models_test::record_outputs(*model, hooked, outputs);
  const at::Tensor mask = gt->get("attention_mask");
  const at::Tensor logits = models_test::masked_logits(*model, gt->get("input_ids"), mask);
  EXPECT_TRUE(close(kept(logits, mask), kept(gt->get("logits"), mask), name + " logits"));
  const int64_t b = mask.size(0), t = mask.size(1);
  for (const auto& [n, ours_n] : hooked) {
    ASSERT_TRUE(outputs.count(n)) << n << " was not called";
    at::Tensor got = outputs[n];
    if (got.dim() == 2) got = got.reshape({b, t, -1});  // router logits [B*T, E]
    EXPECT_TRUE(close(kept(got, mask), kept(gt->get("out." + n), mask), name + " " + n));
  }
  if (info.contains("params"))
    for (const auto& p : info["params"]) {
      const std::string n = p;
      at::Tensor value;
      for (const auto& [key, tensor] : state_dict(*model))
        if (key == ours(n)) value = tensor;
      ASSERT_TRUE(value.defined()) << n << " is not a parameter of the model";
      EXPECT_TRUE(close(value, gt->get("out." + n), name + " " + n));
    }
}

// The batch's logits: the whole forward, or (cache) a prefill of 8 tokens
// then chunks of 3, 1, 1, ... through the KV cache, the mask growing with it.
at::Tensor batch_logits(CausalLM& model, const at::Tensor& ids, const at::Tensor& mask, bool cache) {
  if (!cache) return models_test::masked_logits(model, ids, mask);
  at::NoGradGuard g;
  auto kv = c10::make_intrusive<KVCache>();
  std::vector<at::Tensor> parts;
  const int64_t t = ids.size(1);
  for (int64_t start = 0, len = 8; start < t; start += len, len = start == 8 ? 3 : 1) {
    len = std::min(len, t - start);
    LMInputs in;
    in.input_ids = ids.narrow(1, start, len);
    in.attention_mask = mask.narrow(1, 0, start + len);
    in.past_key_values = kv;
    parts.push_back(model.run(in).logits);
  }
  EXPECT_EQ(kv->seq_length(0), t);
  return at::cat(parts, 1);
}

// Decoding through the KV cache (DeepSeek's holds the compressed latent)
// crosses the sliding windows (6) and gives the golden logits.
TEST_P(GoldenZoo3, KVCacheDecodingMatchesTransformers5) {
  const std::string name = GetParam();
  auto gt = SafetensorsFile::open(golden5(name + ".golden.safetensors"));
  auto model = load_pretrained(golden5(name), at::kFloat);
  const at::Tensor mask = gt->get("attention_mask");
  const at::Tensor cached = batch_logits(*model, gt->get("input_ids"), mask, true);
  EXPECT_TRUE(close(kept(cached, mask), kept(gt->get("logits"), mask), name + " cached logits"));
}

// Dispatched with half the model's bytes on CPU and the rest on disk (the
// no-split class whole), the logits are the in-memory model's bitwise.
TEST_P(GoldenZoo3, DiskOffloadGivesTheInMemoryLogits) {
  const std::string name = GetParam();
  auto gt = SafetensorsFile::open(golden5(name + ".golden.safetensors"));
  const at::Tensor ids = gt->get("input_ids"), mask = gt->get("attention_mask");
  auto plain = from_pretrained(golden5(name));
  const at::Tensor ref = batch_logits(*plain, ids, mask, false);
  flex_test::TempDir off;
  auto dispatched = models_test::from_pretrained_half_on_disk(golden5(name), *plain, off.str());
  auto map = hf_device_map(*dispatched);
  ASSERT_TRUE(map.has_value());
  bool disk = false;
  for (const auto& e : *map) {
    disk = disk || e.second.is_disk();
    const size_t at = e.first.find(".layers.");
    if (at != std::string::npos) {
      EXPECT_EQ(e.first.find('.', at + 8), std::string::npos) << e.first << ": a block split across devices";
    }
  }
  EXPECT_TRUE(disk) << map->to_json();
  EXPECT_TRUE(flex_test::equal(batch_logits(*dispatched, ids, mask, false), ref)) << name;
}

INSTANTIATE_TEST_SUITE_P(Transformers5, GoldenZoo3, ::testing::ValuesIn(models_test::golden5_cases("manifest_zoo3.json")),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
