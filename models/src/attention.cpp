#include "attention.h"

#include <flex/hooks/errors.h>
#include <flex/hooks/frozen_replacement.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <utility>

namespace flex::detail {

namespace {

std::atomic<int64_t> attend_block_budget{int64_t{64} << 20};
thread_local AttendTrace attend_trace;

// gpt-oss: softmax over [scores, sink] with the row maximum subtracted first
// (Transformers' order, in the scores' dtype), the sink column dropped.
at::Tensor sink_softmax(at::Tensor scores, const at::Tensor& allowed, const at::Tensor& sinks) {
  if (allowed.defined()) scores = scores.masked_fill(allowed.logical_not(), lowest_value(scores.scalar_type()));
  const int64_t b = scores.size(0), h = scores.size(1), t = scores.size(2), s = scores.size(3);
  const at::Tensor sink = sinks.to(scores.scalar_type()).reshape({1, h, 1, 1}).expand({b, h, t, 1});
  at::Tensor all = at::cat({scores, sink}, -1);
  scores = at::Tensor();
  all = all - std::get<0>(all.max(-1, /*keepdim=*/true));
  return at::softmax(all, -1).narrow(-1, 0, s);
}

bool power_of_two(double x) {
  int exponent = 0;
  return x > 0 && std::isfinite(x) && std::frexp(x, &exponent) == 0.5;
}

// The net factor on q k^T when applying it to q instead gives the same bits:
// every factor a power of two (each step then exact, in any order) and q of a
// dtype with float32's exponent range (float16's would go subnormal). q is
// [T, D] per head where the scores are [T, S]: a smaller pass, and none on the
// scores. 0 when the factors must be applied to the scores, in their order.
double scale_foldable_into_q(const AttendOptions& o, at::ScalarType q_dtype) {
  if (q_dtype != at::kFloat && q_dtype != at::kBFloat16) return 0.0;
  if (!power_of_two(o.multiply)) return 0.0;
  for (double d : o.divide)
    if (!power_of_two(d)) return 0.0;
  return o.scale();
}

// The probabilities [B, H, T, S] (T: the rows of q given), in v's dtype: the
// eager arithmetic, shared by the eager and the chunked path.
at::Tensor attention_probabilities(const at::Tensor& q_in, const at::Tensor& k, const at::Tensor& allowed,
                                   const AttendOptions& o, at::ScalarType out_dtype) {
  const at::Tensor q_mm = o.upcast_scores ? q_in.to(at::kFloat) : q_in;
  const double folded = scale_foldable_into_q(o, q_mm.scalar_type());
  const at::Tensor q = folded != 0.0 && folded != 1.0 ? q_mm * folded : q_mm;
  at::Tensor scores = at::matmul(q, (o.upcast_scores ? k.to(at::kFloat) : k).transpose(-1, -2));
  if (folded == 0.0) {
    if (o.multiply != 1.0) scores = scores * o.multiply;
    for (double d : o.divide)
      if (d != 1.0) scores = scores / d;
  }
  if (o.softcap > 0) scores = at::tanh(scores / o.softcap) * o.softcap;
  at::Tensor probs = o.sinks.defined() ? sink_softmax(std::move(scores), allowed, o.sinks)
                                        // Moved: at most two score-sized tensors are alive at any step.
                                        : masked_softmax(std::move(scores), allowed, o.upcast_softmax);
  // The frozen replacement (flex/hooks/frozen_replacement.h): the pattern is a constant.
  if (nonlinearities_frozen()) probs = probs.detach();
  return probs.to(out_dtype);
}

// The frozen replacement over replicated batch rows (frozen_batch_replicas):
// the pattern of row 0, [1, H, T, S], applied to every row's values at once
// (the rows folded into the value's last dim: one product per head, and the
// backward keeps the one pattern, not B copies).
at::Tensor replicated_pattern_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const at::Tensor& allowed, const AttendOptions& o, Module& hook_attn_probs) {
  const int64_t b = v.size(0), h = v.size(1), s = v.size(2), d = v.size(3);
  const at::Tensor row_mask = allowed.defined() && allowed.size(0) > 1 ? allowed.narrow(0, 0, 1) : allowed;
  const at::Tensor probs =
      hook_attn_probs(attention_probabilities(q.narrow(0, 0, 1), k.narrow(0, 0, 1), row_mask, o, v.scalar_type()));
  const at::Tensor folded = v.permute({1, 2, 0, 3}).reshape({h, s, b * d});  // [H, S, B*D]
  const int64_t t = probs.size(2);
  return at::matmul(probs[0], folded).view({h, t, b, d}).permute({2, 0, 1, 3});
}

at::Tensor eager_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed,
                           const AttendOptions& o, Module& hook_attn_probs) {
  const bool dropout_on = o.dropout_module ? o.dropout_module->is_training() && o.dropout_module->p > 0
                                           : o.training && o.dropout_p > 0;
  if (frozen_batch_replicas() && v.size(0) > 1 && !dropout_on)
    return replicated_pattern_attention(q, k, v, allowed, o, hook_attn_probs);
  at::Tensor probs = hook_attn_probs(attention_probabilities(q, k, allowed, o, v.scalar_type()));
  if (o.dropout_module)
    probs = (*o.dropout_module)(probs);
  else if (o.training && o.dropout_p > 0)
    probs = at::dropout(probs, o.dropout_p, /*train=*/true);
  return at::matmul(probs, v);
}

// Blocks of queries whose scores fit the budget; each block's softmax is over
// all S keys, so the rows come out as the eager path computes them.
at::Tensor chunked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed,
                             const AttendOptions& o) {
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), s = k.size(2);
  const int64_t elem = std::max<int64_t>(4, q.element_size());  // scores are float32 at least when upcast
  const int64_t rows = q.is_meta() ? t : query_block_rows(b, h, t, s, elem, attention_block_budget());
  attend_trace.path = AttendTrace::Path::Chunked;
  attend_trace.blocks = (t + rows - 1) / rows;
  attend_trace.largest_block_bytes = b * h * std::min(rows, t) * s * elem;
  if (rows >= t) return at::matmul(attention_probabilities(q, k, allowed, o, v.scalar_type()), v);
  // A mask with one query row (a padding-only mask) applies to every block as it is.
  const bool per_query = allowed.defined() && allowed.size(-2) == t;
  std::vector<at::Tensor> parts;
  for (int64_t start = 0; start < t; start += rows) {
    const int64_t n = std::min(rows, t - start);
    const at::Tensor block_mask = per_query ? allowed.narrow(-2, start, n) : allowed;
    parts.push_back(at::matmul(attention_probabilities(q.narrow(2, start, n), k, block_mask, o, v.scalar_type()), v));
  }
  return at::cat(parts, 2);
}

// at::scaled_dot_product_attention with the eager path's masking. A bool
// mask becomes an additive one holding the dtype's lowest finite value, not
// SDPA's -inf: a query row that sees no key must average all values (eager's
// masked_fill(lowest) + softmax), not produce NaN. Kernels differ in whether
// they absorb scores into that value exactly (float32 accumulation of a
// float16 mask does not), so such rows are set to the mean of v explicitly.
at::Tensor fused_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed,
                           bool causal, double scale) {
  attend_trace.path = AttendTrace::Path::Fused;
  attend_trace.causal_kernel = causal;
  at::Tensor mask;
  if (allowed.defined() && !causal)
    mask = at::zeros(allowed.sizes(), q.options()).masked_fill_(allowed.logical_not(), lowest_value(q.scalar_type()));
  // (query, key, value, attn_mask, dropout_p, is_causal, scale[, enable_gqa]).
  at::Tensor z = mask.defined() ? at::scaled_dot_product_attention(q, k, v, mask, 0.0, false, scale)
                                : at::scaled_dot_product_attention(q, k, v, {}, 0.0, causal, scale);
  if (mask.defined()) {
    const at::Tensor blind = allowed.logical_not().all(-1, /*keepdim=*/true);  // [B|1, 1, T|1, 1]
    z = at::where(blind, v.mean(-2, /*keepdim=*/true).to(z.scalar_type()), z);
  }
  return z;
}

}  // namespace

double AttendOptions::scale() const {
  double s = multiply;
  for (double d : divide) s /= d;
  return s;
}

bool has_hook(const Module& m) { return m.model_hook() != nullptr || m.num_registered_hooks() > 0; }

int64_t query_block_rows(int64_t b, int64_t h, int64_t t, int64_t s, int64_t element_bytes, int64_t budget_bytes) {
  const int64_t row_bytes = std::max<int64_t>(1, b * h * s * element_bytes);
  return std::clamp<int64_t>(budget_bytes / row_bytes, 1, std::max<int64_t>(t, 1));
}

int64_t attention_block_budget() { return attend_block_budget.load(std::memory_order_relaxed); }
void set_attention_block_budget(int64_t bytes) { attend_block_budget.store(std::max<int64_t>(bytes, 1)); }

const AttendTrace& last_attend_trace() { return attend_trace; }

at::Tensor attend(const at::Tensor& q, const at::Tensor& k_grouped, const at::Tensor& v_grouped, const at::Tensor& allowed,
                  const AttendOptions& opts, Module& hook_attn_probs) {
  attend_trace = AttendTrace{};
  if (k_grouped.size(1) == 0 || q.size(1) % k_grouped.size(1) != 0 || v_grouped.size(1) != k_grouped.size(1))
    throw ShapeError("attention: " + std::to_string(q.size(1)) + " query heads cannot share " +
                     std::to_string(k_grouped.size(1)) + " key and " + std::to_string(v_grouped.size(1)) + " value heads");
  const bool dropout_on = opts.dropout_module ? opts.dropout_module->is_training() && opts.dropout_module->p > 0
                                              : opts.training && opts.dropout_p > 0;
  // Frozen: the probabilities must exist to be detached.
  const bool eager = has_hook(hook_attn_probs) || (opts.dropout_module && has_hook(*opts.dropout_module)) || dropout_on ||
                     nonlinearities_frozen();
  if (!eager && decode_attention_applies(q, k_grouped, v_grouped, allowed, opts)) {
    attend_trace.path = AttendTrace::Path::Decode;
    return decode_attention(q, k_grouped, v_grouped, allowed, opts.scale());
  }
  const int64_t n_rep = q.size(1) / k_grouped.size(1);
  const at::Tensor k = repeat_kv(k_grouped, n_rep), v = repeat_kv(v_grouped, n_rep);
  if (eager) {
    attend_trace.path = AttendTrace::Path::Eager;
    return eager_attention(q, k, v, allowed, opts, hook_attn_probs);
  }
  // The fused kernel cannot soft-cap logits; it runs in q's dtype (flash and
  // memory-efficient kernels accumulate the softmax in float32 anyway).
  if (opts.softcap <= 0 && !opts.sinks.defined() && !q.is_meta()) {
    // is_causal aligns the diagonal top-left, so it stands for our mask only when T == S.
    const bool causal = q.size(2) == k.size(2) && is_plain_causal(allowed);
    return fused_attention(q, k, v, allowed, causal, opts.scale());
  }
  return chunked_attention(q, k, v, allowed, opts);
}

}  // namespace flex::detail
