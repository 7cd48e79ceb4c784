#pragma once
// The process environment and what this build of libtorch can do:
// Accelerate's patch_environment / clear_environment (scoped, restored on
// destruction, exceptions included) and its version and capability checks.
#include <map>
#include <string>
#include <vector>

namespace flex {

/// Sets each variable for the object's lifetime (names upper-cased, as
/// Accelerate's patch_environment), then restores the previous value or
/// unsets the variables that did not exist.
class PatchEnvironment {
 public:
  explicit PatchEnvironment(const std::map<std::string, std::string>& vars);
  ~PatchEnvironment();
  PatchEnvironment(const PatchEnvironment&) = delete;
  PatchEnvironment& operator=(const PatchEnvironment&) = delete;

 private:
  std::vector<std::pair<std::string, std::pair<bool, std::string>>> saved_;  // name, (existed, value)
};

/// Empties the environment for the object's lifetime; on destruction the
/// environment is exactly the one before (what was set inside is dropped).
class ClearEnvironment {
 public:
  ClearEnvironment();
  ~ClearEnvironment();
  ClearEnvironment(const ClearEnvironment&) = delete;
  ClearEnvironment& operator=(const ClearEnvironment&) = delete;

 private:
  std::map<std::string, std::string> saved_;
};

/// The libtorch version this program runs with ("2.13.0"; a local part such
/// as "+cu124" is dropped).
std::string torch_version();
/// Compares torch_version() with `version` (numerically per component,
/// missing components are 0): op is one of < <= == != >= >. ConfigError for
/// another op or a version that is not dotted numbers.
bool is_torch_version(const std::string& op, const std::string& version);
/// A CUDA device is usable (this libtorch has CUDA and sees a GPU).
bool is_cuda_available();
/// bfloat16 arithmetic is supported: on a GPU, a compute capability of at
/// least 8.0 (as torch.cuda.is_bf16_supported); without one, libtorch's CPU
/// kernels (always, since 1.10).
bool is_bf16_available();

}  // namespace flex
