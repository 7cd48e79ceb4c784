// Module tree, paths, tensor swapping, EmptyInit and the basic layers,
// checked against independent libtorch computations.
#include <flex/hooks/empty_init.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/nn.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <string>

#include "kernel_test_util.h"
#include "test_util.h"

using namespace flex;

namespace {

struct Mlp : Module {
  std::shared_ptr<Linear> c_fc, c_proj;
  std::shared_ptr<Activation> act;
  Mlp(int64_t d, int64_t h) : Module("MLP") {
    c_fc = add("c_fc", std::make_shared<Linear>(d, h));
    act = add("act", std::make_shared<Activation>("gelu_new"));
    c_proj = add("c_proj", std::make_shared<Linear>(h, d));
  }
  Value forward(Inputs in) override { return (*c_proj)((*act)((*c_fc)(in.tensor(0)))); }
};

struct Block : Module {
  std::shared_ptr<LayerNorm> ln;
  std::shared_ptr<Mlp> mlp;
  Block(int64_t d) : Module("Block") {
    ln = add("ln_1", std::make_shared<LayerNorm>(d));
    mlp = add("mlp", std::make_shared<Mlp>(d, 4 * d));
  }
  Value forward(Inputs in) override {
    at::Tensor x = in.tensor(0);
    return x + (*mlp)((*ln)(x));
  }
};

struct Net : Module {
  std::shared_ptr<ModuleList> h;
  Net(int n, int64_t d) : Module("Net") {
    h = add("h", std::make_shared<ModuleList>());
    for (int i = 0; i < n; ++i) h->push_back(std::make_shared<Block>(d));
  }
  Value forward(Inputs in) override {
    at::Tensor x = in.tensor(0);
    for (auto& b : h->items()) x = (*b)(x);
    return x;
  }
};

}  // namespace

TEST(Module, NamedModulesUseDottedHuggingFacePaths) {
  auto net = std::make_shared<Net>(2, 8);
  std::vector<std::string> names;
  for (auto& nm : net->named_flex_modules()) names.push_back(nm.first);
  std::vector<std::string> expected = {"", "h", "h.0", "h.0.ln_1", "h.0.mlp", "h.0.mlp.c_fc", "h.0.mlp.act",
                                       "h.0.mlp.c_proj", "h.1", "h.1.ln_1", "h.1.mlp", "h.1.mlp.c_fc",
                                       "h.1.mlp.act", "h.1.mlp.c_proj"};
  EXPECT_EQ(names, expected);
  // libtorch's own named_modules agrees.
  auto torch_names = net->named_modules().keys();
  EXPECT_EQ(torch_names, expected);
  EXPECT_EQ(net->get_submodule("h.1.mlp")->class_name(), "MLP");
  EXPECT_EQ(net->get_submodule("h.1.mlp.c_fc")->class_name(), "Linear");
}

TEST(Module, UnknownPathNamesClosestModules) {
  auto net = std::make_shared<Net>(2, 8);
  try {
    net->get_submodule("h.1.mlp.c_fx");
    FAIL() << "expected NotFoundError";
  } catch (const NotFoundError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("h.1.mlp.c_fx"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'h.1.mlp.c_fc'"), std::string::npos) << msg;
  }
  EXPECT_THROW(net->get_submodule("h.7"), NotFoundError);
}

TEST(Module, StateDictListsParametersInHuggingFaceOrder) {
  auto net = std::make_shared<Net>(1, 4);
  std::vector<std::string> keys;
  for (auto& kv : state_dict(*net)) keys.push_back(kv.first);
  std::vector<std::string> expected = {"h.0.ln_1.weight",      "h.0.ln_1.bias",        "h.0.mlp.c_fc.weight",
                                       "h.0.mlp.c_fc.bias",    "h.0.mlp.c_proj.weight", "h.0.mlp.c_proj.bias"};
  EXPECT_EQ(keys, expected);
}

TEST(Module, SetTensorSwapsRegistryAndMemberTogether) {
  auto lin = std::make_shared<Linear>(3, 2);
  at::Tensor w = at::arange(6, at::kFloat).reshape({2, 3});
  lin->set_tensor("weight", w);
  EXPECT_TRUE(lin->weight.is_same(lin->named_parameters(false)["weight"]));
  EXPECT_TRUE(lin->weight.requires_grad());
  at::Tensor x = at::ones({1, 3});
  at::Tensor expected = at::matmul(x, w.detach().t()) + lin->bias.detach();
  EXPECT_TRUE(flex_test::close((*lin)(x), expected));
  EXPECT_THROW(lin->set_tensor("wieght", w), NotFoundError);
}

TEST(Module, SetTensorReplacesMetaParameterWithRealOne) {
  std::shared_ptr<Linear> lin;
  {
    EmptyInit scope;
    lin = std::make_shared<Linear>(3, 2);
  }
  EXPECT_TRUE(lin->weight.is_meta());
  set_module_tensor(*lin, "weight", at::ones({2, 3}));
  set_module_tensor(*lin, "bias", at::zeros({2}));
  EXPECT_FALSE(lin->weight.is_meta());
  EXPECT_TRUE(flex_test::equal((*lin)(at::ones({1, 3})), at::full({1, 2}, 3.0)));
  EXPECT_THROW(set_module_tensor(*lin, "nope", at::ones({1})), NotFoundError);
}

TEST(Module, BuffersSwapAndPersistenceIsRecorded) {
  struct WithBuffers : Module {
    at::Tensor mask, scale;
    WithBuffers() : Module("WithBuffers") {
      add_buffer("mask", mask, at::ones({2}, at::kBool), /*persistent=*/false);
      add_buffer("scale", scale, at::ones({2}));
    }
    Value forward(Inputs in) override { return in.tensor(0) * scale; }
  };
  auto m = std::make_shared<WithBuffers>();
  EXPECT_FALSE(m->is_persistent_buffer("mask"));
  auto sd = state_dict(*m);
  ASSERT_EQ(sd.size(), 1u);
  EXPECT_EQ(sd[0].first, "scale");
  m->set_tensor("scale", at::full({2}, 2.0));
  EXPECT_TRUE(flex_test::equal((*m)(at::ones({2})), at::full({2}, 2.0)));
  EXPECT_TRUE(flex_test::equal(get_module_tensor(*m, "scale"), at::full({2}, 2.0)));
}

static size_t resident_kb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoul(line.substr(6));
  return 0;
}

TEST(EmptyInit, ThousandHugeLinearsBuildFastWithoutMemory) {
  const size_t before = resident_kb();
  auto t0 = std::chrono::steady_clock::now();
  auto seq = std::make_shared<Sequential>();
  {
    EmptyInit scope;
    for (int i = 0; i < 1000; ++i) seq->push_back(std::make_shared<Linear>(10000, 10000));
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const size_t after = resident_kb();
  EXPECT_LT(secs, 1.0);
  // 1000 x 400 MB would be 400 GB; allow 64 MB of bookkeeping.
  EXPECT_LT(after - std::min(after, before), 64u * 1024u);
  for (auto& p : seq->parameters()) ASSERT_TRUE(p.is_meta());
  EXPECT_EQ(seq->parameters().size(), 2000u);
  // Outside the scope, modules are real again.
  Linear real(2, 2);
  EXPECT_FALSE(real.weight.is_meta());
}

TEST(EmptyInit, IncludeBuffersPutsBuffersOnMeta) {
  struct B : Module {
    at::Tensor w, buf;
    B() : Module("B") {
      add_parameter("w", w, new_parameter({2}));
      add_buffer("buf", buf, at::zeros({2}));
    }
    Value forward(Inputs in) override { return in.tensor(0); }
  };
  {
    EmptyInit scope(false);
    B b;
    EXPECT_TRUE(b.w.is_meta());
    EXPECT_FALSE(b.buf.is_meta());
  }
  {
    EmptyInit scope(true);
    B b;
    EXPECT_TRUE(b.w.is_meta());
    EXPECT_TRUE(b.buf.is_meta());
  }
}

TEST(Layers, MatchIndependentFormulas) {
  at::manual_seed(0);
  at::Tensor x = at::randn({2, 5, 6});
  Conv1D conv(4, 6);
  EXPECT_TRUE(flex_test::close(conv(x), at::matmul(x, conv.weight) + conv.bias, 1e-5, 1e-6));
  LayerNorm ln(6);
  auto mu = x.mean(-1, true);
  auto var = (x - mu).pow(2).mean(-1, true);
  EXPECT_TRUE(flex_test::close(ln(x), (x - mu) / at::sqrt(var + 1e-5), 1e-5, 1e-5));
  RMSNorm rms(6, 1e-6);
  EXPECT_TRUE(flex_test::close(rms(x), x / at::sqrt(x.pow(2).mean(-1, true) + 1e-6), 1e-5, 1e-5));
  Activation gelu_new("gelu_new");
  at::Tensor expected = 0.5 * x * (1 + at::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
  EXPECT_TRUE(flex_test::close(gelu_new(x), expected, 1e-5, 1e-6));
  EXPECT_EQ(gelu_new.class_name(), "NewGELUActivation");
  EXPECT_THROW(Activation("swiglu2"), ConfigError);
  Embedding emb(10, 3);
  at::Tensor ids = at::tensor({1, 7}, at::kLong).view({1, 2});
  EXPECT_TRUE(flex_test::equal(emb(ids)[0][1], emb.weight[7]));
}

// RMSNorm's one-pass kernel (flex::fused_rms_norm, taken where no graph is
// recorded) against float64 with the dtype casts where each Scale variant
// puts them, and bit-equal to the libtorch op chain it replaces; 1 and 2
// threads bit-equal; with a graph, the libtorch ops and their gradient.
namespace {

at::Tensor rms_reference(const at::Tensor& x, const at::Tensor& w, double eps, RMSNorm::Scale scale) {
  const at::Tensor h = x.to(at::kDouble);
  const at::Tensor n = h / at::sqrt(h.pow(2).mean(-1, true) + eps);
  const at::Tensor wd = w.to(at::kDouble);
  auto as = [](const at::Tensor& t, at::ScalarType s) { return t.to(s).to(at::kDouble); };  // rounded to s
  switch (scale) {
    case RMSNorm::Scale::WeightThenCast: return (wd * n).to(x.scalar_type());
    case RMSNorm::Scale::OnePlusWeight: return (n * (wd + 1.0)).to(x.scalar_type());
    default: return (wd * as(n, x.scalar_type())).to(at::promote_types(w.scalar_type(), x.scalar_type()));
  }
}

}  // namespace

TEST(Layers, FusedRmsNormMatchesFloat64ForEachScaleAndDtype) {
  at::manual_seed(0);
  at::NoGradGuard no_grad;  // parameters require grad: without the guard the libtorch ops run
  for (auto scale : {RMSNorm::Scale::Weight, RMSNorm::Scale::WeightThenCast, RMSNorm::Scale::OnePlusWeight})
    for (auto xt : {at::kFloat, at::kBFloat16})
      for (auto wt : {at::kFloat, at::kBFloat16})
        for (int64_t dim : {2048, 37, 5}) {  // a decode row; tails after 8-lane steps; under 8 lanes
          SCOPED_TRACE(::testing::Message() << "scale " << static_cast<int>(scale) << " x " << xt << " w " << wt
                                            << " dim " << dim);
          RMSNorm rms(dim, 1e-5, "LlamaRMSNorm", at::TensorOptions().dtype(wt), scale);
          rms.weight.copy_(at::randn({dim}) * 0.5 + (scale == RMSNorm::Scale::OnePlusWeight ? 0.0 : 1.0));
          // [3, 2, dim] with the leading dims transposed: rows at strides the kernel walks itself
          const at::Tensor x = (at::randn({2, 3, dim}) * 3.0).to(xt).transpose(0, 1);
          const at::Tensor y = rms(x);
          const at::Tensor expected = rms_reference(x, rms.weight, 1e-5, scale);
          ASSERT_EQ(y.scalar_type(), expected.scalar_type());
          if (xt == at::kFloat) {
            EXPECT_TRUE(flex_test::close(y, expected, 1e-5, 1e-6));
          } else {
            // bf16 x: within one bf16 unit in the last place of the float64
            // value rounded at the same points, and the same bits nearly
            // everywhere (float32 arithmetic may tip a rounding; a misplaced
            // cast shows in many elements).
            EXPECT_TRUE(flex_test::close(y, expected, 1.0 / 128, 1e-6));
            const double same = y.eq(expected).to(at::kDouble).mean().item<double>();
            EXPECT_GE(same, 0.97) << "share of elements bit-equal to the float64 reference";
          }
          // The libtorch op chain RMSNorm ran before the kernel: the same bits
          // (the mean's sum too, added in libtorch's order).
          const at::Tensor h = x.to(at::kFloat);
          const at::Tensor n = h * at::rsqrt(h.pow(2).mean(-1, true) + 1e-5);
          const at::Tensor ops = scale == RMSNorm::Scale::WeightThenCast ? (rms.weight * n).to(xt)
                                 : scale == RMSNorm::Scale::OnePlusWeight
                                     ? (n * (rms.weight.to(at::kFloat) + 1.0)).to(xt)
                                     : rms.weight * n.to(xt);
          EXPECT_TRUE(flex_test::equal(y, ops));
        }
}

TEST(Layers, FusedRmsNormSameBitsForOneAndTwoThreadsAndGradientsKeepTheOps) {
  at::manual_seed(1);
  RMSNorm rms(256, 1e-6);
  rms.weight.data().copy_(at::randn({256}));
  const at::Tensor x = at::randn({4, 64, 256});  // 256 rows: split among threads
  at::Tensor one, two;
  {
    at::NoGradGuard no_grad;
    {
      flex_test::ThreadsGuard threads(1);
      one = rms(x);
    }
    flex_test::ThreadsGuard threads(2);
    two = rms(x);
  }
  EXPECT_TRUE(flex_test::equal(one, two));
  // With a graph to record (x requires grad): the libtorch ops, whose
  // gradient matches the float64 formula's.
  const at::Tensor xg = x.narrow(1, 0, 4).clone().requires_grad_(true);
  const at::Tensor y = rms(xg);
  ASSERT_TRUE(y.requires_grad());
  y.sum().backward();
  const at::Tensor xd = x.narrow(1, 0, 4).to(at::kDouble).requires_grad_(true);
  (rms.weight.detach().to(at::kDouble) * xd / at::sqrt(xd.pow(2).mean(-1, true) + 1e-6)).sum().backward();
  EXPECT_TRUE(flex_test::close(xg.grad(), xd.grad().to(at::kFloat), 1e-4, 1e-5));
  EXPECT_TRUE(flex_test::close(y, one.narrow(1, 0, 4), 1e-5, 1e-6));
}
