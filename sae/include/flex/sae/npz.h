#pragma once
// NumPy archives: a .npz is a zip of .npy arrays (read here through libzip,
// stored or deflated members alike); each array becomes a CPU tensor of its
// dtype and shape (C or Fortran order).
#include <ATen/core/Tensor.h>

#include <map>
#include <string>

namespace flex {

/// Every array of `path` by name (without ".npy"). IOError when the file
/// cannot be opened; FileFormatError naming the file and member for a bad zip,
/// a truncated member or a malformed .npy header; UnsupportedError for a dtype
/// other than float16/32/64, int8/16/32/64, uint8, bool, or big-endian data.
std::map<std::string, at::Tensor> read_npz(const std::string& path);

}  // namespace flex
