#pragma once
// Writing a file so that readers never see half of it: bytes go to
// "<path>.tmp.<pid>", are fsync'ed, and the temp file is renamed over <path>.
// Any failure removes the temp file and throws flex::IOError naming the path.
#include <cstddef>
#include <string>

namespace flex {

class AtomicFile {
 public:
  /// Creates "<path>.tmp.<pid>" (the parent directory must exist).
  explicit AtomicFile(std::string path);
  /// Removes the temp file unless commit() succeeded.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t size);
  void write(const std::string& bytes) { write(bytes.data(), bytes.size()); }
  /// fsync, close, rename onto the final path, fsync the directory.
  void commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_; }

 private:
  void fail(const std::string& what);  // cleans up, throws IOError

  std::string path_;
  std::string temp_;
  int fd_ = -1;
  bool committed_ = false;
};

/// Writes `bytes` to `path` atomically.
void write_file_atomic(const std::string& path, const std::string& bytes);

/// Reads a whole (small) file; IOError naming the path when it cannot.
std::string read_file(const std::string& path);

}  // namespace flex
