#pragma once
// Shared by the tests of the `gpu` label (tests/gpu/test_*.cpp): the device
// they run on, the skip without one, and the device maps they dispatch with.
//
// Every case starts with FLEX_REQUIRE_GPU(): without a CUDA device it is
// skipped (GTEST_SKIP, with the reason), and gpu_main.cpp then exits with
// kSkipReturnCode, which CTest (SKIP_RETURN_CODE, tests/CMakeLists.txt)
// reports as "Skipped" rather than "Passed". A failure still fails.
//
// FLEX_GPU_TEST_DEVICE=cpu runs the cases on the CPU instead: a dry run of
// the tests' own logic (helpers, references, maps) on a machine without a
// GPU. It is not part of the suite; there every "cuda vs CPU" comparison
// compares the CPU with itself.
#include <flex/dispatch/device_map.h>
#include <flex/models/causal_lm.h>
#include <flex/models/from_pretrained.h>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <set>
#include <string>
#include <vector>

namespace gpu_test {

/// What gpu_main.cpp returns when nothing failed but there was no GPU.
constexpr int kSkipReturnCode = 77;

/// FLEX_GPU_TEST_DEVICE=cpu: the dry run described above.
inline bool dry_run() {
  const char* e = std::getenv("FLEX_GPU_TEST_DEVICE");
  return e && std::string(e) == "cpu";
}

inline bool have_cuda() { return at::hasCUDA() && at::getNumGPUs() > 0; }

/// Where the cases compute: cuda:0 (the CPU in a dry run).
inline at::Device device() { return dry_run() ? at::Device(at::kCPU) : at::Device(at::kCUDA, 0); }

/// The same as a device-map entry: GPU 0 ("cpu" in a dry run).
inline flex::MapDevice map_gpu() { return dry_run() ? flex::MapDevice::cpu() : flex::MapDevice::gpu(0); }

/// `t` on the test device (what a user does with the inputs of a model that
/// lives wholly on one GPU, as with Transformers' `.to(model.device)`).
inline at::Tensor on_device(const at::Tensor& t) { return t.defined() ? t.to(device()) : t; }

/// `dir` loaded wholly onto the test device through a device map
/// (from_pretrained's device_map="0"; Transformers' device_map={"": 0}).
inline std::shared_ptr<flex::CausalLM> load_on_device(const std::string& dir, const std::string& torch_dtype = "float32") {
  flex::PretrainedOptions o;
  o.device_map_strategy = dry_run() ? "cpu" : "0";
  o.torch_dtype = torch_dtype;
  return flex::from_pretrained(dir, o);
}

/// Every parameter and buffer of `m` on `d` (meta ones, of disk-offloaded
/// modules at rest, are left out).
inline ::testing::AssertionResult all_on(flex::Module& m, const at::Device& d) {
  for (const auto& p : m.named_parameters(true))
    if (!p.value().is_meta() && p.value().device() != d)
      return ::testing::AssertionFailure() << "parameter " << p.key() << " is on " << p.value().device() << ", not " << d;
  for (const auto& b : m.named_buffers(true))
    if (b.value().defined() && !b.value().is_meta() && b.value().device() != d)
      return ::testing::AssertionFailure() << "buffer " << b.key() << " is on " << b.value().device() << ", not " << d;
  return ::testing::AssertionSuccess();
}

/// The modules of `m` whose class is one of its no-split block classes
/// ("model.layers.0", ...), in module order.
inline std::vector<std::string> block_names(flex::CausalLM& m) {
  const auto classes = m.no_split_modules();
  const std::set<std::string> no_split(classes.begin(), classes.end());
  std::vector<std::string> out;
  for (const auto& [name, mod] : m.named_flex_modules())
    if (!name.empty() && no_split.count(mod->class_name())) out.push_back(name);
  return out;
}

/// A device map over `m` (built or on meta) with every kind of entry: block
/// i on blocks[i % 3] (default cpu, disk, GPU 0: the fixtures' two blocks on
/// the CPU and on disk), and every other module holding tensors on the GPU.
/// The entries are the largest subtrees without a block inside, as
/// Accelerate's maps are; hook points (no tensors) are left out.
inline flex::DeviceMap mixed_device_map(flex::CausalLM& m, std::vector<flex::MapDevice> blocks = {}) {
  if (blocks.empty()) blocks = {flex::MapDevice::cpu(), flex::MapDevice::disk(), map_gpu()};
  const std::vector<std::string> names = block_names(m);
  const std::set<std::string> block_set(names.begin(), names.end());
  auto has_block_inside = [&](const std::string& prefix) {
    for (const auto& b : names)
      if (prefix.empty() || b.rfind(prefix + ".", 0) == 0) return true;
    return false;
  };
  flex::DeviceMap map;
  // Depth-first over the children of the modules that hold a block.
  std::function<void(flex::Module&, const std::string&)> walk = [&](flex::Module& mod, const std::string& prefix) {
    for (const auto& [child, sub] : mod.named_flex_children()) {
      const std::string full = prefix.empty() ? child : prefix + "." + child;
      if (flex::is_hook_point_name(full)) continue;
      if (block_set.count(full)) {
        const size_t i = static_cast<size_t>(std::find(names.begin(), names.end(), full) - names.begin());
        map.set(full, blocks[i % blocks.size()]);
      } else if (has_block_inside(full)) {
        walk(*sub, full);
      } else if (!sub->parameters(true).empty() || !sub->buffers(true).empty()) {
        map.set(full, map_gpu());
      }
    }
  };
  walk(m, "");
  return map;
}

/// How many entries of each kind `map` has, as "gpu/cpu/disk" counts.
inline std::string kinds(const flex::DeviceMap& map) {
  int g = 0, c = 0, d = 0;
  for (const auto& e : map) {
    g += e.second.is_gpu();
    c += e.second.is_cpu();
    d += e.second.is_disk();
  }
  return std::to_string(g) + "/" + std::to_string(c) + "/" + std::to_string(d);
}

/// max |a - b| in float64 on the CPU.
inline double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.detach().to(at::kCPU, at::kDouble) - b.detach().to(at::kCPU, at::kDouble)).abs().max().item<double>();
}

}  // namespace gpu_test

#define FLEX_REQUIRE_GPU()                                                                                  \
  do {                                                                                                      \
    if (!gpu_test::have_cuda() && !gpu_test::dry_run())                                                     \
      GTEST_SKIP() << "no CUDA device (at::hasCUDA() is false): a test of the gpu label, run on a GPU machine " \
                      "(ctest -L gpu; scripts/gpu/check.sh)";                                               \
  } while (0)
