#include "sibling_projections.h"

#include "attention.h"

#include <flex/kernels/linear.h>
#include <flex/quant/ggml_format.h>

#include <typeinfo>

namespace flex::detail {

namespace {
// A plain Linear (whose call is DenseLayer::forward) with no hook.
bool unhooked(const Linear& m) {
  return typeid(m) == typeid(Linear) && !has_hook(m);
}
}  // namespace

std::optional<std::vector<at::Tensor>> project_together(const std::vector<std::shared_ptr<Linear>>& layers,
                                                        const at::Tensor& x) {
  std::vector<const DenseLayer*> plain;
  for (const auto& l : layers) {
    if (!l || !unhooked(*l)) return std::nullopt;
    plain.push_back(l.get());
  }
  bool dense = true;  // plain weights: the GEMV where it applies to all
  for (const DenseLayer* l : plain) dense = dense && !l->weight_format() && gemv_applies(x, l->weight, l->bias);
  if (dense) {
    std::vector<std::pair<at::Tensor, at::Tensor>> wb;
    for (const DenseLayer* l : plain) wb.emplace_back(l->weight, l->bias);
    return gemv_group(x, wb);
  }
  return ggml_linear_together(plain, x);
}

}  // namespace flex::detail
