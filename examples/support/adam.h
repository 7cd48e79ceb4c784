#pragma once
// Adam on a list of tensors, written out so an example shows every step of
// its training loop (no optimizer library). Tensors that share storage (tied
// weights) must be passed once.
#include <ATen/ATen.h>

#include <cmath>
#include <vector>

namespace flex_examples {

struct Adam {
  std::vector<at::Tensor> params, m, v;
  double lr = 1e-3, b1 = 0.9, b2 = 0.98, eps = 1e-8;
  int64_t t = 0;
  explicit Adam(std::vector<at::Tensor> p, double lr_ = 1e-3) : params(std::move(p)), lr(lr_) {
    for (auto& x : params) m.push_back(at::zeros_like(x)), v.push_back(at::zeros_like(x));
  }
  void step() {
    at::NoGradGuard ng;
    ++t;
    for (size_t i = 0; i < params.size(); ++i) {
      if (!params[i].grad().defined()) continue;
      at::Tensor g = params[i].grad();
      m[i].mul_(b1).add_(g, 1 - b1);
      v[i].mul_(b2).addcmul_(g, g, 1 - b2);
      at::Tensor mh = m[i] / (1 - std::pow(b1, t)), vh = v[i] / (1 - std::pow(b2, t));
      params[i].sub_(lr * mh / (vh.sqrt() + eps));
      params[i].mutable_grad().zero_();
    }
  }
};

}  // namespace flex_examples
