#pragma once
// Shared by the benchmarks: a GPT-2-shaped checkpoint folder with random
// weights, interleaved timing with medians, and /proc/self/status readings.
#include <flex/dispatch/safetensors.h>
#include <flex/models/auto_model.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace bench {

/// Writes config.json (`config`) + model.safetensors with the random
/// weights flex::build_causal_lm gives (seed 0) into `dir`. `edit` may change
/// a tensor or drop it (return an undefined tensor), e.g. a tied lm_head that
/// save_pretrained leaves out.
inline void write_random_model(
    const std::filesystem::path& dir, const std::string& config,
    const std::function<at::Tensor(const std::string&, const at::Tensor&)>& edit = nullptr) {
  std::filesystem::create_directories(dir);
  flex::ModelConfig cfg = flex::parse_config(nlohmann::json::parse(config), "bench config");
  at::manual_seed(0);
  auto model = flex::build_causal_lm(cfg);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (auto& [name, t] : flex::state_dict(*model)) {
    at::Tensor v = edit ? edit(name, t.detach()) : t.detach();
    if (v.defined()) tensors.emplace_back(name, v);
  }
  flex::save_safetensors((dir / "model.safetensors").string(), tensors, {{"format", "pt"}});
  std::ofstream(dir / "config.json") << config;
}

/// A GPT-2 of the given shape (tied lm_head left out, as save_pretrained does).
inline void write_gpt2(const std::filesystem::path& dir, int layers, int width, int heads, int vocab) {
  const std::string config = "{\"model_type\": \"gpt2\", \"vocab_size\": " + std::to_string(vocab) +
                             ", \"n_embd\": " + std::to_string(width) + ", \"n_layer\": " + std::to_string(layers) +
                             ", \"n_head\": " + std::to_string(heads) +
                             ", \"n_positions\": 1024, \"activation_function\": \"gelu_new\", "
                             "\"layer_norm_epsilon\": 1e-05, \"torch_dtype\": \"float32\"}";
  write_random_model(dir, config, [](const std::string& name, const at::Tensor& t) {
    return name == "lm_head.weight" ? at::Tensor() : t;
  });
}

/// The forward benches' `--iters N --threads T` (defaults 10 and 2); prints
/// the usage and returns false on anything else. Sets libtorch's threads.
struct ForwardArgs {
  int iters = 10, threads = 2;
};
inline bool parse_forward_args(int argc, char** argv, ForwardArgs& a) {
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (i + 1 < argc && k == "--iters") a.iters = std::max(1, std::atoi(argv[i + 1]));
    else if (i + 1 < argc && k == "--threads") a.threads = std::max(1, std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "usage: %s [--iters N] [--threads T]\n", argv[0]);
      return false;
    }
  }
  at::set_num_threads(a.threads);
  return true;
}

inline std::filesystem::path temp_dir(const std::string& tag) {
  std::random_device rd;
  auto p = std::filesystem::temp_directory_path() / ("flex_bench_" + tag + "_" + std::to_string(rd()));
  std::filesystem::create_directories(p);
  return p;
}

inline double ms(const std::function<void()>& f, int iters) {
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

/// Interleaves the variants (A B C A B C ...) `rounds` times; medians per variant.
inline std::vector<double> interleaved(const std::vector<std::function<void()>>& variants, int rounds, int iters) {
  std::vector<std::vector<double>> t(variants.size());
  for (auto& v : variants) v();  // warm-up
  for (int r = 0; r < rounds; ++r)
    for (size_t i = 0; i < variants.size(); ++i) t[i].push_back(ms(variants[i], iters));
  std::vector<double> out;
  for (auto& x : t) out.push_back(median(x));
  return out;
}

/// A field of /proc/self/status in kB ("RssAnon", "VmHWM", ...), -1 if absent.
inline long status_kb(const std::string& field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(field + ":", 0) == 0) return std::stol(line.substr(field.size() + 1));
  return -1;
}

/// Runs this executable again with `args` in a fresh process (posix_spawn of
/// /proc/self/exe: a fork of a process whose libtorch thread pools have
/// started can hang the child) and returns what it printed on stdout.
/// Throws std::runtime_error when it cannot start or does not exit 0.
inline std::string run_child(const std::vector<std::string>& args) {
  int fds[2];
  if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  posix_spawn_file_actions_addclose(&fa, fds[1]);
  std::vector<std::string> all{"/proc/self/exe"};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    throw std::runtime_error("posix_spawn failed: " + std::string(std::strerror(rc)));
  }
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error("child '" + (args.empty() ? std::string() : args[0]) + "' failed");
  return out;
}

}  // namespace bench
