#pragma once
// Accelerate's find_executable_batch_size: run a function with a batch size,
// halving it after every out-of-memory failure until one fits.
//
//   int64_t bs = flex::find_executable_batch_size(
//       [&](int64_t b) { run_batches(b); return b; }, 128);
#include <flex/hooks/errors.h>

#include <cstdint>
#include <exception>
#include <string>

namespace flex {

/// True for the failures a smaller batch may avoid: std::bad_alloc, and
/// libtorch errors whose message says the CPU or CUDA allocator ran out
/// ("DefaultCPUAllocator: can't allocate memory", "CUDA out of memory",
/// "not enough memory", cuDNN's CUDNN_STATUS_NOT_SUPPORTED), as Accelerate's
/// should_reduce_batch_size.
bool should_reduce_batch_size(const std::exception& e);

/// Calls fn(batch_size) from `starting_batch_size`, halving after each
/// failure should_reduce_batch_size accepts, and returns fn's result; other
/// failures propagate at once. ConfigError once the batch size reaches 0.
template <class Fn>
auto find_executable_batch_size(Fn&& fn, int64_t starting_batch_size = 128) -> decltype(fn(int64_t{})) {
  if (starting_batch_size < 1) throw ConfigError("find_executable_batch_size: the starting batch size must be at least 1");
  std::string last;
  for (int64_t batch = starting_batch_size; batch > 0; batch /= 2) {
    try {
      return fn(batch);
    } catch (const std::exception& e) {
      if (!should_reduce_batch_size(e)) throw;
      last = e.what();
    }
  }
  throw ConfigError("no executable batch size found: batch size 1 still ran out of memory (" + last.substr(0, last.find('\n')) + ")");
}

}  // namespace flex
