#include <flex/hooks/empty_init.h>

#include <ATen/ATen.h>

namespace flex {

namespace {
// 0: off, 1: parameters on meta, 2: parameters and buffers on meta.
thread_local int empty_mode = 0;
}  // namespace

EmptyInit::EmptyInit(bool include_buffers) : prev_(empty_mode) { empty_mode = include_buffers ? 2 : 1; }

EmptyInit::~EmptyInit() { empty_mode = prev_; }

bool empty_init_active() { return empty_mode >= 1; }
bool empty_init_buffers() { return empty_mode >= 2; }

at::Tensor new_parameter(at::IntArrayRef shape, const at::TensorOptions& options) {
  return at::empty(shape, empty_init_active() ? options.device(at::kMeta) : options);
}

at::Tensor new_buffer(at::IntArrayRef shape, const at::TensorOptions& options) {
  return at::empty(shape, empty_init_buffers() ? options.device(at::kMeta) : options);
}

}  // namespace flex
