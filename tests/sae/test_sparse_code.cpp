// Sparse codes (flex/sae/sparse_code.h) against dense computations done
// independently: the CSR entries are at::nonzero's, the gathered decode is
// the float64 dense product, the strongest features are a sort of each row;
// the same results with 1 and 2 threads. A dictionary's decode (which
// gathers when the code is sparse) equals the dense product.
#include <flex/hooks/errors.h>
#include <flex/sae/sparse_code.h>
#include <flex/sae/sparse_dictionary.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "kernel_test_util.h"
#include "test_util.h"

using namespace flex;

namespace {

// [rows, width] with about `density` of the entries non-zero (some rows empty).
at::Tensor sparse_acts(int64_t rows, int64_t width, double density, uint64_t seed) {
  at::manual_seed(seed);
  at::Tensor keep = at::rand({rows, width}).lt(density);
  keep.select(0, 0).zero_();  // an empty row
  return at::where(keep, at::rand({rows, width}) * 3 + 0.1, at::zeros({}));
}

}  // namespace

TEST(SparseCode, EntriesAreTheNonZerosByRow) {
  const at::Tensor a = sparse_acts(37, 300, 0.05, 1);
  const SparseCode c = sparse_code(a.view({37, 1, 300}));  // leading dims flatten to rows
  EXPECT_EQ(c.rows, 37);
  EXPECT_EQ(c.width, 300);
  const at::Tensor nz = at::nonzero(a);  // row-major: rows, then ascending columns
  ASSERT_EQ(c.nnz(), nz.size(0));
  EXPECT_TRUE(flex_test::equal(c.indices, nz.select(1, 1).contiguous()));
  EXPECT_TRUE(flex_test::equal(c.values, a.index({nz.select(1, 0), nz.select(1, 1)})));
  const at::Tensor counts = a.ne(0).sum(1);
  EXPECT_TRUE(flex_test::equal(c.indptr.narrow(0, 1, 37) - c.indptr.narrow(0, 0, 37), counts));
  EXPECT_EQ(c.indptr[0].item<int64_t>(), 0);
}

TEST(SparseCode, DecodeEqualsTheDenseProductInFloat64) {
  for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16}) {
    const at::Tensor a = sparse_acts(50, 400, 0.04, 2).to(dtype);
    at::manual_seed(3);
    const at::Tensor W = at::randn({400, 33}).to(dtype);
    const at::Tensor want = at::matmul(a.to(at::kDouble), W.to(at::kDouble));
    const at::Tensor got = decode_sparse(sparse_code(a), W);
    EXPECT_EQ(got.scalar_type(), dtype);
    const double tol = dtype == at::kBFloat16 ? 2e-2 : 1e-5;
    EXPECT_TRUE(flex_test::close(got.to(at::kDouble), want, tol, tol)) << c10::toString(dtype);
  }
}

TEST(SparseCode, ResultsDoNotDependOnTheThreadCount) {
  const at::Tensor a = sparse_acts(257, 1000, 0.03, 4);
  at::manual_seed(5);
  const at::Tensor W = at::randn({1000, 64});
  SparseCode one, two;
  at::Tensor d1, d2;
  StrongestFeatures s1, s2;
  {
    flex_test::ThreadsGuard g(1);
    one = sparse_code(a);
    d1 = decode_sparse(one, W);
    s1 = strongest_features(one, 8);
  }
  {
    flex_test::ThreadsGuard g(2);
    two = sparse_code(a);
    d2 = decode_sparse(two, W);
    s2 = strongest_features(two, 8);
  }
  EXPECT_TRUE(flex_test::equal(one.indices, two.indices));
  EXPECT_TRUE(flex_test::equal(d1, d2));
  EXPECT_TRUE(flex_test::equal(s1.indices, s2.indices));
  EXPECT_TRUE(flex_test::equal(s1.values, s2.values));
}

TEST(SparseCode, StrongestFeaturesAreEachRowsLargestEntries) {
  at::Tensor a = sparse_acts(20, 64, 0.2, 6);
  a[3][10] = 2.5;
  a[3][40] = 2.5;  // a tie: the lower index first
  a[3][50] = 0;
  const SparseCode c = sparse_code(a);
  for (int64_t width : {0, 3}) {
    const StrongestFeatures s = strongest_features(c, width);
    const int64_t w = s.indices.size(1);
    if (width == 0) EXPECT_EQ(w, a.ne(0).sum(1).max().item<int64_t>());
    EXPECT_TRUE(flex_test::equal(s.l0, a.ne(0).sum(1).to(at::kInt)));
    for (int64_t n = 0; n < 20; ++n) {
      std::vector<std::pair<float, int64_t>> row;  // (-value, index): ascending = strongest first, ties by index
      for (int64_t d = 0; d < 64; ++d)
        if (a[n][d].item<float>() != 0) row.emplace_back(-a[n][d].item<float>(), d);
      std::sort(row.begin(), row.end());
      for (int64_t j = 0; j < w; ++j) {
        const bool present = j < static_cast<int64_t>(row.size());
        EXPECT_EQ(s.indices[n][j].item<int32_t>(), present ? row[j].second : -1) << "row " << n << " slot " << j;
        EXPECT_EQ(s.values[n][j].item<float>(), present ? -row[j].first : 0.0f) << "row " << n << " slot " << j;
      }
    }
  }
  EXPECT_THROW(strongest_features(c, -1), ConfigError);
}

TEST(SparseCode, DictionaryDecodeGathersAndEqualsTheDenseProduct) {
  for (auto arch : {SaeArchitecture::TopK, SaeArchitecture::JumpReLU, SaeArchitecture::Standard}) {
    SaeConfig cfg;
    cfg.architecture = arch;
    cfg.d_in = cfg.d_out = 48;
    cfg.d_sae = 512;
    cfg.k = 6;
    auto sae = std::make_shared<SparseDictionary>(cfg);
    at::manual_seed(7);
    {
      at::NoGradGuard ng;
      sae->set_tensor("W_enc", at::randn({48, 512}) * 0.2);
      sae->set_tensor("b_enc", at::randn({512}) * 0.1 - (arch == SaeArchitecture::Standard ? 3.5 : 0.0));
      sae->set_tensor("W_dec", at::randn({512, 48}) * 0.2);
      sae->set_tensor("b_dec", at::randn({48}) * 0.1);
      if (cfg.jump()) sae->set_tensor("threshold", at::rand({512}) + 3.0);
    }
    const at::Tensor x = at::randn({3, 9, 48});
    at::NoGradGuard ng;
    const at::Tensor f = sae->encode(x);
    const at::Tensor want = at::matmul(f.to(at::kDouble), sae->W_dec.to(at::kDouble)) + sae->b_dec.to(at::kDouble);
    const at::Tensor got = sae->decode(f);
    EXPECT_EQ(got.sizes(), x.sizes());
    EXPECT_TRUE(flex_test::close(got.to(at::kDouble), want, 1e-5, 1e-5)) << sae->class_name();
    EXPECT_LT(f.ne(0).sum().item<int64_t>() * 48, f.numel()) << "dense code: the gather was not exercised";
  }
}

// top_k_code against torch's topk + relu + scatter read back by sparse_code:
// rows of every sign, k from 1 to the whole width (the chunk-maximum bound
// and its fallback), leading dims, and 1 vs 2 threads.
TEST(SparseCode, TopKCodeEqualsDenseTopKThenScan) {
  at::manual_seed(11);
  for (int64_t width : {7, 100, 1000, 4096}) {
    for (int64_t k : {int64_t{1}, int64_t{5}, int64_t{32}, width / 2, width}) {
      if (k < 1 || k > width) continue;
      at::Tensor pre = at::randn({3, 13, width});
      pre.select(1, 0).neg_().abs_().neg_();  // rows with no positive value
      pre.select(1, 1).select(1, 0).fill_(1e3);  // one huge value
      auto [v, i] = pre.topk(k, -1);
      const at::Tensor dense = at::zeros_like(pre).scatter_(-1, i, at::relu(v));
      const SparseCode want = sparse_code(dense);
      SparseCode got1, got2;
      {
        flex_test::ThreadsGuard g(1);
        got1 = top_k_code(pre, k);
      }
      {
        flex_test::ThreadsGuard g(2);
        got2 = top_k_code(pre, k);
      }
      const std::string what = "width " + std::to_string(width) + " k " + std::to_string(k);
      EXPECT_EQ(got1.rows, 39) << what;
      EXPECT_EQ(got1.width, width) << what;
      EXPECT_TRUE(flex_test::equal(got1.indptr, want.indptr)) << what;
      EXPECT_TRUE(flex_test::equal(got1.indices, want.indices)) << what;
      EXPECT_TRUE(flex_test::equal(got1.values, want.values)) << what;
      EXPECT_TRUE(flex_test::equal(got2.indices, got1.indices)) << what;
      EXPECT_TRUE(flex_test::equal(densify(got1), dense.view({39, width}))) << what;
    }
  }
  EXPECT_THROW(top_k_code(at::randn({2, 10}), 11), ConfigError);
  EXPECT_THROW(top_k_code(at::randn({2, 10}).to(at::kDouble), 3), ConfigError);
}

// observe and on_features give the code of encode (the dense activations
// scanned), for the TopK path that never makes them and for the others; a
// hook editing hook_sae_acts_post shows in the code.
TEST(SparseCode, ObservedFeaturesAreTheEncodedOnes) {
  for (auto arch : {SaeArchitecture::TopK, SaeArchitecture::JumpReLU}) {
    SaeConfig cfg;
    cfg.architecture = arch;
    cfg.d_in = cfg.d_out = 40;
    cfg.d_sae = 600;
    cfg.k = 9;
    auto sae = std::make_shared<SparseDictionary>(cfg);
    at::manual_seed(12);
    {
      at::NoGradGuard ng;
      sae->set_tensor("W_enc", at::randn({40, 600}) * 0.2);
      sae->set_tensor("b_enc", at::randn({600}) * 0.1);
      sae->set_tensor("W_dec", at::randn({600, 40}) * 0.2);
      if (cfg.jump()) sae->set_tensor("threshold", at::rand({600}) + 1.0);
    }
    at::NoGradGuard ng;
    const at::Tensor x = at::randn({2, 7, 40});
    std::vector<SparseCode> got;
    HookHandle h = sae->on_features([&](const SparseCode& c) { got.push_back(c); });
    sae->observe(x);
    (*sae)(x);
    const at::Tensor clean = sae->encode(x).reshape({-1, 600});
    const SparseCode want = sparse_code(clean);
    ASSERT_EQ(got.size(), 2u);
    for (const auto& c : got) {
      EXPECT_TRUE(flex_test::equal(c.indptr, want.indptr)) << sae->class_name();
      EXPECT_TRUE(flex_test::equal(c.indices, want.indices)) << sae->class_name();
      // TopK's bounded bfloat16 encoder (bounded_top_k.h) computes the values by its own dot products.
      EXPECT_TRUE(flex_test::close(c.values, want.values, 1e-5, 1e-6)) << sae->class_name();
    }
    // An edit at hook_sae_acts_post: feature 3 forced on everywhere.
    auto hook = sae->get_submodule("hook_sae_acts_post")->register_forward_hook([](Module&, const Inputs&, Value& out) {
      at::Tensor t = out.toTensor().clone();
      t.select(-1, 3).fill_(5.0);
      out = t;
    });
    got.clear();
    sae->observe(x);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].indptr[1].item<int64_t>() - got[0].indptr[0].item<int64_t>(),
              want.indptr[1].item<int64_t>() - want.indptr[0].item<int64_t>() +
                  (clean[0][3].item<float>() == 0.0f ? 1 : 0));
    hook.remove();
    h.remove();
    got.clear();
    sae->observe(x);
    EXPECT_TRUE(got.empty()) << "removed observer still called";
  }
}
