// The decode attention of one step (docs/design.md decision 56): the models
// library's entry (flex::detail::decode_attention, what a decoder layer
// calls) against the kernel (flex::grouped_decode_attention) called
// directly, interleaved, at TinyLlama's shape (1 sequence, 32 query heads
// over 4 key/value heads of 64) with the cache a narrow() of a 2048-position
// buffer, float32 and bf16, at S = 64, 256, 1024, on 1 and 2 threads. Once
// the models entry calls the kernel the two columns time the same work (the
// entry's extra cost is one select()); built at a commit before decision 56,
// "entry" is the previous implementation. Microseconds per call, medians of
// interleaved rounds.
//
//   OMP_WAIT_POLICY=PASSIVE ./bench_decode_attention [--rounds N] [--mask]
#include "bench_util.h"

#include "../models/src/attention.h"

#include <flex/kernels/cpu_isa.h>
#include <flex/kernels/decode_attention.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  int rounds = 15;
  bool masked = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rounds" && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else if (a == "--mask") {
      masked = true;
    } else {
      std::fprintf(stderr, "usage: bench_decode_attention [--rounds N] [--mask]\n");
      return 2;
    }
  }
  const int64_t B = 1, H = 32, Hkv = 4, D = 64, cap = 2048;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  at::NoGradGuard no_grad;
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
