#pragma once
// Whether a product of these tensors would record an autograd graph: the
// hand-written CPU kernels (gemv, oneDNN's linear) have no backward, so
// dense_linear takes them only when it would not.
#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>

namespace flex::detail {

inline bool records_grad(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  auto req = [](const at::Tensor& t) { return t.defined() && t.requires_grad(); };
  return c10::GradMode::is_enabled() && (req(x) || req(weight) || req(bias));
}

}  // namespace flex::detail
