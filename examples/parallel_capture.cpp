// Data-parallel capture: every rank runs its slice of the batch through a
// FlexModel-hooked model, rank 0 gathers the activations (Communicator::gather)
// and writes them whole. Runs as one process, or under mpirun:
//   mpirun -n 2 parallel_capture [MODEL_DIR] [--work DIR]
// Tensor and pipeline parallel captures (--tp/--pp) need the parallel model
// path, which is not wired into the models yet; this example covers dp.
#include "support/example_util.h"

#include <flex/dispatch/safetensors.h>
#include <flex/flexcore/flex_model.h>
#include <flex/models/auto_model.h>
#include <flex/parallel/communicator.h>

#include <ATen/ATen.h>

#include <cstdio>

int main(int argc, char** argv) {
  try {
    auto opt = flex_examples::parse_options(argc, argv, "parallel_capture [MODEL_DIR] [--work DIR]");
    auto world = flex::make_world_communicator();
    // Rank 0 writes the tiny model (when none is given); the others wait for it.
    std::string dir = opt.model_dir.empty() ? opt.work + "/tiny-gpt2" : opt.model_dir;
    if (world->rank() == 0) dir = flex_examples::model_dir_or_tiny(opt);
    world->barrier();
    auto model = flex::load_pretrained(dir);
    const std::string hook = flex_examples::block_name(*model, 0);

    const int64_t rows = 8, T = 12;
    at::Tensor all = at::arange(rows * T, at::kLong).remainder(model->config().vocab_size).view({rows, T});
    const int64_t per = (rows + world->size() - 1) / world->size();
    const int64_t begin = std::min<int64_t>(rows, per * world->rank()), n = std::min<int64_t>(per, rows - begin);
    flex::FlexModel fm(model);
    fm.register_forward_hook(std::make_shared<flex::HookFunction>(hook));
    at::Tensor local = at::empty({0, T, model->config().hidden_size});
    if (n > 0) {
      at::NoGradGuard ng;
      fm.forward(all.narrow(0, begin, n));
      local = fm.output().at(hook)[0];
    }
    auto parts = world->gather(local.contiguous(), 0);
    if (world->rank() == 0) {
      at::Tensor whole = at::cat(parts, 0);
      const std::string path = opt.work + "/parallel_capture.safetensors";
      flex::save_safetensors(path, {{hook, whole}, {"input_ids", all}});
      std::printf("%d rank(s) (%s): gathered %s %ld x %ld x %ld on rank 0 -> %s\n", world->size(), world->backend(),
                  hook.c_str(), static_cast<long>(whole.size(0)), static_cast<long>(whole.size(1)),
                  static_cast<long>(whole.size(2)), path.c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "parallel_capture: error: %s\n", e.what());
    return 1;
  }
}
