// dispatch_model, cpu_offload, disk_offload, cpu_offload_with_hook and
// AlignDevicesHook: outputs bitwise equal to the in-memory model.
#include "big_model_fixture.h"

#include <flex/dispatch/align_devices_hook.h>
#include <flex/dispatch/big_modeling.h>
#include <flex/dispatch/safetensors.h>
#include <flex/dispatch/set_module_tensor.h>
#include <flex/dispatch/tied_parameters.h>
#include <flex/hooks/errors.h>

#include "test_util.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>

using namespace flex;

namespace {
at::Tensor run(Module& m) {
  at::NoGradGuard ng;
  return m(bigm::ids());
}
std::shared_ptr<bigm::LM> make_model() {
  auto m = std::make_shared<bigm::LM>();
  bigm::randomize(*m, 7);
  return m;
}
}  // namespace

TEST(SetModuleTensor, MovesSwapsAndChecks) {
  std::shared_ptr<bigm::LM> m;
  {
    EmptyInit scope;
    m = std::make_shared<bigm::LM>();
  }
  EXPECT_TRUE(m->h->items()[0]->named_parameters()["fc.weight"].is_meta());
  EXPECT_THROW(set_module_tensor_to_device(*m, "h.0.fc.weight", c10::Device(at::kCPU)), ConfigError);
  EXPECT_THROW(set_module_tensor_to_device(*m, "h.0.fc.weight", c10::Device(at::kCPU), at::ones({3, 3})),
               ShapeError);
  EXPECT_THROW(set_module_tensor_to_device(*m, "h.0.fc.wieght", c10::Device(at::kCPU), at::ones({3, 3})),
               NotFoundError);
  at::Tensor v = at::ones({128, 32}, at::kDouble);
  set_module_tensor_to_device(*m, "h.0.fc.weight", c10::Device(at::kCPU), v);
  auto fc = std::dynamic_pointer_cast<bigm::Block>(m->h->items()[0])->fc;
  EXPECT_EQ(fc->weight.scalar_type(), at::kFloat);  // cast to the model's dtype
  EXPECT_TRUE(fc->weight.is_same(fc->named_parameters()["weight"]));
  EXPECT_TRUE(fc->weight.requires_grad());
  // A value already of the right dtype on the right device is used as is (zero copy).
  at::Tensor w = at::full({128}, 2.0);
  set_module_tensor_to_device(*m, "h.0.fc.bias", c10::Device(at::kCPU), w);
  EXPECT_EQ(fc->bias.data_ptr(), w.data_ptr());
}

TEST(AlignDevicesHook, OffloadedModuleIsMetaAtRestAndExactWhenRunning) {
  auto m = make_model();
  at::Tensor ref = run(*m);
  auto block = m->h->items()[1];
  auto weights = std::make_shared<StateDictWeights>(named_module_tensors(*block, true, true));
  AlignDevicesOptions o;
  o.execution_device = c10::Device(at::kCPU);
  o.offload = true;
  o.place_submodules = true;
  o.weights_map = weights;
  auto hook = std::make_shared<AlignDevicesHook>(o);
  add_hook_to_module(*block, hook);
  EXPECT_TRUE(block->get_submodule("fc")->named_parameters()["weight"].is_meta());
  EXPECT_FALSE(block->named_buffers()["mask"].is_meta());  // buffers stay (offload_buffers=false)
  EXPECT_TRUE(has_offloaded_params(*block));
  bool saw_real = false;
  auto h = block->get_submodule("fc")->register_forward_pre_hook([&](Module& mod, Inputs&) {
    saw_real = !mod.named_parameters()["weight"].is_meta();
  });
  EXPECT_TRUE(flex_test::equal(run(*m), ref));
  EXPECT_TRUE(saw_real);
  EXPECT_TRUE(block->get_submodule("fc")->named_parameters()["weight"].is_meta());
  h.remove();
  {
    AlignModuleDevice scope(*block);
    EXPECT_FALSE(block->get_submodule("fc")->named_parameters()["weight"].is_meta());
  }
  EXPECT_TRUE(block->get_submodule("fc")->named_parameters()["weight"].is_meta());
  remove_hook_from_module(*block);
  EXPECT_FALSE(block->get_submodule("fc")->named_parameters()["weight"].is_meta());
  EXPECT_TRUE(flex_test::equal(run(*m), ref));
}

TEST(AlignDevicesHook, HasOffloadedParamsSeesInsideSequentialHook) {
  auto m = make_model();
  AlignDevicesOptions o;
  o.offload = true;
  o.execution_device = c10::Device(at::kCPU);
  add_hook_to_module(*m->ln_f, std::make_shared<ModelHook>());
  add_hook_to_module(*m->ln_f, std::make_shared<AlignDevicesHook>(o), /*append=*/true);
  EXPECT_TRUE(has_offloaded_params(*m->ln_f));  // Accelerate answers false here
  EXPECT_FALSE(has_offloaded_params(*m->wte));
}

TEST(DispatchModel, CpuAndDiskBlocksGiveBitwiseOutputs) {
  auto m = make_model();
  at::Tensor ref = run(*m);
  flex_test::TempDir dir;
  DeviceMap map{{"wte", "cpu"}, {"h.0", "cpu"}, {"h.1", "disk"}, {"h.2", "cpu"}, {"h.3", "disk"},
                {"ln_f", "disk"}, {"lm_head", "cpu"}};
  DispatchOptions o;
  o.offload_dir = dir.str("offload");
  dispatch_model(*m, map, o);
  EXPECT_TRUE(std::filesystem::exists(dir.str("offload/index.json")));
  EXPECT_TRUE(std::filesystem::exists(dir.str("offload/h.1.fc.weight.dat")));
  EXPECT_FALSE(std::filesystem::exists(dir.str("offload/h.0.fc.weight.dat")));
  EXPECT_TRUE(m->h->items()[1]->get_submodule("fc")->named_parameters()["weight"].is_meta());
  EXPECT_FALSE(m->h->items()[0]->get_submodule("fc")->named_parameters()["weight"].is_meta());
  EXPECT_TRUE(flex_test::equal(run(*m), ref));
  EXPECT_TRUE(flex_test::equal(run(*m), ref));  // and again: nothing left behind by the first call
  ASSERT_TRUE(hf_device_map(*m).has_value());
  EXPECT_EQ(*hf_device_map(*m), map);
  // Tied parameters stay tied through dispatch (both on cpu).
  EXPECT_TRUE(m->lm_head->weight.is_same(m->wte->weight));
}

TEST(DispatchModel, TiedHeadOnDiskReadsItsPartner) {
  auto m = make_model();
  at::Tensor ref = run(*m);
  flex_test::TempDir dir;
  DeviceMap map{{"wte", "cpu"}, {"h", "cpu"}, {"ln_f", "cpu"}, {"lm_head", "disk"}};
  DispatchOptions o;
  o.offload_dir = dir.str();
  dispatch_model(*m, map, o);
  EXPECT_TRUE(flex_test::equal(run(*m), ref));
}

TEST(DispatchModel, ErrorsNameTheFault) {
  auto m = make_model();
  EXPECT_THROW(dispatch_model(*m, DeviceMap{{"wte", "cpu"}, {"h", "cpu"}}), DeviceMapError);  // misses ln_f, lm_head
  EXPECT_THROW(dispatch_model(*m, DeviceMap{{"", "cpu"}, {"h.0", "disk"}}), DeviceMapError);  // no offload dir
  auto m2 = make_model();
  at::Tensor ref = run(*m2);
  dispatch_model(*m2, DeviceMap{{"", "cpu"}});  // one device: no hooks
  EXPECT_EQ(m2->model_hook(), nullptr);
  EXPECT_TRUE(flex_test::equal(run(*m2), ref));
}

TEST(CpuOffload, BitwiseOutputsAndMetaAtRest) {
  auto m = make_model();
  at::Tensor ref = run(*m);
  cpu_offload(*m);
  EXPECT_TRUE(m->h->items()[2]->get_submodule("proj")->named_parameters()["weight"].is_meta());
  EXPECT_TRUE(flex_test::equal(run(*m), ref));
}

TEST(DiskOffload, BitwiseOutputsAlsoOnMetaModelWithExistingFolder) {
  auto m = make_model();
  at::Tensor ref = run(*m);
  flex_test::TempDir dir;
  disk_offload(*m, dir.str());
  EXPECT_TRUE(flex_test::equal(run(*m), ref));
  // A meta model (as built under EmptyInit) over the folder written above.
  std::shared_ptr<bigm::LM> meta;
  {
    EmptyInit scope;
    meta = std::make_shared<bigm::LM>();
  }
  disk_offload(*meta, dir.str());
  EXPECT_TRUE(flex_test::equal(run(*meta), ref));
  // Without a folder there is nothing to read a meta model from.
  flex_test::TempDir empty;
  std::shared_ptr<bigm::LM> meta2;
  {
    EmptyInit scope;
    meta2 = std::make_shared<bigm::LM>();
  }
  EXPECT_THROW(disk_offload(*meta2, empty.str()), ConfigError);
}

TEST(CpuOffloadWithHook, ChainOffloadsThePreviousModel) {
  auto m1 = std::make_shared<Linear>(4, 4);
  auto m2 = std::make_shared<Linear>(4, 4);
  auto m3 = std::make_shared<Linear>(4, 4);
  at::Tensor x = at::randn({2, 4});
  at::Tensor expect1 = (*m1)(x);
  at::Tensor expect2 = (*m2)(expect1);
  at::Tensor expect3 = (*m3)(expect2);
  auto h1 = cpu_offload_with_hook(m1, c10::Device(at::kCPU));
  auto h2 = cpu_offload_with_hook(m2, c10::Device(at::kCPU), h1);
  auto h3 = cpu_offload_with_hook(m3, c10::Device(at::kCPU), h2);
  auto hook_of = [](const std::shared_ptr<Module>& m) { return find_hook<CpuOffloadHook>(m->model_hook()); };
  EXPECT_EQ(hook_of(m1)->offload_count(), 1);  // init
  at::Tensor hid1 = (*m1)(x);
  at::Tensor hid2;
  for (int i = 0; i < 5; ++i) hid2 = (*m2)(hid1);
  at::Tensor hid3 = (*m3)(hid2);
  h3->offload();
  EXPECT_TRUE(flex_test::equal(hid3, expect3));
  EXPECT_EQ(hook_of(m2)->prev_offloads(), 5);
  EXPECT_EQ(hook_of(m1)->offload_count(), 1 + 5);
  EXPECT_EQ(hook_of(m2)->offload_count(), 1 + 1);
  EXPECT_EQ(hook_of(m3)->offload_count(), 1 + 1);
  h2->remove();
  EXPECT_EQ(m2->model_hook(), nullptr);
}
