#pragma once
// For tests of the CPU kernels: every instruction-set level this CPU has
// (each test runs them all through flex::ScopedIsa), and a scope with a set
// libtorch thread count (bits that must not depend on it).
#include <flex/kernels/cpu_isa.h>

#include <ATen/Parallel.h>

#include <vector>

namespace flex_test {

inline std::vector<flex::Isa> isa_levels() {
  std::vector<flex::Isa> v;
  for (auto i : {flex::Isa::Scalar, flex::Isa::Avx2, flex::Isa::Avx512, flex::Isa::Avx512Bf16})
    if (static_cast<int>(i) <= static_cast<int>(flex::cpu_isa_supported())) v.push_back(i);
  return v;
}

class ThreadsGuard {
 public:
  explicit ThreadsGuard(int n) : saved_(at::get_num_threads()) { at::set_num_threads(n); }
  ~ThreadsGuard() { at::set_num_threads(saved_); }
  ThreadsGuard(const ThreadsGuard&) = delete;
  ThreadsGuard& operator=(const ThreadsGuard&) = delete;

 private:
  int saved_;
};

}  // namespace flex_test
