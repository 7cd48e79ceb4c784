// ModelHook / SequentialHook / add & remove / PyTorch-style handles.
#include <flex/hooks/errors.h>
#include <flex/hooks/model_hook.h>
#include <flex/hooks/nn.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "test_util.h"

using namespace flex;

namespace {

// Records every call into a shared log, tagged with its name.
struct LogHook : ModelHook {
  std::string tag;
  std::vector<std::string>* log;
  LogHook(std::string t, std::vector<std::string>* l) : tag(std::move(t)), log(l) {}
  void init_hook(Module&) override { log->push_back(tag + ".init"); }
  Inputs pre_forward(Module&, Inputs in) override {
    log->push_back(tag + ".pre");
    return in;
  }
  Value post_forward(Module&, Value out) override {
    log->push_back(tag + ".post");
    return out;
  }
  void detach_hook(Module&) override { log->push_back(tag + ".detach"); }
};

struct ScaleInputHook : ModelHook {
  double s;
  explicit ScaleInputHook(double s) : s(s) {}
  Inputs pre_forward(Module&, Inputs in) override {
    in.args[0] = in.tensor(0) * s;
    return in;
  }
};

struct AddOutputHook : ModelHook {
  double a;
  explicit AddOutputHook(double a) : a(a) {}
  Value post_forward(Module&, Value out) override { return out.toTensor() + a; }
};

struct Tiny : Module {
  std::shared_ptr<Linear> a, b;
  std::shared_ptr<Sequential> inner;
  Tiny() : Module("Tiny") {
    a = add("a", std::make_shared<Linear>(4, 4));
    inner = add("inner", std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
                             std::make_shared<Linear>(4, 4), std::make_shared<Activation>("relu")}));
    b = add("b", std::make_shared<Linear>(4, 2));
  }
  Value forward(Inputs in) override { return (*b)((*inner)((*a)(in.tensor(0)))); }
};

}  // namespace

TEST(SequentialHook, RunsHooksInListOrderAtEveryStageWhenNested) {
  std::vector<std::string> log;
  Linear lin(2, 2);
  auto inner = std::make_shared<SequentialHook>(std::vector<std::shared_ptr<ModelHook>>{
      std::make_shared<LogHook>("b", &log), std::make_shared<LogHook>("c", &log)});
  auto outer = std::make_shared<SequentialHook>(std::vector<std::shared_ptr<ModelHook>>{
      std::make_shared<LogHook>("a", &log), inner, std::make_shared<LogHook>("d", &log)});
  add_hook_to_module(lin, outer);
  lin(at::ones({1, 2}));
  remove_hook_from_module(lin);
  std::vector<std::string> expected = {"a.init", "b.init", "c.init", "d.init", "a.pre",    "b.pre",
                                       "c.pre",  "d.pre",  "a.post", "b.post", "c.post",   "d.post",
                                       "a.detach", "b.detach", "c.detach", "d.detach"};
  EXPECT_EQ(log, expected);
}

TEST(AddHook, ReplaceDoesNotDetachOldAppendDetachesAndReinits) {
  std::vector<std::string> log;
  Linear lin(2, 2);
  add_hook_to_module(lin, std::make_shared<LogHook>("a", &log));
  add_hook_to_module(lin, std::make_shared<LogHook>("b", &log));  // replace: no a.detach
  EXPECT_EQ(log, (std::vector<std::string>{"a.init", "b.init"}));
  log.clear();
  add_hook_to_module(lin, std::make_shared<LogHook>("c", &log), /*append=*/true);
  // Accelerate: the old hook is removed (detach), then SequentialHook(old, new) inits both.
  EXPECT_EQ(log, (std::vector<std::string>{"b.detach", "b.init", "c.init"}));
  log.clear();
  lin(at::ones({1, 2}));
  EXPECT_EQ(log, (std::vector<std::string>{"b.pre", "c.pre", "b.post", "c.post"}));
  ASSERT_TRUE(std::dynamic_pointer_cast<SequentialHook>(lin.model_hook()));
  EXPECT_TRUE(find_hook<LogHook>(lin.model_hook()));
}

TEST(AddHook, RemovalRestoresOutputsBitwise) {
  at::manual_seed(1);
  auto m = std::make_shared<Tiny>();
  at::Tensor x = at::randn({3, 4});
  at::Tensor before = (*m)(x);
  add_hook_to_module(*m->a, std::make_shared<ScaleInputHook>(3.0));
  add_hook_to_module(*m->b, std::make_shared<AddOutputHook>(1.0));
  add_hook_to_module(*m->inner, std::make_shared<AddOutputHook>(0.5), true);
  at::Tensor hooked = (*m)(x);
  EXPECT_FALSE(at::equal(hooked, before));
  remove_hook_from_module(*m, /*recurse=*/true);
  EXPECT_TRUE(flex_test::equal((*m)(x), before));
  EXPECT_EQ(m->a->model_hook(), nullptr);
}

TEST(AddHook, RemoveFromSubmodulesLeavesRootHook) {
  std::vector<std::string> log;
  auto m = std::make_shared<Tiny>();
  add_hook_to_module(*m, std::make_shared<LogHook>("root", &log));
  add_hook_to_module(*m->inner->get_submodule("0"), std::make_shared<LogHook>("deep", &log));
  remove_hook_from_submodules(*m);
  EXPECT_NE(m->model_hook(), nullptr);
  EXPECT_EQ(m->inner->get_submodule("0")->model_hook(), nullptr);
}

TEST(ModelHook, PreForwardChangesWhatForwardSees) {
  Linear lin(3, 2);
  at::Tensor x = at::randn({1, 3});
  at::Tensor expected = at::linear(x * 2.0, lin.weight, lin.bias);
  add_hook_to_module(lin, std::make_shared<ScaleInputHook>(2.0));
  EXPECT_TRUE(flex_test::close(lin(x), expected));
}

TEST(ModelHook, PostForwardReplacesOutput) {
  Linear lin(3, 2);
  at::Tensor x = at::randn({1, 3});
  at::Tensor expected = at::linear(x, lin.weight, lin.bias) + 7.0;
  add_hook_to_module(lin, std::make_shared<AddOutputHook>(7.0));
  EXPECT_TRUE(flex_test::close(lin(x), expected));
}

TEST(ModelHook, NoGradHookProducesNoGraph) {
  Linear lin(3, 2);
  at::Tensor x = at::randn({1, 3});
  EXPECT_TRUE(lin(x).requires_grad());
  auto h = std::make_shared<ModelHook>();
  h->no_grad = true;
  add_hook_to_module(lin, h);
  at::Tensor y = lin(x);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_FALSE(y.grad_fn());
  remove_hook_from_module(lin);
  EXPECT_TRUE(lin(x).requires_grad());
}

TEST(Handles, RemoveOnlyTheirOwnHook) {
  Linear lin(2, 2);
  std::vector<int> calls;
  auto h1 = lin.register_forward_hook([&](Module&, const Inputs&, Value&) { calls.push_back(1); });
  auto h2 = lin.register_forward_hook([&](Module&, const Inputs&, Value&) { calls.push_back(2); });
  auto h3 = lin.register_forward_pre_hook([&](Module&, Inputs&) { calls.push_back(3); });
  lin(at::ones({1, 2}));
  EXPECT_EQ(calls, (std::vector<int>{3, 1, 2}));
  calls.clear();
  h1.remove();
  EXPECT_FALSE(h1.active());
  h1.remove();  // idempotent
  lin(at::ones({1, 2}));
  EXPECT_EQ(calls, (std::vector<int>{3, 2}));
  calls.clear();
  h3.remove();
  h2.remove();
  lin(at::ones({1, 2}));
  EXPECT_TRUE(calls.empty());
  EXPECT_EQ(lin.num_registered_hooks(), 0u);
}

TEST(Handles, ForwardHookEditsAndPreHookRewritesInputs) {
  Linear lin(2, 2);
  at::Tensor x = at::randn({1, 2});
  at::Tensor expected = at::linear(x + 1.0, lin.weight, lin.bias) * 2.0;
  lin.register_forward_pre_hook([](Module&, Inputs& in) { in.args[0] = in.tensor(0) + 1.0; });
  lin.register_forward_hook([](Module&, const Inputs&, Value& out) { out = out.toTensor() * 2.0; });
  EXPECT_TRUE(flex_test::close(lin(x), expected));
}

TEST(Handles, OutliveTheirModule) {
  HookHandle h;
  {
    Linear lin(2, 2);
    h = lin.register_forward_hook([](Module&, const Inputs&, Value&) {});
  }
  EXPECT_NO_THROW(h.remove());
}

TEST(Handles, ModelHookWrapsTorchStyleHooks) {
  // The ModelHook slot is outermost: its pre runs before pre-hooks, its post after forward hooks.
  std::vector<std::string> log;
  Linear lin(2, 2);
  add_hook_to_module(lin, std::make_shared<LogHook>("device", &log));
  lin.register_forward_pre_hook([&](Module&, Inputs&) { log.push_back("user.pre"); });
  lin.register_forward_hook([&](Module&, const Inputs&, Value&) { log.push_back("user.post"); });
  log.clear();
  lin(at::ones({1, 2}));
  EXPECT_EQ(log, (std::vector<std::string>{"device.pre", "user.pre", "user.post", "device.post"}));
}

TEST(Handles, HooksAtSeveralDepthsSeeTheirOwnActivations) {
  at::manual_seed(2);
  auto m = std::make_shared<Tiny>();
  at::Tensor x = at::randn({2, 4});
  std::map<std::string, at::Tensor> seen;
  for (const char* name : {"a", "inner", "inner.0", "inner.1", "b", ""}) {
    std::string n = name;
    m->get_submodule(n)->register_forward_hook(
        [&seen, n](Module&, const Inputs&, Value& out) { seen[n] = out.toTensor(); });
  }
  at::Tensor y = (*m)(x);
  // Independent recomputation from the weights.
  auto lin = [](const std::shared_ptr<Module>& mod, const at::Tensor& t) {
    auto l = std::dynamic_pointer_cast<Linear>(mod);
    return at::matmul(t, l->weight.t()) + l->bias;
  };
  at::Tensor a = lin(m->a, x);
  at::Tensor i0 = lin(m->inner->get_submodule("0"), a);
  at::Tensor i1 = at::relu(i0);
  at::Tensor b = lin(m->b, i1);
  EXPECT_TRUE(flex_test::close(seen["a"], a, 1e-5, 1e-6));
  EXPECT_TRUE(flex_test::close(seen["inner.0"], i0, 1e-5, 1e-6));
  EXPECT_TRUE(flex_test::close(seen["inner.1"], i1, 1e-5, 1e-6));
  EXPECT_TRUE(flex_test::close(seen["inner"], i1, 1e-5, 1e-6));
  EXPECT_TRUE(flex_test::close(seen["b"], b, 1e-5, 1e-6));
  EXPECT_TRUE(flex_test::equal(seen[""], y));
}
