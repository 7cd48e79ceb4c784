// fused_rms_norm: RMSNorm's eight libtorch ops (to float, pow, mean, add,
// rsqrt, mul, scale, to) as one pass over each row: the sum of squares, then
// the scaled row, with every rounding of the ops (float32 throughout, the
// dtype casts where the Scale variant puts them; the sum in libtorch's order),
// so the result is the ops' bit for bit. Plain loops the compiler vectorises;
// compiled without contraction into fused multiply-adds (the ops round each
// product).
#include <flex/hooks/errors.h>
#include <flex/kernels/fused_elementwise.h>

#include "fused_rows.h"
#include "records_grad.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace flex {

namespace {

using BF16 = c10::BFloat16;

// libtorch's float sum over a contiguous last dim (SumKernel.cpp's
// cascade_sum), in its order of additions, so that mean(h^2) has the bits
// the ops give: vectors of 8 lanes (libtorch runs this kernel's AVX2 build on
// AVX-512 CPUs too, checked against at::sum by the hooks test) summed by
// row_sum, the scalar tail, then the lanes in order; rows shorter than 8 go
// through row_sum one element at a time.
constexpr int kSumLanes = 8;

struct Lanes {
  float l[kSumLanes] = {};
  Lanes& operator+=(const Lanes& o) {
    for (int k = 0; k < kSumLanes; ++k) l[k] += o.l[k];
    return *this;
  }
};

inline int64_t ceil_log2(int64_t x) {  // c10's CeilLog2: 1 for x <= 2
  if (x <= 2) return 1;
  int64_t bits = 0;
  for (uint64_t v = static_cast<uint64_t>(x - 1); v; v >>= 1) ++bits;
  return bits;
}

// row_sum: four interleaved accumulators (element 4r + k into k), each a
// four-level cascade flushed every 16 steps; then the leftover elements
// into accumulator 0 and accumulators 1..3 into it.
template <typename A, typename Load>
A row_sum(int64_t size, const Load& load) {
  constexpr int64_t kLevels = 4, kIlp = 4;
  const int64_t rows = size / kIlp;
  const int64_t power = std::max<int64_t>(4, ceil_log2(rows) / kLevels), step = int64_t(1) << power, mask = step - 1;
  A acc[kLevels][kIlp] = {};
  int64_t i = 0;
  while (i + step <= rows) {
    for (int64_t j = 0; j < step; ++j, ++i)
      for (int64_t k = 0; k < kIlp; ++k) acc[0][k] += load(kIlp * i + k);
    for (int64_t j = 1; j < kLevels; ++j) {
      for (int64_t k = 0; k < kIlp; ++k) acc[j][k] += acc[j - 1][k], acc[j - 1][k] = A{};
      if ((i & (mask << (j * power))) != 0) break;
    }
  }
  for (; i < rows; ++i)
    for (int64_t k = 0; k < kIlp; ++k) acc[0][k] += load(kIlp * i + k);
  for (int64_t j = 1; j < kLevels; ++j)
    for (int64_t k = 0; k < kIlp; ++k) acc[0][k] += acc[j][k];
  A sum = acc[0][0];
  for (int64_t e = rows * kIlp; e < size; ++e) sum += load(e);
  for (int64_t k = 1; k < kIlp; ++k) sum += acc[0][k];
  return sum;
}

template <typename X>
float sum_of_squares(const X* x, int64_t n) {
  auto square = [x](int64_t i) {
    const float h = static_cast<float>(x[i]);
    return h * h;
  };
  if (n < kSumLanes) return row_sum<float>(n, square);
  const int64_t vectors = n / kSumLanes;
  const Lanes v = row_sum<Lanes>(vectors, [&](int64_t i) {
    Lanes e;
    for (int k = 0; k < kSumLanes; ++k) e.l[k] = square(i * kSumLanes + k);
    return e;
  });
  float sum = 0.0f;
  for (int64_t i = vectors * kSumLanes; i < n; ++i) sum += square(i);
  for (int k = 0; k < kSumLanes; ++k) sum += v.l[k];
  return sum;
}

template <typename X, typename W, typename O>
void rms_row(const X* x, const W* w, O* out, int64_t n, float eps, RmsNormScale scale) {
  int64_t i = 0;
  const float var = sum_of_squares(x, n) / static_cast<float>(n);  // mean: the sum, then / n
  const float inv = 1.0f / std::sqrt(var + eps);  // at::rsqrt on float
  switch (scale) {
    case RmsNormScale::WeightThenCast:
      for (i = 0; i < n; ++i) out[i] = static_cast<O>(static_cast<float>(w[i]) * (static_cast<float>(x[i]) * inv));
      break;
    case RmsNormScale::OnePlusWeight:
      for (i = 0; i < n; ++i)
        out[i] = static_cast<O>((static_cast<float>(x[i]) * inv) * (static_cast<float>(w[i]) + 1.0f));
      break;
    default:
      for (i = 0; i < n; ++i)
        out[i] = static_cast<O>(static_cast<float>(w[i]) *
                                static_cast<float>(static_cast<X>(static_cast<float>(x[i]) * inv)));
  }
}

template <typename X, typename W, typename O>
void rms_rows(const at::Tensor& x, const at::Tensor& weight, at::Tensor& out, float eps, RmsNormScale scale) {
  const int64_t n = x.size(-1), rows = n ? x.numel() / n : 0;
  const detail::RowOffsets offset(x);
  const X* xp = x.const_data_ptr<X>();
  const W* wp = weight.const_data_ptr<W>();
  O* op = out.mutable_data_ptr<O>();
  at::parallel_for(0, rows, detail::row_grain(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) rms_row<X, W, O>(xp + offset(r), wp, op + r * n, n, eps, scale);
  });
}

template <typename X, typename W>
void rms_dispatch_out(const at::Tensor& x, const at::Tensor& weight, at::Tensor& out, float eps, RmsNormScale scale) {
  if (out.scalar_type() == at::kBFloat16)
    rms_rows<X, W, BF16>(x, weight, out, eps, scale);
  else
    rms_rows<X, W, float>(x, weight, out, eps, scale);
}

template <typename X>
void rms_dispatch_weight(const at::Tensor& x, const at::Tensor& weight, at::Tensor& out, float eps, RmsNormScale scale) {
  if (weight.scalar_type() == at::kBFloat16)
    rms_dispatch_out<X, BF16>(x, weight, out, eps, scale);
  else
    rms_dispatch_out<X, float>(x, weight, out, eps, scale);
}

}  // namespace

bool fused_rms_norm_applies(const at::Tensor& x, const at::Tensor& weight) {
  return detail::fused_elementwise_enabled() && x.defined() && weight.defined() && x.device().is_cpu() &&
         weight.device().is_cpu() &&
         detail::float_or_bf16(x) && detail::float_or_bf16(weight) && !x.is_sparse() && x.layout() == at::kStrided &&
         detail::last_dim_contiguous(x) && weight.dim() == 1 && weight.size(0) == x.size(-1) &&
         weight.is_contiguous() && !detail::records_grad(x, weight, at::Tensor());
}

at::Tensor fused_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, RmsNormScale scale) {
  if (!fused_rms_norm_applies(x, weight))
    throw UnsupportedError("fused_rms_norm: x " + c10::str(x.sizes()) + " and weight " + c10::str(weight.sizes()) +
                           " are not CPU float32/bf16 tensors of one row length without a graph to record");
  const at::ScalarType out_type =
      scale == RmsNormScale::Weight ? at::promote_types(weight.scalar_type(), x.scalar_type()) : x.scalar_type();
  at::Tensor out = at::empty(x.sizes(), x.options().dtype(out_type));
  const float e = static_cast<float>(eps);  // var + eps adds eps as a float32 scalar
  if (x.scalar_type() == at::kBFloat16)
    rms_dispatch_weight<BF16>(x, weight, out, e, scale);
  else
    rms_dispatch_weight<float>(x, weight, out, e, scale);
  return out;
}

}  // namespace flex
