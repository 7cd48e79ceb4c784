#include <flex/dispatch/batch_size.h>

#include <new>

namespace flex {

bool should_reduce_batch_size(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e)) return true;
  const std::string m = e.what();
  for (const char* s : {"CUDA out of memory", "out of memory", "can't allocate memory", "not enough memory",
                        "CUDNN_STATUS_NOT_SUPPORTED"})
    if (m.find(s) != std::string::npos) return true;
  return false;
}

}  // namespace flex
