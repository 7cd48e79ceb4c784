// Read-ahead of offloaded blocks (flex/dispatch/block_prefetch.h) on the CPU:
// the llama fixture with blocks on disk (read from the safetensors checkpoint
// or written to an offload folder) and on the CPU, execution device cpu.
// Prefetch depths 0, 1 and 2 give bit-equal logits, generated tokens and
// FlexModel captures (depth 0 also checked against the golden logits, made
// by Transformers); the reader thread's statistics show it served the
// blocks; a file missing when the thread reads it surfaces on the calling
// thread as the loader's typed error naming the file, every time, no hang.
// The step that keeps a CUDA model's CPU-resident weights pinned once (the
// copy replaces the map's tensor) runs here with a clone for the pin: every
// map then returns the copy, the old storages are freed, logits bit-equal.
#include "../models/golden_util.h"

#include <flex/dispatch/big_modeling.h>
#include <flex/dispatch/align_devices_hook.h>
#include <flex/dispatch/block_prefetch.h>
#include <flex/dispatch/pinned_weights.h>
#include <flex/flexcore/flex_model.h>
#include <flex/hooks/errors.h>
#include <flex/models/generate.h>

#include <filesystem>
#include <set>

#include "test_util.h"

using namespace flex;

namespace {

DeviceMap disk_and_cpu_map() {
  return DeviceMap{{"model.embed_tokens", "cpu"}, {"model.layers.0", "disk"}, {"model.layers.1", "disk"},
                   {"model.norm", "cpu"},         {"model.rotary_emb", "cpu"}, {"lm_head", "disk"}};
}

struct PrefetchRun {
  std::vector<at::Tensor> logits;
  OutputMap captures;
  std::vector<int64_t> tokens;
  std::optional<PrefetchStats> stats;
};

const std::vector<std::string> kHooked = {"model.layers.0.mlp", "model.layers.1.self_attn", "model.layers.1",
                                          "lm_head"};

PrefetchRun run_with_depth(int depth) {
  PretrainedOptions o;
  o.device_map = disk_and_cpu_map();
  o.prefetch_depth = depth;
  auto model = from_pretrained(models_test::model_dir("llama"), o);
  PrefetchRun r;
  at::NoGradGuard ng;
  const at::Tensor ids = models_test::golden_inputs();
  {
    auto out = std::make_shared<OutputMap>();
    FlexModel fm(model, out);
    for (const auto& n : kHooked) fm.register_forward_hook(std::make_shared<HookFunction>(n));
    // Three forwards: the second and third start on blocks read ahead at the end of the one before.
    for (int i = 0; i < 3; ++i) r.logits.push_back(LMOutput::from_value(fm.forward(Inputs{Value(ids)})).logits);
    r.captures = fm.output();
  }
  GenerateOptions g;
  g.max_new_tokens = 6;
  g.do_sample = false;
  g.use_cache = true;
  g.stop_tokens = std::vector<int64_t>{};
  g.pad_token_id = 0;
  r.tokens = generate(*model, ids.narrow(0, 0, 1), at::Tensor(), g).new_tokens(0);
  r.stats = block_prefetch_stats(*model);
  return r;
}

}  // namespace

TEST(BlockPrefetch, DepthsGiveBitEqualLogitsTokensAndCaptures) {
  const PrefetchRun off = run_with_depth(0);
  EXPECT_FALSE(off.stats.has_value()) << "prefetch 0 attaches no prefetcher";
  EXPECT_TRUE(models_test::close(off.logits[0], models_test::golden_tensors("llama")->get("logits"),
                                 "llama with disk blocks, prefetch 0"));
  for (int depth : {1, 2}) {
    SCOPED_TRACE("prefetch depth " + std::to_string(depth));
    const PrefetchRun on = run_with_depth(depth);
    ASSERT_TRUE(on.stats.has_value());
    EXPECT_EQ(on.stats->depth, depth);
    EXPECT_EQ(on.stats->blocks, 3);  // layers.0, layers.1, lm_head
    EXPECT_GT(on.stats->blocks_prefetched, 0);
    EXPECT_GT(on.stats->bytes_prefetched, 0);
    EXPECT_GT(on.stats->hits, 0);
    ASSERT_EQ(on.logits.size(), off.logits.size());
    for (size_t i = 0; i < on.logits.size(); ++i)
      EXPECT_TRUE(flex_test::equal(on.logits[i], off.logits[i])) << "logits of forward " << i;
    EXPECT_EQ(on.tokens, off.tokens);
    for (const auto& n : kHooked) {
      ASSERT_EQ(on.captures.count(n), 1u) << n;
      ASSERT_EQ(on.captures.at(n).size(), 3u) << n;
      for (size_t i = 0; i < 3; ++i)
        EXPECT_TRUE(flex_test::equal(on.captures.at(n)[i], off.captures.at(n)[i])) << n << " capture " << i;
    }
  }
}

TEST(BlockPrefetch, ReadErrorInReaderThreadIsTypedAndNamesTheFile) {
  flex_test::TempDir folder;
  auto model = from_pretrained(models_test::model_dir("llama"));  // in memory, then dispatched to an offload folder
  DispatchOptions d;
  d.offload_dir = folder.str();
  dispatch_model(*model, disk_and_cpu_map(), d);
  auto prefetcher = enable_block_prefetch(*model, 1);
  ASSERT_TRUE(prefetcher);
  prefetcher.reset();  // the model's hooks keep it
  // Block model.layers.1 is read by the thread (queued when layers.0 starts); its files are gone.
  std::string missing;
  for (const auto& f : std::filesystem::directory_iterator(folder.path())) {
    const std::string name = f.path().filename().string();
    if (name.rfind("model.layers.1.", 0) == 0) {
      if (missing.empty()) missing = name;
      std::filesystem::remove(f.path());
    }
  }
  ASSERT_FALSE(missing.empty());
  at::NoGradGuard ng;
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      model->logits(models_test::golden_inputs());
      ADD_FAILURE() << "a forward with missing offload files succeeded";
    } catch (const IOError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(folder.str()), std::string::npos) << what;
      EXPECT_NE(what.find("model.layers.1."), std::string::npos) << what;
    }
  }
  const auto stats = block_prefetch_stats(*model);
  ASSERT_TRUE(stats.has_value());
  EXPECT_EQ(stats->blocks, 3);
  model.reset();  // joins the reader thread
}

TEST(BlockPrefetch, HostCopyReplacesTheMapsTensorAndFreesTheOld) {
  auto model = from_pretrained(models_test::model_dir("llama"));
  at::NoGradGuard ng;
  const at::Tensor ids = models_test::golden_inputs();
  const at::Tensor before = model->logits(ids);
  cpu_offload(*model);  // every module reads its weights from a state dict behind PrefixedWeights
  std::vector<std::shared_ptr<const WeightsMap>> maps;
  for (const auto& [name, m] : model->named_flex_modules()) {
    auto hook = find_hook<AlignDevicesHook>(m->model_hook());
    if (hook && hook->options().offload && hook->options().weights_map) maps.push_back(hook->options().weights_map);
  }
  ASSERT_FALSE(maps.empty());
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> old;
  HostCopies copies;
  int64_t copied = 0;
  const HostCopyFn clone = [&](const at::Tensor& t) {
    ++copied;
    return t.clone();
  };
  std::vector<std::pair<std::shared_ptr<const WeightsMap>, std::string>> held;
  std::set<std::string> names;  // full weight names
  for (const auto& map : maps)
    for (const auto& key : map->keys()) {
      at::Tensor t = map->get(key);
      if (t.is_meta()) continue;
      old.emplace_back(t.storage().getWeakStorageImpl());
      const at::Tensor copy = copies.hold(*map, key, clone);
      EXPECT_NE(copy.data_ptr(), t.data_ptr()) << key;
      EXPECT_TRUE(flex_test::equal(copy, t)) << key;
      EXPECT_EQ(map->get(key).unsafeGetTensorImpl(), copy.unsafeGetTensorImpl()) << key << ": the map still returns the old tensor";
      held.emplace_back(map, key);
      if (auto prefixed = std::dynamic_pointer_cast<const PrefixedWeights>(map)) names.insert(prefixed->prefix() + key);
    }
  ASSERT_FALSE(held.empty());
  // Each weight copied once, however many maps (root and submodule prefixes) name it.
  EXPECT_LE(copied, static_cast<int64_t>(names.size()));
  // Asked again (another hook naming the same weight): the copy already held, no new copy.
  const int64_t after_first = copied;
  const at::Tensor again = copies.hold(*held[0].first, held[0].second, clone);
  EXPECT_EQ(copied, after_first);
  EXPECT_EQ(again.unsafeGetTensorImpl(), held[0].first->get(held[0].second).unsafeGetTensorImpl());
  EXPECT_GT(copied, 0);
  for (size_t i = 0; i < old.size(); ++i)
    EXPECT_TRUE(old[i].expired()) << held[i].second << ": the old storage still has an owner (held twice)";
  EXPECT_TRUE(flex_test::equal(model->logits(ids), before));
}
