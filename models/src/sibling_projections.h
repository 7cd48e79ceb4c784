#pragma once
// The projections of one input (q/k/v of an attention, gate/up of an MLP)
// computed together when nothing can tell the difference.
#include <flex/hooks/nn.h>

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <vector>

namespace flex::detail {

/// x through each of `layers` in one call, as calling each in turn gives,
/// bit for bit, when no layer has a hook (a capture, an edit, an offload
/// hook: each must see its call) and their weights compute together: plain
/// float32/bf16 weights at decode shapes (gemv_group) or GGUF blocks
/// (ggml_linear_together, x quantized once), one parallel region for all.
/// nullopt otherwise: the caller then runs its own
/// sequence of calls, whose order hooks see.
std::optional<std::vector<at::Tensor>> project_together(const std::vector<std::shared_ptr<Linear>>& layers,
                                                        const at::Tensor& x);

}  // namespace flex::detail
