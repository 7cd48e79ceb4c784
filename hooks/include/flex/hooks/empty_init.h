#pragma once
// EmptyInit: Accelerate's init_empty_weights. While a scope is alive on this
// thread, flex::Modules create their parameters (and, with include_buffers,
// their buffers) on the meta device: no memory, no initialisation.
#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

namespace flex {

class EmptyInit {
 public:
  explicit EmptyInit(bool include_buffers = false);
  ~EmptyInit();
  EmptyInit(const EmptyInit&) = delete;
  EmptyInit& operator=(const EmptyInit&) = delete;

 private:
  int prev_;
};

/// True inside an EmptyInit scope.
bool empty_init_active();
/// True inside an EmptyInit(include_buffers=true) scope.
bool empty_init_buffers();

/// An uninitialised tensor for a new parameter: on meta inside EmptyInit.
at::Tensor new_parameter(at::IntArrayRef shape, const at::TensorOptions& options = {});
/// The same for a new buffer (meta only under include_buffers).
at::Tensor new_buffer(at::IntArrayRef shape, const at::TensorOptions& options = {});

}  // namespace flex
