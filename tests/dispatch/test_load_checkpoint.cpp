// load_checkpoint_in_model / load_checkpoint_and_dispatch on a model built
// under EmptyInit: bitwise the in-memory outputs, disk weights served from
// the checkpoint, load-time errors Accelerate only hits later.
#include "big_model_fixture.h"

#include <flex/dispatch/align_devices_hook.h>
#include <flex/dispatch/load_checkpoint.h>
#include <flex/dispatch/safetensors.h>
#include <flex/hooks/errors.h>

#include "test_util.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

using namespace flex;

namespace {

struct Saved {
  flex_test::TempDir dir;
  at::Tensor ref;
  std::string file;
  explicit Saved(bool drop_tied = true) {
    auto m = std::make_shared<bigm::LM>();
    bigm::randomize(*m, 11);
    at::NoGradGuard ng;
    ref = (*m)(bigm::ids());
    auto sd = state_dict(*m);
    std::vector<std::pair<std::string, at::Tensor>> kept;
    for (auto& kv : sd)
      if (!(drop_tied && kv.first == "lm_head.weight")) kept.push_back(kv);  // as HF drops tied copies
    file = dir.str("model.safetensors");
    save_safetensors(file, kept, {{"format", "pt"}});
  }
};

std::shared_ptr<bigm::LM> meta_model() {
  EmptyInit scope;
  return std::make_shared<bigm::LM>();
}

at::Tensor run(Module& m) {
  at::NoGradGuard ng;
  return m(bigm::ids());
}

}  // namespace

TEST(LoadCheckpoint, MetaModelLoadsToBitwiseOutputs) {
  Saved s;
  auto m = meta_model();
  std::ostringstream log;
  LoadCheckpointOptions o;
  o.log = &log;
  LoadCheckpointReport r = load_checkpoint_in_model(*m, s.file, o);
  EXPECT_TRUE(r.missing_keys.empty()) << log.str();
  EXPECT_TRUE(r.unexpected_keys.empty());
  EXPECT_TRUE(m->lm_head->weight.is_same(m->wte->weight));  // retied
  EXPECT_TRUE(flex_test::equal(run(*m), s.ref));
}

TEST(LoadCheckpoint, MissingKeysAreReportedNotDiscoveredLater) {
  flex_test::TempDir dir;
  auto full = std::make_shared<bigm::LM>();
  std::vector<std::pair<std::string, at::Tensor>> partial;
  for (auto& kv : state_dict(*full))
    if (kv.first != "h.2.fc.bias" && kv.first != "lm_head.weight") partial.push_back(kv);
  partial.emplace_back("h.9.extra", at::ones({1}));
  save_safetensors(dir.str("m.safetensors"), partial);
  {
    auto m = meta_model();
    std::ostringstream log;
    LoadCheckpointOptions o;
    o.log = &log;
    LoadCheckpointReport r = load_checkpoint_in_model(*m, dir.str("m.safetensors"), o);
    EXPECT_EQ(r.missing_keys, std::vector<std::string>{"h.2.fc.bias"});
    EXPECT_EQ(r.unexpected_keys, std::vector<std::string>{"h.9.extra"});
    EXPECT_NE(log.str().find("h.2.fc.bias"), std::string::npos);
  }
  {
    auto m = meta_model();
    LoadCheckpointOptions o;
    o.strict = true;
    try {
      load_checkpoint_in_model(*m, dir.str("m.safetensors"), o);
      FAIL();
    } catch (const NotFoundError& e) {
      EXPECT_NE(std::string(e.what()).find("h.2.fc.bias"), std::string::npos);
      EXPECT_NE(std::string(e.what()).find("h.9.extra"), std::string::npos);
    }
  }
}

TEST(LoadCheckpoint, ShapeMismatchOfDiskWeightCaughtAtLoadTime) {
  flex_test::TempDir dir;
  auto full = std::make_shared<bigm::LM>();
  auto sd = state_dict(*full);
  for (auto& kv : sd)
    if (kv.first == "h.3.proj.weight") kv.second = at::zeros({32, 100});
  save_safetensors(dir.str("m.safetensors"), sd);
  auto m = meta_model();
  LoadCheckpointOptions o;
  o.device_map = DeviceMap{{"wte", "cpu"}, {"h.0", "cpu"}, {"h.1", "cpu"}, {"h.2", "cpu"}, {"h.3", "disk"},
                           {"ln_f", "cpu"}, {"lm_head", "cpu"}};
  try {
    load_checkpoint_in_model(*m, dir.str("m.safetensors"), o);
    FAIL();
  } catch (const ShapeError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("h.3.proj.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[32, 100]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("m.safetensors"), std::string::npos) << msg;
  }
}

TEST(LoadCheckpointAndDispatch, AutoWithSmallBudgetServesDiskWeightsFromCheckpoint) {
  Saved s;
  auto m = meta_model();
  flex_test::TempDir off;
  LoadAndDispatchOptions o;
  o.device_map_strategy = "auto";
  MaxMemory mm;
  mm.set(MapDevice::cpu(), 60000);  // well below the ~0.1 MB model
  o.max_memory = mm;
  o.no_split_module_classes = {"Block"};
  o.offload_folder = off.str();
  std::ostringstream log;
  o.log = &log;
  LoadCheckpointReport r = load_checkpoint_and_dispatch(*m, s.file, o);
  auto map = hf_device_map(*m);
  ASSERT_TRUE(map.has_value());
  bool any_disk = false, any_cpu = false;
  for (const auto& e : *map) {
    any_disk = any_disk || e.second.is_disk();
    any_cpu = any_cpu || e.second.is_cpu();
  }
  EXPECT_TRUE(any_disk && any_cpu) << map->to_json();
  ASSERT_TRUE(r.offload_index);
  // No tensor was copied into the offload folder: the index points into the checkpoint.
  for (const auto& e : std::filesystem::directory_iterator(off.path()))
    EXPECT_NE(e.path().extension(), ".dat") << e.path();
  for (const auto& kv : r.offload_index->entries()) EXPECT_EQ(kv.second.safetensors_file, s.file);
  EXPECT_TRUE(flex_test::equal(run(*m), s.ref));

  // Zero copy on a CPU execution device: a disk-offloaded weight used in the
  // forward is the same memory-mapped view on every call.
  std::string disk_block;
  for (const auto& e : *map)
    if (e.second.is_disk() && e.first == "h") disk_block = "h.0";
    else if (e.second.is_disk() && e.first.rfind("h.", 0) == 0) disk_block = e.first;
  ASSERT_FALSE(disk_block.empty()) << map->to_json();
  std::vector<const void*> seen;
  auto fc = m->get_submodule(disk_block + ".fc");
  auto h = fc->register_forward_pre_hook([&](Module& mod, Inputs&) {
    seen.push_back(mod.named_parameters()["weight"].data_ptr());
  });
  run(*m);
  run(*m);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], seen[1]);
  auto hook = find_hook<AlignDevicesHook>(fc->model_hook());
  ASSERT_TRUE(hook && hook->options().weights_map);
  EXPECT_EQ(hook->options().weights_map->get("weight").data_ptr(), seen[0]);
}

TEST(LoadCheckpointAndDispatch, ExplicitMapWithDiskBlocksAndMissingFile) {
  Saved s;
  auto m = meta_model();
  LoadAndDispatchOptions o;
  o.device_map = DeviceMap{{"wte", "cpu"}, {"h", "disk"}, {"ln_f", "cpu"}, {"lm_head", "cpu"}};
  flex_test::TempDir off;
  o.offload_folder = off.str();
  load_checkpoint_and_dispatch(*m, s.file, o);
  EXPECT_TRUE(flex_test::equal(run(*m), s.ref));
  EXPECT_THROW(load_checkpoint_in_model(*meta_model(), s.dir.str("nope.safetensors")), IOError);
}
