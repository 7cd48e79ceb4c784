// Forward latency of a GPT-2-small-shaped model (12 layers, 768 wide, 12
// heads, vocab 50257): random weights are written once as safetensors into a
// temp dir, loaded with flex::load_pretrained, and timed at batch x tokens
// 1x32, 1x128 and 8x128 with 2 threads, no grad, float32, on CPU.
//
//   OMP_WAIT_POLICY=PASSIVE ./bench_forward [--iters N] [--threads T]
//
// Prints per shape the median / min milliseconds of one forward (logits
// included) and tokens per second at the median, for comparison with PyTorch
// eager (`with torch.no_grad(): model(ids)`) on the same machine. The same
// forward written with plain ATen calls on the same weights (no modules, no
// hooks machinery) runs interleaved with it, as a baseline that shares the
// machine's load: "flex/raw" is the framework's cost (1.00 = none). The raw
// logits also cross-check the model's.
#include "bench_util.h"

#include <flex/dispatch/safetensors.h>
#include <flex/models/auto_model.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace {

// GPT-2 written out with ATen ops only, reading the loaded model's weights.
struct RawGpt2 {
  flex::CausalLM& m;
  int64_t layers = 12, heads = 12, c = 768;
  at::Tensor w(const std::string& n) const { return flex::get_module_tensor(m, n); }
  at::Tensor linear(const at::Tensor& x, const std::string& n) const {  // Conv1D: x W + b
    auto sizes = x.sizes().vec();
    at::Tensor wt = w(n + ".weight");
    sizes.back() = wt.size(1);
    return at::addmm(w(n + ".bias"), x.reshape({-1, x.size(-1)}), wt).view(sizes);
  }
  at::Tensor ln(const at::Tensor& x, const std::string& n) const {
    return at::layer_norm(x, {c}, w(n + ".weight"), w(n + ".bias"), 1e-5);
  }
  at::Tensor forward(const at::Tensor& ids) const {
    const int64_t b = ids.size(0), t = ids.size(1), d = c / heads;
    at::Tensor x = at::embedding(w("transformer.wte.weight"), ids) +
                   at::embedding(w("transformer.wpe.weight"), at::arange(t, at::kLong).unsqueeze(0));
    at::Tensor causal = at::ones({t, t}, at::kBool).tril();
    for (int64_t l = 0; l < layers; ++l) {
      const std::string p = "transformer.h." + std::to_string(l) + ".";
      auto qkv = linear(ln(x, p + "ln_1"), p + "attn.c_attn").split(c, 2);
      auto heads_of = [&](const at::Tensor& y) { return y.view({b, t, heads, d}).permute({0, 2, 1, 3}); };
      at::Tensor s = at::matmul(heads_of(qkv[0]), heads_of(qkv[1]).transpose(-1, -2)) / std::sqrt(double(d));
      s = at::softmax(s.masked_fill(causal.logical_not(), std::numeric_limits<float>::lowest()), -1);
      at::Tensor z = at::matmul(s, heads_of(qkv[2])).permute({0, 2, 1, 3}).reshape({b, t, c});
      x = x + linear(z, p + "attn.c_proj");
      at::Tensor h = linear(ln(x, p + "ln_2"), p + "mlp.c_fc");
      h = 0.5 * h * (1.0 + at::tanh(std::sqrt(2.0 / M_PI) * (h + 0.044715 * at::pow(h, 3.0))));
      x = x + linear(h, p + "mlp.c_proj");
    }
    return at::matmul(ln(x, "transformer.ln_f"), w("transformer.wte.weight").t());
  }
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  bench::ForwardArgs args;
  if (!bench::parse_forward_args(argc, argv, args)) return 2;
  const int iters = args.iters;
  namespace fs = std::filesystem;
  std::random_device rd;
  const fs::path dir = fs::temp_directory_path() / ("flex_bench_forward_" + std::to_string(rd()));
  fs::create_directories(dir);
  try {
    // Random GPT-2-small weights, saved the way save_pretrained does (tied lm_head left out).
    auto t0 = std::chrono::steady_clock::now();
    bench::write_gpt2(dir, 12, 768, 12, 50257);
    const double write_ms = ms_since(t0);
    t0 = std::chrono::steady_clock::now();
    auto model = flex::load_pretrained(dir.string(), at::kFloat);
    const double load_ms = ms_since(t0);
    int64_t params = 0;
    for (auto& [name, t] : flex::state_dict(*model))
      if (name != "lm_head.weight") params += t.numel();
    std::printf("GPT-2 small shape: %.1fM parameters, write %.0f ms, load %.0f ms, %d threads, %d iterations\n",
                params / 1e6, write_ms, load_ms, at::get_num_threads(), iters);
    std::printf("%-8s %12s %12s %14s %12s %10s\n", "shape", "median ms", "min ms", "tokens/s", "raw ms", "flex/raw");
    RawGpt2 raw{*model};

    at::NoGradGuard no_grad;
    const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 32}, {1, 128}, {8, 128}};
    for (auto [b, t] : shapes) {
      at::Tensor ids = at::randint(0, 50257, {b, t}, at::kLong);
      for (int w = 0; w < 2; ++w) model->logits(ids);  // warm-up: allocator, thread pool
      const at::Tensor ref = raw.forward(ids);
      const at::Tensor got = model->logits(ids);
      if (!at::allclose(got, ref, 1e-4, 1e-4)) throw std::runtime_error("model logits differ from the raw ATen forward");
      std::vector<double> times, raw_times;
      for (int i = 0; i < iters; ++i) {  // interleaved, so both see the same load
        auto s = std::chrono::steady_clock::now();
        model->logits(ids);
        times.push_back(ms_since(s));
        s = std::chrono::steady_clock::now();
        raw.forward(ids);
        raw_times.push_back(ms_since(s));
      }
      std::sort(times.begin(), times.end());
      std::sort(raw_times.begin(), raw_times.end());
      const double median = times[times.size() / 2], raw_median = raw_times[raw_times.size() / 2];
      std::printf("%lldx%-6lld %12.2f %12.2f %14.0f %12.2f %10.3f\n", static_cast<long long>(b),
                  static_cast<long long>(t), median, times.front(), static_cast<double>(b * t) / (median / 1000.0),
                  raw_median, median / raw_median);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_forward: %s\n", e.what());
    std::error_code ec;
    fs::remove_all(dir, ec);
    return 1;
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return 0;
}
