#include "expert_routing.h"

#include <flex/hooks/errors.h>
#include <flex/hooks/token_rows.h>

#include <ATen/ATen.h>

namespace flex::detail {

void check_selected_experts(const at::Tensor& selected, int64_t n, int64_t k, int64_t experts, const std::string& who) {
  if (selected.dim() != 2 || selected.size(0) != n || selected.size(1) != k || selected.scalar_type() != at::kLong)
    throw ShapeError(who + ": hook_selected_experts must stay a [" + std::to_string(n) + ", " + std::to_string(k) +
                     "] int64 tensor of expert ids");
  if (n > 0 && (selected.min().item<int64_t>() < 0 || selected.max().item<int64_t>() >= experts))
    throw ShapeError(who + ": hook_selected_experts holds an expert id outside [0, " + std::to_string(experts) + ")");
}

void for_each_routed_expert(const at::Tensor& selected, int64_t experts, bool skip_unused,
                            const std::function<void(int64_t, const at::Tensor&, const at::Tensor&)>& fn) {
  const at::Tensor by_slot = selected.t();  // [k, N]: nonzero() lists (slot, token) slot-major
  for (int64_t e = 0; e < experts; ++e) {
    const at::Tensor hits = by_slot.eq(e).nonzero();
    if (skip_unused && hits.size(0) == 0) continue;
    const at::Tensor slot = hits.select(1, 0), token = hits.select(1, 1);
    // Where each row belongs (b * T + t, and which choice of the token it
    // is), for captures inside the expert, over data-parallel ranks too.
    ScopedTokenRows rows({token, slot, selected.size(0)});
    fn(e, token, slot);
  }
}

}  // namespace flex::detail
