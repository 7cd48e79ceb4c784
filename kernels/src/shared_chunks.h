#pragma once
// Work split shared by the row-parallel kernels (gemv, ggml_linear).
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace flex::kernel {

// f(r0, r1) over consecutive chunks of [0, n), handed to the threads as they
// come for them (an atomic counter) inside one parallel region, so a thread
// the OS holds back (a shared machine) leaves its chunks to the others
// instead of making them wait. Which thread computes a chunk does not change
// its bits.
template <class F>
void shared_chunks(int64_t n, int64_t chunk, const F& f) {
  const int64_t chunks = (n + chunk - 1) / chunk;
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), chunks);
  if (threads <= 1 || at::in_parallel_region()) return f(0, n);
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c < chunks;
         c = next.fetch_add(1, std::memory_order_relaxed))
      f(c * chunk, std::min(n, (c + 1) * chunk));
  });
}

}  // namespace flex::kernel
