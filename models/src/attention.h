#pragma once
// The attention core GPT-2, GPT-NeoX and the Llama family share:
// z = softmax(mask(scale(q k^T))) v, computed one of three ways, so that the
// [B, H, T, S] probabilities exist only when a hook asks for them
// (docs/design.md decision 14: pay only for what is hooked).
//
//   eager    the probabilities materialized and passed through the module's
//            hook_attn_probs point (which may edit them), then dropout. Taken
//            when that point (or GPT-2's attn_dropout module) has a hook, or
//            when dropout is active. Bit for bit the computation the
//            architectures did before this file existed.
//   fused    at::scaled_dot_product_attention: flash / memory-efficient
//            kernels that keep nothing of size T x S.
//   chunked  the eager arithmetic over blocks of queries, each block's scores
//            under a memory budget: Gemma 2's soft-capping (which the fused
//            kernel cannot apply) and meta tensors. T == 1 (decoding) and
//            short inputs are one block.
// Internal to the models library; tests include it for the knobs below.
#include "common.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace flex::detail {

struct AttendOptions {
  // logits = q k^T, then * multiply, then / each of `divide`, then soft-capped:
  // each architecture's own order of operations, so its eager path keeps its
  // exact bits (x * (1/8) and x / 8 can differ in the last bit). Factors equal
  // to 1 are skipped (bitwise a no-op).
  double multiply = 1.0;
  std::vector<double> divide;
  double softcap = 0.0;         // > 0: logits = tanh(logits / softcap) * softcap (Gemma 2)
  bool upcast_scores = false;   // q k^T in float32 (GPT-2's reorder_and_upcast_attn)
  bool upcast_softmax = false;  // softmax in float32, probabilities cast back
  // Learned attention sinks [H] (gpt-oss): one extra logit per head in every
  // row's softmax, dropped afterwards, so a row's probabilities sum below 1.
  // The fused kernel has no sinks: they run the eager / chunked arithmetic.
  at::Tensor sinks;
  // Dropout on the probabilities: `dropout_module` when set (GPT-2's
  // attn_dropout, a module hooks can see), else at::dropout(dropout_p) when
  // `training`.
  Dropout* dropout_module = nullptr;
  double dropout_p = 0.0;
  bool training = false;

  /// The net factor on q k^T: multiply / (divide[0] * divide[1] ...).
  double scale() const;
};

/// q [B, H, T, D], k [B, Hkv, S, D], v [B, Hkv, S, Dv] (Hkv divides H: head h
/// reads key/value head h / (H / Hkv)) -> z [B, H, T, Dv] in v's dtype. A
/// decode step (T == 1) without hooks reads the grouped heads in place
/// (decode_attention); the other paths repeat them to H first. `allowed`: bool, true where
/// query t may see key s, broadcastable as [B or 1, 1, T or 1, S]; undefined =
/// everything visible. The model's own causal mask (allowed_mask without
/// padding or past, see is_plain_causal) runs the fused kernel's causal mode.
/// A query row that sees no key (a left-padding position) averages all values
/// uniformly on every path, as the eager masked_fill(lowest) + softmax does.
at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed,
                  const AttendOptions& opts, Module& hook_attn_probs);

/// The decode kernel (decode_attention.cpp): T == 1, CPU, float32 or
/// bfloat16 q/k/v alike, no soft-capping or sinks, a mask of [B|1, 1, 1, S]
/// or none, no autograd graph to record.
bool decode_attention_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed,
                              const AttendOptions& opts);
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed,
                            double scale);

/// True when `m` would run a hook when called (a ModelHook or a PyTorch-style one).
bool has_hook(const Module& m);

// --- for tests -------------------------------------------------------------

/// Queries per block such that one block's scores, [b, h, rows, s] elements of
/// `element_bytes` each, fit in `budget_bytes`: at least 1, at most t.
int64_t query_block_rows(int64_t b, int64_t h, int64_t t, int64_t s, int64_t element_bytes, int64_t budget_bytes);

/// The chunked path's budget for one block of scores (64 MiB by default).
/// Tests lower it so that short inputs split into several blocks.
int64_t attention_block_budget();
void set_attention_block_budget(int64_t bytes);

/// What the last attend() on this thread did.
struct AttendTrace {
  enum class Path { None, Eager, Fused, Chunked, Decode } path = Path::None;
  bool causal_kernel = false;       // fused: is_causal without a mask
  int64_t blocks = 0;               // chunked: query blocks computed
  int64_t largest_block_bytes = 0;  // chunked: the largest score block's size
};
const AttendTrace& last_attend_trace();

}  // namespace flex::detail
