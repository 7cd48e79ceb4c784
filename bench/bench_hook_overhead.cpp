// Cost of the hookable call path: a 24-block MLP stack built from
// flex::Modules vs. the same ops in plain libtorch modules vs. the flex stack
// with a no-op ModelHook and a no-op forward hook on every block.
// Variants are interleaved (A B C A B C ...) and medians reported, because
// wall time on shared 2-core machines drifts by ~10% between runs.
//
//   OMP_WAIT_POLICY=PASSIVE ./bench_hook_overhead [rounds]
//   ./bench_hook_overhead --only plain|flex|hooks BATCH ITERS
//       runs one variant only, for instruction counts under
//       valgrind --tool=callgrind (repeatable, unlike wall time).
#include <flex/hooks/nn.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int kBlocks = 24;
constexpr int64_t kWidth = 512, kHidden = 2048;

struct FlexBlock : flex::Module {
  std::shared_ptr<flex::Linear> fc, proj;
  std::shared_ptr<flex::Activation> act;
  FlexBlock() : Module("MLPBlock") {
    fc = add("fc", std::make_shared<flex::Linear>(kWidth, kHidden));
    act = add("act", std::make_shared<flex::Activation>("gelu"));
    proj = add("proj", std::make_shared<flex::Linear>(kHidden, kWidth));
  }
  flex::Value forward(flex::Inputs in) override {
    const at::Tensor& x = in.tensor(0);
    return x + (*proj)((*act)((*fc)(x)));
  }
};

struct FlexStack : flex::Module {
  std::shared_ptr<flex::ModuleList> blocks;
  FlexStack() : Module("Stack") {
    blocks = add("blocks", std::make_shared<flex::ModuleList>());
    for (int i = 0; i < kBlocks; ++i) blocks->push_back(std::make_shared<FlexBlock>());
  }
  flex::Value forward(flex::Inputs in) override {
    at::Tensor x = in.tensor(0);
    for (const auto& b : blocks->items()) x = (*b)(x);
    return x;
  }
};

struct PlainBlockImpl : torch::nn::Module {
  torch::nn::Linear fc{nullptr}, proj{nullptr};
  torch::nn::GELU act{nullptr};
  PlainBlockImpl() {
    fc = register_module("fc", torch::nn::Linear(kWidth, kHidden));
    act = register_module("act", torch::nn::GELU());
    proj = register_module("proj", torch::nn::Linear(kHidden, kWidth));
  }
  at::Tensor forward(const at::Tensor& x) { return x + proj->forward(act->forward(fc->forward(x))); }
};

struct PlainStack : torch::nn::Module {
  std::vector<std::shared_ptr<PlainBlockImpl>> blocks;
  PlainStack() {
    for (int i = 0; i < kBlocks; ++i)
      blocks.push_back(register_module("b" + std::to_string(i), std::make_shared<PlainBlockImpl>()));
  }
  at::Tensor forward(at::Tensor x) {
    for (auto& b : blocks) x = b->forward(x);
    return x;
  }
};

template <typename F>
double time_ms(F&& f, int iters) {
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const bool only = argc > 1 && std::strcmp(argv[1], "--only") == 0;
  const int rounds = (argc > 1 && !only) ? std::atoi(argv[1]) : 15;
  at::set_num_threads(only ? 1 : 2);
  at::NoGradGuard no_grad;
  at::manual_seed(0);
  const std::string which = only && argc > 2 ? argv[2] : "all";
  // With --only, build just the variant measured so instruction counts are not
  // dominated by the random initialisation of the others.
  auto flex_stack = which == "all" || which == "flex" ? std::make_shared<FlexStack>() : nullptr;
  auto hooked = which == "all" || which == "hooks" ? std::make_shared<FlexStack>() : nullptr;
  auto plain = which == "all" || which == "plain" ? std::make_shared<PlainStack>() : nullptr;
  if (hooked) {
    for (auto& nm : hooked->blocks->named_flex_children()) {
      flex::add_hook_to_module(*nm.second, std::make_shared<flex::ModelHook>());
      nm.second->register_forward_hook([](flex::Module&, const flex::Inputs&, flex::Value&) {});
    }
  }
  if (only) {
    at::Tensor x = at::randn({argc > 3 ? std::atoll(argv[3]) : 1, kWidth});
    const int iters = argc > 4 ? std::atoi(argv[4]) : 10;
    for (int i = 0; i < iters; ++i) {
      if (plain) plain->forward(x);
      else if (hooked) (*hooked)(x);
      else (*flex_stack)(x);
    }
    return 0;
  }
  std::printf("24-block MLP stack (%lld -> %lld -> %lld), %d interleaved rounds, median ms per forward\n",
              (long long)kWidth, (long long)kHidden, (long long)kWidth, rounds);
  std::printf("%-6s %10s %10s %10s %12s %12s\n", "batch", "plain", "flex", "flex+hooks", "flex/plain",
              "hooks/plain");
  for (int64_t batch : {1, 64}) {
    at::Tensor x = at::randn({batch, kWidth});
    const int iters = batch == 1 ? 40 : 8;
    std::vector<double> tp, tf, th;
    for (int w = 0; w < 3; ++w) {  // warm-up
      plain->forward(x);
      (*flex_stack)(x);
      (*hooked)(x);
    }
    for (int r = 0; r < rounds; ++r) {
      tp.push_back(time_ms([&] { plain->forward(x); }, iters));
      tf.push_back(time_ms([&] { (*flex_stack)(x); }, iters));
      th.push_back(time_ms([&] { (*hooked)(x); }, iters));
    }
    double p = median(tp), f = median(tf), h = median(th);
    std::printf("%-6lld %10.3f %10.3f %10.3f %12.3f %12.3f\n", (long long)batch, p, f, h, f / p, h / p);
  }
  return 0;
}
