// libFuzzer target: the restricted torch.save reader (zip archive + pickle
// subset); tensors it returns must be readable in full.
#include "fuzz_util.h"

#include <flex/dispatch/checkpoint.h>

#include <ATen/ATen.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace flex_fuzz;
  const std::string path = scratch() + "/in.bin";
  write_bytes(path, data, size);
  guarded([&] {
    for (const auto& [name, t] : flex::load_torch_bin(path)) {
      at::Tensor c = t.contiguous();
      const auto* p = static_cast<const uint8_t*>(c.data_ptr());
      uint64_t s = 0;
      for (size_t i = 0; i < c.nbytes(); ++i) s += p[i];  // a view past its storage faults here
      (void)s;
    }
  });
  return 0;
}
