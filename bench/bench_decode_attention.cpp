// The decode attention of one step (docs/design.md decision 56): the models
// library's entry (flex::detail::decode_attention, what a decoder layer
// calls) against the kernel (flex::grouped_decode_attention) called
// directly, interleaved, at TinyLlama's shape (1 sequence, 32 query heads
// over 4 key/value heads of 64) with the cache a narrow() of a 2048-position
// buffer, float32 and bf16, at S = 64, 256, 1024, on 1 and 2 threads. Once
// the models entry calls the kernel the two columns time the same work (the
// entry's extra cost is one select()); built at a commit before decision 56,
// "entry" is the previous implementation. Microseconds per call, medians of
// interleaved rounds. --cold: as in a decode step, where the weights
// streamed through since this layer's last step: 22 layers' caches, a 96 MB
// read between steps, microseconds per step of 22 calls at S = 158 (the
// mean position of 8 + 300 tokens) and 300.
//
//   OMP_WAIT_POLICY=PASSIVE ./bench_decode_attention [--rounds N] [--mask] [--cold]
#include "bench_util.h"

#include "../models/src/attention.h"

#include <flex/kernels/cpu_isa.h>
#include <flex/kernels/decode_attention.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

// Microseconds per decode step of `layers` calls on caches the weights'
// stream evicted, entry (true) or kernel (false), on the current threads.
double cold_step_us(const at::Tensor& q, const std::vector<at::Tensor>& k, const std::vector<at::Tensor>& v,
                    const at::Tensor& weights, bool entry, double scale, int steps) {
  double total = 0;
  volatile float sink = 0;
  for (int st = 0; st < steps; ++st) {
    sink = sink + weights.sum().item<float>();
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t l = 0; l < k.size(); ++l)
      entry ? flex::detail::decode_attention(q, k[l], v[l], at::Tensor(), scale)
            : flex::grouped_decode_attention(q, k[l], v[l], at::Tensor(), scale);
    total += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }
  return total / steps;
}

void cold(int rounds) {
  const double scale = 0.125;
  const at::Tensor q = at::randn({1, 32, 1, 64}), weights = at::randn({24 * 1024 * 1024});
  std::printf("cold: 22 layers' float32 caches, a 96 MB read between steps; us per step\n");
  std::printf("%6s %7s %12s %12s %8s\n", "S", "threads", "entry_us", "kernel_us", "ratio");
  for (int64_t S : {158, 300}) {
    std::vector<at::Tensor> k, v;
    for (int l = 0; l < 22; ++l) {
      k.push_back(at::randn({1, 4, 2048, 64}).narrow(2, 0, S));
      v.push_back(at::randn({1, 4, 2048, 64}).narrow(2, 0, S));
    }
    for (int threads : {1, 2}) {
      at::set_num_threads(threads);
      std::vector<double> e, n;
      for (int r = 0; r < rounds; ++r) {
        e.push_back(cold_step_us(q, k, v, weights, true, scale, 4));
        n.push_back(cold_step_us(q, k, v, weights, false, scale, 4));
      }
      const double me = bench::median(e), mn = bench::median(n);
      std::printf("%6lld %7d %12.1f %12.1f %8.2f\n", static_cast<long long>(S), threads, me, mn, me / mn);
      std::fflush(stdout);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 15;
  bool masked = false, cold_steps = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rounds" && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else if (a == "--mask") {
      masked = true;
    } else if (a == "--cold") {
      cold_steps = true;
    } else {
      std::fprintf(stderr, "usage: bench_decode_attention [--rounds N] [--mask] [--cold]\n");
      return 2;
    }
  }
  const int64_t B = 1, H = 32, Hkv = 4, D = 64, cap = 2048;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  at::NoGradGuard no_grad;
  if (cold_steps) {
    cold(rounds);
    return 0;
  }
  std::printf("isa %s, B %lld, H %lld, Hkv %lld, D %lld, cache a narrow of %lld positions%s\n",
              flex::to_string(flex::cpu_isa()).c_str(), static_cast<long long>(B), static_cast<long long>(H),
              static_cast<long long>(Hkv), static_cast<long long>(D), static_cast<long long>(cap),
              masked ? ", mask [B, 1, 1, S] with the first 3 keys hidden" : "");
  std::printf("%-6s %6s %7s %12s %12s %8s\n", "dtype", "S", "threads", "entry_us", "kernel_us", "ratio");
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    at::manual_seed(0);
    const at::Tensor q = at::randn({B, 1, H, D}).to(dt).transpose(1, 2);  // as the layer's view of [B, T, H, D]
    const at::Tensor kbuf = at::randn({B, Hkv, cap, D}).to(dt), vbuf = at::randn({B, Hkv, cap, D}).to(dt);
    for (int64_t S : {64, 256, 1024}) {
      const at::Tensor k = kbuf.narrow(2, 0, S), v = vbuf.narrow(2, 0, S);
      at::Tensor allowed;
      if (masked) {
        allowed = at::ones({B, 1, 1, S}, at::kBool);
        allowed.narrow(3, 0, 3).fill_(false);
      }
      const at::Tensor mask = allowed.defined() ? allowed.select(2, 0).select(1, 0) : at::Tensor();
      for (int threads : {1, 2}) {
        at::set_num_threads(threads);
        const int iters = static_cast<int>(std::max<int64_t>(20, 40000 / S));
        const auto t = bench::interleaved(
            {[&] { flex::detail::decode_attention(q, k, v, allowed, scale); },
             [&] { flex::grouped_decode_attention(q, k, v, mask, scale); }},
            rounds, iters);
        std::printf("%-6s %6lld %7d %12.2f %12.2f %8.2f\n", dt == at::kFloat ? "f32" : "bf16",
                    static_cast<long long>(S), threads, 1000 * t[0], 1000 * t[1], t[0] / t[1]);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
