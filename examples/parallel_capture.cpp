// Tensor-, pipeline- and data-parallel capture. Every rank loads only its
// slices of the checkpoint; FlexModel's parallel router brings each hooked
// activation whole to rank 0 (tensor-parallel shards concatenated, fused QKV
// blocks in order, row-parallel partial sums reduced, later pipeline stages
// forwarded, data-parallel rows concatenated); rank 0 writes them and checks
// them against the same model run in one process.
//   mpirun -n 4 parallel_capture [MODEL_DIR] [--tp 2] [--pp 2] [--dp 1] [--work DIR]
// Unset sizes: tp = number of ranks / (pp * dp). Also runs as one process.
#include "support/example_util.h"

#include <flex/dispatch/safetensors.h>
#include <flex/flexcore/flex_model.h>
#include <flex/models/architecture.h>
#include <flex/models/auto_model.h>
#include <flex/models/parallel_lm.h>
#include <flex/parallel/communicator.h>

#include <ATen/ATen.h>

#include <cstdio>
#include <stdexcept>

namespace {

int size_flag(const flex_examples::Options& o, const std::string& flag, int fallback) {
  auto it = o.extra.find(flag);
  return it == o.extra.end() ? fallback : std::stoi(it->second);
}

/// Runs `model` with a capturing hook on each of `hooks`; the captures (on rank 0).
std::map<std::string, at::Tensor> capture(flex::FlexModel& fm, const std::vector<std::string>& hooks, const at::Tensor& ids) {
  for (const auto& h : hooks) fm.register_forward_hook(std::make_shared<flex::HookFunction>(h));
  at::NoGradGuard ng;
  fm.forward(ids);
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, list] : fm.output()) out[name] = list.at(0);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto opt = flex_examples::parse_options(argc, argv, "parallel_capture [MODEL_DIR] [--tp N] [--pp N] [--dp N] [--work DIR]");
    auto world = flex::make_world_communicator();  // MPI under mpirun, else one local rank
    const int pp = size_flag(opt, "--pp", 1), dp = size_flag(opt, "--dp", 1);
    const int tp = size_flag(opt, "--tp", world->size() / std::max(1, pp * dp));
    // Rank 0 writes the tiny model (when none is given); the others wait for it.
    std::string dir = opt.model_dir.empty() ? opt.work + "/tiny-gpt2" : opt.model_dir;
    if (world->rank() == 0) dir = flex_examples::model_dir_or_tiny(opt);
    world->barrier();

    flex::DeviceMesh mesh(world, tp, pp, dp);  // ConfigError unless tp*pp*dp == ranks
    auto model = flex::load_parallel_pretrained(dir, mesh);
    const auto& cfg = model->config();
    const flex::Architecture& arch = flex::architecture(cfg);
    const std::string block0 = flex::block_name(arch, 0), last = flex::block_name(arch, cfg.num_hidden_layers - 1);
    // GPT-2's MLP hooked at its output projection, the others' whole MLP.
    const std::string mlp = block0 + (arch.family == flex::ArchFamily::GPT2 ? ".mlp.c_proj" : ".mlp");
    const std::vector<std::string> hooks = {block0, mlp, last, arch.names.head};
    const int64_t rows = 8, T = 12;
    at::Tensor ids = at::arange(rows * T, at::kLong).remainder(cfg.vocab_size).view({rows, T});

    flex::FlexModel fm(model);
    fm.set_mesh(mesh, model->layout());
    auto parallel = capture(fm, hooks, ids);
    if (world->rank() != 0) return 0;

    // The same forward in one process, unsharded.
    auto whole = flex::load_pretrained(dir);
    flex::FlexModel single(whole);
    auto reference = capture(single, hooks, ids);
    double worst = 0;
    std::vector<std::pair<std::string, at::Tensor>> tensors = {{"input_ids", ids}};
    for (const auto& h : hooks) {
      const at::Tensor& a = parallel.at(h);
      if (a.sizes() != reference.at(h).sizes()) throw std::runtime_error(h + ": gathered shape differs from the single-process one");
      worst = std::max(worst, (a - reference.at(h)).abs().max().item<double>());
      tensors.emplace_back(h, a);
    }
    const std::string path = opt.work + "/parallel_capture.safetensors";
    flex::save_safetensors(path, tensors);
    const at::Tensor& b0 = parallel.at(block0);
    std::printf("%d rank(s) (%s, %s): gathered %s %ld x %ld x %ld and %zu more on rank 0 -> %s\n", world->size(),
                world->backend(), mesh.describe().c_str(), block0.c_str(), static_cast<long>(b0.size(0)),
                static_cast<long>(b0.size(1)), static_cast<long>(b0.size(2)), hooks.size() - 1, path.c_str());
    if (worst > 1e-4) throw std::runtime_error("parallel captures differ from the single-process run by " + std::to_string(worst));
    std::printf("same as the single-process run: max |difference| %.2g\n", worst);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "parallel_capture: error: %s\n", e.what());
    return 1;
  }
}
