// ShardSpec: shard_of / assemble against slicing written out by hand
// (at::chunk, at::narrow, at::cat), single process.
#include <flex/parallel/shard_spec.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "test_util.h"

using namespace flex;

namespace {
std::vector<at::Tensor> shards(const ShardSpec& s, const at::Tensor& whole, int n) {
  std::vector<at::Tensor> out;
  for (int r = 0; r < n; ++r) out.push_back(shard_of(s, whole, r, n));
  return out;
}
}  // namespace

TEST(ShardSpec, EvenSplitIsChunk) {
  const at::Tensor w = at::randn({8, 6});
  for (int n : {1, 2, 4}) {
    auto by_hand = w.chunk(n, 0);
    const auto s = ShardSpec::split(0);
    for (int r = 0; r < n; ++r) EXPECT_TRUE(flex_test::equal(shard_of(s, w, r, n), by_hand[r]));
    EXPECT_TRUE(flex_test::equal(assemble(s, std::vector<at::Tensor>(by_hand.begin(), by_hand.end())), w));
  }
  auto last = w.chunk(3, -1);
  EXPECT_TRUE(flex_test::equal(shard_of(ShardSpec::split(-1), w, 2, 3), last[2]));
}

TEST(ShardSpec, SplitOnDimZeroIsAViewOfTheWhole) {
  const at::Tensor w = at::randn({8, 6});
  at::Tensor p = shard_of(ShardSpec::split(0), w, 1, 2);
  EXPECT_TRUE(p.is_contiguous());
  EXPECT_EQ(p.data_ptr<float>(), w.data_ptr<float>() + 4 * 6);
}

// GPT-2 c_attn: the whole is [q|k|v]; rank r holds [q_r|k_r|v_r].
TEST(ShardSpec, FusedQkvDeinterleaves) {
  const int64_t E = 8;
  const at::Tensor whole = at::randn({2, 3, 3 * E});
  const auto spec = ShardSpec::fused(-1, {E, E, E});
  auto qkv = whole.split(E, -1);
  const int n = 2;
  std::vector<at::Tensor> by_hand;
  for (int r = 0; r < n; ++r) {
    by_hand.push_back(at::cat({qkv[0].chunk(n, -1)[r], qkv[1].chunk(n, -1)[r], qkv[2].chunk(n, -1)[r]}, -1));
    EXPECT_TRUE(flex_test::equal(shard_of(spec, whole, r, n), by_hand[r])) << r;
  }
  EXPECT_TRUE(flex_test::equal(assemble(spec, by_hand), whole));
  // The naive concatenation is what FlexModel/nnsight return: wrong.
  EXPECT_FALSE(at::cat(by_hand, -1).equal(whole));
}

// Llama GQA fused qkv: blocks of unequal size, split by heads of 4.
TEST(ShardSpec, FusedUnequalBlocksWithUnit) {
  const at::Tensor whole = at::randn({5, 16 + 8 + 8});
  const auto spec = ShardSpec::fused(1, {16, 8, 8}, 4);
  const int n = 2;
  std::vector<at::Tensor> by_hand;
  for (int r = 0; r < n; ++r) {
    by_hand.push_back(at::cat({whole.narrow(1, 8 * r, 8), whole.narrow(1, 16 + 4 * r, 4),
                               whole.narrow(1, 24 + 4 * r, 4)}, 1));
    EXPECT_TRUE(flex_test::equal(shard_of(spec, whole, r, n), by_hand[r]));
  }
  EXPECT_TRUE(flex_test::equal(assemble(spec, by_hand), whole));
}

// GPT-NeoX query_key_value: heads of [q k v] (3*head_dim each), ranks hold whole heads.
TEST(ShardSpec, NeoxInterleavedHeads) {
  const int64_t H = 4, hd = 2;
  const at::Tensor whole = at::randn({3, H * 3 * hd});
  const auto spec = ShardSpec::interleaved_heads(-1, 3 * hd);
  const int n = 2;
  const at::Tensor heads = whole.view({3, H, 3 * hd});
  std::vector<at::Tensor> by_hand;
  for (int r = 0; r < n; ++r) {
    by_hand.push_back(heads.narrow(1, r * H / n, H / n).reshape({3, -1}));
    EXPECT_TRUE(flex_test::equal(shard_of(spec, whole, r, n), by_hand[r]));
  }
  const at::Tensor back = assemble(spec, by_hand);
  EXPECT_TRUE(flex_test::equal(back, whole));
  // The queries read back per head are the original ones.
  EXPECT_TRUE(flex_test::equal(back.view({3, H, 3 * hd}).narrow(2, 0, hd), heads.narrow(2, 0, hd)));
  // Splitting a head is refused.
  EXPECT_THROW(shard_of(spec, whole, 0, 8), ShapeError);
}

TEST(ShardSpec, UnevenFollowsArraySplit) {
  const at::Tensor w = at::arange(10, at::kLong);
  const auto s = ShardSpec::split(0);
  // numpy.array_split(arange(10), 3) = [0..3], [4..6], [7..9]
  EXPECT_TRUE(flex_test::equal(shard_of(s, w, 0, 3), at::arange(0, 4, at::kLong)));
  EXPECT_TRUE(flex_test::equal(shard_of(s, w, 1, 3), at::arange(4, 7, at::kLong)));
  EXPECT_TRUE(flex_test::equal(shard_of(s, w, 2, 3), at::arange(7, 10, at::kLong)));
  EXPECT_TRUE(flex_test::equal(assemble(s, shards(s, w, 3)), w));
  // 5 heads of 2 over 2 ranks: 3 heads and 2 heads.
  const auto h = ShardSpec::split(0, 2);
  EXPECT_EQ(shard_of(h, w, 0, 2).size(0), 6);
  EXPECT_EQ(shard_of(h, w, 1, 2).size(0), 4);
  EXPECT_TRUE(flex_test::equal(assemble(h, shards(h, w, 2)), w));
  // Uneven fused blocks.
  const auto f = ShardSpec::fused(0, {6, 4}, 2);
  EXPECT_TRUE(flex_test::equal(assemble(f, shards(f, w, 2)), w));
  EXPECT_TRUE(flex_test::equal(shard_of(f, w, 1, 2), at::tensor({4, 5, 8, 9}, at::kLong)));
}

TEST(ShardSpec, BadSplitsAreShapeErrors) {
  const at::Tensor w = at::randn({6, 3});
  EXPECT_THROW(shard_of(ShardSpec::split(0), w, 0, 8), ShapeError);          // fewer rows than ranks
  EXPECT_THROW(shard_of(ShardSpec::split(0, 4), w, 0, 1), ShapeError);       // 6 is not a multiple of 4
  EXPECT_THROW(shard_of(ShardSpec::fused(0, {3, 2}), w, 0, 1), ShapeError);  // blocks add to 5, not 6
  EXPECT_THROW(shard_of(ShardSpec::split(2), w, 0, 1), ShapeError);          // no dim 2
  // A piece of the wrong size is named by rank.
  auto p = shards(ShardSpec::split(0), w, 2);
  p[0] = p[0].narrow(0, 0, 2);  // 2 + 3 rows: array_split(5, 2) would give rank 0 three
  try {
    assemble(ShardSpec::split(0), p);
    FAIL();
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 holds 2"), std::string::npos) << e.what();
  }
  // Fused blocks fix the whole size, so a short last piece is caught too.
  auto f = shards(ShardSpec::fused(0, {4, 2}), w, 2);
  f[1] = f[1].narrow(0, 0, 2);
  try {
    assemble(ShardSpec::fused(0, {4, 2}), f);
    FAIL();
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 holds 2"), std::string::npos) << e.what();
  }
  p = shards(ShardSpec::split(0), w, 2);
  p[0] = at::randn({3, 4});
  EXPECT_THROW(assemble(ShardSpec::split(0), p), ShapeError);
}

TEST(ShardSpec, PartialSumReducesNotConcatenates) {
  const at::Tensor a = at::randn({2, 3}), b = at::randn({2, 3}), c = at::randn({2, 3});
  const auto s = ShardSpec::partial_sum();
  EXPECT_TRUE(flex_test::close(assemble(s, {a, b, c}), a + b + c));
  const at::Tensor whole = at::randn({2, 3});
  EXPECT_TRUE(flex_test::equal(shard_of(s, whole, 0, 3), whole));
  EXPECT_TRUE(flex_test::equal(shard_of(s, whole, 2, 3), at::zeros_like(whole)));
  EXPECT_TRUE(flex_test::equal(assemble(s, shards(s, whole, 3)), whole));
  EXPECT_THROW(assemble(s, {a, at::randn({3, 2})}), ShapeError);
}

TEST(ShardSpec, EveryDtypeRoundTrips) {
  for (auto dt : {at::kDouble, at::kFloat, at::kHalf, at::kBFloat16, at::kLong, at::kInt, at::kShort, at::kChar,
                  at::kByte, at::kBool}) {
    const at::Tensor w = (at::arange(24) % 5).to(dt).view({4, 6});
    const auto s = ShardSpec::fused(1, {3, 3});
    EXPECT_TRUE(flex_test::equal(assemble(s, shards(s, w, 3)), w)) << c10::toString(dt);
  }
}

TEST(ShardSpec, Describe) {
  EXPECT_EQ(ShardSpec::fused(-1, {64, 64, 64}, 16).describe(), "split(dim=-1, blocks=[64,64,64], unit=16)");
  EXPECT_EQ(ShardSpec::partial_sum().describe(), "partial_sum");
  EXPECT_EQ(ShardSpec::replicated().describe(), "replicated");
}

// Grouped-query key/value heads follow the array_split of the query heads:
// 6 query heads over 2 ranks are [0,1,2] and [3,4,5]; with 3 kv heads
// (group 2) rank 0 uses kv heads 0,1 and rank 1 kv heads 1,2. Worked by hand.
TEST(ShardSpec, KvHeadsFollowTheQueryHeads) {
  const int64_t d = 2;
  const ShardSpec s = ShardSpec::kv_heads(-1, 3 * d, d, 2);
  at::Tensor whole = at::arange(2 * 3 * d, at::kFloat).view({2, 3 * d});
  EXPECT_TRUE(flex_test::equal(shard_of(s, whole, 0, 2), whole.narrow(1, 0, 2 * d)));
  EXPECT_TRUE(flex_test::equal(shard_of(s, whole, 1, 2), whole.narrow(1, d, 2 * d)));
  EXPECT_TRUE(flex_test::equal(assemble(s, {shard_of(s, whole, 0, 2), shard_of(s, whole, 1, 2)}), whole));
  // 4 query heads over 4 ranks, 2 kv heads: ranks 0,1 hold kv 0; ranks 2,3 kv 1.
  const ShardSpec r = ShardSpec::kv_heads(0, 2 * d, d, 2);
  at::Tensor w = at::arange(2 * d, at::kFloat);
  std::vector<at::Tensor> pieces;
  for (int rank = 0; rank < 4; ++rank) {
    pieces.push_back(shard_of(r, w, rank, 4));
    EXPECT_TRUE(flex_test::equal(pieces.back(), w.narrow(0, rank < 2 ? 0 : d, d))) << rank;
  }
  EXPECT_TRUE(flex_test::equal(assemble(r, pieces), w));
  // Fused [q | k | v] with grouped k and v blocks: 4 q heads, 2 kv heads, tp=3.
  const ShardSpec f = ShardSpec::fused(0, {4 * d, 2 * d, 2 * d}, d, {0, 2, 2});
  at::Tensor qkv = at::arange(8 * d, at::kFloat);
  std::vector<at::Tensor> fp;
  for (int rank = 0; rank < 3; ++rank) fp.push_back(shard_of(f, qkv, rank, 3));
  // rank 0: q heads 0,1 + kv 0; rank 1: q head 2 + kv 1; rank 2: q head 3 + kv 1.
  EXPECT_TRUE(
      flex_test::equal(fp[0], at::cat({qkv.narrow(0, 0, 2 * d), qkv.narrow(0, 4 * d, d), qkv.narrow(0, 6 * d, d)})));
  EXPECT_TRUE(
      flex_test::equal(fp[2], at::cat({qkv.narrow(0, 3 * d, d), qkv.narrow(0, 5 * d, d), qkv.narrow(0, 7 * d, d)})));
  EXPECT_TRUE(flex_test::equal(assemble(f, fp), qkv));
  EXPECT_EQ(s.describe(), "split(dim=-1, blocks=[6], unit=2, kv_groups=[2])");
}
