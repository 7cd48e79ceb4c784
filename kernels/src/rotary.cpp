// fused_rotary: x * cos + rotate_half(x) * sin (mul, narrow, neg, narrow,
// cat, mul, add) as one pass over each [D] row of q or k. Each product and
// the sum are rounded to x's dtype as the separate ops round them, so the
// result is the ops' bit for bit; compiled without contraction into fused
// multiply-adds for that reason.
#include <flex/hooks/errors.h>
#include <flex/kernels/fused_elementwise.h>

#include "fused_rows.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/core/GradMode.h>

namespace flex {

namespace {

using BF16 = c10::BFloat16;

// One row: out[j] = x[j] * c[j] + r[j] * s[j], r = (-x[h..D), x[0..h)).
template <typename T>
void rotate_row(const T* x, const T* c, const T* s, T* out, int64_t d) {
  const int64_t h = d / 2;
  for (int64_t j = 0; j < h; ++j) {
    const T a = static_cast<T>(static_cast<float>(x[j]) * static_cast<float>(c[j]));
    const T b = static_cast<T>(-static_cast<float>(x[j + h]) * static_cast<float>(s[j]));
    out[j] = static_cast<T>(static_cast<float>(a) + static_cast<float>(b));
  }
  for (int64_t j = h; j < d; ++j) {
    const T a = static_cast<T>(static_cast<float>(x[j]) * static_cast<float>(c[j]));
    const T b = static_cast<T>(static_cast<float>(x[j - h]) * static_cast<float>(s[j]));
    out[j] = static_cast<T>(static_cast<float>(a) + static_cast<float>(b));
  }
}

template <typename T>
void rotate_rows(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& out) {
  const int64_t B = x.size(0), H = x.size(1), T_ = x.size(2), D = x.size(3);
  const bool per_batch = cos.size(0) > 1;
  const T* xp = x.const_data_ptr<T>();
  const T* cp = cos.const_data_ptr<T>();
  const T* sp = sin.const_data_ptr<T>();
  T* op = out.mutable_data_ptr<T>();
  at::parallel_for(0, B * H * T_, detail::row_grain(D), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t t = r % T_, h = r / T_ % H, b = r / T_ / H;
      const int64_t p = per_batch ? b : 0;
      rotate_row<T>(xp + b * x.stride(0) + h * x.stride(1) + t * x.stride(2),
                    cp + p * cos.stride(0) + t * cos.stride(1), sp + p * sin.stride(0) + t * sin.stride(1),
                    op + b * out.stride(0) + h * out.stride(1) + t * out.stride(2), D);
    }
  });
}

bool table_fits(const at::Tensor& t, const at::Tensor& x) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == x.scalar_type() && t.layout() == at::kStrided &&
         t.dim() == 3 && (t.size(0) == 1 || t.size(0) == x.size(0)) && t.size(1) == x.size(2) &&
         t.size(2) == x.size(3) && detail::last_dim_contiguous(t);
}

}  // namespace

bool fused_rotary_applies(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  if (!detail::fused_elementwise_enabled() || !x.defined() || !x.device().is_cpu() || x.layout() != at::kStrided ||
      !detail::float_or_bf16(x) ||
      x.dim() != 4 || x.size(3) % 2 != 0 || !detail::last_dim_contiguous(x) || !table_fits(cos, x) ||
      !table_fits(sin, x))
    return false;
  return !(c10::GradMode::is_enabled() && (x.requires_grad() || cos.requires_grad() || sin.requires_grad()));
}

at::Tensor fused_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  if (!fused_rotary_applies(x, cos, sin))
    throw UnsupportedError("fused_rotary: x " + c10::str(x.sizes()) + " with cos " + c10::str(cos.sizes()) +
                           " and sin " + c10::str(sin.sizes()) +
                           " are not CPU float32/bf16 [B, H, T, D] and [1 or B, T, D] tensors without a graph");
  at::Tensor out = at::empty_like(x);  // x's strides when dense, as the libtorch ops' result has
  if (out.size(3) > 1 && out.stride(3) != 1) out = at::empty(x.sizes(), x.options());
  if (x.scalar_type() == at::kBFloat16)
    rotate_rows<BF16>(x, cos, sin, out);
  else
    rotate_rows<float>(x, cos, sin, out);
  return out;
}

}  // namespace flex
