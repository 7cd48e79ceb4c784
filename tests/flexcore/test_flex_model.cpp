// FlexModel on a small LM of flex::Modules: captures, edits, backward hooks,
// groups, trainable probes, restore. Expected values come from independent
// recomputation with plain ATen ops or torch::autograd::grad.
#include "tiny_lm.h"

#include <flex/flexcore/flex_model.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/graph_recording.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/optim/adam.h>

#include "test_util.h"

using namespace flex;

namespace {

// Plain recomputation of the tiny LM, optionally substituting block `k`'s output.
struct Manual {
  std::shared_ptr<tiny::LM> m;
  at::Tensor lin(const std::shared_ptr<Module>& mod, const at::Tensor& x) const {
    auto l = std::dynamic_pointer_cast<Linear>(mod);
    return l->bias.defined() ? at::matmul(x, l->weight.t()) + l->bias : at::matmul(x, l->weight.t());
  }
  at::Tensor ln(const std::shared_ptr<LayerNorm>& l, const at::Tensor& x) const {
    auto mu = x.mean(-1, true);
    auto var = (x - mu).pow(2).mean(-1, true);
    return (x - mu) / at::sqrt(var + 1e-5) * l->weight + l->bias;
  }
  at::Tensor mlp(size_t i, const at::Tensor& x) const {
    auto& seq = m->block(i)->mlp;
    return lin(seq->get_submodule("2"), at::gelu(lin(seq->get_submodule("0"), x)));
  }
  at::Tensor block(size_t i, const at::Tensor& x) const { return x + mlp(i, ln(m->block(i)->ln_1, x)); }
  at::Tensor run(const at::Tensor& ids, int substitute_at = -1, const at::Tensor& value = {}) const {
    at::Tensor x = m->wte->weight.index_select(0, ids.flatten()).view({ids.size(0), ids.size(1), -1});
    for (size_t i = 0; i < m->h->size(); ++i) {
      x = block(i, x);
      if (static_cast<int>(i) == substitute_at) x = value;
    }
    return lin(m->lm_head, ln(m->ln_f, x));
  }
};

at::Tensor ids_fixture() { return at::tensor({3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8}, at::kLong).view({2, 6}); }

}  // namespace

TEST(FlexModel, CapturesEqualIndependentRecomputation) {
  at::manual_seed(0);
  auto lm = std::make_shared<tiny::LM>();
  Manual ref{lm};
  FlexModel fm(lm);
  fm.register_forward_hook(std::make_shared<HookFunction>("h.1", std::vector<int64_t>{kAnyDim, 6, 16}));
  fm.register_forward_hook(std::make_shared<HookFunction>("h.2.mlp.0"));
  at::Tensor ids = ids_fixture();
  at::NoGradGuard ng;
  at::Tensor logits = fm.forward(ids);
  at::Tensor x0 = ref.block(0, lm->wte->weight.index_select(0, ids.flatten()).view({2, 6, 16}));
  at::Tensor x1 = ref.block(1, x0);
  ASSERT_EQ(fm.output().at("h.1").size(), 1u);
  EXPECT_TRUE(flex_test::close(fm.output().at("h.1")[0], x1, 1e-5, 1e-5));
  at::Tensor x2_fc = ref.lin(lm->block(2)->mlp->get_submodule("0"), ref.ln(lm->block(2)->ln_1, ref.block(1, x0)));
  EXPECT_TRUE(flex_test::close(fm.output().at("h.2.mlp.0")[0], x2_fc, 1e-5, 1e-5));
  EXPECT_TRUE(flex_test::close(logits, ref.run(ids), 1e-5, 1e-5));
  // Each forward appends; clear() empties.
  fm.forward(ids);
  EXPECT_EQ(fm.output().at("h.1").size(), 2u);
  fm.clear();
  EXPECT_TRUE(fm.output().empty());
}

TEST(FlexModel, CapturedTensorIsACopyOnCpu) {
  auto lm = std::make_shared<tiny::LM>();
  FlexModel fm(lm);
  at::Tensor seen;
  HookFunctionOptions o;
  o.editing_function = [&](Module&, const at::Tensor& t, SaveContext&, TrainableModules&) {
    seen = t;
    return t;
  };
  fm.register_forward_hook(std::make_shared<HookFunction>("h.0.mlp", o));
  at::NoGradGuard ng;
  fm.forward(ids_fixture());
  at::Tensor cap = fm.output().at("h.0.mlp")[0];
  EXPECT_FALSE(cap.is_same(seen));
  EXPECT_NE(cap.data_ptr(), seen.data_ptr());
  EXPECT_TRUE(flex_test::equal(cap, seen));
  EXPECT_FALSE(cap.requires_grad());
}

TEST(FlexModel, PreForwardHookSeesModuleInputs) {
  at::manual_seed(1);
  auto lm = std::make_shared<tiny::LM>();
  Manual ref{lm};
  FlexModel fm(lm);
  fm.register_forward_pre_hook(std::make_shared<HookFunction>("h.1.mlp"));
  at::NoGradGuard ng;
  at::Tensor ids = ids_fixture();
  fm.forward(ids);
  at::Tensor x0 = ref.block(0, lm->wte->weight.index_select(0, ids.flatten()).view({2, 6, 16}));
  at::Tensor expected_input = ref.ln(lm->block(1)->ln_1, x0);
  EXPECT_TRUE(flex_test::close(fm.output().at("h.1.mlp#input")[0], expected_input, 1e-5, 1e-5));
}

TEST(FlexModel, ActivationPatchingMatchesHandSubstitution) {
  at::manual_seed(2);
  auto lm = std::make_shared<tiny::LM>();
  Manual ref{lm};
  at::Tensor clean = ids_fixture();
  at::Tensor corrupted = clean.clone();
  corrupted.index_put_({0, 0}, 7);
  corrupted.index_put_({1, 2}, 0);
  at::NoGradGuard ng;
  FlexModel fm(lm);
  auto cap = std::make_shared<HookFunction>("h.1");
  fm.register_forward_hook(cap);
  fm.forward(clean);
  at::Tensor clean_act = fm.output().at("h.1")[0];
  fm.restore();

  FlexModel patcher(lm);
  HookFunctionOptions o;
  o.save = false;
  o.editing_function = [&](Module&, const at::Tensor&, SaveContext& ctx, TrainableModules&) {
    return ctx.tensor("patch");
  };
  patcher.save_ctx().set("patch", clean_act);
  patcher.register_forward_hook(std::make_shared<HookFunction>("h.1", o));
  at::Tensor patched = patcher.forward(corrupted);
  at::Tensor by_hand = ref.run(corrupted, /*substitute_at=*/1, clean_act);
  EXPECT_TRUE(flex_test::close(patched, by_hand, 1e-5, 1e-5));
  EXPECT_FALSE(at::allclose(patched, ref.run(corrupted), 1e-3, 1e-3));
}

TEST(FlexModel, EditWithWrongShapeNamesTheHook) {
  auto lm = std::make_shared<tiny::LM>();
  FlexModel fm(lm);
  HookFunctionOptions o;
  o.editing_function = [](Module&, const at::Tensor& t, SaveContext&, TrainableModules&) { return t.sum(-1); };
  fm.register_forward_hook(std::make_shared<HookFunction>("h.0.mlp", o));
  try {
    fm.forward(ids_fixture());
    FAIL();
  } catch (const ShapeError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("h.0.mlp"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[2, 6]"), std::string::npos) << msg;
  }
}

// While a CUDA-graph decode step is being recorded (GraphRecordingScope), a
// capture would run at recording only, not at the replays: it refuses, naming
// the hook and the way out (taps). An edit-only hook (device work) still runs.
TEST(FlexModel, CaptureRefusesWhileAGraphStepIsRecorded) {
  auto lm = std::make_shared<tiny::LM>();
  FlexModel fm(lm);
  HookFunctionOptions edit;
  edit.save = false;
  edit.editing_function = [](Module&, const at::Tensor& t, SaveContext&, TrainableModules&) { return t * 2.0; };
  fm.register_forward_hook(std::make_shared<HookFunction>("h.0.mlp", edit));
  at::NoGradGuard ng;
  {
    GraphRecordingScope recording;
    EXPECT_NO_THROW(fm.forward(ids_fixture()));
  }
  fm.register_forward_hook(std::make_shared<HookFunction>("h.1.mlp"));
  {
    GraphRecordingScope recording;
    try {
      fm.forward(ids_fixture());
      FAIL() << "a capture ran while a graph step was recorded";
    } catch (const UnsupportedError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("h.1.mlp"), std::string::npos) << msg;
      EXPECT_NE(msg.find("taps"), std::string::npos) << msg;
    }
  }
  EXPECT_FALSE(graph_recording());
  fm.forward(ids_fixture());  // outside the scope the capture works
  EXPECT_EQ(fm.output().at("h.1.mlp").size(), 1u);
}

TEST(FlexModel, ExpectedShapeMismatchIsReported) {
  auto lm = std::make_shared<tiny::LM>();
  FlexModel fm(lm);
  fm.register_forward_hook(std::make_shared<HookFunction>("h.0.mlp", std::vector<int64_t>{kAnyDim, kAnyDim, 99}));
  EXPECT_THROW(fm.forward(ids_fixture()), ShapeError);
}

TEST(FlexModel, UnknownModuleFailsAtRegistrationWithCloseNames) {
  auto lm = std::make_shared<tiny::LM>();
  FlexModel fm(lm);
  try {
    fm.register_forward_hook(std::make_shared<HookFunction>("h.1.mpl"));
    FAIL();
  } catch (const NotFoundError& e) {
    EXPECT_NE(std::string(e.what()).find("'h.1.mlp'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fm.register_hook(std::make_shared<HookFunction>("h.1.mlp.0.weigth")), NotFoundError);
  EXPECT_TRUE(fm.hook_functions().empty());
}

TEST(FlexModel, UnpackIdxPicksTupleElementAndSaveAfterEdit) {
  auto lm = std::make_shared<tiny::LM>();
  FlexModel fm(lm);
  HookFunctionOptions o;
  o.save_after_edit = true;
  o.editing_function = [](Module&, const at::Tensor& t, SaveContext&, TrainableModules&) { return t * 0; };
  fm.register_forward_hook(std::make_shared<HookFunction>("h.2", o));  // block output is a tuple
  at::NoGradGuard ng;
  at::Tensor logits = fm.forward(ids_fixture());
  EXPECT_TRUE(flex_test::equal(fm.output().at("h.2")[0], at::zeros({2, 6, 16})));
  // With zero residual stream, ln_f gives its bias and logits are constant over positions.
  at::Tensor expected_row = at::matmul(lm->ln_f->bias, lm->lm_head->weight.t());
  EXPECT_TRUE(flex_test::close(logits[1][3], expected_row, 1e-5, 1e-5));
  auto bad = std::make_shared<HookFunction>("h.1", HookFunctionOptions{{}, nullptr, 3});
  fm.register_forward_hook(bad);
  EXPECT_THROW(fm.forward(ids_fixture()), NotFoundError);
}

TEST(FlexModel, BackwardHooksCaptureAutogradGradients) {
  at::manual_seed(3);
  auto lm = std::make_shared<tiny::LM>();
  FlexModel fm(lm);
  fm.register_full_backward_pre_hook(std::make_shared<HookFunction>("h.1.mlp"));  // grad_output
  fm.register_full_backward_hook(std::make_shared<HookFunction>("h.1.mlp"));      // grad_input
  fm.register_hook(std::make_shared<HookFunction>("h.0.mlp.2.weight"));           // parameter grad
  at::Tensor logits = fm.forward(ids_fixture());
  at::Tensor loss = logits.pow(2).mean();
  loss.backward();

  // Independent: the same graph built with plain hooks into the module's
  // input/output tensors, differentiated with torch::autograd::grad.
  fm.restore();
  at::Tensor mlp_in, mlp_out;
  auto mlp = lm->get_submodule("h.1.mlp");
  auto h1 = mlp->register_forward_pre_hook([&](Module&, Inputs& in) { mlp_in = in.tensor(0); });
  auto h2 = mlp->register_forward_hook([&](Module&, const Inputs&, Value& out) { mlp_out = out.toTensor(); });
  at::Tensor loss2 = (*lm)(ids_fixture()).pow(2).mean();
  at::Tensor w = get_module_tensor(*lm, "h.0.mlp.2.weight");
  auto grads = torch::autograd::grad({loss2}, {mlp_in, mlp_out, w});
  EXPECT_TRUE(flex_test::close(fm.output().at("h.1.mlp#grad_input")[0], grads[0], 1e-6, 1e-5));
  EXPECT_TRUE(flex_test::close(fm.output().at("h.1.mlp#grad_output")[0], grads[1], 1e-6, 1e-5));
  EXPECT_TRUE(flex_test::close(fm.output().at("h.0.mlp.2.weight#grad")[0], grads[2], 1e-6, 1e-5));
  EXPECT_TRUE(flex_test::close(w.grad(), grads[2], 1e-6, 1e-5));
}

TEST(FlexModel, BackwardEditChangesUpstreamGradients) {
  auto lm = std::make_shared<tiny::LM>();
  FlexModel fm(lm);
  HookFunctionOptions o;
  o.save = false;
  o.editing_function = [](Module&, const at::Tensor& g, SaveContext&, TrainableModules&) { return g * 0; };
  fm.register_full_backward_pre_hook(std::make_shared<HookFunction>("lm_head", o));
  fm.forward(ids_fixture()).sum().backward();
  // Zero gradient into lm_head's output: nothing upstream of it gets a gradient signal.
  EXPECT_TRUE(flex_test::equal(lm->wte->weight.grad(), at::zeros_like(lm->wte->weight)));
  EXPECT_TRUE(flex_test::equal(lm->lm_head->weight.grad(), at::zeros_like(lm->lm_head->weight)));
}

TEST(FlexModel, SaveContextPersistsAcrossCalls) {
  auto lm = std::make_shared<tiny::LM>();
  FlexModel fm(lm);
  HookFunctionOptions o;
  o.save = false;
  o.editing_function = [](Module&, const at::Tensor& t, SaveContext& ctx, TrainableModules&) {
    double n = ctx.has("calls") ? ctx.scalar("calls") : 0.0;
    ctx.set("calls", n + 1);
    ctx.set("last_norm", t.norm().detach());
    return t;
  };
  fm.register_forward_hook(std::make_shared<HookFunction>("h.0", o));
  fm.register_forward_hook(std::make_shared<HookFunction>("h.2", o));
  at::NoGradGuard ng;
  fm.forward(ids_fixture());
  fm.forward(ids_fixture());
  EXPECT_EQ(fm.save_ctx().scalar("calls"), 4.0);
  EXPECT_THROW(fm.save_ctx().get("nope"), NotFoundError);
}

TEST(FlexModel, RestoreGivesBitwiseOriginalOutputs) {
  at::manual_seed(4);
  auto lm = std::make_shared<tiny::LM>();
  at::NoGradGuard ng;
  at::Tensor before = (*lm)(ids_fixture());
  {
    FlexModel fm(lm);
    HookFunctionOptions o;
    o.editing_function = [](Module&, const at::Tensor& t, SaveContext&, TrainableModules&) { return t + 1; };
    fm.create_hook_group("mlps", "mlp", o);
    fm.register_forward_pre_hook(std::make_shared<HookFunction>("ln_f"));
    EXPECT_FALSE(at::equal(fm.forward(ids_fixture()), before));
    auto m = fm.restore();
    EXPECT_EQ(m, lm);
    EXPECT_TRUE(flex_test::equal((*lm)(ids_fixture()), before));
    for (auto& nm : lm->named_flex_modules()) EXPECT_EQ(nm.second->num_registered_hooks(), 0u) << nm.first;
  }
}

TEST(FlexModel, DestructionRemovesHooksAndHandlesRemoveOne) {
  auto lm = std::make_shared<tiny::LM>();
  {
    FlexModel fm(lm);
    auto a = fm.register_forward_hook(std::make_shared<HookFunction>("h.0"));
    fm.register_forward_hook(std::make_shared<HookFunction>("h.1"));
    a.remove();
    EXPECT_EQ(fm.hook_functions().size(), 1u);
    EXPECT_EQ(lm->get_submodule("h.0")->num_registered_hooks(), 0u);
    EXPECT_EQ(lm->get_submodule("h.1")->num_registered_hooks(), 1u);
  }
  EXPECT_EQ(lm->get_submodule("h.1")->num_registered_hooks(), 0u);
}

TEST(FlexModel, NamesAndParameters) {
  auto lm = std::make_shared<tiny::LM>(32, 16, 2);
  FlexModel fm(lm);
  fm.register_trainable_module("probe", std::make_shared<Linear>(16, 2));
  auto names = fm.wrapped_module_names();
  EXPECT_EQ(names.front(), "");
  EXPECT_NE(std::find(names.begin(), names.end(), "h.1.mlp.2"), names.end());
  EXPECT_EQ(fm.trainable_modules_names(), std::vector<std::string>{"probe"});
  EXPECT_EQ(fm.all_modules_names().size(), names.size() + 1);
  at::Tensor w = fm.get_module_parameter("h.1.mlp.0.weight", {64, 16});
  EXPECT_TRUE(flex_test::equal(w, lm->block(1)->mlp->get_submodule("0")->named_parameters()["weight"]));
  EXPECT_FALSE(w.requires_grad());
  EXPECT_THROW(fm.get_module_parameter("h.1.mlp.0.weight", {16, 64}), ShapeError);
  EXPECT_THROW(fm.get_module_parameter("h.9.mlp.0.weight"), NotFoundError);
}

TEST(FlexModel, LinearProbeTrainsWhileWrappedModelStaysFrozen) {
  at::manual_seed(5);
  auto lm = std::make_shared<tiny::LM>(32, 16, 2);
  std::vector<at::Tensor> frozen;
  for (auto& p : lm->parameters()) frozen.push_back(p.detach().clone());
  FlexModel fm(lm);
  fm.wrapped_module_requires_grad(false);
  auto probe = std::make_shared<Linear>(16, 1);
  fm.register_trainable_module("probe", probe);
  // Target: a fixed linear function of the block-0 output, which the probe can learn.
  at::Tensor true_w = at::randn({16, 1});
  HookFunctionOptions o;
  o.save = false;
  o.editing_function = [&](Module&, const at::Tensor& t, SaveContext& ctx, TrainableModules& mods) {
    at::Tensor pred = (*mods.get<Linear>("probe"))(t.detach());
    at::Tensor target = at::matmul(t.detach(), true_w);
    ctx.set("loss", (pred - target).pow(2).mean());
    return t;
  };
  fm.register_forward_hook(std::make_shared<HookFunction>("h.0", o));
  torch::optim::Adam opt(fm.trainable_modules().parameters(), torch::optim::AdamOptions(0.05));
  at::Tensor ids = at::randint(0, 32, {8, 12}, at::kLong);
  double first = 0, last = 0;
  for (int step = 0; step < 100; ++step) {
    opt.zero_grad();
    fm.forward(ids);
    at::Tensor loss = fm.save_ctx().tensor("loss");
    if (step == 0) first = loss.item<double>();
    last = loss.item<double>();
    loss.backward();
    opt.step();
  }
  EXPECT_LT(last, 0.1 * first) << "first " << first << " last " << last;
  auto params = lm->parameters();
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(flex_test::equal(params[i], frozen[i]));
}
