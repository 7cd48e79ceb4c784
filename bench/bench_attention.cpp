// Attention with and without a hook on the probabilities (docs/design.md
// decision 14): a Llama-shaped model (4 layers, 512 wide, 8 query heads over 4
// key/value heads of 64, vocab 4096, random weights) run on one sequence of T
// tokens, unhooked (at::scaled_dot_product_attention) and with an identity
// hook on every hook_attn_probs (the [1, 8, T, T] probabilities materialized,
// as Transformers' eager attention does). Latency: medians, the two
// interleaved. Peak memory: each variant's forward in a fresh process (VmHWM
// minus the resident size before it). About a minute on 2 cores with libtorch
// 2.13: at T=4096 unhooked 781 ms and 187 MiB, hooked 3305 ms and 1157 MiB
// (the probabilities alone are 512 MiB).
//
//   OMP_WAIT_POLICY=PASSIVE ./bench_attention [--iters N] [--threads T]
#include "bench_util.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

const char* kConfig = R"({"model_type": "llama", "vocab_size": 4096, "hidden_size": 512, "num_hidden_layers": 4,
  "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64, "intermediate_size": 1376,
  "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "hidden_act": "silu", "torch_dtype": "float32"})";

std::vector<flex::HookHandle> hook_all_probs(flex::CausalLM& model) {
  std::vector<flex::HookHandle> hs;
  for (auto& [name, m] : model.named_flex_modules())
    if (name.size() >= 15 && name.compare(name.size() - 15, 15, "hook_attn_probs") == 0)
      hs.push_back(m->register_forward_hook([](flex::Module&, const flex::Inputs&, flex::Value&) {}));
  return hs;
}

at::Tensor ids_of(int64_t t) {
  at::manual_seed(1);
  return at::randint(0, 4096, {1, t}, at::kLong);
}

// Child: one forward of T tokens; prints the growth of the peak resident size in kB.
int memory_child(const std::string& dir, int64_t t, bool hooked) {
  auto model = flex::load_pretrained(dir, at::kFloat);
  auto hs = hooked ? hook_all_probs(*model) : std::vector<flex::HookHandle>{};
  const at::Tensor ids = ids_of(t);
  at::NoGradGuard g;
  model->logits(ids_of(8));  // thread pools and lazy state, before the baseline
  const long before = bench::status_kb("VmRSS");
  model->logits(ids);
  std::printf("%ld\n", bench::status_kb("VmHWM") - before);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::string(argv[1]) == "--memory-child")
    return memory_child(argv[2], std::atoll(argv[3]), std::string(argv[4]) == "hooked");
  bench::ForwardArgs args;
  args.iters = 1;  // a 4096-token forward takes seconds on 2 cores
  if (!bench::parse_forward_args(argc, argv, args)) return 2;
  const auto dir = bench::temp_dir("attention");
  int rc = 0;
  try {
    bench::write_random_model(dir, kConfig);
    auto model = flex::load_pretrained(dir.string(), at::kFloat);
    std::printf("bench_attention: Llama-shaped, 4 layers, 8 heads of 64, %d thread(s), median of 3 rounds x %d\n",
                args.threads, args.iters);
    std::printf("%6s %14s %14s %8s %16s %16s %14s\n", "T", "unhooked ms", "hooked ms", "ratio", "unhooked peak MiB",
                "hooked peak MiB", "probs MiB");
    for (int64_t t : {1024, 4096}) {
      const at::Tensor ids = ids_of(t);
      std::vector<flex::HookHandle> hs;
      auto plain = [&] {
        at::NoGradGuard g;
        model->logits(ids);
      };
      auto hooked = [&] {
        hs = hook_all_probs(*model);
        at::NoGradGuard g;
        model->logits(ids);
        for (auto& h : hs) h.remove();
      };
      const auto times = bench::interleaved({plain, hooked}, 3, args.iters);
      auto peak = [&](const char* variant) {
        const std::string kb = bench::run_child({"--memory-child", dir.string(), std::to_string(t), variant});
        return std::atof(kb.c_str()) / 1024.0;
      };
      const double probs_mib = 8.0 * t * t * 4 / (1 << 20);
      std::printf("%6lld %14.1f %14.1f %8.2f %16.0f %16.0f %14.0f\n", static_cast<long long>(t), times[0], times[1],
                  times[1] / times[0], peak("plain"), peak("hooked"), probs_mib);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_attention: %s\n", e.what());
    rc = 1;
  }
  std::filesystem::remove_all(dir);
  return rc;
}
