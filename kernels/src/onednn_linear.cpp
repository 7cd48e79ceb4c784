// Float32 products of many rows through oneDNN instead of MKL
// (flex/kernels/linear.h says when and why). libtorch registers oneDNN's
// linear as the operator mkldnn::_linear_pointwise; it is found once through
// the dispatcher, so a libtorch built without oneDNN simply keeps MKL.
#include <flex/hooks/errors.h>
#include <flex/kernels/linear.h>

#include "records_grad.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace flex {

namespace {

using LinearPointwise = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                   std::string_view, c10::List<std::optional<at::Scalar>>,
                                   std::optional<std::string_view>);

// libtorch's oneDNN linear, or nullopt when this libtorch has none.
const std::optional<c10::TypedOperatorHandle<LinearPointwise>>& linear_op() {
  static const std::optional<c10::TypedOperatorHandle<LinearPointwise>> op =
      []() -> std::optional<c10::TypedOperatorHandle<LinearPointwise>> {
    if (!at::hasMKLDNN()) return std::nullopt;
    auto handle = c10::Dispatcher::singleton().findSchema({"mkldnn::_linear_pointwise", ""});
    if (!handle) return std::nullopt;
    try {
      return handle->typed<LinearPointwise>();
    } catch (const c10::Error&) {
      return std::nullopt;  // another signature in another libtorch: keep MKL
    }
  }();
  return op;
}

bool amd_cpu() {
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  return std::string_view(vendor) == "AuthenticAMD";
#else
  return false;
#endif
}

GemmLibrary env_library() {
  static const GemmLibrary lib = [] {
    const char* v = std::getenv("FLEXMODEL_GEMM");
    if (!v || !*v) return amd_cpu() ? GemmLibrary::OneDnn : GemmLibrary::Mkl;
    const std::string s(v);
    if (s == "mkl") return GemmLibrary::Mkl;
    if (s == "onednn") return GemmLibrary::OneDnn;
    throw ConfigError("FLEXMODEL_GEMM must be mkl or onednn, got '" + s + "'");
  }();
  return lib;
}

std::atomic<int> g_scoped{-1};  // -1: no ScopedGemmLibrary

// Why onednn_linear cannot take these tensors, or "" when it can.
std::string unsupported_reason(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                               WeightLayout layout) {
  if (!linear_op()) return "this libtorch has no oneDNN linear";
  if (!x.defined() || !weight.defined()) return "undefined input or weight";
  if (!x.device().is_cpu() || !weight.device().is_cpu() || (bias.defined() && !bias.device().is_cpu()))
    return "CPU tensors only";
  if (x.scalar_type() != at::kFloat || weight.scalar_type() != at::kFloat ||
      (bias.defined() && bias.scalar_type() != at::kFloat))
    return "float32 x, weight and bias only";
  if (weight.dim() != 2 || x.dim() < 1) return "a 2-D weight and an input [..., in]";
  const bool out_in = layout == WeightLayout::OutIn;
  const int64_t in = weight.size(out_in ? 1 : 0), out = weight.size(out_in ? 0 : 1);
  if (x.size(-1) != in || in == 0 || out == 0) return "the input's last dim is not the weight's input width";
  if (bias.defined() && (bias.dim() != 1 || bias.size(0) != out)) return "a bias [out] or none";
  if (detail::records_grad(x, weight, bias)) return "no backward (an autograd graph would be recorded)";
  return "";
}

}  // namespace

GemmLibrary gemm_library() {
  const int scoped = g_scoped.load(std::memory_order_relaxed);
  return scoped >= 0 ? static_cast<GemmLibrary>(scoped) : env_library();
}

ScopedGemmLibrary::ScopedGemmLibrary(GemmLibrary library) : previous_(g_scoped.exchange(static_cast<int>(library))) {}
ScopedGemmLibrary::~ScopedGemmLibrary() { g_scoped.store(previous_); }

bool onednn_applies(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, WeightLayout layout) {
  if (gemm_library() != GemmLibrary::OneDnn) return false;
  if (!unsupported_reason(x, weight, bias, layout).empty()) return false;
  return x.numel() / x.size(-1) > kGemvMaxRows;
}

at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, WeightLayout layout) {
  const std::string why = unsupported_reason(x, weight, bias, layout);
  if (!why.empty()) throw UnsupportedError("onednn_linear: " + why);
  // [in, out] weights go in as their transpose, a view: oneDNN reads the
  // strides, no copy is made.
  const at::Tensor w = layout == WeightLayout::OutIn ? weight : weight.t();
  std::optional<at::Tensor> b;
  if (bias.defined()) b = bias;
  return linear_op()->call(x, w, b, "none", c10::List<std::optional<at::Scalar>>(), std::nullopt);
}

}  // namespace flex
