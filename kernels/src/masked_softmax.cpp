// masked_softmax_: masked_fill + softmax over the last dim, in place, one
// row at a time: (1) masked entries become `fill`, the row's maximum is
// taken; (2) exp(x - max) is stored and summed; (3) the row is scaled by
// 1 / sum. Passes 2 and 3 find the row in L1. Rows are independent, so a
// row's bits do not depend on how rows are split among threads. A NaN needs
// no bookkeeping: its exp is NaN whatever the maximum, so the sum and with it
// the whole row become NaN, as in libtorch.
#include <flex/hooks/errors.h>
#include <flex/kernels/cpu_isa.h>
#include <flex/kernels/softmax.h>
#include <flex/kernels/target.h>

#include "exp_poly.h"
#include "records_grad.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

FLEX_KERNELS_BEGIN

namespace flex {

namespace {

using kernel::kExpLow;

// One row: `x` [n] in place, `allowed` [n] (or null: everything allowed).
struct Row {
  float* x;
  const bool* allowed;
  int64_t n;
  float fill;
};

void row_scalar(const Row& r) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < r.n; ++i) {
    if (r.allowed && !r.allowed[i]) r.x[i] = r.fill;
    m = std::max(m, r.x[i]);
  }
  float sum = 0.0f;
  for (int64_t i = 0; i < r.n; ++i) {
    const float d = r.x[i] - m;
    r.x[i] = d < kExpLow ? 0.0f : std::exp(d);
    sum += r.x[i];
  }
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < r.n; ++i) r.x[i] *= inv;
}

#if FLEX_HAVE_X86_KERNELS
using kernel::exp_avx2;
using kernel::exp_avx512;

FLEX_TARGET_AVX2 inline __m256 allowed_avx2(const bool* a) {  // 8 bools -> all-ones lanes where true
  const __m256i w = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a)));
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(w, _mm256_setzero_si256()));
}

FLEX_TARGET_AVX2 void row_avx2(const Row& r) {
  const int64_t n8 = r.n / 8 * 8;
  const __m256 fill = _mm256_set1_ps(r.fill);
  __m256 vmax = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < n8; i += 8) {
    __m256 v = _mm256_loadu_ps(r.x + i);
    if (r.allowed) {
      v = _mm256_blendv_ps(fill, v, allowed_avx2(r.allowed + i));
      _mm256_storeu_ps(r.x + i, v);
    }
    vmax = _mm256_max_ps(vmax, v);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  float m = *std::max_element(lanes, lanes + 8);
  for (int64_t i = n8; i < r.n; ++i) {
    if (r.allowed && !r.allowed[i]) r.x[i] = r.fill;
    m = std::max(m, r.x[i]);
  }
  const __m256 vm = _mm256_set1_ps(m);
  __m256 vsum = _mm256_setzero_ps();
  for (int64_t i = 0; i < n8; i += 8) {
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(r.x + i), vm));
    _mm256_storeu_ps(r.x + i, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  float sum = kernel::hsum_avx2(vsum);
  if (n8 < r.n) {  // the tail through the same exp, padded with exp(-inf) = 0
    alignas(32) float tail[8];
    for (int j = 0; j < 8; ++j) tail[j] = n8 + j < r.n ? r.x[n8 + j] - m : -std::numeric_limits<float>::infinity();
    _mm256_store_ps(tail, exp_avx2(_mm256_load_ps(tail)));
    for (int64_t i = n8; i < r.n; ++i) {
      r.x[i] = tail[i - n8];
      sum += r.x[i];
    }
  }
  const __m256 inv = _mm256_set1_ps(1.0f / sum);
  for (int64_t i = 0; i < n8; i += 8) _mm256_storeu_ps(r.x + i, _mm256_mul_ps(_mm256_loadu_ps(r.x + i), inv));
  for (int64_t i = n8; i < r.n; ++i) r.x[i] *= 1.0f / sum;
}

FLEX_TARGET_AVX512 void row_avx512(const Row& r) {
  const __m512 fill = _mm512_set1_ps(r.fill);
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 vmax = neg_inf;
  for (int64_t i = 0; i < r.n; i += 16) {
    const __mmask16 live = r.n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (r.n - i)) - 1);
    __m512 v = _mm512_maskz_loadu_ps(live, r.x + i);
    if (r.allowed) {
      const __m512i w = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(live, r.allowed + i));
      v = _mm512_mask_blend_ps(_mm512_test_epi32_mask(w, w), fill, v);
      _mm512_mask_storeu_ps(r.x + i, live, v);
    }
    vmax = _mm512_mask_max_ps(vmax, live, vmax, v);
  }
  const float m = _mm512_reduce_max_ps(vmax);
  const __m512 vm = _mm512_set1_ps(m);
  __m512 vsum = _mm512_setzero_ps();
  for (int64_t i = 0; i < r.n; i += 16) {
    const __mmask16 live = r.n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (r.n - i)) - 1);
    const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_mask_loadu_ps(neg_inf, live, r.x + i), vm));
    _mm512_mask_storeu_ps(r.x + i, live, e);
    vsum = _mm512_add_ps(vsum, e);  // the dead lanes hold exp(-inf) = 0
  }
  const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(vsum));
  for (int64_t i = 0; i < r.n; i += 16) {
    const __mmask16 live = r.n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (r.n - i)) - 1);
    _mm512_mask_storeu_ps(r.x + i, live, _mm512_mul_ps(_mm512_maskz_loadu_ps(live, r.x + i), inv));
  }
}
#endif

using RowFn = void (*)(const Row&);

RowFn row_kernel() {
#if FLEX_HAVE_X86_KERNELS
  const Isa isa = cpu_isa();
  if (isa >= Isa::Avx512) return row_avx512;
  if (isa >= Isa::Avx2) return row_avx2;
#endif
  return row_scalar;
}

// Why masked_softmax_ cannot take these tensors (empty: it can), and which
// error that is: another dtype, device or layout is unsupported, a mask of
// another shape is a shape error.
struct Refusal {
  std::string why;
  bool shape = false;
};

// `allowed` as a view of the scores' shape (broadcast dims of stride 0) in
// `out`, or left undefined.
Refusal expand_allowed(const at::Tensor& scores, const at::Tensor& allowed, at::Tensor& out) {
  if (!allowed.defined()) return {};
  if (allowed.scalar_type() != at::kBool || !allowed.device().is_cpu())
    return {"allowed must be a CPU bool tensor, got " + std::string(c10::toString(allowed.scalar_type())) + " on " +
            allowed.device().str()};
  bool fits = allowed.dim() <= scores.dim();
  for (int64_t i = 1; fits && i <= allowed.dim(); ++i)
    fits = allowed.size(-i) == scores.size(-i) || allowed.size(-i) == 1;
  if (!fits)
    return {"allowed " + c10::str(allowed.sizes()) + " does not broadcast to the scores " + c10::str(scores.sizes()),
            true};
  out = allowed.expand(scores.sizes());
  if (out.size(-1) > 1 && out.stride(-1) != 1) return {"allowed's last dim is not contiguous"};
  return {};
}

Refusal refusal(const at::Tensor& scores, const at::Tensor& allowed, at::Tensor& expanded) {
  if (!scores.defined() || !scores.device().is_cpu() || scores.scalar_type() != at::kFloat)
    return {"scores must be a CPU float32 tensor"};
  if (scores.dim() == 0) return {"scores must have a last dim", true};
  if (!scores.is_contiguous()) return {"scores must be contiguous (they are written in place)"};
  if (detail::records_grad(scores, at::Tensor(), at::Tensor()))
    return {"scores record an autograd graph (the kernel has no backward)"};
  return expand_allowed(scores, allowed, expanded);
}

}  // namespace

bool masked_softmax_applies(const at::Tensor& scores, const at::Tensor& allowed) {
  at::Tensor expanded;
  return cpu_isa() >= Isa::Avx2 && refusal(scores, allowed, expanded).why.empty();
}

void masked_softmax_(const at::Tensor& scores, const at::Tensor& allowed, float fill) {
  at::Tensor mask;
  if (const Refusal no = refusal(scores, allowed, mask); !no.why.empty()) {
    if (no.shape) throw ShapeError("masked_softmax_: " + no.why);
    throw UnsupportedError("masked_softmax_: " + no.why);
  }
  const int64_t n = scores.size(-1);
  if (scores.numel() == 0) return;
  const int64_t rows = scores.numel() / n;
  float* x = scores.data_ptr<float>();
  const bool* a = mask.defined() ? mask.data_ptr<bool>() : nullptr;
  // A row's offset into the (strided, broadcast) mask from its index.
  const int64_t lead = scores.dim() - 1;
  std::vector<int64_t> sizes(lead), strides(lead);
  for (int64_t d = 0; d < lead; ++d) {
    sizes[d] = scores.size(d);
    strides[d] = a ? mask.stride(d) : 0;
  }
  const RowFn kernel = row_kernel();
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      int64_t offset = 0;
      for (int64_t d = lead - 1, rest = r; d >= 0; --d) {
        offset += (rest % sizes[d]) * strides[d];
        rest /= sizes[d];
      }
      kernel(Row{x + r * n, a ? a + offset : nullptr, n, fill});
    }
  });
}

}  // namespace flex

FLEX_KERNELS_END
