// Tensor-parallel layers across real ranks: every rank loads its slice of the
// same whole weights and the results equal the single-process computation.
#include <flex/parallel/device_mesh.h>
#include <flex/parallel/tp_layers.h>

#include <gtest/gtest.h>

#include "mpi_util.h"
#include "test_util.h"

using namespace flex;
using flex_test::world;

namespace {
// The same tensors on every rank (CPU generator, fixed seed).
at::Tensor seeded(uint64_t seed, at::IntArrayRef shape) {
  at::manual_seed(seed);
  return at::randn(shape);
}
}  // namespace

TEST(TensorParallel, ColumnGatherAndGatherWhole) {
  auto tp = world();
  const at::Tensor W = seeded(1, {12, 6}), b = seeded(2, {12}), x = seeded(3, {2, 3, 6});
  const at::Tensor expect = at::linear(x, W, b);
  ColumnParallelLinear local(6, 12, tp);
  local.load_shard("weight", W);
  local.load_shard("bias", b);
  const at::Tensor piece = local(x);
  EXPECT_TRUE(flex_test::close(piece, shard_of(ShardSpec::split(-1), expect, tp->rank(), tp->size()), 1e-5, 1e-6));
  at::Tensor whole = gather_whole(local.sharding().output, piece, *tp, 0);
  if (tp->rank() == 0) {
    EXPECT_TRUE(flex_test::close(whole, expect, 1e-5, 1e-6));
  } else {
    EXPECT_FALSE(whole.defined());
  }
  ColumnParallelLinear::Options o;
  o.gather_output = true;
  ColumnParallelLinear gathered(6, 12, tp, o);
  gathered.load_shard("weight", W);
  gathered.load_shard("bias", b);
  EXPECT_TRUE(flex_test::close(gathered(x), expect, 1e-5, 1e-6));
}

// GPT-2's c_attn (Conv1D layout, fused [q|k|v], split by heads): gathered on
// rank 0 it is the plain projection, q, k and v in place.
TEST(TensorParallel, FusedQkvGathersDeinterleaved) {
  auto tp = world();
  const int64_t E = 16, hd = 4;  // 4 heads
  const at::Tensor W = seeded(4, {E, 3 * E}), b = seeded(5, {3 * E}), x = seeded(6, {2, 5, E});
  const at::Tensor expect = at::addmm(b, x.reshape({-1, E}), W).view({2, 5, 3 * E});
  ColumnParallelLinear::Options o;
  o.blocks = {E, E, E};
  o.unit = hd;
  o.conv1d_layout = true;
  ColumnParallelLinear attn(E, 3 * E, tp, o);
  attn.load_shard("weight", W);
  attn.load_shard("bias", b);
  const at::Tensor whole = all_gather_whole(attn.sharding().output, attn(x), *tp);
  EXPECT_TRUE(flex_test::close(whole, expect, 1e-5, 1e-6));
}

TEST(TensorParallel, ColumnRowMlpForwardAndBackward) {
  auto tp = world();
  const at::Tensor W1 = seeded(7, {16, 8}), b1 = seeded(8, {16}), W2 = seeded(9, {8, 16}), b2 = seeded(10, {8});
  const at::Tensor x = seeded(11, {3, 8});
  ColumnParallelLinear up(8, 16, tp);
  RowParallelLinear down(16, 8, tp);
  up.load_shard("weight", W1);
  up.load_shard("bias", b1);
  down.load_shard("weight", W2);
  down.load_shard("bias", b2);
  at::Tensor y = down(at::gelu(up(x)));
  const at::Tensor W1r = W1.clone().requires_grad_(), W2r = W2.clone().requires_grad_();
  at::Tensor ref = at::linear(at::gelu(at::linear(x, W1r, b1)), W2r, b2);
  EXPECT_TRUE(flex_test::close(y, ref, 1e-5, 1e-5));
  y.sum().backward();
  ref.sum().backward();
  // Each rank's weight gradient is its slice of the whole gradient.
  const int r = tp->rank(), n = tp->size();
  EXPECT_TRUE(flex_test::close(up.weight.grad(), shard_of(ShardSpec::split(0), W1r.grad(), r, n), 1e-5, 1e-5));
  EXPECT_TRUE(flex_test::close(down.weight.grad(), shard_of(ShardSpec::split(1), W2r.grad(), r, n), 1e-5, 1e-5));
  EXPECT_TRUE(flex_test::close(down.bias.grad(), at::ones({3, 8}).sum(0)));
}

// A loss computed identically on every rank backpropagates through the
// autograd-aware collectives (tp_autograd.h) to the single-process gradients:
// whole input gradients on every rank, each rank's slice of the weights'.
TEST(TensorParallel, AutogradGivesSingleProcessInputAndParameterGradients) {
  auto tp = world();
  const int r = tp->rank(), n = tp->size();
  const at::Tensor W1 = seeded(30, {16, 8}), b1 = seeded(31, {16}), W2 = seeded(32, {8, 16}), b2 = seeded(33, {8});
  const at::Tensor x0 = seeded(34, {3, 8}), w = seeded(35, {3, 8});
  // Column -> row MLP: the input gradient needs the column layer's all-reduce.
  ColumnParallelLinear up(8, 16, tp);
  RowParallelLinear down(16, 8, tp);
  up.load_shard("weight", W1);
  up.load_shard("bias", b1);
  down.load_shard("weight", W2);
  down.load_shard("bias", b2);
  const at::Tensor x = x0.clone().requires_grad_(), xr = x0.clone().requires_grad_();
  const at::Tensor W1r = W1.clone().requires_grad_(), b1r = b1.clone().requires_grad_();
  (down(at::gelu(up(x))) * w).sum().backward();
  (at::linear(at::gelu(at::linear(xr, W1r, b1r)), W2, b2) * w).sum().backward();
  EXPECT_TRUE(flex_test::close(x.grad(), xr.grad(), 1e-5, 1e-5)) << "rank " << r;
  EXPECT_TRUE(flex_test::close(up.weight.grad(), shard_of(ShardSpec::split(0), W1r.grad(), r, n), 1e-5, 1e-5));
  EXPECT_TRUE(flex_test::close(up.bias.grad(), shard_of(ShardSpec::split(0), b1r.grad(), r, n), 1e-5, 1e-5));

  // Gathered column output (the logits head): backward takes this rank's slice.
  ColumnParallelLinear::Options o;
  o.gather_output = true;
  ColumnParallelLinear head(8, 16, tp, o);
  head.load_shard("weight", W1);
  head.load_shard("bias", b1);
  const at::Tensor wh = seeded(36, {3, 16});
  const at::Tensor x2 = x0.clone().requires_grad_(), x2r = x0.clone().requires_grad_();
  const at::Tensor W1h = W1.clone().requires_grad_();
  (head(x2).pow(2) * wh).sum().backward();
  (at::linear(x2r, W1h, b1).pow(2) * wh).sum().backward();
  EXPECT_TRUE(flex_test::close(x2.grad(), x2r.grad(), 1e-5, 1e-5)) << "rank " << r;
  EXPECT_TRUE(flex_test::close(head.weight.grad(), shard_of(ShardSpec::split(0), W1h.grad(), r, n), 1e-5, 1e-5));

  // Row layer on a whole input: the input gradient is all-gathered back.
  RowParallelLinear::Options ro;
  ro.input_is_parallel = false;
  RowParallelLinear row(16, 8, tp, ro);
  row.load_shard("weight", W2);
  row.load_shard("bias", b2);
  const at::Tensor z0 = seeded(37, {3, 16});
  const at::Tensor z = z0.clone().requires_grad_(), zr = z0.clone().requires_grad_();
  const at::Tensor W2r = W2.clone().requires_grad_(), b2r = b2.clone().requires_grad_();
  (row(z).tanh() * w).sum().backward();
  (at::linear(zr, W2r, b2r).tanh() * w).sum().backward();
  EXPECT_TRUE(flex_test::close(z.grad(), zr.grad(), 1e-5, 1e-5)) << "rank " << r;
  EXPECT_TRUE(flex_test::close(row.weight.grad(), shard_of(ShardSpec::split(1), W2r.grad(), r, n), 1e-5, 1e-5));
  EXPECT_TRUE(flex_test::close(row.bias.grad(), b2r.grad(), 1e-5, 1e-5));  // the bias is whole on every rank

  // Vocab-parallel embedding: each rank's rows get their part of the gradient.
  const at::Tensor E = seeded(38, {10, 4}), ids = at::tensor({0, 9, 3, 4, 7, 2, 5, 9}, at::kLong).view({2, 4});
  const at::Tensor we = seeded(39, {2, 4, 4});
  VocabParallelEmbedding emb(10, 4, tp);
  emb.load_shard("weight", E);
  const at::Tensor Er = E.clone().requires_grad_();
  (emb(ids).sin() * we).sum().backward();
  (at::embedding(Er, ids).sin() * we).sum().backward();
  EXPECT_TRUE(flex_test::close(emb.weight.grad(), shard_of(ShardSpec::split(0), Er.grad(), r, n), 1e-5, 1e-5));
}

TEST(TensorParallel, RowFromWholeInputAndPartialSums) {
  auto tp = world();
  const at::Tensor W = seeded(12, {5, 12}), b = seeded(13, {5}), x = seeded(14, {4, 12});
  const at::Tensor expect = at::linear(x, W, b);
  RowParallelLinear::Options o;
  o.input_is_parallel = false;
  RowParallelLinear row(12, 5, tp, o);
  row.load_shard("weight", W);
  row.load_shard("bias", b);
  EXPECT_TRUE(flex_test::close(row(x), expect, 1e-5, 1e-5));
  // Without the all-reduce the output is a partial sum; gathering reduces it.
  RowParallelLinear::Options p;
  p.reduce_output = false;
  RowParallelLinear part(12, 5, tp, p);
  part.load_shard("weight", W);
  part.load_shard("bias", b);
  EXPECT_EQ(part.sharding().output, ShardSpec::partial_sum());
  const at::Tensor local = part(shard_of(ShardSpec::split(-1), x, tp->rank(), tp->size()));
  at::Tensor whole = gather_whole(part.sharding().output, local, *tp, tp->size() - 1);
  if (tp->rank() == tp->size() - 1) {
    EXPECT_TRUE(flex_test::close(whole, expect, 1e-5, 1e-5));
  } else {
    EXPECT_FALSE(whole.defined());
  }
}

TEST(TensorParallel, VocabParallelEmbeddingUneven) {
  auto tp = world();
  const at::Tensor W = seeded(15, {10, 4});  // 10 rows over 4 ranks: 3, 3, 2, 2
  const at::Tensor ids = at::tensor({0, 9, 3, 4, 7, 2, 5, 6}, at::kLong).view({2, 4});
  VocabParallelEmbedding emb(10, 4, tp);
  emb.load_shard("weight", W);
  EXPECT_TRUE(flex_test::equal(emb(ids), at::embedding(W, ids)));
  // Every rank rejects an id outside the vocabulary (no rank is left waiting).
  EXPECT_THROW(emb(at::tensor({10}, at::kLong)), ShapeError);
  at::Tensor again = emb(ids);
  EXPECT_TRUE(flex_test::equal(again, at::embedding(W, ids)));
}

// Tensor-parallel layers on the tp groups of a 2-D mesh.
TEST(TensorParallel, OnMeshTpGroups) {
  auto w = world();
  if (w->size() % 2 != 0) GTEST_SKIP();
  DeviceMesh mesh(w, 2, 1, w->size() / 2);
  const at::Tensor W = seeded(16, {6, 8}), b = seeded(17, {6});
  const at::Tensor x = seeded(18 + mesh.dp_rank(), {3, 8});  // a different batch per dp rank
  ColumnParallelLinear::Options o;
  o.gather_output = true;
  ColumnParallelLinear m(8, 6, mesh.tp_group(), o);
  m.load_shard("weight", W);
  m.load_shard("bias", b);
  EXPECT_TRUE(flex_test::close(m(x), at::linear(x, W, b), 1e-5, 1e-6));
}
