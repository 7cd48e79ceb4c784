// Offload around a CUDA device (the gpu label; each case skips itself
// without one): every fixture model under a device map with GPU, CPU and
// disk entries (blocks on the CPU and on disk, the rest on GPU 0; the
// offloaded blocks run on the GPU, their weights brought in for each call),
// through from_pretrained and through dispatch_model, and under the
// automatic planner with GPU and CPU budgets. The inputs stay on the CPU, as
// a user of an Accelerate-style map leaves them (the hooks place them). The
// logits equal the same model wholly on the GPU (to 1e-6; the same kernels
// compute both) and the golden logits within the fixture tolerance; FlexModel
// captures of the offloaded blocks equal the GPU-only model's.
#include "../models/golden_util.h"
#include "gpu_util.h"

#include <flex/dispatch/big_modeling.h>
#include <flex/flexcore/flex_model.h>

#include <cstdio>
#include <filesystem>

#include "test_util.h"

using namespace flex;

namespace {

class OffloadOnGpu : public ::testing::TestWithParam<std::string> {};

std::string golden_of(const std::string& model) { return model == "llama-sharded" ? "llama" : model; }

at::Tensor logits_of(CausalLM& m, const at::Tensor& ids) {
  at::NoGradGuard ng;
  return m.logits(ids).cpu();
}

// The captures of `names` in one forward of `model` on `ids`.
OutputMap captures(const std::shared_ptr<CausalLM>& model, const std::vector<std::string>& names, const at::Tensor& ids) {
  FlexModel fm(model);
  for (const auto& n : names) fm.register_forward_hook(std::make_shared<HookFunction>(n));
  at::NoGradGuard ng;
  fm.forward(ids);
  return fm.output();
}

// `got` within 1e-6 of the GPU-only model's `ref` (and how far, printed) and
// within the fixture tolerance of the golden logits.
void expect_logits(const at::Tensor& got, const at::Tensor& ref, const std::string& model, const std::string& what) {
  const double d = gpu_test::max_diff(got, ref);
  std::printf("%-18s %-32s max |logits - GPU-only logits| %.3g%s\n", model.c_str(), what.c_str(), d,
              d == 0 ? " (bitwise)" : "");
  EXPECT_TRUE(flex_test::close(got, ref, 0, 1e-6)) << model << " " << what << " vs the model wholly on the GPU";
  EXPECT_TRUE(models_test::close(got, models_test::golden_tensors(golden_of(model))->get("logits"),
                                 model + " " + what + " vs golden"));
}

TEST_P(OffloadOnGpu, FromPretrainedWithGpuCpuAndDiskEntries) {
  FLEX_REQUIRE_GPU();
  const std::string name = GetParam();
  const std::string dir = models_test::model_dir(name);
  const at::Tensor ids = models_test::golden_inputs();
  auto whole = gpu_test::load_on_device(dir);
  const at::Tensor ref = logits_of(*whole, gpu_test::on_device(ids));

  auto plain = from_pretrained(dir);
  const DeviceMap map = gpu_test::mixed_device_map(*plain);
  flex_test::TempDir off;
  PretrainedOptions o;
  o.device_map = map;
  o.offload_folder = off.str();
  auto dispatched = from_pretrained(dir, o);
  ASSERT_TRUE(hf_device_map(*dispatched).has_value());
  EXPECT_EQ(*hf_device_map(*dispatched), map);
  std::printf("%-18s map gpu/cpu/disk entries %s: %s\n", name.c_str(), gpu_test::kinds(map).c_str(), map.to_json().c_str());
  for (const auto& [module, where] : map) {
    if (where.is_gpu()) {
      EXPECT_TRUE(gpu_test::all_on(*dispatched->get_submodule(module), gpu_test::device())) << module;
    }
  }

  expect_logits(logits_of(*dispatched, ids), ref, name, "from_pretrained(gpu/cpu/disk map)");
  expect_logits(logits_of(*dispatched, ids), ref, name, "the same, a second call");

  // Captures of the offloaded blocks (and everything else) equal the GPU-only model's.
  std::vector<std::string> names;
  for (const auto& [n, m] : dispatched->named_flex_modules())
    if (!n.empty() && !is_hook_point_name(n)) names.push_back(n);
  const OutputMap got = captures(dispatched, names, ids), want = captures(whole, names, gpu_test::on_device(ids));
  ASSERT_EQ(got.size(), want.size()) << name;
  for (const auto& [n, w] : want) {
    ASSERT_TRUE(got.count(n)) << name << ": no capture of " << n;
    ASSERT_EQ(got.at(n).size(), w.size()) << n;
    for (size_t i = 0; i < w.size(); ++i) {
      if (!at::isFloatingType(w[i].scalar_type())) {
        EXPECT_TRUE(flex_test::equal(got.at(n)[i], w[i])) << name << " " << n;
      } else {
        EXPECT_TRUE(flex_test::close(got.at(n)[i], w[i], 0, 1e-6)) << name << " " << n;
      }
    }
  }
}

TEST_P(OffloadOnGpu, DispatchModelWithGpuCpuAndDiskEntries) {
  FLEX_REQUIRE_GPU();
  const std::string name = GetParam();
  const std::string dir = models_test::model_dir(name);
  const at::Tensor ids = models_test::golden_inputs();
  const at::Tensor ref = logits_of(*gpu_test::load_on_device(dir), gpu_test::on_device(ids));
  auto model = load_pretrained(dir, at::kFloat);
  const DeviceMap map = gpu_test::mixed_device_map(*model);
  flex_test::TempDir off;
  DispatchOptions o;
  o.offload_dir = off.str("offload");
  dispatch_model(*model, map, o);  // the main device: the map's first GPU
  if (!gpu_test::dry_run()) {
    EXPECT_TRUE(std::filesystem::exists(off.str("offload/index.json")));
  }
  expect_logits(logits_of(*model, ids), ref, name, "dispatch_model(gpu/cpu/disk map)");
}

// The automatic planner with a GPU present: a third of the model's bytes for
// GPU 0, a third for the CPU, the rest to disk.
TEST_P(OffloadOnGpu, AutoMapWithGpuAndCpuBudgets) {
  FLEX_REQUIRE_GPU();
  const std::string name = GetParam();
  const std::string dir = models_test::model_dir(name);
  const at::Tensor ids = models_test::golden_inputs();
  const at::Tensor ref = logits_of(*gpu_test::load_on_device(dir), gpu_test::on_device(ids));
  auto plain = from_pretrained(dir);
  const double third = compute_module_sizes(*plain).total() / 3;
  flex_test::TempDir off;
  PretrainedOptions o;
  o.device_map_strategy = "auto";
  MaxMemory mm;
  mm.set(gpu_test::map_gpu(), third);
  if (!gpu_test::dry_run()) mm.set(MapDevice::cpu(), third);
  o.max_memory = mm;
  o.offload_folder = off.str();
  auto dispatched = from_pretrained(dir, o);
  const auto map = hf_device_map(*dispatched);
  ASSERT_TRUE(map.has_value());
  std::printf("%-18s auto map gpu/cpu/disk entries %s\n", name.c_str(), gpu_test::kinds(*map).c_str());
  bool gpu = false, elsewhere = false;
  for (const auto& e : *map) {
    gpu = gpu || e.second.is_gpu();
    elsewhere = elsewhere || !e.second.is_gpu();
  }
  if (!gpu_test::dry_run()) {
    EXPECT_TRUE(gpu) << map->to_json();
  }
  EXPECT_TRUE(elsewhere) << map->to_json();
  expect_logits(logits_of(*dispatched, ids), ref, name, "auto map (GPU and CPU budgets)");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, OffloadOnGpu,
                         ::testing::Values("gpt2", "llama", "gpt-neox", "llama3-rope-tied", "llama-sharded", "mistral",
                                           "qwen2", "gemma2", "phi3", "olmo2", "mixtral", "qwen2_moe"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (auto& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

}  // namespace
