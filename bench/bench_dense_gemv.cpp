// Dense decode GEMV (flex::gemv, one input row) against the speed memory
// delivers the same bytes: for the 1.1B Llama shapes (TinyLlama: q/o
// 2048x2048, k/v 256x2048, gate/up 5632x2048, down 2048x5632, head
// 32000x2048) in float32 and bfloat16, at each thread count, over enough
// copies of the weight (--mb, default 512 MB) that every call reads from
// memory, not cache. Per round, interleaved: flex::gemv over the copies,
// flex::read_once over the same copies (a pure streaming read: the
// ceiling), libtorch's at::linear, and flex::gemv over copies of the
// copies in flex::to_huge_pages storage (huge/4K: the per-round ratio). Prints GB/s of weight bytes (medians
// over rounds) and gemv / read as the median of the per-round ratios, which
// holds still while other processes load the machine. A last row per dtype
// is a decode step's mix: 4 layers of the seven products then the head.
//
//   ./bench_dense_gemv [--rounds R] [--threads 1,2] [--mb MB]
#include "bench_util.h"

#include <flex/kernels/cpu_isa.h>
#include <flex/kernels/huge_pages.h>
#include <flex/kernels/linear.h>
#include <flex/kernels/read_once.h>

#include <sstream>

namespace {

struct Args {
  int rounds = 7;
  std::vector<int> threads{1, 2};
  double mb = 512;
};

bool parse(int argc, char** argv, Args& a) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--rounds") a.rounds = std::max(1, std::atoi(v.c_str()));
    else if (k == "--mb") a.mb = std::max(1.0, std::atof(v.c_str()));
    else if (k == "--threads") {
      a.threads.clear();
      std::stringstream ss(v);
      for (std::string t; std::getline(ss, t, ',');) a.threads.push_back(std::max(1, std::atoi(t.c_str())));
    } else return false;
  }
  return argc % 2 == 1;
}

double seconds(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One row of the table: the weights (each [out, in]) read in order, once per variant per round.
void measure(const std::string& label, const std::vector<at::Tensor>& ws, const Args& a) {
  double bytes = 0;
  for (const auto& w : ws) bytes += static_cast<double>(w.nbytes());
  std::vector<at::Tensor> xs, huge;
  for (const auto& w : ws) xs.push_back(at::randn({1, w.size(1)}).to(w.scalar_type()));
  for (const auto& w : ws) huge.push_back(flex::to_huge_pages(w));
  volatile float sink = 0;
  for (int threads : a.threads) {
    at::set_num_threads(threads);
    const std::vector<std::function<void()>> v{
        [&] { for (size_t i = 0; i < ws.size(); ++i) flex::gemv(xs[i], ws[i], at::Tensor()); },
        [&] { for (const auto& w : ws) sink = sink + flex::read_once(w); },
        [&] { for (size_t i = 0; i < ws.size(); ++i) at::linear(xs[i], ws[i]); },
        [&] { for (size_t i = 0; i < ws.size(); ++i) flex::gemv(xs[i], huge[i], at::Tensor()); },
    };
    std::vector<std::vector<double>> t(v.size());
    std::vector<double> ratio, huge_ratio;
    for (auto& f : v) f();  // warm-up
    for (int r = 0; r < a.rounds; ++r) {
      for (size_t i = 0; i < v.size(); ++i) t[i].push_back(seconds(v[i]));
      ratio.push_back(t[1].back() / t[0].back());
      huge_ratio.push_back(t[0].back() / t[3].back());
    }
    std::printf("| %-26s | %d | %7.1f | %7.1f | %5.2f | %7.1f | %7.1f | %5.2f |\n", label.c_str(), threads,
                bytes / bench::median(t[0]) / 1e9, bytes / bench::median(t[1]) / 1e9, bench::median(ratio),
                bytes / bench::median(t[2]) / 1e9, bytes / bench::median(t[3]) / 1e9, bench::median(huge_ratio));
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!parse(argc, argv, a)) {
    std::fprintf(stderr, "usage: %s [--rounds R] [--threads 1,2] [--mb MB]\n", argv[0]);
    return 2;
  }
  at::NoGradGuard no_grad;
  at::manual_seed(0);
  const std::vector<std::pair<int64_t, int64_t>> shapes{{2048, 2048}, {256, 2048}, {5632, 2048}, {2048, 5632}, {32000, 2048}};
  std::printf("ISA %s; GB/s of weight bytes, medians of %d interleaved rounds; read = flex::read_once over the same bytes\n",
              flex::to_string(flex::cpu_isa()).c_str(), a.rounds);
  std::printf("| weight (x1 row)            | threads | gemv GB/s | read GB/s | gemv/read | at::linear GB/s | gemv, 2 MB pages | huge/4K |\n|---|---|---|---|---|---|---|---|\n");
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const std::string name = dtype == at::kFloat ? "f32" : "bf16";
    for (auto [out, in] : shapes) {
      const at::Tensor w = (at::randn({out, in}) * 0.02).to(dtype);
      const int64_t copies = std::max<int64_t>(2, static_cast<int64_t>(a.mb * 1e6 / w.nbytes() + 0.5));
      std::vector<at::Tensor> ws;
      for (int64_t c = 0; c < copies; ++c) ws.push_back(w.clone());
      measure(name + " " + std::to_string(out) + "x" + std::to_string(in) + " (" + std::to_string(copies) + " copies)", ws, a);
    }
    std::vector<at::Tensor> step;  // 4 layers of q, k, v, o, gate, up, down; then the head
    for (int l = 0; l < 4; ++l)
      for (auto [out, in] : std::vector<std::pair<int64_t, int64_t>>{
               {2048, 2048}, {256, 2048}, {256, 2048}, {2048, 2048}, {5632, 2048}, {5632, 2048}, {2048, 5632}})
        step.push_back((at::randn({out, in}) * 0.02).to(dtype));
    step.push_back((at::randn({32000, 2048}) * 0.02).to(dtype));
    measure(name + " decode mix (4 layers+head)", step, a);
  }
  return 0;
}
