// FlexModel capture cost: a GPT-2-small-shaped model with capture hooks on
// all 12 MLPs vs. no hooks at batch 1 x 128 on CPU (target ratio <= 1.02);
// capture of every named module (162) at 8 x 128 vs. no hooks (target
// <= 1.10); and StreamingSink throughput vs. a plain sequential write of the
// same bytes.
//
//   OMP_WAIT_POLICY=PASSIVE ./bench_capture [--rounds N]
#include "bench_util.h"

#include <flex/dispatch/atomic_file.h>
#include <flex/flexcore/flex_model.h>
#include <flex/flexcore/streaming_sink.h>

#include <ATen/Parallel.h>

#include <cstring>
#include <fcntl.h>
#include <unistd.h>

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  int rounds = 9;
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(argv[i + 1]);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines appear even if the run is cut short
  at::set_num_threads(2);
  const fs::path dir = bench::temp_dir("capture");
  bench::write_gpt2(dir / "model", 12, 768, 12, 50257);
  auto plain = flex::load_pretrained((dir / "model").string(), at::kFloat);
  auto hooked_model = flex::load_pretrained((dir / "model").string(), at::kFloat);
  flex::FlexModel fm(hooked_model);
  for (int i = 0; i < 12; ++i)
    fm.register_forward_hook(std::make_shared<flex::HookFunction>("transformer.h." + std::to_string(i) + ".mlp"));
  at::Tensor ids = at::randint(0, 50257, {1, 128}, at::kLong);
  at::NoGradGuard ng;
  flex::Inputs in{flex::Value(ids)};
  auto t = bench::interleaved({[&] { (*plain)(flex::Inputs{flex::Value(ids)}); },
                               [&] {
                                 fm.forward(flex::Inputs{flex::Value(ids)});
                                 fm.clear();
                               }},
                              rounds, 3);
  std::printf("capture on all 12 MLPs, GPT-2 small shape, 1 x 128, %d threads, medians of %d rounds\n",
              at::get_num_threads(), rounds);
  std::printf("  no hooks %.1f ms, capturing %.1f ms, ratio %.3f (target <= 1.02)\n", t[0], t[1], t[1] / t[0]);

  // Every named module (what `--hook all` selects) at 8 x 128.
  {
    auto every_model = flex::load_pretrained((dir / "model").string(), at::kFloat);
    flex::FlexModel every(every_model);
    int hooks = 0;
    for (const auto& nm : every_model->named_flex_modules()) {
      if (nm.first.empty() || nm.first.find("hook_") != std::string::npos) continue;
      every.register_forward_hook(std::make_shared<flex::HookFunction>(nm.first));
      ++hooks;
    }
    at::Tensor ids8 = at::randint(0, 50257, {8, 128}, at::kLong);
    auto e = bench::interleaved({[&] { (*plain)(flex::Inputs{flex::Value(ids8)}); },
                                 [&] {
                                   every.forward(flex::Inputs{flex::Value(ids8)});
                                   every.clear();
                                 }},
                                std::max(3, rounds / 2), 1);
    std::printf("capture of every named module (%d hooks), GPT-2 small shape, 8 x 128, medians of %d rounds\n", hooks,
                std::max(3, rounds / 2));
    std::printf("  no hooks %.1f ms, capturing %.1f ms, ratio %.3f (target <= 1.10)\n", e[0], e[1], e[1] / e[0]);
  }

  // Streaming sink: 64 forwards x 12 captures of [8, 128, 768] f32 (3 MB each): 2.4 GB.
  const int forwards = 64;
  at::Tensor act = at::randn({8, 128, 768});
  const double bytes = double(forwards) * 12 * act.numel() * 4;
  auto t0 = std::chrono::steady_clock::now();
  {
    flex::StreamingSink sink((dir / "stream").string(), flex::StreamingSinkOptions{256ull << 20, false});
    for (int f = 0; f < forwards; ++f) {
      for (int m = 0; m < 12; ++m) sink.write("transformer.h." + std::to_string(m) + ".mlp", f, act);
      sink.end_forward(f);
    }
  }
  const double sink_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  t0 = std::chrono::steady_clock::now();
  {
    int fd = ::open((dir / "plain.bin").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const char* p = static_cast<const char*>(act.data_ptr());
    const size_t n = act.numel() * 4;
    for (int i = 0; i < forwards * 12; ++i)
      if (::write(fd, p, n) != static_cast<ssize_t>(n)) break;
    ::fsync(fd);
    ::close(fd);
  }
  const double plain_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("streaming sink: %.0f MB in %.2f s = %.0f MB/s; plain sequential write + fsync %.2f s = %.0f MB/s "
              "(ratio %.2f)\n",
              bytes / 1e6, sink_s, bytes / 1e6 / sink_s, plain_s, bytes / 1e6 / plain_s, plain_s / sink_s);
  fs::remove_all(dir);
  return 0;
}
