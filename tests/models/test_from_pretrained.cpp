// from_pretrained with device maps: every fixture model loaded onto CPU +
// disk through the dispatch layer gives the in-memory logits bitwise, the
// golden logits within tolerance, and FlexModel captures of its offloaded
// blocks equal the golden activations.
#include "golden_util.h"

#include <flex/dispatch/big_modeling.h>
#include <flex/dispatch/module_sizes.h>
#include <flex/flexcore/flex_model.h>
#include <flex/hooks/errors.h>
#include <flex/models/from_pretrained.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "test_util.h"

using namespace flex;

namespace {

class FromPretrained : public ::testing::TestWithParam<std::string> {};

at::Tensor logits_of(CausalLM& m) {
  at::NoGradGuard ng;
  return m.logits(models_test::golden_inputs());
}

}  // namespace

TEST_P(FromPretrained, AutoMapWithSmallBudgetMatchesInMemoryAndGolden) {
  const std::string name = GetParam();
  const std::string golden = name == "llama-sharded" ? "llama" : name;
  auto plain = from_pretrained(models_test::model_dir(name));
  at::Tensor ref = logits_of(*plain);
  EXPECT_TRUE(models_test::close(ref, models_test::golden_tensors(golden)->get("logits"), name + " logits"));

  flex_test::TempDir off;
  auto dispatched = models_test::from_pretrained_half_on_disk(models_test::model_dir(name), *plain, off.str());
  auto map = hf_device_map(*dispatched);
  ASSERT_TRUE(map.has_value());
  bool disk = false;
  for (const auto& e : *map) disk = disk || e.second.is_disk();
  EXPECT_TRUE(disk) << map->to_json();
  EXPECT_TRUE(flex_test::equal(logits_of(*dispatched), ref)) << name;

  // Captures through FlexModel on the offloaded model equal the golden activations.
  FlexModel fm(dispatched);
  auto golden_file = models_test::golden_tensors(golden);
  std::vector<std::string> hooked;
  for (const auto& nm : dispatched->named_flex_modules()) {
    if (nm.first.empty() || is_hook_point_name(nm.first) || !golden_file->contains(nm.first)) continue;
    fm.register_forward_hook(std::make_shared<HookFunction>(nm.first));
    hooked.push_back(nm.first);
  }
  ASSERT_GT(hooked.size(), 10u);
  {
    at::NoGradGuard ng;
    fm.forward(Inputs{Value(models_test::golden_inputs())});
  }
  for (const auto& n : hooked) {
    ASSERT_EQ(fm.output().count(n), 1u) << n;
    EXPECT_TRUE(models_test::close(fm.output().at(n)[0], golden_file->get(n), name + " " + n));
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FromPretrained,
                         ::testing::Values("gpt2", "llama", "gpt-neox", "llama3-rope-tied", "llama-sharded", "mistral",
                                           "qwen2", "gemma2", "phi3", "olmo2", "mixtral", "qwen2_moe"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (auto& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

TEST(FromPretrainedOptions, TorchDtypeAutoAndExplicitMap) {
  PretrainedOptions autod;
  autod.torch_dtype = "auto";
  auto bf = from_pretrained(models_test::model_dir("llama-bf16"), autod);
  EXPECT_EQ(bf->input_embeddings()->weight.scalar_type(), at::kBFloat16);
  PretrainedOptions o;
  o.device_map = DeviceMap{{"model.embed_tokens", "cpu"}, {"model.layers.0", "disk"}, {"model.layers.1", "cpu"},
                           {"model.norm", "disk"}, {"model.rotary_emb", "cpu"}, {"lm_head", "cpu"}};
  o.torch_dtype = "float32";
  auto m = from_pretrained(models_test::model_dir("llama-bf16"), o);
  EXPECT_TRUE(models_test::close(logits_of(*m), models_test::golden_tensors("llama-bf16-as-f32")->get("logits"),
                                 "llama-bf16 as f32 with disk blocks"));
  PretrainedOptions bad;
  bad.device_map = DeviceMap{{"model.embed_tokens", "cpu"}};
  EXPECT_THROW(from_pretrained(models_test::model_dir("llama"), bad), DeviceMapError);
  bad.device_map.reset();
  bad.device_map_strategy = "fastest";
  EXPECT_THROW(from_pretrained(models_test::model_dir("llama"), bad), ConfigError);
}

namespace {
// The address ranges /proc/self/maps shows for files whose path contains `needle`.
std::vector<std::pair<uintptr_t, uintptr_t>> mapped_ranges(const std::string& needle) {
  std::vector<std::pair<uintptr_t, uintptr_t>> out;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find(needle) == std::string::npos) continue;
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) == 2) out.emplace_back(lo, hi);
  }
  return out;
}

size_t tensors_in(CausalLM& m, const std::vector<std::pair<uintptr_t, uintptr_t>>& ranges) {
  size_t n = 0;
  for (const auto& [name, t] : state_dict(m)) {
    const auto p = reinterpret_cast<uintptr_t>(t.data_ptr());
    for (const auto& [lo, hi] : ranges) n += (p >= lo && p < hi);
  }
  return n;
}
}  // namespace

TEST(FromPretrainedOptions, NoMmapCopiesEveryWeightIntoProcessMemoryKeepingTies) {
  const std::string dir = models_test::model_dir("gpt2");
  auto mapped = from_pretrained(dir);
  PretrainedOptions o;
  o.mmap = false;
  auto copied = from_pretrained(dir, o);
  const auto ranges = mapped_ranges(dir + "/model.safetensors");
  ASSERT_FALSE(ranges.empty()) << "the default load maps the checkpoint";
  EXPECT_GT(tensors_in(*mapped, ranges), 0u) << "default: weights are views of the mapped file";
  EXPECT_EQ(tensors_in(*copied, ranges), 0u) << "mmap = false: no weight left in the mapped file";
  EXPECT_EQ(get_module_tensor(*copied, "lm_head.weight").data_ptr(),
            get_module_tensor(*copied, "transformer.wte.weight").data_ptr())
      << "the tied head still shares the embedding";
  EXPECT_TRUE(flex_test::equal(logits_of(*copied), logits_of(*mapped)));
}
