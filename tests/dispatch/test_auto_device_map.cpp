// infer_auto_device_map and get_balanced_memory on Accelerate's documented
// toy cases (tests/test_modeling_utils.py of Accelerate 1.2.1 and the
// reference notes), plus the strategy strings.
#include <flex/dispatch/auto_device_map.h>
#include <flex/dispatch/balanced_memory.h>
#include <flex/hooks/errors.h>

#include <gtest/gtest.h>

#include <sstream>

#include "toy_models.h"

using flex::DeviceMap;
using flex::MaxMemory;
using flex_test::ModelForTest;

namespace {

DeviceMap infer(const torch::nn::Module& m, MaxMemory mm, std::vector<std::string> no_split = {}) {
  flex::InferDeviceMapOptions o;
  o.max_memory = std::move(mm);
  o.no_split_module_classes = std::move(no_split);
  return flex::infer_auto_device_map(m, o);
}

std::shared_ptr<flex_test::Named> named_models(int n) {
  std::vector<std::pair<std::string, std::shared_ptr<flex::Module>>> children;
  for (int i = 1; i <= n; ++i) children.emplace_back("layer" + std::to_string(i), std::make_shared<ModelForTest>());
  return std::make_shared<flex_test::Named>(children);
}

}  // namespace

TEST(InferAutoDeviceMap, ModelForTestTwoGpus) {
  ModelForTest model;
  // Only linear1 fits on GPU 0: room for the largest layer (linear2, 100) is kept back.
  EXPECT_EQ(infer(model, {{0, 200}, {1, 200}}), (DeviceMap{{"linear1", 0}, {"batchnorm", 1}, {"linear2", 1}}));
  // GPU 1 keeps nothing back, so 172 = batchnorm + linear2 is enough.
  EXPECT_EQ(infer(model, {{0, 200}, {1, 172}, {2, 200}}),
            (DeviceMap{{"linear1", 0}, {"batchnorm", 1}, {"linear2", 1}}));
}

TEST(InferAutoDeviceMap, TiedWeightsFitOnOneGpu) {
  ModelForTest model;
  flex::set_module_tensor(model, "linear1.weight", model.linear2->weight);
  EXPECT_EQ(infer(model, {{0, 200}, {1, 200}}), (DeviceMap{{"", 0}}));
}

TEST(InferAutoDeviceMap, SequentialOfThree) {
  auto model = flex_test::three_models();
  EXPECT_EQ(infer(*model, {{0, 500}, {1, 500}}),
            (DeviceMap{{"0", 0}, {"1.linear1", 0}, {"1.batchnorm", 0}, {"1.linear2", 1}, {"2", 1}}));
  EXPECT_EQ(infer(*model, {{0, 500}, {1, 500}}, {"ModelForTest"}), (DeviceMap{{"0", 0}, {"1", 1}, {"2", 1}}));
}

TEST(InferAutoDeviceMap, TiedAcrossLayersSplitsTheTiedModule) {
  // layer3.linear2.weight is layer1.linear2.weight: layer3 is split so its
  // linear2 can go with layer1.
  auto model = named_models(3);
  flex::set_module_tensor(*model, "layer3.linear2.weight", flex::get_module_tensor(*model, "layer1.linear2.weight"));
  EXPECT_EQ(infer(*model, {{0, 400}, {1, 500}}),
            (DeviceMap{{"layer1", 0}, {"layer3.linear2", 0}, {"layer2", 1}, {"layer3.linear1", 1},
                       {"layer3.batchnorm", 1}}));
}

TEST(InferAutoDeviceMap, FallbackAllocation) {
  // Accelerate 1.2's test: module = Sequential(linear1 (10->4), linear2 (4->4), linear3 (4->8)), {0: 256}.
  auto inner = std::make_shared<flex_test::Named>(std::vector<std::pair<std::string, std::shared_ptr<flex::Module>>>{
      {"linear1", std::make_shared<flex::Linear>(10, 4)},
      {"linear2", std::make_shared<flex::Linear>(4, 4)},
      {"linear3", std::make_shared<flex::Linear>(4, 8)}});
  flex_test::Named model({{"module", inner}});
  flex::InferDeviceMapOptions o;
  o.max_memory = MaxMemory{{0, 256}};
  const DeviceMap without = flex::infer_auto_device_map(model, o);
  for (const auto& e : without) EXPECT_NE(e.second, flex::MapDevice(0)) << without;
  EXPECT_EQ(without, (DeviceMap{{"", "disk"}}));
  o.fallback_allocation = true;
  EXPECT_EQ(flex::infer_auto_device_map(model, o),
            (DeviceMap{{"module.linear1", "disk"}, {"module.linear2", 0}, {"module.linear3", "disk"}}));
}

TEST(InferAutoDeviceMap, CleanResultFalseKeepsLeaves) {
  auto model = flex_test::three_models();
  flex::InferDeviceMapOptions o;
  o.max_memory = MaxMemory{{0, 10000}};
  EXPECT_EQ(flex::infer_auto_device_map(*model, o), (DeviceMap{{"", 0}}));
  o.clean_result = false;
  EXPECT_EQ(flex::infer_auto_device_map(*model, o), (DeviceMap{{"0", 0}, {"1", 0}, {"2", 0}}));
}

TEST(InferAutoDeviceMap, DtypeShrinksTheModel) {
  ModelForTest model;
  flex::InferDeviceMapOptions o;
  o.max_memory = MaxMemory{{0, 150}, {1, 300}};
  // f32: GPU 0 keeps 100 back for linear2, and linear1 (64) does not fit in 50.
  EXPECT_EQ(flex::infer_auto_device_map(model, o), (DeviceMap{{"", 1}}));
  o.dtype = at::kHalf;  // 32 + 40 + 50 bytes, largest layer 50
  EXPECT_EQ(flex::infer_auto_device_map(model, o), (DeviceMap{{"", 0}}));
  // special_dtypes keep linear1 in f32 (64): it is now the largest layer.
  o.special_dtypes = {{"linear1.weight", at::kFloat}, {"linear1.bias", at::kFloat}};
  EXPECT_EQ(flex::infer_auto_device_map(model, o), (DeviceMap{{"linear1", 0}, {"batchnorm", 1}, {"linear2", 1}}));
}

TEST(InferAutoDeviceMap, CpuAndDiskWhenGpusAreFull) {
  ModelForTest model;
  // cpu is a main device too: it keeps 100 back, so 170 holds linear1 only.
  EXPECT_EQ(infer(model, {{0, 10}, {"cpu", 170}}), (DeviceMap{{"linear1", "cpu"}, {"batchnorm", "disk"}, {"linear2", "disk"}}));
  EXPECT_EQ(infer(model, {{"cpu", 1}}), (DeviceMap{{"", "disk"}}));
  // An explicit disk budget is not a limit (disk takes whatever is left).
  EXPECT_EQ(infer(model, {{"cpu", 1}, {"disk", 1}}), (DeviceMap{{"", "disk"}}));
}

TEST(InferAutoDeviceMap, NoBudgetUsesThisMachine) {
  ModelForTest model;
  const DeviceMap m = flex::infer_auto_device_map(model);
  if (flex::gpu_device_count() == 0) {
    EXPECT_EQ(m, (DeviceMap{{"", "cpu"}}));
  }
  EXPECT_NO_THROW(flex::check_device_map(model, m));
}

TEST(InferAutoDeviceMap, BufferWarningUnlessOffloaded) {
  ModelForTest model;
  std::ostringstream log;
  flex::InferDeviceMapOptions o;
  o.max_memory = MaxMemory{{0, 120}, {"cpu", 1000}};
  o.log = &log;
  const DeviceMap m = flex::infer_auto_device_map(model, o);
  EXPECT_EQ(m, (DeviceMap{{"", "cpu"}}));
  // batchnorm's 40 bytes of buffers stay with the GPU computation: 120 < 100 reserved + 40.
  EXPECT_NE(log.str().find("40 bytes of buffers"), std::string::npos) << log.str();
  std::ostringstream log2;
  o.log = &log2;
  o.offload_buffers = true;
  EXPECT_EQ(flex::infer_auto_device_map(model, o), m);
  EXPECT_EQ(log2.str(), "");
}

TEST(InferAutoDeviceMap, VerboseExplainsEachStep) {
  ModelForTest model;
  std::ostringstream log;
  flex::InferDeviceMapOptions o;
  o.max_memory = MaxMemory{{0, 200}, {1, 200}};
  o.verbose = true;
  o.log = &log;
  flex::infer_auto_device_map(model, o);
  EXPECT_NE(log.str().find("Treating module linear1."), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("Putting linear1 (size=64) (available=100) on 0."), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("Not enough space on 0 to put batchnorm"), std::string::npos) << log.str();
}

TEST(InferAutoDeviceMap, SkippedModulesStayOutOfTheMap) {
  // A tensor-less hook point inside a split module.
  auto inner = std::make_shared<flex_test::Named>(std::vector<std::pair<std::string, std::shared_ptr<flex::Module>>>{
      {"hook_in", std::make_shared<flex::Identity>()},
      {"linear1", std::make_shared<flex::Linear>(3, 4)},
      {"linear2", std::make_shared<flex::Linear>(4, 5)}});
  flex_test::Named model({{"block", inner}});
  flex::InferDeviceMapOptions o;
  o.max_memory = MaxMemory{{0, 150}, {1, 500}};
  // The zero-size hook point lands on GPU 0 and keeps "block" from collapsing.
  const DeviceMap plain = flex::infer_auto_device_map(model, o);
  EXPECT_EQ(plain, (DeviceMap{{"block.hook_in", 0}, {"block.linear1", 1}, {"block.linear2", 1}})) << plain;
  o.skip_module = [](const std::string& name) { return name.rfind("hook_") != std::string::npos; };
  const DeviceMap skipped = flex::infer_auto_device_map(model, o);
  EXPECT_EQ(skipped, (DeviceMap{{"", 1}})) << skipped;
}

// --- get_balanced_memory and strategies -------------------------------------------------

TEST(BalancedMemory, AccelerateGolden) {
  ModelForTest model;
  // 236 // 2 = 118, plus int(1.25 * mean(64, 72, 100)) = 97.
  EXPECT_EQ(flex::get_balanced_memory(model, MaxMemory{{0, 300}, {1, 300}}), (MaxMemory{{0, 215}, {1, 300}}));
  EXPECT_EQ(flex::get_balanced_memory(model, MaxMemory{{0, 0}, {1, 300}, {2, 300}}),
            (MaxMemory{{0, 0}, {1, 215}, {2, 300}}));
}

TEST(BalancedMemory, LowZeroNoSplitAndEdgeCases) {
  ModelForTest model;
  // low_zero: GPU 0 only gets what GPU 1 cannot hold (nothing).
  EXPECT_EQ(flex::get_balanced_memory(model, MaxMemory{{0, 300}, {1, 300}}, {}, std::nullopt, {}, true),
            (MaxMemory{{0, 0}, {1, 300}}));
  // No GPU: unchanged. One GPU: unchanged (low_zero ignored).
  EXPECT_EQ(flex::get_balanced_memory(model, MaxMemory{{"cpu", 1000}}), (MaxMemory{{"cpu", 1000}}));
  EXPECT_EQ(flex::get_balanced_memory(model, MaxMemory{{0, 300}, {"cpu", 50}}, {}, std::nullopt, {}, true),
            (MaxMemory{{0, 300}, {"cpu", 50}}));
  // No-split block ModelForTest (236) beats the mean leaf: 708 // 2 + int(1.25 * 236) = 354 + 295.
  auto three = flex_test::three_models();
  EXPECT_EQ(flex::get_balanced_memory(*three, MaxMemory{{0, 1000}, {1, 1000}}, {"ModelForTest"}),
            (MaxMemory{{0, 649}, {1, 1000}}));
  // Without it the mean leaf (78) is the margin: 354 + 97.
  EXPECT_EQ(flex::get_balanced_memory(*three, MaxMemory{{0, 1000}, {1, 1000}}), (MaxMemory{{0, 451}, {1, 1000}}));
}

TEST(ResolveDeviceMap, Strategies) {
  ModelForTest model;
  flex::InferDeviceMapOptions o;
  o.max_memory = MaxMemory{{0, 300}, {1, 300}};
  // balanced: {0: 215, 1: 300}; GPU 0 keeps 100 back and takes linear1 only.
  EXPECT_EQ(flex::resolve_device_map(model, "auto", o), (DeviceMap{{"linear1", 0}, {"batchnorm", 1}, {"linear2", 1}}));
  EXPECT_EQ(flex::resolve_device_map(model, "balanced", o), flex::resolve_device_map(model, "auto", o));
  // sequential: GPU 0 keeps its 300; once linear2 is the last layer nothing is kept back.
  EXPECT_EQ(flex::resolve_device_map(model, "sequential", o), (DeviceMap{{"", 0}}));
  o.max_memory = MaxMemory{{0, 300}, {1, 300}, {2, 300}};
  // balanced_low_0: {0: 0, 1: 215, 2: 300}.
  EXPECT_EQ(flex::resolve_device_map(model, "balanced_low_0", o),
            (DeviceMap{{"linear1", 1}, {"batchnorm", 1}, {"linear2", 2}}));
  EXPECT_EQ(flex::resolve_device_map(model, "cpu"), (DeviceMap{{"", "cpu"}}));
  EXPECT_EQ(flex::resolve_device_map(model, "cuda:1"), (DeviceMap{{"", 1}}));
  try {
    flex::resolve_device_map(model, "fastest");
    FAIL() << "expected ConfigError";
  } catch (const flex::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'fastest'"), std::string::npos) << e.what();
  }
}
