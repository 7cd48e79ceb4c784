// Tensor-parallel layers, single process: build every rank's module, load its
// slice of whole weights, combine the local results by hand, and compare with
// the plain computation on the whole weights.
#include <flex/hooks/nn.h>
#include <flex/parallel/local_communicator.h>
#include <flex/parallel/tp_layers.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "sim_comm.h"
#include "test_util.h"

using namespace flex;
using flex_test::RankOnlyComm;

namespace {
std::shared_ptr<Communicator> sim(int r, int n) { return std::make_shared<RankOnlyComm>(r, n); }
}  // namespace

TEST(ColumnParallel, PiecesConcatenateToLinear) {
  const at::Tensor W = at::randn({12, 5}), b = at::randn({12}), x = at::randn({2, 3, 5});
  const at::Tensor expect = at::linear(x, W, b);
  for (int n : {1, 2, 3, 4}) {
    std::vector<at::Tensor> outs;
    for (int r = 0; r < n; ++r) {
      ColumnParallelLinear m(5, 12, sim(r, n));
      m.load_shard("weight", W);
      m.load_shard("bias", b);
      EXPECT_TRUE(flex_test::equal(m.weight, W.chunk(n, 0)[r]));
      outs.push_back(m.compute_local(x));
    }
    EXPECT_TRUE(flex_test::close(at::cat(outs, -1), expect, 1e-5, 1e-6)) << n;
  }
}

// GPT-2 c_attn: Conv1D layout (in, 3E), fused [q|k|v], split by heads.
TEST(ColumnParallel, FusedConv1dQkv) {
  const int64_t E = 8, hd = 2;
  const at::Tensor W = at::randn({E, 3 * E}), b = at::randn({3 * E}), x = at::randn({2, 4, E});
  const at::Tensor expect = at::addmm(b, x.reshape({-1, E}), W).view({2, 4, 3 * E});
  const int n = 2;
  ColumnParallelLinear::Options o;
  o.blocks = {E, E, E};
  o.unit = hd;
  o.conv1d_layout = true;
  o.class_name = "Conv1D";
  std::vector<at::Tensor> outs;
  ModuleSharding sh;
  for (int r = 0; r < n; ++r) {
    ColumnParallelLinear m(E, 3 * E, sim(r, n), o);
    EXPECT_EQ(m.class_name(), "Conv1D");
    EXPECT_EQ(m.weight.sizes(), (std::vector<int64_t>{E, 3 * E / n}));
    m.load_shard("weight", W);
    m.load_shard("bias", b);
    outs.push_back(m.compute_local(x));
    sh = m.sharding();
  }
  EXPECT_EQ(sh.output, ShardSpec::fused(-1, {E, E, E}, hd));
  EXPECT_EQ(sh.params.at("weight"), ShardSpec::fused(1, {E, E, E}, hd));
  const at::Tensor whole = assemble(sh.output, outs);
  EXPECT_TRUE(flex_test::close(whole, expect, 1e-5, 1e-6));
  // q, k and v each equal the plain projection's.
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(flex_test::close(whole.narrow(-1, i * E, E), expect.narrow(-1, i * E, E), 1e-5, 1e-6));
  }
}

TEST(RowParallel, PartialSumsAddToLinear) {
  const at::Tensor W = at::randn({7, 12}), b = at::randn({7}), x = at::randn({3, 12});
  const at::Tensor expect = at::linear(x, W, b);
  for (int n : {1, 2, 3, 4}) {
    std::vector<at::Tensor> partial;
    for (int r = 0; r < n; ++r) {
      RowParallelLinear m(12, 7, sim(r, n));
      m.load_shard("weight", W);
      m.load_shard("bias", b);
      EXPECT_TRUE(flex_test::equal(m.bias, b));
      partial.push_back(m.compute_local(x.chunk(n, -1)[r]));
      EXPECT_EQ(m.sharding().params.at("bias"), ShardSpec::replicated());
      EXPECT_EQ(m.sharding().input, ShardSpec::split(-1));
    }
    at::Tensor sum = partial[0];
    for (int r = 1; r < n; ++r) sum = sum + partial[r];
    EXPECT_TRUE(flex_test::close(sum, expect, 1e-5, 1e-5)) << n;
  }
}

TEST(RowParallel, Conv1dLayoutUnevenHeads) {
  // 5 heads of 2 over 2 ranks: rank 0 gets input features [0, 6), rank 1 [6, 10).
  const at::Tensor W = at::randn({10, 4}), b = at::randn({4}), x = at::randn({3, 10});
  const at::Tensor expect = at::addmm(b, x, W);
  RowParallelLinear::Options o;
  o.unit = 2;
  o.conv1d_layout = true;
  RowParallelLinear m0(10, 4, sim(0, 2), o), m1(10, 4, sim(1, 2), o);
  EXPECT_EQ(m0.local_in_features, 6);
  EXPECT_EQ(m1.local_in_features, 4);
  for (auto* m : {&m0, &m1}) {
    m->load_shard("weight", W);
    m->load_shard("bias", b);
  }
  const at::Tensor y = m0.compute_local(x.narrow(1, 0, 6)) + m1.compute_local(x.narrow(1, 6, 4));
  EXPECT_TRUE(flex_test::close(y, expect, 1e-5, 1e-5));
  EXPECT_THROW(m1.compute_local(x), ShapeError);
}

TEST(VocabParallel, PartialLookupsAddToEmbedding) {
  const at::Tensor W = at::randn({10, 4});
  const at::Tensor ids = at::tensor({0, 9, 3, 4, 7, 2}, at::kLong).view({2, 3});
  const at::Tensor expect = at::embedding(W, ids);
  for (int n : {1, 2, 3, 4}) {
    at::Tensor sum = at::zeros({2, 3, 4});
    for (int r = 0; r < n; ++r) {
      VocabParallelEmbedding m(10, 4, sim(r, n));
      m.load_shard("weight", W);
      sum = sum + m.compute_local(ids);
    }
    EXPECT_TRUE(flex_test::equal(sum, expect)) << n;
  }
  VocabParallelEmbedding m(10, 4, sim(1, 3));
  EXPECT_EQ(m.vocab_start, 4);  // array_split(10, 3): 4, 3, 3
  EXPECT_EQ(m.vocab_end, 7);
  try {
    m.compute_local(at::tensor({3, 10}, at::kLong));
    FAIL();
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("token id 10"), std::string::npos) << e.what();
  }
}

// A ColumnParallel -> RowParallel MLP over a size-1 local group runs the real
// forward (communication included) and backward, equal to the plain MLP.
TEST(TensorParallel, MlpForwardBackwardOnLocalGroup) {
  auto tp = std::make_shared<LocalCommunicator>("tp");
  const at::Tensor W1 = at::randn({16, 8}), b1 = at::randn({16}), W2 = at::randn({8, 16}), b2 = at::randn({8});
  ColumnParallelLinear up(8, 16, tp);
  RowParallelLinear down(16, 8, tp);
  up.load_shard("weight", W1);
  up.load_shard("bias", b1);
  down.load_shard("weight", W2);
  down.load_shard("bias", b2);
  const at::Tensor x = at::randn({3, 8});
  at::Tensor y = down(at::gelu(up(x)));
  const at::Tensor W1r = W1.clone().requires_grad_(), W2r = W2.clone().requires_grad_();
  at::Tensor ref = at::linear(at::gelu(at::linear(x, W1r, b1)), W2r, b2);
  EXPECT_TRUE(flex_test::close(y, ref, 1e-5, 1e-5));
  y.sum().backward();
  ref.sum().backward();
  EXPECT_TRUE(flex_test::close(up.weight.grad(), W1r.grad(), 1e-5, 1e-5));
  EXPECT_TRUE(flex_test::close(down.weight.grad(), W2r.grad(), 1e-5, 1e-5));
}

TEST(LoadShard, ViewOfWholeAndErrors) {
  const at::Tensor W = at::randn({12, 5});
  ColumnParallelLinear m(5, 12, sim(1, 2));
  m.load_shard("weight", W);
  // Rows 6..11 of the whole, read in place (no copy of the whole).
  EXPECT_EQ(m.weight.data_ptr<float>(), W.data_ptr<float>() + 6 * 5);
  EXPECT_TRUE(m.weight.requires_grad());
  try {
    m.load_shard("weight", at::randn({12, 4}));
    FAIL();
  } catch (const ShapeError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("[12, 4]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[12, 5]"), std::string::npos) << msg;
  }
  EXPECT_THROW(m.load_shard("scale", W), NotFoundError);
  // The parameter keeps its dtype.
  ColumnParallelLinear h(5, 12, sim(0, 2), [] {
    ColumnParallelLinear::Options o;
    o.tensor_options = at::TensorOptions().dtype(at::kHalf);
    return o;
  }());
  h.load_shard("weight", W);
  EXPECT_EQ(h.weight.scalar_type(), at::kHalf);
  EXPECT_TRUE(flex_test::close(h.weight.to(at::kFloat), W.narrow(0, 0, 6), 1e-2, 1e-2));
}

TEST(LoadShard, NullGroupIsConfigError) {
  EXPECT_THROW(ColumnParallelLinear(4, 4, nullptr), ConfigError);
  EXPECT_THROW(VocabParallelEmbedding(4, 4, nullptr), ConfigError);
}
