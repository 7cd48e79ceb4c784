// The CPU kernels one by one: x W^T for a Llama-1B MLP weight (5632 x 2048)
// in fp32 / bf16 (libtorch's GEMM), bf16 (dense_linear: our GEMV for
// decode rows), int8 (int8_linear) and nf4
// (four_bit_linear), for 1 input row (decode) and 128 (prefill), over
// enough copies of the weight (~1.5 GB of fp32) that every call reads from
// memory; and the quantizers' speed (GB of bf16 input per second). Prints
// ms per call and the GB/s of stored weight bytes read.
//
//   ./bench_quant_kernels [--iters N] [--threads T]
#include "bench_util.h"

#include <flex/kernels/cpu_isa.h>
#include <flex/kernels/linear.h>
#include <flex/quant/quantize.h>

int main(int argc, char** argv) {
  bench::ForwardArgs args;
  args.iters = 3;
  if (!bench::parse_forward_args(argc, argv, args)) return 2;
  const int64_t N = 5632, K = 2048, copies = 32;
  at::manual_seed(0);
  std::vector<at::Tensor> f32, b16;
  std::vector<flex::Int8Weight> i8;
  std::vector<flex::FourBitWeight> n4;
  double quant_s_int8 = 0, quant_s_nf4 = 0;
  for (int64_t c = 0; c < copies; ++c) {
    f32.push_back(at::randn({N, K}) * 0.02);
    b16.push_back(f32.back().to(at::kBFloat16));
    auto t0 = std::chrono::steady_clock::now();
    i8.push_back(flex::quantize_int8_rowwise(b16.back()));
    auto t1 = std::chrono::steady_clock::now();
    n4.push_back(flex::quantize_4bit(b16.back(), flex::FourBitType::NF4, true));
    auto t2 = std::chrono::steady_clock::now();
    quant_s_int8 += std::chrono::duration<double>(t1 - t0).count();
    quant_s_nf4 += std::chrono::duration<double>(t2 - t1).count();
  }
  const double in_gb = copies * N * K * 2 / 1e9;
  std::printf("ISA %s, %d threads; quantize (bf16 input): int8 %.2f GB/s, nf4 double-quant %.2f GB/s\n",
              flex::to_string(flex::cpu_isa()).c_str(), at::get_num_threads(), in_gb / quant_s_int8, in_gb / quant_s_nf4);
  at::NoGradGuard ng;
  for (int64_t rows : {1, 128}) {
    const at::Tensor x = at::randn({rows, K});
    const at::Tensor xb = x.to(at::kBFloat16);
    std::vector<std::function<void()>> v{
        [&] { for (auto& w : f32) at::linear(x, w); },
        [&] { for (auto& w : b16) at::linear(xb, w); },
        [&] { for (auto& w : b16) flex::dense_linear(xb, w, at::Tensor()); },
        [&] { for (auto& w : i8) flex::int8_linear(xb, w.cb, w.scb, at::Tensor(), 6.0); },
        [&] { for (auto& w : n4) flex::four_bit_linear(w, xb, at::Tensor(), at::kBFloat16); },
    };
    const auto t = bench::interleaved(v, args.iters, 1);
    const double bytes[5] = {N * K * 4.0, N * K * 2.0, N * K * 2.0, N * K * 1.0 + N * 4.0,
                             N * K * 0.5 + N * K / 64.0 + N * K / 64 / 256 * 4.0};
    const char* names[5] = {"fp32", "bf16 (at::linear)", "bf16 (dense_linear)", "int8", "nf4"};
    std::printf("rows %3ld:", static_cast<long>(rows));
    for (int i = 0; i < 5; ++i)
      std::printf("  %s %.3f ms (%.1f GB/s)", names[i], t[i] / copies, bytes[i] * copies / (t[i] / 1000.0) / 1e9);
    std::printf("\n");
  }
  return 0;
}
