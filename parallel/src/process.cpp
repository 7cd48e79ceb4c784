#include <flex/parallel/process.h>

#include <flex/hooks/errors.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <cstdlib>
#include <mutex>

namespace flex {

void set_seed(uint64_t seed, bool device_specific, const Communicator* comm) {
  if (device_specific && comm) seed += static_cast<uint64_t>(comm->rank());
  std::srand(static_cast<unsigned>(seed));
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(seed);
  }
  if (at::globalContext().hasCUDA()) {
    for (size_t d = 0; d < at::getNumGPUs(); ++d) {
      auto gen = at::globalContext().defaultGenerator(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(d)));
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_current_seed(seed);
    }
  }
}

void synchronize_rng_state(Communicator& comm, RngType type, at::Generator* generator) {
  at::Generator gen;
  switch (type) {
    case RngType::Torch:
      gen = at::detail::getDefaultCPUGenerator();
      break;
    case RngType::Cuda:
      if (!at::globalContext().hasCUDA() || at::getNumGPUs() == 0)
        throw ConfigError("synchronize_rng_state: RngType::Cuda without a CUDA device");
      gen = at::globalContext().defaultGenerator(at::Device(at::kCUDA, at::detail::getCUDAHooks().current_device()));
      break;
    case RngType::Generator:
      if (!generator || !generator->defined())
        throw ConfigError("synchronize_rng_state: RngType::Generator needs the generator to synchronize");
      gen = *generator;
      break;
  }
  at::Tensor state;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    state = gen.get_state().clone();  // a CPU uint8 tensor of the generator's layout
  }
  comm.broadcast(state, 0);  // same generator type on every rank: same size
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

void synchronize_rng_states(Communicator& comm, const std::vector<RngType>& types, at::Generator* generator) {
  for (RngType t : types) synchronize_rng_state(comm, t, generator);
}

}  // namespace flex
