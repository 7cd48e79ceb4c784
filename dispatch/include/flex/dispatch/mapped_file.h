#pragma once
// A read-only file mapped into memory, shared by the tensors viewing it: the
// mapping is released when the last MappedFile handle and the last tensor
// view are gone.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace flex {

class MappedFile : public std::enable_shared_from_this<MappedFile> {
 public:
  /// Maps the whole file; IOError naming the path when it cannot.
  static std::shared_ptr<MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

  /// A CPU tensor over bytes [offset, offset + numel * itemsize) of the file,
  /// without copying. The mapping is private copy-on-write: writing into the
  /// tensor changes this process's pages only, never the file. When the bytes
  /// are not aligned to the element size (files from writers that do not pad)
  /// the tensor is an aligned copy instead. The caller checks the range.
  at::Tensor view(uint64_t offset, const std::vector<int64_t>& shape, at::ScalarType dtype) const;

 private:
  MappedFile() = default;
  std::string path_;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace flex
