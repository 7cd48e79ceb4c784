// Dispatch and offload on CPU: forward latency of a GPT-2-small-shaped model
// (12 layers, 768 wide, vocab 50257) in memory vs. every block on disk (warm
// page cache, weights served from the safetensors checkpoint as zero-copy
// views) vs. cpu_offload; then peak anonymous memory while running a >= 1 GB
// checkpoint with every block on disk.
//
//   OMP_WAIT_POLICY=PASSIVE ./bench_offload [--rounds N] [--skip-memory]
#include "bench_util.h"

#include <flex/dispatch/big_modeling.h>
#include <flex/models/from_pretrained.h>

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
  bool memory = true;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--skip-memory")) memory = false;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines appear even if the run is cut short
  at::set_num_threads(2);
  latency(rounds);
  if (memory) anon_memory();
  return 0;
}
