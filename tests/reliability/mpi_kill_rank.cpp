// Distributed fault: one rank dies by SIGKILL in the middle of a forward pass
// (inside a FlexModel hook, between two all_reduce "layers"); the surviving
// ranks, blocked in the next collective, must exit with an error within 30 s
// (checked by tests/parallel/run_fault.sh). Plain main, run under mpirun.
#include <flex/flexcore/flex_model.h>
#include <flex/parallel/communicator.h>

#include <ATen/ATen.h>

#include <csignal>
#include <cstdio>
#include <string>

namespace {

// One "layer": a local op followed by an all_reduce, as a row-parallel linear does.
struct ReduceLayer : flex::Module {
  std::shared_ptr<flex::Communicator> comm;
  explicit ReduceLayer(std::shared_ptr<flex::Communicator> c) : Module("ReduceLayer"), comm(std::move(c)) {}
  flex::Value forward(flex::Inputs in) override {
    at::Tensor t = in.tensor(0) * 0.5 + 1.0;
    comm->all_reduce(t);
    return t;
  }
};

struct Stack : flex::Module {
  std::vector<std::shared_ptr<ReduceLayer>> layers;
  explicit Stack(const std::shared_ptr<flex::Communicator>& c) : Module("Stack") {
    for (int i = 0; i < 6; ++i) layers.push_back(add("layer" + std::to_string(i), std::make_shared<ReduceLayer>(c)));
  }
  flex::Value forward(flex::Inputs in) override {
    at::Tensor x = in.tensor(0);
    for (auto& l : layers) x = (*l)(x);
    return x;
  }
};

}  // namespace

int main() {
  auto w = flex::make_world_communicator();
  const int r = w->rank(), n = w->size();
  auto model = std::make_shared<Stack>(w);
  flex::FlexModel fm(model);
  fm.register_forward_hook(std::make_shared<flex::HookFunction>("layer1"));
  flex::HookFunctionOptions o;
  o.save = false;
  int forwards = 0;
  o.editing_function = [&](flex::Module&, const at::Tensor& t, flex::SaveContext&, flex::TrainableModules&) {
    if (r == 1 && forwards == 2) std::raise(SIGKILL);  // mid-forward, third batch
    return t;
  };
  fm.register_forward_hook(std::make_shared<flex::HookFunction>("layer2", o));
  at::NoGradGuard ng;
  for (; forwards < 5; ++forwards) fm.forward(at::ones({4, 8}));
  std::printf("rank %d of %d finished normally\n", r, n);
  return 0;
}
