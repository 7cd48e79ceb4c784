// FlexModel on a CUDA device (the gpu label; each case skips itself without
// one): captures (forward, forward-pre, gradients), editing functions (a
// built-in steering edit and a user's), hook groups, the save context and a
// trainable probe, on the flexcore tests' small LM moved to the GPU. The
// reference is the same network's CPU twin (identical weights) run by
// calling its modules directly, without hooks, or differentiated with
// torch::autograd::grad.
#include "../flexcore/tiny_lm.h"
#include "gpu_util.h"

#include <flex/flexcore/activation_edits.h>
#include <flex/flexcore/flex_model.h>

#include <torch/csrc/autograd/autograd.h>
#include <torch/optim/adam.h>

#include <functional>
#include <map>
#include <regex>
#include <set>

#include "test_util.h"

using namespace flex;

namespace {

// Two LMs with the same weights: one on the CPU, one moved to the test device.
std::pair<std::shared_ptr<tiny::LM>, std::shared_ptr<tiny::LM>> twins(uint64_t seed) {
  at::manual_seed(seed);
  auto cpu = std::make_shared<tiny::LM>(32, 16, 3);
  auto gpu = std::make_shared<tiny::LM>(32, 16, 3);
  {
    at::NoGradGuard ng;
    auto src = cpu->named_parameters(true);
    for (auto& p : gpu->named_parameters(true)) p.value().copy_(src[p.key()]);
  }
  gpu->to(gpu_test::device());
  return {cpu, gpu};
}

at::Tensor ids() { return at::tensor({3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8}, at::kLong).view({2, 6}); }

// The CPU twin by hand: block i's MLP output passes through `mlp_edit[i]`
// (if set), block i's output through `block_edit[i]`.
struct ByHand {
  explicit ByHand(std::shared_ptr<tiny::LM> lm) : m(std::move(lm)) {}
  std::shared_ptr<tiny::LM> m;
  std::map<size_t, std::function<at::Tensor(at::Tensor)>> mlp_edit, block_edit;
  std::map<std::string, at::Tensor> seen;  // "h.i" block outputs, "h.i.mlp#input"
  at::Tensor run(const at::Tensor& x_ids) {
    at::NoGradGuard ng;
    at::Tensor x = (*m->wte)(x_ids);
    for (size_t i = 0; i < 3; ++i) {
      auto b = m->block(i);
      const at::Tensor in = (*b->ln_1)(x);
      seen["h." + std::to_string(i) + ".mlp#input"] = in;
      at::Tensor y = (*b->mlp)(in);
      if (mlp_edit.count(i)) y = mlp_edit[i](y);
      x = x + y;
      seen["h." + std::to_string(i)] = x;
      if (block_edit.count(i)) x = block_edit[i](x);
    }
    return (*m->lm_head)((*m->ln_f)(x));
  }
};

HookFunctionPtr hook(const std::string& name, EditFn fn = nullptr, bool save = true) {
  HookFunctionOptions o;
  o.editing_function = std::move(fn);
  o.save = save;
  return std::make_shared<HookFunction>(name, o);
}

}  // namespace

TEST(FlexModelOnGpu, CapturesAndEditsEqualTheCpuRecomputation) {
  FLEX_REQUIRE_GPU();
  auto [cpu, gpu] = twins(1);
  at::manual_seed(2);
  const at::Tensor v = at::randn({16}), shift = at::randn({16});
  FlexModel fm(gpu);
  fm.save_ctx().set("shift", gpu_test::on_device(shift));
  std::vector<std::string> edit_devices;
  fm.register_forward_hook(std::make_shared<HookFunction>("h.1", std::vector<int64_t>{kAnyDim, 6, 16}));
  fm.register_forward_pre_hook(std::make_shared<HookFunction>("h.1.mlp"));
  // A user's editing function reading the save context, and a built-in edit (the vector stays on the CPU).
  fm.register_forward_hook(hook("h.0.mlp", [&](Module&, const at::Tensor& t, SaveContext& ctx, TrainableModules&) {
    edit_devices.push_back(t.device().str());
    return t * 0.5 + ctx.tensor("shift");
  }));
  fm.register_forward_hook(hook("h.2", add_vector(v, 2.5)));
  at::Tensor logits;
  {
    at::NoGradGuard ng;
    logits = fm.forward(gpu_test::on_device(ids()));
  }
  ByHand ref{cpu};
  ref.mlp_edit[0] = [&](at::Tensor y) { return y * 0.5 + shift; };
  ref.block_edit[2] = [&](at::Tensor x) { return x + 2.5 * v; };
  const at::Tensor want = ref.run(ids());
  EXPECT_EQ(logits.device(), gpu_test::device());
  EXPECT_TRUE(flex_test::close(logits.cpu(), want, 1e-5, 1e-5));
  EXPECT_EQ(edit_devices, std::vector<std::string>{gpu_test::device().str()}) << "the editing function ran on the activation's device";
  for (const char* key : {"h.1", "h.1.mlp#input", "h.2", "h.0.mlp"}) {
    ASSERT_EQ(fm.output().count(key), 1u) << key;
    ASSERT_EQ(fm.output().at(key).size(), 1u) << key;
    EXPECT_EQ(fm.output().at(key)[0].device(), at::Device(at::kCPU)) << key << ": captures are CPU tensors";
  }
  EXPECT_TRUE(flex_test::close(fm.output().at("h.1")[0], ref.seen["h.1"], 1e-5, 1e-5));
  EXPECT_TRUE(flex_test::close(fm.output().at("h.1.mlp#input")[0], ref.seen["h.1.mlp#input"], 1e-5, 1e-5));
  EXPECT_TRUE(flex_test::close(fm.output().at("h.2")[0], ref.seen["h.2"], 1e-5, 1e-5)) << "captured before the edit";
  // restore() gives the unhooked network back: the CPU twin's plain logits.
  fm.restore();
  at::NoGradGuard ng;
  EXPECT_TRUE(flex_test::close((*gpu)(gpu_test::on_device(ids())).cpu(), ByHand{cpu}.run(ids()), 1e-5, 1e-5));
}

TEST(FlexModelOnGpu, HookGroupsSelectWhichHooksRun) {
  FLEX_REQUIRE_GPU();
  auto [cpu, gpu] = twins(3);
  FlexModel fm(gpu);
  HookFunctionOptions plus_one;
  plus_one.editing_function = [](Module&, const at::Tensor& t, SaveContext&, TrainableModules&) { return t + 1.0; };
  ASSERT_EQ(fm.create_hook_group("mlps", std::regex("h\\.[0-9]+\\.mlp"), plus_one).size(), 3u);
  ASSERT_EQ(fm.create_hook_group("norms", "ln_1").size(), 3u);
  ByHand edited{cpu};
  for (size_t i = 0; i < 3; ++i) edited.mlp_edit[i] = [](at::Tensor y) { return y + 1.0; };
  const at::Tensor with_mlps = edited.run(ids()), plain = ByHand{cpu}.run(ids());
  at::NoGradGuard ng;
  auto keys = [&] {
    std::set<std::string> k;
    for (const auto& kv : fm.output()) k.insert(kv.first);
    fm.clear();
    return k;
  };
  EXPECT_TRUE(flex_test::close(fm.forward(gpu_test::on_device(ids()), {"mlps"}).cpu(), with_mlps, 1e-5, 1e-5));
  EXPECT_EQ(keys(), (std::set<std::string>{"h.0.mlp", "h.1.mlp", "h.2.mlp"}));
  EXPECT_TRUE(flex_test::close(fm.forward(gpu_test::on_device(ids()), {"mlps"}, true).cpu(), plain, 1e-5, 1e-5));
  EXPECT_EQ(keys(), (std::set<std::string>{"h.0.ln_1", "h.1.ln_1", "h.2.ln_1"}));
  EXPECT_TRUE(flex_test::close(fm.forward(gpu_test::on_device(ids())).cpu(), with_mlps, 1e-5, 1e-5));
  EXPECT_EQ(keys().size(), 6u);
}

TEST(FlexModelOnGpu, SaveContextKeepsGpuTensorsAcrossCalls) {
  FLEX_REQUIRE_GPU();
  auto [cpu, gpu] = twins(4);
  FlexModel fm(gpu);
  fm.register_forward_hook(hook("h.1", [](Module&, const at::Tensor& t, SaveContext& ctx, TrainableModules&) {
    ctx.set("calls", (ctx.has("calls") ? ctx.scalar("calls") : 0.0) + 1);
    ctx.set("norm", t.norm().detach());
    return t;
  }, false));
  at::NoGradGuard ng;
  fm.forward(gpu_test::on_device(ids()));
  fm.forward(gpu_test::on_device(ids()));
  EXPECT_EQ(fm.save_ctx().scalar("calls"), 2.0);
  const at::Tensor norm = fm.save_ctx().tensor("norm");
  EXPECT_EQ(norm.device(), gpu_test::device());
  ByHand ref{cpu};
  ref.run(ids());
  EXPECT_TRUE(flex_test::close(norm.cpu(), ref.seen["h.1"].norm(), 1e-5, 1e-5));
  EXPECT_TRUE(fm.output().empty());
}

TEST(FlexModelOnGpu, BackwardHooksCaptureTheCpuGradients) {
  FLEX_REQUIRE_GPU();
  auto [cpu, gpu] = twins(5);
  FlexModel fm(gpu);
  fm.register_full_backward_pre_hook(std::make_shared<HookFunction>("h.1.mlp"));  // grad_output
  fm.register_full_backward_hook(std::make_shared<HookFunction>("h.1.mlp"));      // grad_input
  fm.register_hook(std::make_shared<HookFunction>("h.0.mlp.2.weight"));           // parameter grad
  fm.forward(gpu_test::on_device(ids())).pow(2).mean().backward();

  // The CPU twin, differentiated with torch::autograd::grad through plain hooks.
  at::Tensor mlp_in, mlp_out;
  auto mlp = cpu->get_submodule("h.1.mlp");
  auto h1 = mlp->register_forward_pre_hook([&](Module&, Inputs& in) { mlp_in = in.tensor(0); });
  auto h2 = mlp->register_forward_hook([&](Module&, const Inputs&, Value& out) { mlp_out = out.toTensor(); });
  const at::Tensor loss = (*cpu)(ids()).pow(2).mean();
  const at::Tensor w = get_module_tensor(*cpu, "h.0.mlp.2.weight");
  const auto grads = torch::autograd::grad({loss}, {mlp_in, mlp_out, w});
  for (const char* key : {"h.1.mlp#grad_input", "h.1.mlp#grad_output", "h.0.mlp.2.weight#grad"}) {
    ASSERT_EQ(fm.output().count(key), 1u) << key;
    EXPECT_EQ(fm.output().at(key)[0].device(), at::Device(at::kCPU)) << key;
  }
  EXPECT_TRUE(flex_test::close(fm.output().at("h.1.mlp#grad_input")[0], grads[0], 1e-4, 1e-6));
  EXPECT_TRUE(flex_test::close(fm.output().at("h.1.mlp#grad_output")[0], grads[1], 1e-4, 1e-6));
  EXPECT_TRUE(flex_test::close(fm.output().at("h.0.mlp.2.weight#grad")[0], grads[2], 1e-4, 1e-6));
  const at::Tensor gw = get_module_tensor(*gpu, "h.0.mlp.2.weight").grad();
  ASSERT_TRUE(gw.defined());
  EXPECT_EQ(gw.device(), gpu_test::device());
  EXPECT_TRUE(flex_test::close(gw.cpu(), grads[2], 1e-4, 1e-6));
}

// A probe registered as a trainable module (on the GPU, as its user moves
// it) gets, through an editing function, the gradient the same probe gets on
// the CPU twin, and trains; the frozen model does not change.
TEST(FlexModelOnGpu, TrainableProbeGetsTheCpuGradientsAndTrains) {
  FLEX_REQUIRE_GPU();
  auto [cpu, gpu] = twins(6);
  at::manual_seed(7);
  auto probe = std::make_shared<Linear>(16, 1);
  auto cpu_probe = std::make_shared<Linear>(16, 1);
  {
    at::NoGradGuard ng;
    cpu_probe->weight.copy_(probe->weight);
    cpu_probe->bias.copy_(probe->bias);
  }
  probe->to(gpu_test::device());
  const at::Tensor true_w = at::randn({16, 1});
  std::vector<at::Tensor> frozen;
  for (auto& p : gpu->parameters()) frozen.push_back(p.detach().cpu().clone());

  FlexModel fm(gpu);
  fm.wrapped_module_requires_grad(false);
  fm.register_trainable_module("probe", probe);
  fm.register_forward_hook(hook("h.0", [&](Module&, const at::Tensor& t, SaveContext& ctx, TrainableModules& mods) {
    const at::Tensor pred = (*mods.get<Linear>("probe"))(t.detach());
    const at::Tensor target = at::matmul(t.detach(), true_w.to(t.device()));
    ctx.set("loss", (pred - target).pow(2).mean());
    return t;
  }, false));
  const at::Tensor x = at::randint(0, 32, {8, 12}, at::kLong);
  fm.forward(gpu_test::on_device(x));
  const at::Tensor loss = fm.save_ctx().tensor("loss");
  EXPECT_EQ(loss.device(), gpu_test::device());
  loss.backward();
  ASSERT_TRUE(probe->weight.grad().defined()) << "no gradient reached the probe";
  EXPECT_EQ(probe->weight.grad().device(), gpu_test::device());

  // The CPU twin: the same probe on the block's output, by hand.
  ByHand ref{cpu};
  ref.run(x);
  const at::Tensor h0 = ref.seen["h.0"];
  const at::Tensor cpu_loss = ((*cpu_probe)(h0) - at::matmul(h0, true_w)).pow(2).mean();
  const auto g = torch::autograd::grad({cpu_loss}, {cpu_probe->weight, cpu_probe->bias});
  EXPECT_TRUE(flex_test::close(loss.detach().cpu(), cpu_loss.detach(), 1e-5, 1e-6));
  EXPECT_TRUE(flex_test::close(probe->weight.grad().cpu(), g[0], 1e-4, 1e-6));
  EXPECT_TRUE(flex_test::close(probe->bias.grad().cpu(), g[1], 1e-4, 1e-6));

  torch::optim::Adam opt(fm.trainable_modules().parameters(), torch::optim::AdamOptions(0.05));
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    opt.zero_grad();
    fm.forward(gpu_test::on_device(x));
    const at::Tensor l = fm.save_ctx().tensor("loss");
    if (step == 0) first = l.item<double>();
    last = l.item<double>();
    l.backward();
    opt.step();
  }
  EXPECT_LT(last, 0.2 * first) << "first " << first << " last " << last;
  const auto params = gpu->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(flex_test::equal(params[i].detach().cpu(), frozen[i])) << "parameter " << i << " of the frozen model changed";
    EXPECT_FALSE(params[i].grad().defined()) << "parameter " << i << " of the frozen model got a gradient";
  }
}
