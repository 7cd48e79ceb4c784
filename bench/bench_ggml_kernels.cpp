// GGUF block kernels one by one (ggml_linear): x W^T for a Llama-1B MLP
// weight (5632 x 2048) stored as random blocks of each quantized type, for
// 1 input row (decode) and 128 (prefill), float and Q8 activations, beside
// the bf16 GEMV (dense_linear) as the known-good reader, over enough copies
// (~0.5-1 GB) that every call reads from memory. Interleaved rounds; prints
// ms per call and GB/s of stored bytes read.
//
//
// --per-core instead: what one core can decode, apart from memory speed: a
// 256 x 2048 weight that stays in cache, one thread, each ISA level the CPU
// has above scalar, float and Q8 inputs, the fastest of 300 calls (so a
// shared machine's interruptions drop out), in GB/s of stored bytes; decode
// with T threads reads at most T times that.
//
// --type NAME: only that type (Q8_0, Q4_0, ..., Q6_K). (The prefill column
// is the faithful float tiles; --prefill times the fast bf16 ones beside
// them, design decision 58.)
//
// --quantile TYPE [T]: single calls from memory at T threads, their 10th and
// 50th percentiles (below). --prefill: a 128-row product's parts (below).
//
//   ./bench_ggml_kernels [--iters N] [--threads T] [--type NAME] | --per-core | --quantile TYPE [T] | --prefill
#include "bench_util.h"

#include <flex/kernels/cpu_isa.h>
#include <flex/kernels/ggml_dequant.h>
#include <flex/kernels/ggml_linear.h>
#include <flex/kernels/linear.h>

#include <c10/util/Half.h>

#include <cstring>

namespace {

// Random block bytes with small fp16 scales at the type's fp16 fields.
at::Tensor random_blocks(uint32_t type, int64_t N, int64_t K) {
  const flex::GgmlTypeInfo* t = flex::ggml_type_info(type);
  at::Tensor raw = at::randint(0, 256, {N * flex::ggml_row_bytes(type, K)}, at::kByte);
  std::vector<int> fields = type == 14 ? std::vector<int>{208} : (type == 3 || type == 7 || type == 12 || type == 13) ? std::vector<int>{0, 2} : std::vector<int>{0};
  uint8_t* p = raw.data_ptr<uint8_t>();
  const uint16_t h = c10::Half(0.001f).x;
  for (int64_t b = 0; b < N * K / t->block; ++b)
    for (int f : fields) std::memcpy(p + b * t->block_bytes + f, &h, 2);
  return raw;
}

}  // namespace

int per_core() {
  const int64_t N = 256, K = 2048;
  at::set_num_threads(1);
  at::manual_seed(0);
  const at::Tensor x = at::randn({1, K});
  std::vector<float> y(N);
  std::printf("per core: %ld x %ld weight in cache, 1 thread, fastest of 300 calls, GB/s of stored bytes\n",
              static_cast<long>(N), static_cast<long>(K));
  for (flex::Isa isa : {flex::Isa::Avx512, flex::Isa::Avx2}) {
    if (static_cast<int>(isa) > static_cast<int>(flex::cpu_isa_supported())) continue;
    for (const auto& [name, type] : {std::pair<const char*, uint32_t>{"Q8_0", 8}, {"Q4_0", 2}, {"Q4_1", 3}, {"Q5_0", 6},
                                     {"Q5_1", 7}, {"Q4_K", 12}, {"Q5_K", 13}, {"Q6_K", 14}}) {
      const at::Tensor w = random_blocks(type, N, K);
      double best[2] = {1e30, 1e30};
      for (int rep = 0; rep < 300; ++rep)
        for (int a = 0; a < 2; ++a) {
          const auto t0 = std::chrono::steady_clock::now();
          flex::ggml_gemv(isa, type, w.data_ptr<uint8_t>(), N, K, x.data_ptr<float>(), 1, y.data(), 0, N,
                          a ? flex::GgmlActivations::Q8 : flex::GgmlActivations::Float);
          best[a] = std::min(best[a], std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
      // The Q8 call with no rows: the inputs' quantization alone, taken off
      // for the kernel's own speed.
      double q8_alone = 1e30;
      for (int rep = 0; rep < 300; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        flex::ggml_gemv(isa, type, w.data_ptr<uint8_t>(), N, K, x.data_ptr<float>(), 1, y.data(), 0, 0,
                        flex::GgmlActivations::Q8);
        q8_alone = std::min(q8_alone, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      std::printf("%-6s %-5s float %5.1f GB/s  Q8 %5.1f GB/s (kernel alone %5.1f GB/s, the inputs' quantization %.2f us)\n",
                  isa == flex::Isa::Avx512 ? "avx512" : "avx2", name, w.numel() / best[0] / 1e9,
                  w.numel() / best[1] / 1e9, w.numel() / (best[1] - q8_alone) / 1e9, q8_alone * 1e6);
    }
  }
  return 0;
}

// --quantile TYPE: each call from memory timed alone (a 5632 x 2048 weight,
// copies over 0.8 GB, 2 threads), decode float and Q8, and the 10th / 50th
// percentile of the calls' GB/s: on a shared machine the low percentile is
// the calls that the other load left alone.
int quantile(const std::string& only) {
  const int64_t N = 5632, K = 2048;
  for (const auto& [name, type] : {std::pair<const char*, uint32_t>{"Q8_0", 8}, {"Q4_0", 2}, {"Q4_K", 12}, {"Q6_K", 14}}) {
    if (only != name) continue;
    const int64_t bytes = N * flex::ggml_row_bytes(type, K);
    std::vector<at::Tensor> w;
    for (int64_t c = 0; c < 800000000 / bytes; ++c) w.push_back(random_blocks(type, N, K));
    const at::Tensor x1 = at::randn({1, K});
    std::vector<double> t[2];
    for (int rep = 0; rep < 6; ++rep)
      for (int a = 0; a < 2; ++a)
        for (auto& wc : w) {
          const auto t0 = std::chrono::steady_clock::now();
          flex::ggml_linear(type, wc, N, K, x1, at::Tensor(), a ? flex::GgmlActivations::Q8 : flex::GgmlActivations::Float);
          t[a].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
    for (int a = 0; a < 2; ++a) {
      std::sort(t[a].begin(), t[a].end());
      std::printf("%s %d threads %-5s p10 %.1f GB/s  p50 %.1f GB/s\n", name, at::get_num_threads(), a ? "Q8" : "float",
                  bytes / t[a][t[a].size() / 10] / 1e9, bytes / t[a][t[a].size() / 2] / 1e9);
    }
  }
  return 0;
}

// --prefill: where a prompt's time goes, one thread, a 5632 x 2048 weight
// (in L3), 128 input rows: ggml_linear faithful (float tiles) and fast
// (GgmlActivations::Q8: bfloat16 tiles where the CPU has AVX512_BF16,
// design decision 58), the integer kernel with Q8 inputs (ggml_gemv; decode
// shapes only since decision 50), the F32 weight's dense_linear (what the F32
// file runs), and the dequantization alone. Fastest of 5 calls, ms. Then the
// error of the fast prefill and of the integer (decode) kernel on these
// random inputs: max |y - y64| / max |y64| against the float64 product of
// the dequantized weight.
int prefill_parts() {
  const int64_t N = 5632, K = 2048;
  at::set_num_threads(1);
  at::NoGradGuard ng;
  const at::Tensor x = at::randn({128, K});
  for (const auto& [name, type] : {std::pair<const char*, uint32_t>{"Q8_0", 8}, {"Q4_0", 2}, {"Q4_K", 12}, {"Q6_K", 14}}) {
    const at::Tensor w = random_blocks(type, N, K);
    at::Tensor f = at::empty({N, K}), yq = at::empty({128, N}), yfast;
    std::vector<std::function<void()>> v{
        [&] { flex::ggml_linear(type, w, N, K, x, at::Tensor()); },
        [&] { yfast = flex::ggml_linear(type, w, N, K, x, at::Tensor(), flex::GgmlActivations::Q8); },
        [&] {  // the integer kernel, which ggml_linear keeps for decode shapes
          flex::ggml_gemv(flex::cpu_isa(), type, w.data_ptr<uint8_t>(), N, K, x.data_ptr<float>(), 128,
                          yq.data_ptr<float>(), 0, N, flex::GgmlActivations::Q8);
        },
        [&] { flex::dense_linear(x, f, at::Tensor()); },
        [&] { flex::dequantize_ggml(type, w.data_ptr<uint8_t>(), f.data_ptr<float>(), N * K); },
    };
    double best[5] = {1e30, 1e30, 1e30, 1e30, 1e30};
    for (int rep = 0; rep < 5; ++rep)
      for (size_t a = 0; a < v.size(); ++a) {
        const auto t0 = std::chrono::steady_clock::now();
        v[a]();
        best[a] = std::min(best[a], std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
    const at::Tensor y64 = at::mm(x.to(at::kDouble), f.to(at::kDouble).t());
    const double scale = y64.abs().max().item<double>();
    auto rel = [&](const at::Tensor& y) { return (y.to(at::kDouble) - y64).abs().max().item<double>() / scale; };
    std::printf("%-5s 128 rows, 1 thread: ggml_linear %.1f ms, fast %.1f ms  integer kernel (Q8 inputs) %.1f ms | F32 weight "
                "%.1f ms | dequantize alone %.1f ms | max error / max |y|: fast %.2e, integer kernel %.2e\n",
                name, best[0], best[1], best[2], best[3], best[4], rel(yfast), rel(yq));
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--per-core") return per_core();
  if (argc == 2 && std::string(argv[1]) == "--prefill") return prefill_parts();
  if (argc >= 3 && std::string(argv[1]) == "--quantile") {
    at::set_num_threads(argc >= 4 ? std::atoi(argv[3]) : 2);
    return quantile(argv[2]);
  }
  std::string only;
  std::vector<char*> rest{argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--type" && i + 1 < argc) only = argv[++i];
    else rest.push_back(argv[i]);
  }
  bench::ForwardArgs args;
  args.iters = 3;
  if (!bench::parse_forward_args(static_cast<int>(rest.size()), rest.data(), args)) return 2;
  at::set_num_threads(args.threads);
  const int64_t N = 5632, K = 2048;
  at::manual_seed(0);
  std::printf("ISA %s, %d threads, weight %ld x %ld\n", flex::to_string(flex::cpu_isa()).c_str(), at::get_num_threads(),
              static_cast<long>(N), static_cast<long>(K));
  at::NoGradGuard ng;
  std::vector<at::Tensor> b16;
  for (int c = 0; c < 24; ++c) b16.push_back((at::randn({N, K}) * 0.02).to(at::kBFloat16));
  const std::pair<const char*, uint32_t> types[] = {{"Q8_0", 8}, {"Q4_0", 2}, {"Q4_1", 3}, {"Q5_0", 6},
                                                    {"Q5_1", 7}, {"Q4_K", 12}, {"Q5_K", 13}, {"Q6_K", 14}};
  for (const auto& [name, type] : types) {
    if (!only.empty() && only != name) continue;
    const int64_t bytes = N * flex::ggml_row_bytes(type, K);
    const int64_t copies = std::max<int64_t>(4, 800000000 / bytes);
    std::vector<at::Tensor> w;
    for (int64_t c = 0; c < copies; ++c) w.push_back(random_blocks(type, N, K));
    const at::Tensor x1 = at::randn({1, K}), x128 = at::randn({128, K});
    const at::Tensor xb = x1.to(at::kBFloat16);
    std::vector<std::function<void()>> v{
        [&] { for (auto& t : b16) flex::dense_linear(xb, t, at::Tensor()); },
        [&] { for (auto& t : w) flex::ggml_linear(type, t, N, K, x1, at::Tensor()); },
        [&] { for (auto& t : w) flex::ggml_linear(type, t, N, K, x1, at::Tensor(), flex::GgmlActivations::Q8); },
        [&] { for (int64_t c = 0; c < 4; ++c) flex::ggml_linear(type, w[c], N, K, x128, at::Tensor()); },
    };
    const auto t = bench::interleaved(v, args.iters, 1);
    const double bf = N * K * 2.0 * b16.size() / (t[0] / 1000.0) / 1e9;
    std::printf("%-5s %.3f B/elem  bf16 GEMV %.1f GB/s | decode float %.3f ms (%.1f GB/s)  Q8 %.3f ms (%.1f GB/s) | "
                "prefill 128 rows %.1f ms\n",
                name, static_cast<double>(bytes) / (N * K), bf, t[1] / copies, bytes * copies / (t[1] / 1000.0) / 1e9,
                t[2] / copies, bytes * copies / (t[2] / 1000.0) / 1e9, t[3] / 4);
  }
  return 0;
}
