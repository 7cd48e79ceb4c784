#pragma once
// Test-data paths and scratch directories, without libtorch: the tests of the
// libraries that do not use it (tests/tokenizers) include this alone;
// test_util.h adds the tensor comparisons.
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>

namespace flex_test {

/// tests/data/<rel> (override the root with FLEX_TEST_DATA).
inline std::string data_path(const std::string& rel) {
  const char* env = std::getenv("FLEX_TEST_DATA");
  std::string root = env && *env ? env : FLEX_TEST_DATA_DIR;
  return root + "/" + rel;
}

/// The golden fixtures in tests/data/fixtures (provenance: their README.md).
inline std::string fixture(const std::string& rel) { return data_path("fixtures/" + rel); }

/// A fresh directory under the system temp dir, removed when destroyed.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("flex_test_" + std::to_string(rd()) + "_" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string str(const std::string& rel = "") const { return rel.empty() ? path_.string() : (path_ / rel).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace flex_test
