#pragma once
// How error messages print a shape: "[2, 3, 768]" (the way libtorch prints sizes).

#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string>

namespace flex {

inline std::string shape_text(c10::IntArrayRef shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

}  // namespace flex
