// Uses the installed flexmodel: a hooked Linear whose output a forward hook
// doubles; prints "consumer ok" when the hook ran and the result is right.
#include <flex/hooks/nn.h>

#include <ATen/ATen.h>

#include <cstdio>

int main() {
  auto lin = std::make_shared<flex::Linear>(3, 2);
  int calls = 0;
  auto h = lin->register_forward_hook([&](flex::Module&, const flex::Inputs&, flex::Value& out) {
    ++calls;
    out = flex::Value(out.toTensor() * 2);
  });
  at::Tensor x = at::ones({1, 3});
  at::Tensor y = (*lin)(x);
  const bool ok = calls == 1 && at::allclose(y, 2 * lin->compute(x));
  std::printf(ok ? "consumer ok\n" : "consumer FAILED\n");
  return ok ? 0 : 1;
}
