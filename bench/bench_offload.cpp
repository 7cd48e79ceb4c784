// Dispatch and offload on CPU: forward latency of a GPT-2-small-shaped model
// (12 layers, 768 wide, vocab 50257) in memory vs. every block on disk (warm
// page cache, weights served from the safetensors checkpoint as zero-copy
// views) vs. cpu_offload; then peak anonymous memory while running a >= 1 GB
// checkpoint with every block on disk. With --decode: greedy decode of 16
// tokens (KV cache) with every block on disk, prefetch depth 0 / 1 / 2
// interleaved (design decision 41), cold (the checkpoint's cached pages
// dropped before each run with POSIX_FADV_DONTNEED) and warm.
//
//   OMP_WAIT_POLICY=PASSIVE ./bench_offload [--rounds N] [--skip-memory] [--decode]
#include "bench_util.h"

#include <flex/dispatch/big_modeling.h>
#include <flex/dispatch/block_prefetch.h>
#include <flex/models/from_pretrained.h>
#include <flex/models/generate.h>

#include <fcntl.h>
#include <unistd.h>

#include <ATen/Parallel.h>

#include <cstring>

namespace fs = std::filesystem;

namespace {

flex::DeviceMap blocks_on_disk(int layers) {
  flex::DeviceMap map{{"transformer.wte", "cpu"}, {"transformer.wpe", "cpu"}, {"transformer.drop", "cpu"}};
  for (int i = 0; i < layers; ++i) map.set("transformer.h." + std::to_string(i), "disk");
  map.set("transformer.ln_f", "cpu");
  map.set("lm_head", "cpu");
  return map;
}

void latency(int rounds) {
  const fs::path dir = bench::temp_dir("offload");
  bench::write_gpt2(dir, 12, 768, 12, 50257);
  auto mem = flex::from_pretrained(dir.string());
  flex::PretrainedOptions o;
  o.device_map = blocks_on_disk(12);
  auto disk = flex::from_pretrained(dir.string(), o);
  auto cpu = flex::load_pretrained(dir.string(), at::kFloat);
  flex::cpu_offload(*cpu);
  at::Tensor ids = at::randint(0, 50257, {1, 128}, at::kLong);
  at::NoGradGuard ng;
  auto t = bench::interleaved({[&] { mem->logits(ids); }, [&] { disk->logits(ids); }, [&] { cpu->logits(ids); }},
                              rounds, 3);
  std::printf("GPT-2 small shape, batch 1 x 128, %d threads, medians of %d interleaved rounds\n",
              at::get_num_threads(), rounds);
  std::printf("  in memory        %8.1f ms\n", t[0]);
  std::printf("  blocks on disk   %8.1f ms   ratio %.3f  (target <= 1.15)\n", t[1], t[1] / t[0]);
  std::printf("  cpu_offload      %8.1f ms   ratio %.3f\n", t[2], t[2] / t[0]);
  fs::remove_all(dir);
}

// Asks the kernel to drop the cached pages of `file` (not guaranteed for pages mapped by a process).
void drop_cache(const fs::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY);
  if (fd < 0) return;
  (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// Decode with every block on disk, prefetch off vs on, interleaved in one run.
void decode(int rounds) {
  const fs::path dir = bench::temp_dir("offload_decode");
  bench::write_gpt2(dir, 12, 768, 12, 50257);
  const int depths[] = {0, 1, 2};
  std::vector<std::shared_ptr<flex::CausalLM>> models;
  for (int d : depths) {
    flex::PretrainedOptions o;
    o.device_map = blocks_on_disk(12);
    o.prefetch_depth = d;
    models.push_back(flex::from_pretrained(dir.string(), o));
  }
  at::Tensor ids = at::randint(0, 50257, {1, 32}, at::kLong);
  flex::GenerateOptions g;
  g.max_new_tokens = 16;
  g.do_sample = false;
  g.use_cache = true;
  g.stop_tokens = std::vector<int64_t>{};
  g.pad_token_id = 0;
  at::NoGradGuard ng;
  std::vector<int64_t> want;
  bool same = true;
  for (const bool cold : {false, true}) {
    std::vector<std::function<void()>> variants;
    for (auto& m : models)
      variants.push_back([&, m] {
        if (cold) drop_cache(dir / "model.safetensors");
        auto out = flex::generate(*m, ids, at::Tensor(), g).new_tokens(0);
        if (want.empty()) want = out;
        same = same && out == want;
      });
    auto t = bench::interleaved(variants, rounds, 1);
    std::printf("GPT-2 small shape, all 12 blocks on disk, %s page cache, decode 16 tokens after 32, medians of %d "
                "interleaved rounds:\n", cold ? "cold (dropped before each run)" : "warm", rounds);
    for (size_t i = 0; i < models.size(); ++i)
      std::printf("  prefetch %d   %8.1f ms   %6.2f tok/s   vs prefetch 0: %.3fx\n", depths[i], t[i],
                  16e3 / t[i], t[0] / t[i]);
  }
  for (size_t i = 1; i < models.size(); ++i) {
    const auto st = flex::block_prefetch_stats(*models[i]);
    if (st)
      std::printf("  prefetch %d stats: %lld blocks read ahead (%.0f MB, %.2f s in the reader thread), %lld hits, "
                  "%lld misses, %lld waits\n", depths[i], static_cast<long long>(st->blocks_prefetched),
                  st->bytes_prefetched / 1e6, st->read_seconds, static_cast<long long>(st->hits),
                  static_cast<long long>(st->misses), static_cast<long long>(st->waits));
  }
  std::printf("  same greedy tokens for every depth: %s\n", same ? "yes" : "NO");
  models.clear();
  fs::remove_all(dir);
}

// Child: loads `dir` with every block on disk, runs one forward and prints
// RssAnon at the start and at its peak (kB).
int memory_child(const std::string& dir) {
  const long base = bench::status_kb("RssAnon");
  flex::PretrainedOptions o;
  o.device_map = blocks_on_disk(24);
  auto model = flex::from_pretrained(dir, o);
  long peak = bench::status_kb("RssAnon");
  for (auto& nm : model->named_flex_modules())
    if (nm.second->class_name() == "GPT2Block")
      nm.second->register_forward_hook([&peak](flex::Module&, const flex::Inputs&, flex::Value&) {
        peak = std::max(peak, bench::status_kb("RssAnon"));
      });
  at::NoGradGuard ng;
  model->logits(at::randint(0, 32000, {1, 128}, at::kLong));
  peak = std::max(peak, bench::status_kb("RssAnon"));
  std::printf("%ld %ld\n", base, peak);
  return 0;
}

// In spawned processes, so the parent's memory does not count.
void anon_memory() {
  const fs::path dir = bench::temp_dir("offload_mem");
  // 24 layers x 1024 wide: 302M parameters + embeddings, about 1.4 GB in f32.
  bench::run_child({"--write-child", dir.string()});
  const double gb = fs::file_size(dir / "model.safetensors") / 1e9;
  long base = 0, peak = 0;
  if (std::sscanf(bench::run_child({"--memory-child", dir.string()}).c_str(), "%ld %ld", &base, &peak) == 2) {
    const double peak_mb = (peak - base) / 1024.0;
    std::printf("disk-offloaded inference of a %.2f GB checkpoint (24 x 1024, all blocks on disk):\n", gb);
    std::printf("  peak anonymous memory above start %.0f MB = %.1f%% of the checkpoint (target < 25%%)\n",
                peak_mb, 100.0 * peak_mb / (gb * 1000.0));
  }
  fs::remove_all(dir);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && !std::strcmp(argv[1], "--write-child")) {
    bench::write_gpt2(argv[2], 24, 1024, 16, 32000);
    return 0;
  }
  if (argc == 3 && !std::strcmp(argv[1], "--memory-child")) return memory_child(argv[2]);
  int rounds = 7;
  bool memory = true, decode_only = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--skip-memory")) memory = false;
    else if (!std::strcmp(argv[i], "--decode")) decode_only = true;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines appear even if the run is cut short
  at::set_num_threads(2);
  if (decode_only) {
    decode(rounds);
    return 0;
  }
  latency(rounds);
  if (memory) anon_memory();
  return 0;
}
