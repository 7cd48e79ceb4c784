#pragma once
// What every sparse MoE block does with a routing decision (internal to
// flex::models): check what a hook_selected_experts edit left, and hand each
// expert the rows routed to it in Transformers' order.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>

namespace flex::detail {

/// ShapeError naming `who` unless `selected` is an [n, k] int64 tensor of ids in [0, experts).
void check_selected_experts(const at::Tensor& selected, int64_t n, int64_t k, int64_t experts, const std::string& who);

/// Calls fn(e, token, slot) for each expert e in index order with the rows
/// routed to it: the tokens for which e is the first choice, in token order,
/// then the second choice, ... (token, slot: int64 [rows]). While fn runs,
/// flex::current_token_rows() holds them, so captures inside the expert get
/// "#token_index". `skip_unused`: experts no token chose are not called.
void for_each_routed_expert(const at::Tensor& selected, int64_t experts, bool skip_unused,
                            const std::function<void(int64_t, const at::Tensor&, const at::Tensor&)>& fn);

}  // namespace flex::detail
