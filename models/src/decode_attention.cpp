// One query per sequence against the cached keys (a decode step), with
// grouped key/value heads read in place: no [B, H, S, D] copies of the cache
// (repeat_kv copies it h / kv_heads times per layer and token: 44 MB per
// token for TinyLlama at 256 positions) and no per-head library GEMV (the
// fused kernel runs 2 x 32 small MKL calls per layer). Scores and the
// weighted sum of values accumulate in float32, the softmax is ATen's; the
// result is rounded once to v's dtype.
#include "attention.h"

#include <flex/hooks/errors.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <limits>
#include <vector>

namespace flex::detail {

namespace {

template <typename T>
float to_float(T x) {
  return static_cast<float>(x);
}

// 16 fixed lanes, added in lane order: the compiler keeps them in vector
// registers, and the bits do not depend on how rows are split.
template <typename T>
float dot(const float* q, const T* k, int64_t D) {
  constexpr int64_t L = 16;
  float lane[L] = {};
  int64_t d = 0;
  for (; d + L <= D; d += L)
    for (int64_t l = 0; l < L; ++l) lane[l] += q[d + l] * to_float(k[d + l]);
  for (int64_t l = 0; d + l < D; ++l) lane[l] += q[d + l] * to_float(k[d + l]);
  float s = 0.0f;
  for (int64_t l = 0; l < L; ++l) s += lane[l];
  return s;
}

template <typename T>
at::Tensor run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed, double scale) {
  const int64_t B = q.size(0), H = q.size(1), D = q.size(3), Hkv = k.size(1), S = k.size(2), Dv = v.size(3);
  const int64_t G = H / Hkv;
  const at::Tensor qf = q.to(at::kFloat).contiguous();  // [B, H, 1, D]
  at::Tensor mask;                                      // [B, S] bool, or none
  if (allowed.defined()) mask = allowed.expand({B, 1, 1, S}).reshape({B, S}).contiguous();
  const bool* mp = mask.defined() ? mask.const_data_ptr<bool>() : nullptr;
  const T* kp = k.const_data_ptr<T>();
  const T* vp = v.const_data_ptr<T>();
  const int64_t ks0 = k.stride(0), ks1 = k.stride(1), ks2 = k.stride(2);
  const int64_t vs0 = v.stride(0), vs1 = v.stride(1), vs2 = v.stride(2);
  const float* qp = qf.const_data_ptr<float>();
  const float sc = static_cast<float>(scale);

  at::Tensor scores = at::empty({B * H, S}, at::kFloat);
  float* sp = scores.data_ptr<float>();
  at::parallel_for(0, B * H, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / H, g = (r % H) / G;
      const T* kr = kp + b * ks0 + g * ks1;
      for (int64_t s = 0; s < S; ++s)
        sp[r * S + s] = mp && !mp[b * S + s] ? -std::numeric_limits<float>::infinity()
                                             : dot(qp + r * D, kr + s * ks2, D) * sc;
    }
  });
  const at::Tensor probs = at::softmax(scores, -1);  // a row that sees no key: NaN, handled below
  const float* pp = probs.const_data_ptr<float>();

  at::Tensor out = at::empty({B, H, 1, Dv}, v.options());
  T* op = out.data_ptr<T>();
  at::parallel_for(0, B * H, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> acc(Dv);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / H, g = (r % H) / G;
      const T* vr = vp + b * vs0 + g * vs1;
      bool blind = mp != nullptr;
      for (int64_t s = 0; mp && s < S && blind; ++s) blind = !mp[b * S + s];
      std::fill(acc.begin(), acc.end(), 0.0f);
      // A row that sees no key averages all values, as the other paths do.
      const float uniform = 1.0f / static_cast<float>(S);
      for (int64_t s = 0; s < S; ++s) {
        const float p = blind ? uniform : pp[r * S + s];
        if (p == 0.0f) continue;
        const T* row = vr + s * vs2;
        for (int64_t d = 0; d < Dv; ++d) acc[d] += p * to_float(row[d]);
      }
      for (int64_t d = 0; d < Dv; ++d) op[r * Dv + d] = static_cast<T>(acc[d]);
    }
  });
  return out;
}

}  // namespace

bool decode_attention_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed,
                              const AttendOptions& o) {
  if (q.dim() != 4 || q.size(2) != 1 || q.is_meta() || !q.device().is_cpu() || !k.device().is_cpu()) return false;
  const at::ScalarType t = q.scalar_type();
  if ((t != at::kFloat && t != at::kBFloat16) || k.scalar_type() != t || v.scalar_type() != t) return false;
  if (o.softcap > 0 || o.sinks.defined() || k.size(2) == 0) return false;
  if (k.stride(-1) != 1 || v.stride(-1) != 1 || q.size(1) % k.size(1) != 0) return false;
  if (allowed.defined() && (allowed.dim() != 4 || allowed.scalar_type() != at::kBool || allowed.size(1) != 1 ||
                            allowed.size(2) != 1 || allowed.size(3) != k.size(2)))
    return false;
  return !(c10::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad()));
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed,
                            double scale) {
  return q.scalar_type() == at::kFloat ? run<float>(q, k, v, allowed, scale)
                                       : run<at::BFloat16>(q, k, v, allowed, scale);
}

}  // namespace flex::detail
