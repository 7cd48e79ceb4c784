#pragma once
// Typed errors. Every error names the file, module, key or shape at fault so a
// user can act on it; catch flex::Error for all of them.
#include <stdexcept>
#include <string>

namespace flex {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A module, parameter, hook or key name that does not exist.
class NotFoundError : public Error {
 public:
  using Error::Error;
};

/// A tensor of the wrong shape or dtype for where it is used.
class ShapeError : public Error {
 public:
  using Error::Error;
};

/// A malformed or inconsistent file (safetensors, index, offload folder, config).
class FileFormatError : public Error {
 public:
  using Error::Error;
};

/// An I/O failure: missing file, unwritable path, disk full.
class IOError : public Error {
 public:
  using Error::Error;
};

/// A device map or memory budget that cannot be honoured.
class DeviceMapError : public Error {
 public:
  using Error::Error;
};

/// A tensor handed to a module on another device than the module's weights
/// (an input the caller did not place). `module()` is the identity of the
/// module at fault, so a caller that knows the module tree can name it.
class DeviceError : public DeviceMapError {
 public:
  explicit DeviceError(const std::string& what, const void* module = nullptr) : DeviceMapError(what), module_(module) {}
  const void* module() const { return module_; }

 private:
  const void* module_;
};

/// A bad configuration value or argument.
class ConfigError : public Error {
 public:
  using Error::Error;
};

/// A request for something this build or this format does not support.
class UnsupportedError : public Error {
 public:
  using Error::Error;
};

/// A computation that turned NaN or infinite (a diverging training run).
class NumericError : public Error {
 public:
  using Error::Error;
};

}  // namespace flex
