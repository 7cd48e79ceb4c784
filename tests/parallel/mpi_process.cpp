// Accelerate's process helpers across real ranks (run with 2 and 3): seeds,
// random-state synchronisation, the barrier, and save on rank 0 only; each
// compared with what one process computes for every rank.
#include <flex/dispatch/safetensors.h>
#include <flex/flexcore/save.h>
#include <flex/hooks/errors.h>
#include <flex/parallel/process.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "mpi_util.h"
#include "test_util.h"

using namespace flex;
using flex_test::world;
namespace fs = std::filesystem;

namespace {

// Every rank's tensor, on every rank.
std::vector<at::Tensor> everyone(Communicator& w, const at::Tensor& t) { return w.all_gather(t.contiguous()); }

// A directory every rank sees: rank 0 names it.
std::string shared_dir(Communicator& w) {
  at::Tensor stamp = at::zeros({1}, at::kLong);
  if (w.rank() == 0) stamp.fill_(std::chrono::steady_clock::now().time_since_epoch().count() % 1000000007);
  w.broadcast(stamp, 0);
  const fs::path d = fs::temp_directory_path() / ("flex_mpi_process_" + std::to_string(stamp.item<int64_t>()));
  fs::create_directories(d);
  return d.string();
}

}  // namespace

TEST(Process, SetSeedDeviceSpecificGivesEachRankItsOwnStream) {
  auto w = world();
  set_seed(42, /*device_specific=*/true, w.get());
  const at::Tensor got = at::randn({5});
  const auto all = everyone(*w, got);
  for (int r = 0; r < w->size(); ++r) {
    at::manual_seed(42 + r);  // what rank r's stream must be
    EXPECT_TRUE(flex_test::equal(all[r], at::randn({5}))) << "rank " << r;
  }
  set_seed(7, /*device_specific=*/false, w.get());
  const auto same = everyone(*w, at::randn({5}));
  for (int r = 1; r < w->size(); ++r) EXPECT_TRUE(flex_test::equal(same[r], same[0]));
}

TEST(Process, SynchronizeRngStateCopiesRankZerosState) {
  auto w = world();
  set_seed(100, /*device_specific=*/true, w.get());
  at::randn({3});  // states differ per rank now
  synchronize_rng_state(*w, RngType::Torch);
  const auto draws = everyone(*w, at::randn({8}));
  for (int r = 1; r < w->size(); ++r) EXPECT_TRUE(flex_test::equal(draws[r], draws[0])) << "rank " << r;
  // Rank 0's own stream is unchanged by the synchronisation.
  at::manual_seed(100);
  at::randn({3});
  EXPECT_TRUE(flex_test::equal(draws[0], at::randn({8})));

  // A generator of one's own, through synchronize_rng_states.
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(1000 + w->rank());
  synchronize_rng_states(*w, {RngType::Generator}, &g);
  const auto mine = everyone(*w, at::randn({4}, g));
  at::Generator ref = at::make_generator<at::CPUGeneratorImpl>(1000);
  EXPECT_TRUE(flex_test::equal(mine[w->rank()], at::randn({4}, ref)));
  for (int r = 1; r < w->size(); ++r) EXPECT_TRUE(flex_test::equal(mine[r], mine[0]));

  EXPECT_THROW(synchronize_rng_state(*w, RngType::Generator), ConfigError);  // no generator: on every rank
}

// RngType::Cuda: without a CUDA device a ConfigError on every rank; with one,
// the current device's generator takes rank 0's state on every rank (the
// ranks share the machine's GPUs; each uses its current device).
TEST(Process, SynchronizeRngStateCudaCopiesRankZerosCudaState) {
  auto w = world();
  if (!at::hasCUDA() || at::getNumGPUs() == 0) {
    EXPECT_THROW(synchronize_rng_state(*w, RngType::Cuda), ConfigError);
    return;
  }
  const at::Device dev(at::kCUDA, at::detail::getCUDAHooks().current_device());
  at::Generator gen = at::globalContext().defaultGenerator(dev);
  auto state = [&] {
    std::lock_guard<std::mutex> lock(gen.mutex());
    return gen.get_state().clone();  // a CPU uint8 tensor: seed and offset
  };
  set_seed(300, /*device_specific=*/true, w.get());
  at::randn({5}, at::TensorOptions().device(dev));  // advances the offset; states differ per rank
  const at::Tensor before = state();
  const auto before_all = everyone(*w, before);
  if (w->size() > 1) {
    EXPECT_FALSE(at::equal(before_all[0], before_all[1])) << "the states differ before";
  }
  synchronize_rng_state(*w, RngType::Cuda);
  const auto after = everyone(*w, state());
  for (int r = 0; r < w->size(); ++r) EXPECT_TRUE(flex_test::equal(after[r], before_all[0])) << "rank " << r;
  // Equal states draw equal numbers.
  const auto draws = everyone(*w, at::randn({8}, at::TensorOptions().device(dev)).cpu());
  for (int r = 1; r < w->size(); ++r) EXPECT_TRUE(flex_test::equal(draws[r], draws[0])) << "rank " << r;
  // Through synchronize_rng_states with both kinds.
  set_seed(400, /*device_specific=*/true, w.get());
  synchronize_rng_states(*w, {RngType::Torch, RngType::Cuda});
  const auto cpu_draws = everyone(*w, at::randn({4}));
  const auto gpu_draws = everyone(*w, at::randn({4}, at::TensorOptions().device(dev)).cpu());
  for (int r = 1; r < w->size(); ++r) {
    EXPECT_TRUE(flex_test::equal(cpu_draws[r], cpu_draws[0])) << "rank " << r;
    EXPECT_TRUE(flex_test::equal(gpu_draws[r], gpu_draws[0])) << "rank " << r;
  }
}

TEST(Process, WaitForEveryoneWaitsForTheLastRank) {
  auto w = world();
  const std::string dir = shared_dir(*w);
  const int last = w->size() - 1;
  if (w->rank() == last) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::ofstream(dir + "/done") << "x";
  }
  wait_for_everyone(*w);
  EXPECT_TRUE(fs::exists(dir + "/done")) << "rank " << w->rank() << " passed the barrier early";
  wait_for_everyone(*w);
  if (w->rank() == 0) fs::remove_all(dir);
}

TEST(Process, SaveWritesRankZerosObjectOnly) {
  auto w = world();
  const std::string dir = shared_dir(*w);
  // Each rank saves its own values to the same paths; rank 0's must be there.
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("rank", int64_t(w->rank()));
  d.insert("x", at::full({2, 2}, double(w->rank())));
  save(Value(d), dir + "/obj.pt", w.get());
  const std::vector<std::pair<std::string, at::Tensor>> tensors = {{"w", at::full({3}, float(w->rank()))}};
  save(tensors, dir + "/t.safetensors", w.get());
  wait_for_everyone(*w);
  std::ifstream in(dir + "/obj.pt", std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const Value back = torch::jit::pickle_load(bytes);
  EXPECT_EQ(back.toGenericDict().at("rank").toInt(), 0);
  EXPECT_TRUE(flex_test::equal(back.toGenericDict().at("x").toTensor(), at::zeros({2, 2})));  // at::full of a double is float
  EXPECT_TRUE(flex_test::equal(SafetensorsFile::open(dir + "/t.safetensors")->get("w"), at::zeros({3})));
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  wait_for_everyone(*w);
  if (w->rank() == 0) fs::remove_all(dir);
}
