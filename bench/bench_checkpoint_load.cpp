// Load-to-ready time and peak resident memory for a >= 1 GB safetensors
// checkpoint: zero-copy mmap views vs. reading every tensor into memory.
//
// A 24-layer, Llama-shaped f32 checkpoint (hidden 1024, MLP 4096, vocab 32000,
// ~1.66 GB) is streamed to a temp dir (FLEX_BENCH_DIR or /tmp). Each mode runs
// in a spawned child process so its VmHWM (peak RSS) is its own; each runs with the
// file evicted from the page cache (posix_fadvise DONTNEED: "cold") and again
// right after ("warm"). Modes:
//   mmap        SafetensorsFile::open + get() of every tensor (views; nothing read yet)
//   mmap+touch  the same, then one pass summing every tensor (pages faulted in)
//   read        every tensor read with pread() into its own allocated tensor
#include "bench_util.h"

#include <flex/dispatch/atomic_file.h>
#include <flex/dispatch/safetensors.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::pair<std::string, at::Tensor>> layout() {
  const int64_t L = 24, H = 1024, I = 4096, V = 32000;
  auto meta = at::TensorOptions().dtype(at::kFloat).device(at::kMeta);
  std::vector<std::pair<std::string, at::Tensor>> t;
  t.emplace_back("model.embed_tokens.weight", at::empty({V, H}, meta));
  for (int64_t l = 0; l < L; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    for (const char* n : {"q_proj", "k_proj", "v_proj", "o_proj"})
      t.emplace_back(p + "self_attn." + n + ".weight", at::empty({H, H}, meta));
    t.emplace_back(p + "mlp.gate_proj.weight", at::empty({I, H}, meta));
    t.emplace_back(p + "mlp.up_proj.weight", at::empty({I, H}, meta));
    t.emplace_back(p + "mlp.down_proj.weight", at::empty({H, I}, meta));
    t.emplace_back(p + "input_layernorm.weight", at::empty({H}, meta));
    t.emplace_back(p + "post_attention_layernorm.weight", at::empty({H}, meta));
  }
  t.emplace_back("model.norm.weight", at::empty({H}, meta));
  return t;
}

// Streams the checkpoint tensor by tensor so the generator never holds it all.
uint64_t generate(const std::string& path) {
  auto sorted = flex::safetensors_order(layout());
  flex::AtomicFile out(path);
  std::string header = flex::safetensors_header(sorted, {{"format", "pt"}});
  out.write(header);
  uint64_t total = header.size();
  int64_t i = 0;
  for (const auto& [name, meta] : sorted) {
    at::Tensor t = at::full(meta.sizes(), static_cast<float>(++i) * 0.001f, at::kFloat);
    out.write(t.data_ptr(), t.nbytes());
    total += t.nbytes();
  }
  out.commit();
  return total;
}

void evict(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

struct Result {
  double seconds;
  long hwm_kb, rss_kb;
  double checksum;
};

Result run_mode(const std::string& mode, const std::string& path) {
  auto t0 = Clock::now();
  double checksum = 0;
  std::vector<at::Tensor> ready;
  if (mode == "read") {
    auto f = flex::SafetensorsFile::open(path);  // header only; the data is read below
    int fd = ::open(path.c_str(), O_RDONLY);
    for (const auto& n : f->names()) {
      const auto& info = f->info(n);
      at::Tensor t = at::empty(info.shape, at::kFloat);
      uint64_t off = f->data_offset() + info.begin, left = info.nbytes();
      char* dst = static_cast<char*>(t.data_ptr());
      while (left > 0) {
        ssize_t r = ::pread(fd, dst, left, static_cast<off_t>(off));
        if (r <= 0) std::abort();
        dst += r, off += r, left -= r;
      }
      ready.push_back(t);
    }
    ::close(fd);
  } else {
    auto f = flex::SafetensorsFile::open(path);
    for (const auto& n : f->names()) ready.push_back(f->get(n));
    if (mode == "mmap+touch")
      for (const auto& t : ready) checksum += t.sum().item<double>();
  }
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  return {s, bench::status_kb("VmHWM"), bench::status_kb("VmRSS"), checksum};
}

// Runs `mode` in a spawned child and reads its result from its output.
Result in_child(const std::string& mode, const std::string& path) {
  Result r{};
  r.seconds = -1;
  try {
    const std::string out = bench::run_child({"--child", mode, path});
    if (std::sscanf(out.c_str(), "%lf %ld %ld %lf", &r.seconds, &r.hwm_kb, &r.rss_kb, &r.checksum) != 4) r.seconds = -1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_checkpoint_load: %s\n", e.what());
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--child") {
    at::set_num_threads(1);
    const Result r = run_mode(argv[2], argv[3]);
    std::printf("%.6f %ld %ld %.6f\n", r.seconds, r.hwm_kb, r.rss_kb, r.checksum);
    return 0;
  }
  const char* env = std::getenv("FLEX_BENCH_DIR");
  std::string dir = (env && *env) ? env : std::filesystem::temp_directory_path().string();
  std::string path = dir + "/flex_bench_ckpt_" + std::to_string(::getpid()) + ".safetensors";
  auto t0 = Clock::now();
  uint64_t bytes = generate(path);
  double gen_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("checkpoint: %s, %.2f GB, %zu tensors, generated in %.1f s\n", path.c_str(), bytes / 1e9,
              layout().size(), gen_s);
  std::printf("%-11s %-5s %10s %14s %14s\n", "mode", "cache", "time_s", "peak_rss_MB", "rss_ready_MB");
  for (const char* mode : {"mmap", "mmap+touch", "read"}) {
    for (const char* cache : {"cold", "warm"}) {
      if (std::string(cache) == "cold") evict(path);
      Result r = in_child(mode, path);
      std::printf("%-11s %-5s %10.3f %14.1f %14.1f\n", mode, cache, r.seconds, r.hwm_kb / 1024.0, r.rss_kb / 1024.0);
      std::fflush(stdout);
    }
  }
  std::filesystem::remove(path);
  return 0;
}
