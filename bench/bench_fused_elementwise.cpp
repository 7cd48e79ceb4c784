// The fused decode-step kernels (docs/design.md decision 57) against the
// libtorch op chains they replace, at TinyLlama-1.1B's decode shapes:
// RMSNorm of [1, 1, 2048] (Scale::Weight), the rotation of q [1, 32, 1, 64]
// and k [1, 4, 1, 64] (views with heads and time swapped, as attention makes
// them), silu(gate) * up of [1, 1, 5632]; float32 and bf16. Microseconds per
// call, medians of interleaved rounds (ops, fused, ops, ...), on the calling
// thread (one row never leaves it). ATEN_CPU_CAPABILITY=avx2 FLEX_CPU_ISA=avx2
// compares the AVX2 builds of both.
//
//   ./bench_fused_elementwise [--rounds N]
#include <flex/kernels/fused_elementwise.h>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace {

double micros_per_call(const std::function<at::Tensor()>& f, int calls) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) f();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / calls;
}

void row(const char* name, const std::function<at::Tensor()>& ops, const std::function<at::Tensor()>& fused,
         int rounds) {
  std::vector<double> a, b;
  for (int i = 0; i < 3; ++i) ops(), fused();  // warm the allocator and caches
  for (int r = 0; r < rounds; ++r) {
    a.push_back(micros_per_call(ops, 200));
    b.push_back(micros_per_call(fused, 200));
  }
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  const double ma = a[a.size() / 2], mb = b[b.size() / 2];
  std::printf("%-28s ops %7.2f us   fused %6.2f us   %5.1fx\n", name, ma, mb, ma / mb);
}

at::Tensor rms_ops(const at::Tensor& x, const at::Tensor& w, double eps) {
  at::Tensor h = x.to(at::kFloat);
  const at::Tensor inv = at::rsqrt(h.pow(2).mean(-1, true) + eps);
  return w * (h * inv).to(x.scalar_type());
}

at::Tensor rotary_ops(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t h = x.size(-1) / 2;
  const at::Tensor c = cos.unsqueeze(1), s = sin.unsqueeze(1);
  return x * c + at::cat({-x.narrow(-1, h, h), x.narrow(-1, 0, h)}, -1) * s;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 15;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--rounds") rounds = std::max(1, std::stoi(argv[i + 1]));
  c10::NoGradGuard no_grad;  // the kernels take no graph to record
  at::manual_seed(0);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    const std::string t = dtype == at::kFloat ? "f32" : "bf16";
    const at::Tensor x = at::randn({1, 1, 2048}).to(dtype), w = at::randn({2048}).to(dtype);
    row(("rms_norm [1,1,2048] " + t).c_str(), [&] { return rms_ops(x, w, 1e-5); },
        [&] { return flex::fused_rms_norm(x, w, 1e-5, flex::RmsNormScale::Weight); }, rounds);
    const at::Tensor ang = at::rand({1, 1, 32});
    const at::Tensor cos = at::cat({ang, ang}, -1).cos().to(dtype), sin = at::cat({ang, ang}, -1).sin().to(dtype);
    for (int64_t heads : {32, 4}) {
      const at::Tensor q = at::randn({1, 1, heads, 64}).to(dtype).transpose(1, 2);
      row(("rotary [1," + std::to_string(heads) + ",1,64] " + t).c_str(), [&] { return rotary_ops(q, cos, sin); },
          [&] { return flex::fused_rotary(q, cos, sin); }, rounds);
    }
    const at::Tensor gu = at::randn({1, 1, 2 * 5632}).to(dtype);
    const at::Tensor gate = gu.narrow(-1, 0, 5632), up = gu.narrow(-1, 5632, 5632);
    if (flex::silu_mul_applies(gate, up))
      row(("silu*up [1,1,5632] " + t).c_str(), [&] { return at::silu(gate) * up; },
          [&] { return flex::silu_mul(gate, up); }, rounds);
    else
      std::printf("silu*up %s: the kernel does not apply at this ISA level\n", t.c_str());
  }
  return 0;
}
