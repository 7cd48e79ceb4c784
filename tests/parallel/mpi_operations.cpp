// Accelerate's nested-value operations across real ranks (run with 2 and 3),
// each compared with the value built in one process from every rank's input;
// mismatched structures or shapes are a typed error on every rank.
#include <flex/hooks/errors.h>
#include <flex/parallel/operations.h>

#include <gtest/gtest.h>

#include "mpi_util.h"
#include "test_util.h"

using namespace flex;
using flex_test::all_comm_dtypes;
using flex_test::rank_tensor;
using flex_test::world;

namespace {

/// {"a": [2, 3] tensor, "b": ([4] tensor, 0-d tensor), "n": 7} of rank r.
Value nested(int r, at::ScalarType dt) {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("a", rank_tensor(r, {2, 3}, dt));
  d.insert("b", c10::ivalue::Tuple::create({rank_tensor(r, {4}, dt), rank_tensor(r, {1}, dt).reshape({})}));
  d.insert("n", int64_t(7));
  return d;
}

at::Tensor leaf(const Value& v, const std::string& key, int index = -1) {
  const Value x = v.toGenericDict().at(key);
  return index < 0 ? x.toTensor() : x.toTupleRef().elements()[index].toTensor();
}

}  // namespace

TEST(Operations, GatherConcatenatesEveryRankOnDim0) {
  auto w = world();
  const int n = w->size();
  for (auto dt : all_comm_dtypes()) {
    const Value got = gather(*w, nested(w->rank(), dt));
    std::vector<at::Tensor> a, b0, b1;
    for (int r = 0; r < n; ++r) {
      a.push_back(rank_tensor(r, {2, 3}, dt));
      b0.push_back(rank_tensor(r, {4}, dt));
      b1.push_back(rank_tensor(r, {1}, dt));
    }
    EXPECT_TRUE(flex_test::equal(leaf(got, "a"), at::cat(a))) << c10::toString(dt);
    EXPECT_TRUE(flex_test::equal(leaf(got, "b", 0), at::cat(b0))) << c10::toString(dt);
    EXPECT_TRUE(flex_test::equal(leaf(got, "b", 1), at::cat(b1))) << c10::toString(dt);  // 0-d -> [n]
    EXPECT_EQ(got.toGenericDict().at("n").toInt(), 7);
  }
}

TEST(Operations, UnevenShapesNeedPaddingFirst) {
  auto w = world();
  const int n = w->size(), me = w->rank();
  const at::Tensor mine = rank_tensor(me, {me + 1, 2}, at::kFloat);  // rank r has r + 1 rows
  EXPECT_THROW(gather(*w, Value(mine)), ShapeError);
  for (bool first : {false, true}) {
    const Value padded = pad_across_processes(*w, Value(mine), 0, -1, first);
    ASSERT_EQ(padded.toTensor().size(0), n);
    std::vector<at::Tensor> expected;
    for (int r = 0; r < n; ++r) {
      at::Tensor e = at::full({n, 2}, -1.0f);
      e.narrow(0, first ? n - (r + 1) : 0, r + 1).copy_(rank_tensor(r, {r + 1, 2}, at::kFloat));
      expected.push_back(e);
    }
    EXPECT_TRUE(flex_test::equal(gather(*w, padded).toTensor(), at::cat(expected))) << "pad_first " << first;
  }
  // Along dim 1, and a 1-d tensor left alone when dim 1 does not exist.
  const Value two = c10::ivalue::Tuple::create({rank_tensor(me, {2, me + 2}, at::kLong), rank_tensor(me, {3}, at::kLong)});
  const Value p = pad_across_processes(*w, two, 1, 9);
  EXPECT_EQ(p.toTupleRef().elements()[0].toTensor().size(1), n + 1);
  EXPECT_TRUE(p.toTupleRef().elements()[0].toTensor().narrow(1, me + 2, n - 1 - me).eq(9).all().item<bool>());
  EXPECT_TRUE(flex_test::equal(p.toTupleRef().elements()[1].toTensor(), rank_tensor(me, {3}, at::kLong)));
}

TEST(Operations, MismatchedStructuresFailOnEveryRank) {
  auto w = world();
  const at::Tensor t = at::ones({2});
  // Rank 0 passes a tuple of one tensor, the others a list of two.
  const Value v = w->rank() == 0 ? Value(c10::ivalue::Tuple::create({t})) : Value(c10::List<at::Tensor>({t, t}));
  EXPECT_THROW(gather(*w, v), ConfigError);
  EXPECT_THROW(broadcast(*w, v), ConfigError);
  EXPECT_THROW(reduce(*w, v), ConfigError);
  EXPECT_THROW(pad_across_processes(*w, v), ConfigError);
  // Another dtype on one rank.
  EXPECT_THROW(reduce(*w, Value(w->rank() == 0 ? at::ones({2}) : at::ones({2}, at::kDouble))), ConfigError);
  // The communicator is still usable afterwards.
  EXPECT_TRUE(flex_test::equal(gather(*w, Value(t)).toTensor(), at::ones({2 * w->size()})));
}

TEST(Operations, BroadcastFromTheLastRank) {
  auto w = world();
  const int root = w->size() - 1;
  for (auto dt : all_comm_dtypes()) {
    const Value got = broadcast(*w, nested(w->rank(), dt), root);
    EXPECT_TRUE(flex_test::equal(leaf(got, "a"), rank_tensor(root, {2, 3}, dt))) << c10::toString(dt);
    EXPECT_TRUE(flex_test::equal(leaf(got, "b", 1), rank_tensor(root, {1}, dt).reshape({}))) << c10::toString(dt);
  }
}

TEST(Operations, ObjectsTravelPickled) {
  auto w = world();
  const int n = w->size(), me = w->rank();
  std::vector<Value> objs(3);
  if (me == 1) objs = {Value(int64_t(42)), Value(std::string("from one")), Value(rank_tensor(1, {2, 2}, at::kHalf))};
  broadcast_object_list(*w, objs, 1);
  ASSERT_EQ(objs.size(), 3u);
  EXPECT_EQ(objs[0].toInt(), 42);
  EXPECT_EQ(objs[1].toStringRef(), "from one");
  EXPECT_TRUE(flex_test::equal(objs[2].toTensor(), rank_tensor(1, {2, 2}, at::kHalf)));

  // A list is flattened; anything else is one entry per rank.
  c10::impl::GenericList pair(c10::AnyType::get());
  pair.push_back(int64_t(me));
  pair.push_back("rank " + std::to_string(me));
  const auto flat = gather_object(*w, pair);
  ASSERT_EQ(flat.size(), static_cast<size_t>(2 * n));
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(flat[2 * r].toInt(), r);
    EXPECT_EQ(flat[2 * r + 1].toStringRef(), "rank " + std::to_string(r));
  }
  const auto each = gather_object(*w, Value(rank_tensor(me, {me + 1}, at::kLong)));  // uneven shapes are fine here
  ASSERT_EQ(each.size(), static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) EXPECT_TRUE(flex_test::equal(each[r].toTensor(), rank_tensor(r, {r + 1}, at::kLong)));
}

TEST(Operations, ReduceSumAndMean) {
  auto w = world();
  const int n = w->size();
  for (auto dt : all_comm_dtypes()) {
    if (dt == at::kBool) continue;  // sum of bools is a logical or (Communicator::all_reduce)
    at::Tensor sum = at::zeros({3, 2}, at::kDouble);
    for (int r = 0; r < n; ++r) sum += rank_tensor(r, {3, 2}, dt).to(at::kDouble);
    const Value v(rank_tensor(w->rank(), {3, 2}, dt));
    at::Tensor got = reduce(*w, v, Reduction::Sum).toTensor();
    EXPECT_EQ(got.scalar_type(), dt);
    EXPECT_TRUE(flex_test::equal(got.to(at::kDouble), sum)) << c10::toString(dt);
    if (at::isFloatingType(dt)) {
      got = reduce(*w, v, Reduction::Sum, 0.5).toTensor();
      EXPECT_TRUE(flex_test::close(got.to(at::kDouble), sum * 0.5)) << c10::toString(dt);
      got = reduce(*w, v, Reduction::Mean).toTensor();
      const double tol = dt == at::kBFloat16 ? 2e-2 : dt == at::kHalf ? 2e-3 : 1e-6;
      EXPECT_TRUE(flex_test::close(got.to(at::kDouble), sum / n, tol, tol)) << c10::toString(dt);
    } else {
      EXPECT_THROW(reduce(*w, v, Reduction::Mean), ConfigError) << c10::toString(dt);
      EXPECT_THROW(reduce(*w, v, Reduction::Sum, 0.5), ConfigError) << c10::toString(dt);
    }
    EXPECT_TRUE(flex_test::equal(reduce(*w, v, Reduction::None).toTensor(), v.toTensor()));
  }
}

TEST(Operations, LocalHelpers) {
  EXPECT_THROW(concatenate({nested(0, at::kFloat), nested(1, at::kFloat)}), ShapeError);  // its 0-d leaf
  auto pair = [](int r) {
    c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
    d.insert("a", rank_tensor(r, {2, 3}, at::kFloat));
    d.insert("b", c10::ivalue::Tuple::create({rank_tensor(r, {4, 1}, at::kFloat)}));
    return Value(d);
  };
  const Value a = pair(0), b = pair(1);
  const Value c = concatenate({a, b}, 0);
  EXPECT_TRUE(flex_test::equal(leaf(c, "b", 0), at::cat({leaf(a, "b", 0), leaf(b, "b", 0)})));
  EXPECT_TRUE(flex_test::equal(leaf(c, "a"), at::cat({leaf(a, "a"), leaf(b, "a")})));
  EXPECT_THROW(concatenate({a, Value(at::ones({1}))}), ConfigError);
  const Value s = slice_tensors(c, 1, 3);
  EXPECT_TRUE(flex_test::equal(leaf(s, "a"), leaf(c, "a").narrow(0, 1, 2)));
  const Value h = convert_to_fp32(nested(2, at::kBFloat16));
  EXPECT_EQ(leaf(h, "a").scalar_type(), at::kFloat);
  EXPECT_TRUE(flex_test::equal(leaf(h, "a"), rank_tensor(2, {2, 3}, at::kFloat)));
  EXPECT_EQ(leaf(convert_to_fp32(nested(2, at::kLong)), "a").scalar_type(), at::kLong);
  const auto j = listify(c10::ivalue::Tuple::create({Value(at::arange(4, at::kLong).view({2, 2})), Value(1.5)}));
  EXPECT_EQ(j.dump(), "[[[0,1],[2,3]],1.5]");
  // recursively_apply with another leaf test, and the error for other leaves.
  const Value ints = c10::ivalue::Tuple::create({Value(int64_t(2)), Value(at::ones({1}))});
  const Value doubled = recursively_apply([](const Value& v) { return Value(v.toInt() * 2); }, ints,
                                          [](const Value& v) { return v.isInt(); });
  EXPECT_EQ(doubled.toTupleRef().elements()[0].toInt(), 4);
  EXPECT_TRUE(doubled.toTupleRef().elements()[1].isTensor());
  EXPECT_THROW(recursively_apply([](const Value& v) { return v; }, ints, {}, true), ConfigError);
}
