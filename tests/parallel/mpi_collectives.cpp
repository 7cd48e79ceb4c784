// One collective per operation and dtype across real ranks, each compared
// with the value computed in one process from every rank's input.
#include <flex/parallel/communicator.h>

#include <gtest/gtest.h>

#include "mpi_util.h"
#include "test_util.h"

using namespace flex;
using flex_test::all_comm_dtypes;
using flex_test::rank_tensor;
using flex_test::world;

namespace {
// Every rank's input stacked, reduced in double, cast back (exact: small ints).
at::Tensor expected_reduce(ReduceOp op, at::IntArrayRef shape, at::ScalarType dt, int n) {
  std::vector<at::Tensor> all;
  for (int r = 0; r < n; ++r) all.push_back(rank_tensor(r, shape, dt).to(at::kDouble));
  at::Tensor s = at::stack(all);
  at::Tensor red = op == ReduceOp::Sum ? s.sum(0) : op == ReduceOp::Max ? std::get<0>(s.max(0)) : std::get<0>(s.min(0));
  return red.to(dt);
}
}  // namespace

TEST(Collectives, Broadcast) {
  auto w = world();
  const int root = w->size() - 1;
  for (auto dt : all_comm_dtypes()) {
    at::Tensor t = w->rank() == root ? rank_tensor(root, {3, 4}, dt) : at::Tensor();
    w->broadcast(t, root);
    EXPECT_TRUE(flex_test::equal(t, rank_tensor(root, {3, 4}, dt))) << c10::toString(dt);
    at::Tensor u = w->rank() == 0 ? rank_tensor(0, {5}, dt) : at::zeros({5}, dt);  // preallocated
    w->broadcast(u, 0);
    EXPECT_TRUE(flex_test::equal(u, rank_tensor(0, {5}, dt))) << c10::toString(dt);
  }
}

TEST(Collectives, SendRecvRing) {
  auto w = world();
  const int n = w->size(), r = w->rank();
  for (auto dt : all_comm_dtypes()) {
    // Even ranks send first so the ring cannot deadlock even with synchronous sends.
    const at::Tensor mine = rank_tensor(r, {2, r + 1}, dt);
    at::Tensor got;
    if (r % 2 == 0) {
      w->send(mine, (r + 1) % n, 3);
      got = w->recv((r + n - 1) % n, 3);
    } else {
      got = w->recv((r + n - 1) % n, 3);
      w->send(mine, (r + 1) % n, 3);
    }
    const int from = (r + n - 1) % n;
    EXPECT_TRUE(flex_test::equal(got, rank_tensor(from, {2, from + 1}, dt))) << c10::toString(dt);
  }
}

TEST(Collectives, GatherWithDifferentShapes) {
  auto w = world();
  const int root = 1 % w->size();
  for (auto dt : all_comm_dtypes()) {
    auto got = w->gather(rank_tensor(w->rank(), {w->rank() + 1, 3}, dt), root);
    if (w->rank() != root) {
      EXPECT_TRUE(got.empty());
      continue;
    }
    ASSERT_EQ(static_cast<int>(got.size()), w->size());
    for (int r = 0; r < w->size(); ++r) {
      EXPECT_TRUE(flex_test::equal(got[r], rank_tensor(r, {r + 1, 3}, dt))) << c10::toString(dt) << " rank " << r;
    }
  }
}

TEST(Collectives, AllGather) {
  auto w = world();
  for (auto dt : all_comm_dtypes()) {
    auto got = w->all_gather(rank_tensor(w->rank(), {2, 2}, dt));
    ASSERT_EQ(static_cast<int>(got.size()), w->size());
    for (int r = 0; r < w->size(); ++r)
      EXPECT_TRUE(flex_test::equal(got[r], rank_tensor(r, {2, 2}, dt))) << c10::toString(dt);
  }
}

TEST(Collectives, AllReduceSumMaxMin) {
  auto w = world();
  for (auto dt : all_comm_dtypes()) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min}) {
      at::Tensor t = rank_tensor(w->rank(), {4, 5}, dt);
      w->all_reduce(t, op);
      EXPECT_EQ(t.scalar_type(), dt);
      EXPECT_TRUE(flex_test::equal(t, expected_reduce(op, {4, 5}, dt, w->size())))
          << c10::toString(dt) << " " << to_string(op);
    }
  }
}

TEST(Collectives, AllReduceRandomFloats) {
  auto w = world();
  std::vector<at::Tensor> all;
  for (int r = 0; r < w->size(); ++r) {
    at::manual_seed(100 + r);
    all.push_back(at::randn({64, 33}));
  }
  at::Tensor t = all[w->rank()].clone();
  w->all_reduce(t);
  EXPECT_TRUE(flex_test::close(t, at::stack(all).sum(0), 1e-5, 1e-6));
}

TEST(Collectives, Reduce) {
  auto w = world();
  for (auto dt : all_comm_dtypes()) {
    at::Tensor got = w->reduce(rank_tensor(w->rank(), {6}, dt), 0, ReduceOp::Sum);
    if (w->rank() == 0) {
      EXPECT_TRUE(flex_test::equal(got, expected_reduce(ReduceOp::Sum, {6}, dt, w->size()))) << c10::toString(dt);
    } else {
      EXPECT_FALSE(got.defined());
    }
  }
}

TEST(Collectives, ReduceScatter) {
  auto w = world();
  const int n = w->size();
  for (auto dt : all_comm_dtypes()) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Min}) {
      at::Tensor got = w->reduce_scatter(rank_tensor(w->rank(), {2 * n, 3}, dt), op);
      at::Tensor expect = expected_reduce(op, {2 * n, 3}, dt, n).chunk(n, 0)[w->rank()];
      EXPECT_TRUE(flex_test::equal(got, expect)) << c10::toString(dt) << " " << to_string(op);
    }
  }
  EXPECT_THROW(w->reduce_scatter(at::zeros({n + 1}), ReduceOp::Sum), ShapeError);
}

TEST(Collectives, SplitByColorAndKey) {
  auto w = world();
  const int r = w->rank(), n = w->size();
  // Odd and even ranks, each group ordered by descending world rank.
  auto sub = w->split(r % 2, -r, "parity");
  ASSERT_TRUE(sub);
  std::vector<int> members;
  for (int q = n - 1; q >= 0; --q)
    if (q % 2 == r % 2) members.push_back(q);
  EXPECT_EQ(sub->size(), static_cast<int>(members.size()));
  auto ids = sub->all_gather(at::tensor({r}, at::kInt));
  for (size_t i = 0; i < members.size(); ++i) EXPECT_EQ(ids[i].item<int>(), members[i]);
  EXPECT_EQ(sub->name(), "parity");
  // Only rank 0 asks for a group.
  auto solo = w->split(r == 0 ? 0 : -1, 0, "solo");
  EXPECT_EQ(solo != nullptr, r == 0);
}

TEST(Collectives, CreateGroupFromList) {
  auto w = world();
  const int n = w->size(), r = w->rank();
  auto g = w->create_group({n - 1, 0}, "ends");
  if (r == n - 1 || r == 0) {
    ASSERT_TRUE(g);
    EXPECT_EQ(g->rank(), r == n - 1 ? 0 : 1);
    at::Tensor t = at::tensor({r + 1.0});
    g->all_reduce(t);
    EXPECT_EQ(t.item<double>(), n + 1.0);
  } else {
    EXPECT_EQ(g, nullptr);
  }
  // Ranks passing different lists: the same ConfigError everywhere.
  EXPECT_THROW(w->create_group(r == 0 ? std::vector<int>{0} : std::vector<int>{1}, "bad"), ConfigError);
}

TEST(Collectives, MismatchesRaiseTheSameErrorEverywhere) {
  auto w = world();
  at::Tensor t = at::ones({w->rank() == 0 ? 2 : 3});
  try {
    w->all_reduce(t);
    ADD_FAILURE() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 passed all_reduce(Float[2], sum)"), std::string::npos) << e.what();
  }
  // Different operations on different ranks.
  try {
    if (w->rank() == 0) {
      w->barrier();
    } else {
      at::Tensor u = at::ones({2});
      w->all_reduce(u);
    }
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("collective mismatch"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 0 called barrier()"), std::string::npos) << e.what();
  }
  // A broadcast into a preallocated tensor of the wrong shape.
  at::Tensor b = w->rank() == 0 ? at::ones({4}) : at::zeros({5});
  EXPECT_THROW(w->broadcast(b, 0), ShapeError);
  // The communicator is still in step after validation errors.
  at::Tensor ok = at::ones({2});
  w->all_reduce(ok);
  EXPECT_TRUE(flex_test::equal(ok, at::full({2}, static_cast<double>(w->size()))));
}
