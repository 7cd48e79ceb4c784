// Run under mpirun with FLEX_MESH="tp,pp,dp": training a trainable module
// (a probe applied by editing functions on both MLP outputs of the fixture
// GPT-2) over the mesh gives, on every rank, the parameters of the same
// training in a single process, and the same parameters on every rank.
// Misuse is reported: a rank-local loss, trainable modules that differ
// between ranks, gradient hooks, and a loss on the logits through an edit.
#include <flex/dispatch/safetensors.h>
#include <flex/flexcore/flex_model.h>
#include <flex/hooks/errors.h>
#include <flex/models/auto_model.h>
#include <flex/models/parallel_lm.h>
#include <flex/parallel/communicator.h>
#include <flex/parallel/device_mesh.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <cstdio>
#include <cstdlib>
#include <functional>

#include "mesh_env.h"
#include "test_util.h"

namespace {

using parallel2_test::mesh;
using parallel2_test::mesh_shape;

// Three rows: with dp=2 the ranks run 2 and 1, so the gathered rows are uneven.
at::Tensor inputs() {
  at::Tensor ids =
      parallel2_test::golden_input_ids();
  return at::cat({ids, ids.narrow(0, 0, 1).flip(1)}, 0);
}

std::string gpt2_dir() { return flex_test::fixture("models/gpt2"); }

constexpr int64_t kHidden = 64;  // the fixture's n_embd
const std::vector<std::string> kHooks{"transformer.h.0.mlp", "transformer.h.1.mlp"};

// A linear map with a buffer, so both parameters and buffers must agree.
struct ProbeImpl : torch::nn::Module {
  ProbeImpl(uint64_t seed, double scale_value) {
    torch::manual_seed(seed);
    lin = register_module("lin", torch::nn::Linear(kHidden, kHidden));
    scale = register_buffer("scale", at::full({kHidden}, scale_value));
  }
  at::Tensor forward(const at::Tensor& x) { return lin(x) * scale; }
  torch::nn::Linear lin{nullptr};
  at::Tensor scale;
};

// The single-process probe's initial state; the mesh ranks start from
// different ones and registration must give them rank 0's (this one).
std::shared_ptr<ProbeImpl> reference_probe() { return std::make_shared<ProbeImpl>(100, 1.0); }
std::shared_ptr<ProbeImpl> rank_probe() {
  const int r = mesh().rank();
  return std::make_shared<ProbeImpl>(100 + r, 1.0 + r);
}

at::Tensor flat_state(const ProbeImpl& p) {
  return at::cat({p.lin->weight.detach().flatten(), p.lin->bias.detach().flatten(), p.scale.flatten()});
}

// At both MLP outputs: the probe predicts a fixed function of the whole
// activation (one loss term per hook), and the activation is edited by the
// probe's current (detached) output, so later layers see the training.
void add_probe_edits(flex::FlexModel& fm, std::vector<at::Tensor>& terms, double rank_factor = 1.0) {
  for (const auto& n : kHooks) {
    flex::HookFunctionOptions o;
    o.save = false;
    o.editing_function = [&terms, rank_factor](flex::Module&, const at::Tensor& x, flex::SaveContext&,
                                               flex::TrainableModules& tm) {
      at::Tensor y = tm.get<ProbeImpl>("probe")->forward(x);
      at::Tensor target = 0.5 * x.roll(1, 1) - 0.25 * x;
      terms.push_back(rank_factor * (y - target).pow(2).mean());
      return x + 0.5 * y.detach();
    };
    fm.register_forward_hook(std::make_shared<flex::HookFunction>(n, o));
  }
}

constexpr int kSteps = 4;

// The training loop of flex_model.h: forward, loss, backward, sync, step.
// Returns the loss of each step as this rank saw it.
std::vector<double> train(flex::FlexModel& fm, std::vector<at::Tensor>& terms, const at::Tensor& ids) {
  torch::optim::SGD opt(fm.trainable_modules().parameters(), torch::optim::SGDOptions(0.2));
  std::vector<double> losses;
  for (int step = 0; step < kSteps; ++step) {
    terms.clear();
    opt.zero_grad();
    fm.forward(ids);
    at::Tensor loss = at::zeros({});
    for (const auto& t : terms) loss = loss + t;
    if (!terms.empty()) loss.backward();
    fm.sync_trainable_gradients();
    opt.step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

TEST(ParallelTraining, ProbeTrainsAsInOneProcessAndStaysIdenticalOnEveryRank) {
  const at::Tensor ids = inputs();

  // The same training in one process (every rank computes it for itself).
  auto ref = reference_probe();
  const at::Tensor initial = flat_state(*ref);
  std::vector<double> ref_losses;
  {
    std::vector<at::Tensor> terms;
    flex::FlexModel single(flex::load_pretrained(gpt2_dir()));
    single.wrapped_module_requires_grad(false);
    single.register_trainable_module("probe", ref);
    add_probe_edits(single, terms);
    ref_losses = train(single, terms, ids);
  }
  const at::Tensor expected = flat_state(*ref);
  // Training moved the probe, and the loss went down: the comparison below is not of two no-ops.
  ASSERT_GT(max_diff(expected, initial), 1e-3);
  ASSERT_LT(ref_losses.back(), ref_losses.front());

  auto lm = flex::load_parallel_pretrained(gpt2_dir(), mesh());
  flex::FlexModel fm(lm);
  fm.set_mesh(mesh(), lm->layout());
  fm.wrapped_module_requires_grad(false);
  auto probe = rank_probe();
  if (mesh().rank() != 0) { ASSERT_GT(max_diff(flat_state(*probe), initial), 1e-3) << "ranks must start apart"; }
  fm.register_trainable_module("probe", probe);
  EXPECT_EQ(max_diff(flat_state(*probe), initial), 0.0) << "registration must copy rank 0's parameters and buffers";

  std::vector<at::Tensor> terms;
  add_probe_edits(fm, terms);
  train(fm, terms, ids);

  const at::Tensor mine = flat_state(*probe);
  EXPECT_TRUE(flex_test::close(mine, expected, /*rtol=*/0, 1e-5))
      << "rank " << mesh().rank() << " of " << mesh().describe();
  auto all = mesh().comm()->all_gather(mine.contiguous());
  for (size_t r = 1; r < all.size(); ++r)
    EXPECT_TRUE(flex_test::equal(all[r], all[0])) << "rank " << r << "'s probe differs from rank 0's by "
                                           << max_diff(all[r], all[0]);
}

TEST(ParallelTraining, RankLocalLossIsReported) {
  if (mesh().tp_size() * mesh().dp_size() == 1) GTEST_SKIP() << "every pipeline stage has a single rank";
  auto lm = flex::load_parallel_pretrained(gpt2_dir(), mesh());
  flex::FlexModel fm(lm);
  fm.set_mesh(mesh(), lm->layout());
  fm.wrapped_module_requires_grad(false);
  fm.register_trainable_module("probe", rank_probe());
  std::vector<at::Tensor> terms;
  // Each rank weighs its loss differently: the gradients of a stage disagree.
  add_probe_edits(fm, terms, 1.0 + mesh().rank());
  fm.forward(inputs());
  at::Tensor loss = at::zeros({});
  for (const auto& t : terms) loss = loss + t;
  loss.backward();
  const at::Tensor before = fm.trainable_modules().parameters()[0].grad().clone();
  try {
    fm.sync_trainable_gradients();
    ADD_FAILURE() << "rank-local losses were synchronised";
  } catch (const flex::ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("probe.lin.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank " + std::to_string(mesh().comm()->size() - 1)), std::string::npos) << msg;
  }
  // Nothing was changed by the refused sync.
  EXPECT_TRUE(flex_test::equal(fm.trainable_modules().parameters()[0].grad(), before));
}

TEST(ParallelTraining, TrainableModulesThatDifferAcrossRanksAreReported) {
  auto lm = flex::load_parallel_pretrained(gpt2_dir(), mesh());
  flex::FlexModel fm(lm);
  fm.set_mesh(mesh(), lm->layout());
  const int odd = mesh().comm()->size() - 1;
  const int64_t out = mesh().rank() == odd ? 32 : kHidden;
  try {
    fm.register_trainable_module("probe", std::make_shared<torch::nn::LinearImpl>(kHidden, out));
    ADD_FAILURE() << "a probe of another shape on rank " << odd << " was registered";
  } catch (const flex::ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("rank " + std::to_string(odd) + " differs"), std::string::npos) << msg;
    EXPECT_NE(msg.find("probe.weight"), std::string::npos) << msg;
  }
}

// Gradient hooks need autograd across the whole mesh: allowed under tensor
// parallelism only (mpi_grad.cpp checks what they capture there), refused
// with pipeline or data parallelism, naming the axis.
TEST(ParallelTraining, GradientHooksAreRefusedWithPipelineOrDataParallel) {
  auto lm = flex::load_parallel_pretrained(gpt2_dir(), mesh());
  flex::FlexModel fm(lm);
  fm.set_mesh(mesh(), lm->layout());
  const bool tp_only = mesh().pp_size() == 1 && mesh().dp_size() == 1;
  auto expect_refused = [&](const std::function<void()>& f, const std::string& what) {
    try {
      f();
      if (!tp_only) ADD_FAILURE() << what << " was registered under " << mesh().describe();
    } catch (const flex::UnsupportedError& e) {
      const std::string msg = e.what();
      if (tp_only) ADD_FAILURE() << what << " was refused under " << mesh().describe() << ": " << msg;
      EXPECT_NE(msg.find("supported under tensor parallelism only"), std::string::npos) << msg;
      EXPECT_NE(msg.find("transformer.h.0.mlp"), std::string::npos) << msg;
      if (mesh().pp_size() > 1) { EXPECT_NE(msg.find("pipeline parallel (pp="), std::string::npos) << msg; }
      if (mesh().dp_size() > 1) { EXPECT_NE(msg.find("data parallel (dp="), std::string::npos) << msg; }
    }
  };
  const std::string mlp = "transformer.h.0.mlp";
  expect_refused([&] { fm.register_full_backward_hook(std::make_shared<flex::HookFunction>(mlp)); },
                 "a full backward hook");
  expect_refused([&] { fm.register_full_backward_pre_hook(std::make_shared<flex::HookFunction>(mlp)); },
                 "a full backward pre hook");
  expect_refused([&] { fm.register_hook(std::make_shared<flex::HookFunction>(mlp + ".c_fc.weight")); },
                 "a tensor gradient hook");
  expect_refused([&] { fm.create_hook_group("grads", mlp + ".c_fc", {}, flex::HookType::Tensor); },
                 "a group of tensor hooks");
  if (!tp_only) { EXPECT_TRUE(fm.hook_functions().empty()); }

  // Registered before the mesh is set: set_mesh refuses.
  auto lm2 = flex::load_parallel_pretrained(gpt2_dir(), mesh());
  flex::FlexModel fm2(lm2);
  fm2.register_full_backward_hook(std::make_shared<flex::HookFunction>(mlp));
  expect_refused([&] { fm2.set_mesh(mesh(), lm2->layout()); }, "set_mesh with a backward hook");
}

TEST(ParallelTraining, LossOnLogitsThroughAnEditIsRefused) {
  auto lm = flex::load_parallel_pretrained(gpt2_dir(), mesh());
  flex::FlexModel fm(lm);
  fm.set_mesh(mesh(), lm->layout());
  fm.wrapped_module_requires_grad(false);
  fm.register_trainable_module("probe", rank_probe());
  flex::HookFunctionOptions o;
  o.editing_function = [](flex::Module&, const at::Tensor& x, flex::SaveContext&, flex::TrainableModules& tm) {
    return x + tm.get<ProbeImpl>("probe")->forward(x);
  };
  // The last block: on the last pipeline stage, whose logits carry autograd.
  fm.register_forward_hook(std::make_shared<flex::HookFunction>(kHooks.back(), o));
  at::Tensor logits = fm.forward(inputs());
  int differentiable = logits.requires_grad() ? 1 : 0, refused = 0;
  if (differentiable) {
    try {
      logits.pow(2).mean().backward();
      ADD_FAILURE() << "a loss on the logits went back through an edit under " << mesh().describe();
    } catch (const flex::UnsupportedError& e) {
      refused = 1;
      EXPECT_NE(std::string(e.what()).find(kHooks.back()), std::string::npos) << e.what();
    }
  }
  at::Tensor counts = at::tensor({differentiable, refused}, at::kInt);
  mesh().comm()->all_reduce(counts, flex::ReduceOp::Sum);
  EXPECT_GE(counts[0].item<int>(), 1) << "no rank had differentiable logits: the test checks nothing";
  EXPECT_EQ(counts[1].item<int>(), counts[0].item<int>());
}

}  // namespace
