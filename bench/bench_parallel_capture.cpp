// Cost of capturing all 12 MLPs of a GPT-2-small-shaped model at tp=2 vs the
// same forward without hooks.
//
//   mpirun --allow-run-as-root --oversubscribe -np 2 ./bench_parallel_capture [seq] [rounds]
//
// Both ranks build the same random GPT-2 small (12 x 768, 12 heads, vocab
// 50257; seed 0) and slice it over a tp=2 mesh. Variants, interleaved
// (A B C D A B C D ...), median ms per forward of a 1 x seq batch:
//   plain      the parallel model called directly (no FlexModel)
//   no hooks   through FlexModel with every hook disabled (the per-forward
//              hook-consistency check still runs)
//   12 MLPs    FlexModel capturing transformer.h.*.mlp (replicated after the
//              row-parallel all-reduce: rank 0 copies, no gather)
//   12 c_fc    FlexModel capturing transformer.h.*.mlp.c_fc (column shards:
//              each capture is an all-gather of [1, seq, 3072] over tp)
// Every variant starts with a barrier, so rank 0 times from a common start.
// Without mpirun it runs on one rank (tp=1).
#include <flex/flexcore/flex_model.h>
#include <flex/models/auto_model.h>
#include <flex/models/parallel_lm.h>
#include <flex/parallel/communicator.h>

#include <ATen/ATen.h>

#include <cstdio>
#include <cstdlib>

#include "bench_util.h"

int main(int argc, char** argv) {
  const int64_t seq = argc > 1 ? std::atoi(argv[1]) : 128;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 7;
  auto world = flex::make_world_communicator();
  flex::DeviceMesh mesh(world, world->size(), 1, 1);
  const std::string config =
      "{\"model_type\": \"gpt2\", \"vocab_size\": 50257, \"n_embd\": 768, \"n_layer\": 12, \"n_head\": 12,"
      " \"n_positions\": 1024, \"activation_function\": \"gelu_new\", \"layer_norm_epsilon\": 1e-05}";
  flex::ModelConfig cfg = flex::parse_config(nlohmann::json::parse(config), "bench config");
  std::shared_ptr<flex::ParallelCausalLM> lm;
  {
    at::manual_seed(0);
    auto whole = flex::build_causal_lm(cfg);
    lm = flex::parallelize(*whole, mesh);
  }
  at::Tensor ids = at::randint(0, cfg.vocab_size, {1, seq}, at::kLong);
  world->broadcast(ids, 0);

  flex::FlexModel fm(lm);
  fm.set_mesh(mesh, lm->layout());
  const std::regex mlp_re("transformer\\.h\\.[0-9]+\\.mlp"), fc_re("transformer\\.h\\.[0-9]+\\.mlp\\.c_fc");
  fm.create_hook_group("mlps", mlp_re);
  fm.create_hook_group("c_fc", fc_re);

  at::NoGradGuard no_grad;
  auto t = bench::interleaved(
      {[&] {
         world->barrier();
         lm->logits(ids);
       },
       [&] {
         world->barrier();
         fm.forward(ids, {"mlps", "c_fc"}, /*complement=*/true);
       },
       [&] {
         world->barrier();
         fm.forward(ids, {"mlps"});
         fm.clear();
       },
       [&] {
         world->barrier();
         fm.forward(ids, {"c_fc"});
         fm.clear();
       },
       [&] {  // plain again: position in the round shows up as a difference from t[0]
         world->barrier();
         lm->logits(ids);
       }},
      rounds, 1);
  if (world->rank() == 0) {
    std::printf("GPT-2 small, tp=%d, batch 1 x %lld, median of %d interleaved rounds\n", world->size(),
                static_cast<long long>(seq), rounds);
    std::printf("  plain forward        %8.2f ms\n", t[0]);
    std::printf("  FlexModel, no hooks  %8.2f ms  (%+.1f%% vs plain)\n", t[1], 100.0 * (t[1] / t[0] - 1));
    std::printf("  capture 12 MLPs      %8.2f ms  (%+.1f%% vs no hooks)\n", t[2], 100.0 * (t[2] / t[1] - 1));
    std::printf("  capture 12 c_fc      %8.2f ms  (%+.1f%% vs no hooks)\n", t[3], 100.0 * (t[3] / t[1] - 1));
    std::printf("  plain forward again  %8.2f ms  (%+.1f%%; noise between identical variants)\n", t[4],
                100.0 * (t[4] / t[0] - 1));
  }
  return 0;
}
