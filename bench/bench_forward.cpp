// Forward latency of a GPT-2-small-shaped model (12 layers, 768 wide, 12
// heads, vocab 50257): random weights are written once as safetensors into a
// temp dir, loaded with flex::load_pretrained, and timed at batch x tokens
// 1x32, 1x128 and 8x128 with 2 threads, no grad, float32, on CPU.
//
//   OMP_WAIT_POLICY=PASSIVE ./bench_forward [--iters N] [--threads T]
//
// Prints per shape the median / min milliseconds of one forward (logits
// included) and tokens per second at the median, for comparison with PyTorch
// eager (`with torch.no_grad(): model(ids)`) on the same machine.
#include <flex/dispatch/safetensors.h>
#include <flex/models/auto_model.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace {

const char* kConfig = R"({
  "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
  "vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024,
  "n_inner": null, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05,
  "attn_pdrop": 0.1, "embd_pdrop": 0.1, "resid_pdrop": 0.1,
  "bos_token_id": 50256, "eos_token_id": 50256, "torch_dtype": "float32"
})";

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 10, threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--iters") iters = std::max(1, std::atoi(argv[i + 1]));
    else if (a == "--threads") threads = std::max(1, std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "usage: %s [--iters N] [--threads T]\n", argv[0]);
      return 2;
    }
  }
  at::set_num_threads(threads);
  namespace fs = std::filesystem;
  std::random_device rd;
  const fs::path dir = fs::temp_directory_path() / ("flex_bench_forward_" + std::to_string(rd()));
  fs::create_directories(dir);
  try {
    // Random GPT-2-small weights, saved the way save_pretrained does (tied lm_head left out).
    auto t0 = std::chrono::steady_clock::now();
    {
      flex::ModelConfig cfg = flex::parse_config(nlohmann::json::parse(kConfig), "bench config");
      at::manual_seed(0);
      auto model = flex::build_causal_lm(cfg);
      std::vector<std::pair<std::string, at::Tensor>> tensors;
      for (auto& [name, t] : flex::state_dict(*model))
        if (name != "lm_head.weight") tensors.emplace_back(name, t.detach());
      flex::save_safetensors((dir / "model.safetensors").string(), tensors, {{"format", "pt"}});
      std::ofstream(dir / "config.json") << kConfig;
    }
    const double write_ms = ms_since(t0);
    t0 = std::chrono::steady_clock::now();
    auto model = flex::load_pretrained(dir.string(), at::kFloat);
    const double load_ms = ms_since(t0);
    int64_t params = 0;
    for (auto& [name, t] : flex::state_dict(*model))
      if (name != "lm_head.weight") params += t.numel();
    std::printf("GPT-2 small shape: %.1fM parameters, write %.0f ms, load %.0f ms, %d threads, %d iterations\n",
                params / 1e6, write_ms, load_ms, at::get_num_threads(), iters);
    std::printf("%-8s %12s %12s %14s\n", "shape", "median ms", "min ms", "tokens/s");

    at::NoGradGuard no_grad;
    const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 32}, {1, 128}, {8, 128}};
    for (auto [b, t] : shapes) {
      at::Tensor ids = at::randint(0, 50257, {b, t}, at::kLong);
      for (int w = 0; w < 2; ++w) model->logits(ids);  // warm-up: allocator, thread pool
      std::vector<double> times;
      for (int i = 0; i < iters; ++i) {
        auto s = std::chrono::steady_clock::now();
        at::Tensor logits = model->logits(ids);
        times.push_back(ms_since(s));
        if (logits.size(2) != 50257) throw std::runtime_error("unexpected logits shape");
      }
      std::sort(times.begin(), times.end());
      const double median = times[times.size() / 2];
      std::printf("%lldx%-6lld %12.2f %12.2f %14.0f\n", static_cast<long long>(b), static_cast<long long>(t), median,
                  times.front(), static_cast<double>(b * t) / (median / 1000.0));
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
