// fused_rms_norm: RMSNorm's eight libtorch ops (to float, pow, mean, add,
// rsqrt, mul, scale, to) as one pass over each row: the sum of squares, then
// the scaled row, with every rounding of the ops (float32 throughout, the
// dtype casts where the Scale variant puts them). Plain loops the compiler
// vectorises; compiled without contraction into fused multiply-adds (the ops
// round each product).
#include <flex/hooks/errors.h>
#include <flex/kernels/fused_elementwise.h>

#include "fused_rows.h"
#include "records_grad.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <cmath>

namespace flex {

namespace {

using BF16 = c10::BFloat16;

template <typename X, typename W, typename O>
void rms_row(const X* x, const W* w, O* out, int64_t n, float eps, RmsNormScale scale) {
  // mean(h^2): sixteen running sums, added pairwise at the end (libtorch's
  // sum is also a set of partial sums; the order differs in the last bits).
  constexpr int kLanes = 16;
  float part[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const float h = static_cast<float>(x[i + j]);
      part[j] += h * h;
    }
  for (int j = 0; i < n; ++i, ++j) {
    const float h = static_cast<float>(x[i]);
    part[j] += h * h;
  }
  for (int width = kLanes / 2; width >= 1; width /= 2)
    for (int j = 0; j < width; ++j) part[j] += part[j + width];
  const float var = part[0] / static_cast<float>(n);
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
  return x.defined() && weight.defined() && x.device().is_cpu() && weight.device().is_cpu() &&
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
