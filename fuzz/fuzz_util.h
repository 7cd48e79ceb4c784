#pragma once
// Shared by the libFuzzer targets: a per-process scratch directory, writing the
// input to a file there, and the rule every target checks — bad input may only
// surface as a typed flex::Error; any other exception is a bug, reported by
// aborting so libFuzzer saves the input.
#include <flex/hooks/errors.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <typeinfo>
#include <unistd.h>

namespace flex_fuzz {

/// tests/data/<rel> of the source tree (the seed data and fixtures).
inline std::string data_path(const std::string& rel) { return std::string(FLEX_FUZZ_DATA_DIR) + "/" + rel; }

/// A scratch directory for this process (on /dev/shm when it exists: the
/// targets write one file per input).
inline const std::string& scratch() {
  // Never destroyed: the atexit cleanup below runs after static destructors.
  static const std::string* dir = [] {
    std::filesystem::path base = std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
    auto d = base / ("flex_fuzz_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch(), ec);
    });
    return new std::string(d.string());
  }();
  return *dir;
}

inline void write_bytes(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!f) std::abort();
}

/// Runs `f`; a flex::Error is an accepted outcome, anything else aborts.
template <typename F>
void guarded(F&& f) {
  try {
    f();
  } catch (const flex::Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "untyped exception %s: %s\n", typeid(e).name(), e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "unknown exception\n");
    std::abort();
  }
}

/// A property the target checks failed: report and abort.
inline void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "property violated: %s\n", what);
    std::abort();
  }
}

}  // namespace flex_fuzz
