// One query per sequence against the cached keys (a decode step), with
// grouped key/value heads read in place: no [B, H, S, D] copies of the cache
// (repeat_kv copies it h / kv_heads times per layer and token: 44 MB per
// token for TinyLlama at 256 positions). The arithmetic is the kernel's
// (flex/kernels/decode_attention.h, docs/design.md decision 56); this file
// says which calls it takes.
#include "attention.h"

#include <flex/kernels/decode_attention.h>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

namespace flex::detail {

bool decode_attention_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed,
                              const AttendOptions& o) {
  if (q.dim() != 4 || q.size(2) != 1 || q.is_meta() || !q.device().is_cpu() || !k.device().is_cpu()) return false;
  const at::ScalarType t = q.scalar_type();
  if ((t != at::kFloat && t != at::kBFloat16) || k.scalar_type() != t || v.scalar_type() != t) return false;
  if (o.softcap > 0 || o.sinks.defined() || k.size(2) == 0) return false;
  if (k.stride(-1) != 1 || v.stride(-1) != 1 || q.size(1) % k.size(1) != 0) return false;
  if (allowed.defined() && (allowed.dim() != 4 || allowed.scalar_type() != at::kBool ||
                            (allowed.size(0) != 1 && allowed.size(0) != q.size(0)) || allowed.size(1) != 1 ||
                            allowed.size(2) != 1 || allowed.size(3) != k.size(2)))
    return false;
  return !(c10::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad()));
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed,
                            double scale) {
  // allowed [B or 1, 1, 1, S] (decode_attention_applies) as the kernel's [B or 1, S].
  const at::Tensor mask = allowed.defined() ? allowed.select(2, 0).select(1, 0) : at::Tensor();
  return grouped_decode_attention(q, k, v, mask, scale);
}

}  // namespace flex::detail
