#pragma once
// Tensor comparisons that say what differs, for EXPECT_TRUE / ASSERT_TRUE:
//   EXPECT_TRUE(flex_test::close(actual, expected, rtol, atol)) << "context";
//   EXPECT_TRUE(flex_test::equal(actual, expected));
// On failure the message gives the dtype and shape, how many elements differ
// of how many, the (multi-dimensional) index of the worst element and both
// values there. They never throw: undefined tensors, different shapes (no
// broadcasting) or different dtypes are failures with a message naming both.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <exception>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace flex_test {
namespace detail {

/// "Float [2, 3]", or "undefined".
inline std::string describe(const at::Tensor& t) {
  if (!t.defined()) return "undefined";
  std::ostringstream o;
  o << t.scalar_type() << " " << t.sizes();
  return o.str();
}

/// Why `a` and `e` cannot be compared element by element (undefined, other
/// dtype, other shape), or "" when they can.
inline std::string mismatch(const at::Tensor& a, const at::Tensor& e) {
  const char* what = !a.defined() || !e.defined() ? "undefined tensor"
                     : a.scalar_type() != e.scalar_type() ? "dtypes differ"
                     : a.sizes() != e.sizes()             ? "shapes differ"
                                                          : nullptr;
  return what ? std::string(what) + ": actual " + describe(a) + " vs expected " + describe(e) : "";
}

/// " at [i, j, k]: actual x, expected y" for element `flat` (row-major) of
/// the flattened `a` and `e`, of shape `sizes`.
inline void element(std::ostream& o, at::IntArrayRef sizes, const at::Tensor& a, const at::Tensor& e, int64_t flat) {
  std::vector<int64_t> index(sizes.size());
  for (int64_t k = flat, d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    index[d] = k % sizes[d];
    k /= sizes[d];
  }
  o << " at " << at::IntArrayRef(index) << ": actual " << a[flat].item() << ", expected " << e[flat].item();
}

inline int precision(const at::Tensor& t) { return t.scalar_type() == at::kDouble ? 17 : 9; }

}  // namespace detail

/// at::allclose that explains itself: every element satisfies
/// |actual - expected| <= atol + rtol * |expected| (or is equal; NaN is never
/// close), computed in float64 on the CPU so half/bfloat16 work too. Same
/// defaults as at::allclose. Shapes and dtypes must be the same.
inline ::testing::AssertionResult close(const at::Tensor& actual, const at::Tensor& expected, double rtol = 1e-5,
                                        double atol = 1e-8) {
  const std::string why = detail::mismatch(actual, expected);
  if (!why.empty()) return ::testing::AssertionFailure() << why;
  try {
    const auto dt = actual.is_complex() ? at::kComplexDouble : at::kDouble;
    const at::Tensor a = actual.detach().to(at::kCPU, dt).reshape(-1), e = expected.detach().to(at::kCPU, dt).reshape(-1);
    const at::Tensor diff = (a - e).abs();
    const at::Tensor ok = (a == e) | (at::isfinite(e) & (diff <= atol + rtol * e.abs()));
    const int64_t bad = a.numel() - ok.sum().item<int64_t>();
    if (bad == 0) return ::testing::AssertionSuccess();
    // The largest difference, a NaN first.
    const int64_t worst = diff.masked_fill(diff.isnan(), std::numeric_limits<double>::infinity()).argmax().item<int64_t>();
    std::ostringstream o;
    o << "not close: " << bad << " of " << a.numel() << " elements of " << detail::describe(actual)
      << " out of tolerance (rtol " << rtol << ", atol " << atol << ")";
    o.precision(detail::precision(actual));
    o << "; largest |actual - expected| " << diff[worst].item<double>();
    detail::element(o, actual.sizes(), a, e, worst);
    if (ok[worst].item<bool>()) {  // within tolerance there (large values): show one that is not
      o << "; first out of tolerance";
      detail::element(o, actual.sizes(), a, e, ok.logical_not().nonzero()[0].item<int64_t>());
    }
    return ::testing::AssertionFailure() << o.str();
  } catch (const std::exception& ex) {
    return ::testing::AssertionFailure() << "could not compare " << detail::describe(actual) << " with "
                                         << detail::describe(expected) << ": " << ex.what();
  }
}

/// at::equal that explains itself: same dtype, same shape, every element
/// equal (by value, as at::equal: 0.0 == -0.0, NaN != NaN).
inline ::testing::AssertionResult equal(const at::Tensor& actual, const at::Tensor& expected) {
  const std::string why = detail::mismatch(actual, expected);
  if (!why.empty()) return ::testing::AssertionFailure() << why;
  try {
    const at::Tensor a = actual.detach().cpu().reshape(-1), e = expected.detach().cpu().reshape(-1);
    const at::Tensor differ = a.ne(e);
    const int64_t bad = differ.sum().item<int64_t>();
    if (bad == 0) return ::testing::AssertionSuccess();
    std::ostringstream o;
    o.precision(detail::precision(actual));
    o << "not equal: " << bad << " of " << a.numel() << " elements of " << detail::describe(actual)
      << " differ; the first";
    detail::element(o, actual.sizes(), a, e, differ.nonzero()[0].item<int64_t>());
    return ::testing::AssertionFailure() << o.str();
  } catch (const std::exception& ex) {
    return ::testing::AssertionFailure() << "could not compare " << detail::describe(actual) << " with "
                                         << detail::describe(expected) << ": " << ex.what();
  }
}

}  // namespace flex_test
