#pragma once
// Shared by the benchmarks: a GPT-2-shaped checkpoint folder with random
// weights, interleaved timing with medians, and /proc/self/status readings.
#include <flex/dispatch/safetensors.h>
#include <flex/models/auto_model.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace bench {

/// Writes config.json + model.safetensors (tied lm_head left out, as
/// save_pretrained does) for a GPT-2 of the given shape into `dir`.
inline void write_gpt2(const std::filesystem::path& dir, int layers, int width, int heads, int vocab) {
  std::filesystem::create_directories(dir);
  const std::string config = "{\"model_type\": \"gpt2\", \"vocab_size\": " + std::to_string(vocab) +
                             ", \"n_embd\": " + std::to_string(width) + ", \"n_layer\": " + std::to_string(layers) +
                             ", \"n_head\": " + std::to_string(heads) +
                             ", \"n_positions\": 1024, \"activation_function\": \"gelu_new\", "
                             "\"layer_norm_epsilon\": 1e-05, \"torch_dtype\": \"float32\"}";
  flex::ModelConfig cfg = flex::parse_config(nlohmann::json::parse(config), "bench config");
  at::manual_seed(0);
  auto model = flex::build_causal_lm(cfg);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (auto& [name, t] : flex::state_dict(*model))
    if (name != "lm_head.weight") tensors.emplace_back(name, t.detach());
  flex::save_safetensors((dir / "model.safetensors").string(), tensors, {{"format", "pt"}});
  std::ofstream(dir / "config.json") << config;
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

}  // namespace bench
