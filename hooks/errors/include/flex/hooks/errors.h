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
