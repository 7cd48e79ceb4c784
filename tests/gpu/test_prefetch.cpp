// Read-ahead of offloaded blocks on a CUDA device (design decision 41; the
// gpu label, skipped without one): the llama and gpt2 fixtures with blocks on
// GPU 0, the CPU (pinned, copied on the side stream) and disk (read by the
// thread into pinned memory, then copied), run on GPU 0. Prefetch depths 1
// and 2 give logits and captures bit-equal to depth 0, over three forwards
// (the later ones start on blocks read ahead), and depth 0 is checked against
// the golden logits; the prefetcher's statistics show it served the blocks.
// The host holds the CPU-resident weights once: the tensor the weights map
// returns is the pinned one the prefetcher copies from (one storage).
#include "../models/golden_util.h"
#include "gpu_util.h"

#include <flex/dispatch/block_prefetch.h>
#include <flex/dispatch/pinned_weights.h>
#include <flex/flexcore/flex_model.h>

#include "test_util.h"

using namespace flex;

namespace {

class PrefetchOnGpu : public ::testing::TestWithParam<std::string> {};

struct Result {
  std::vector<at::Tensor> logits;
  OutputMap captures;
  std::optional<PrefetchStats> stats;
  int64_t host_weights = 0;       // CPU-resident weights the prefetcher copies from pinned memory
  std::string held_twice;         // the first of them whose map tensor is not that pinned storage
};

Result run(const std::string& dir, const DeviceMap& map, const std::string& offload, int depth,
           const std::vector<std::string>& hooked) {
  PretrainedOptions o;
  o.device_map = map;
  o.offload_folder = offload;
  o.prefetch_depth = depth;
  auto model = from_pretrained(dir, o);
  Result r;
  for (const auto& [key, pair] : block_prefetch_host_weights(*model)) {
    ++r.host_weights;
    const at::Tensor& pinned = pair.first;
    const at::Tensor& in_map = pair.second;
    const bool once = pinned.is_pinned() && in_map.is_pinned() &&
                      in_map.storage().unsafeGetStorageImpl() == pinned.storage().unsafeGetStorageImpl();
    if (!once && r.held_twice.empty()) r.held_twice = key;
  }
  at::NoGradGuard ng;
  auto out = std::make_shared<OutputMap>();
  {
    FlexModel fm(model, out);
    for (const auto& n : hooked) fm.register_forward_hook(std::make_shared<HookFunction>(n));
    for (int i = 0; i < 3; ++i)
      r.logits.push_back(LMOutput::from_value(fm.forward(Inputs{Value(models_test::golden_inputs())})).logits.cpu());
    r.captures = fm.output();
  }
  r.stats = block_prefetch_stats(*model);
  return r;
}

}  // namespace

TEST_P(PrefetchOnGpu, DepthsBitEqualOverCpuAndDiskBlocks) {
  FLEX_REQUIRE_GPU();
  const std::string name = GetParam();
  const std::string dir = models_test::model_dir(name);
  auto plain = from_pretrained(dir);
  const DeviceMap map = gpu_test::mixed_device_map(*plain);
  const auto blocks = gpu_test::block_names(*plain);
  const std::vector<std::string> hooked = {blocks.front(), blocks.back()};
  flex_test::TempDir off;
  const Result ref = run(dir, map, off.str(), 0, hooked);
  EXPECT_FALSE(ref.stats.has_value());
  EXPECT_TRUE(models_test::close(ref.logits[0], models_test::golden_tensors(name)->get("logits"), name + " prefetch 0"));
  for (int depth : {1, 2}) {
    SCOPED_TRACE(name + " prefetch depth " + std::to_string(depth));
    const Result r = run(dir, map, off.str(), depth, hooked);
    // On cuda the map's CPU and disk blocks are both offloaded (two or more blocks to read ahead); the
    // CPU dry run offloads only the disk ones, too few for a prefetcher.
    if (gpu_test::dry_run() && !r.stats) continue;
    ASSERT_TRUE(r.stats.has_value()) << map.to_json();
    std::printf("%-8s prefetch %d: %lld blocks read ahead, %lld hits, %lld misses, %lld waits\n", name.c_str(), depth,
                static_cast<long long>(r.stats->blocks_prefetched), static_cast<long long>(r.stats->hits),
                static_cast<long long>(r.stats->misses), static_cast<long long>(r.stats->waits));
    EXPECT_GT(r.stats->hits, 0);
    if (!gpu_test::dry_run()) {
      EXPECT_GT(r.host_weights, 0) << "no CPU-resident weight pinned; map " << map.to_json();
    }
    EXPECT_TRUE(r.held_twice.empty()) << r.held_twice << ": the weights map still holds an unpinned copy";
    for (size_t i = 0; i < r.logits.size(); ++i)
      EXPECT_TRUE(flex_test::equal(r.logits[i], ref.logits[i])) << "forward " << i;
    for (const auto& n : hooked)
      for (size_t i = 0; i < 3; ++i)
        EXPECT_TRUE(flex_test::equal(r.captures.at(n)[i].cpu(), ref.captures.at(n)[i].cpu())) << n << " " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PrefetchOnGpu, ::testing::Values("llama", "gpt2"));
