#pragma once
// Accelerate's process-level helpers over a Communicator
// (accelerate.utils.random, utils.other.wait_for_everyone): seeding every
// rank, making random states equal across ranks, and barriers.
//
//   flex::set_seed(42, /*device_specific=*/true, world.get());  // rank r seeds 42 + r
//   flex::synchronize_rng_state(*world, flex::RngType::Torch);  // rank 0's CPU generator state everywhere
#include <flex/parallel/communicator.h>

#include <ATen/core/Generator.h>

#include <cstdint>
#include <vector>

namespace flex {

/// Seeds C's rand(), libtorch's CPU generator and every CUDA device's
/// generator with `seed`, plus the rank in `comm` when `device_specific`
/// (rank 0 when `comm` is null).
void set_seed(uint64_t seed, bool device_specific = false, const Communicator* comm = nullptr);

enum class RngType {
  Torch,      // libtorch's default CPU generator
  Cuda,       // the default generator of the current CUDA device
  Generator,  // the generator passed in
};

/// Sets every rank's generator of `type` to rank 0's state (a collective:
/// every rank calls it). RngType::Generator needs `generator` (ConfigError
/// otherwise); RngType::Cuda without CUDA is a ConfigError.
void synchronize_rng_state(Communicator& comm, RngType type, at::Generator* generator = nullptr);
void synchronize_rng_states(Communicator& comm, const std::vector<RngType>& types, at::Generator* generator = nullptr);

/// Blocks until every rank of `comm` has reached it (a barrier).
inline void wait_for_everyone(Communicator& comm) { comm.barrier(); }

}  // namespace flex
