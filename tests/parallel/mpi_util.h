#pragma once
// Shared by the tests that run under mpirun (mpi_*.cpp with mpi_main.cpp).
#include <flex/parallel/communicator.h>

#include <ATen/ATen.h>

#include <vector>

namespace flex_test {

/// The MPI world (every mpi_* test runs with it).
inline std::shared_ptr<flex::Communicator> world() { return flex::make_world_communicator(); }

inline const std::vector<at::ScalarType>& all_comm_dtypes() {
  static const std::vector<at::ScalarType> d{at::kDouble, at::kFloat, at::kHalf, at::kBFloat16, at::kLong,
                                             at::kInt,    at::kShort, at::kChar, at::kByte,     at::kBool};
  return d;
}

/// A tensor only rank `r` would hold: small integers, exact in every dtype
/// (bool: 0/1), so reductions have one right answer.
inline at::Tensor rank_tensor(int r, at::IntArrayRef shape, at::ScalarType dt) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  at::Tensor v = (at::arange(n, at::kLong) * 3 + r * 5) % (dt == at::kBool ? 2 : 11);
  return v.view(shape).to(dt);
}

}  // namespace flex_test
