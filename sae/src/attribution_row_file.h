#pragma once
// Rows of a matrix on disk, appended in order and read back by ranges or by
// index: where a streamed attribution keeps its edge rows (design decision
// 45), so that no process memory holds the whole matrix. The file lives in
// a folder of its own made under `parent` and is removed with the object,
// also when an error unwinds. Reads and writes go through pread/pwrite into
// tensors the caller sizes (no mapping: the file's pages stay out of the
// process's resident size). Internal to attribution.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace flex::detail {

class RowFile {
 public:
  /// IOError naming `parent` when the folder cannot be made in it.
  RowFile(const std::string& parent, const std::string& name, int64_t cols, at::ScalarType dtype);
  ~RowFile();
  RowFile(const RowFile&) = delete;
  RowFile& operator=(const RowFile&) = delete;

  /// Appends [n, cols] (converted to the file's dtype). IOError naming the
  /// file when the write fails (a full disk).
  void append(const at::Tensor& rows);
  /// Rows [first, first + n) as [n, cols].
  at::Tensor read(int64_t first, int64_t n) const;
  /// The rows at `index` (any order) as [index.size(), cols].
  at::Tensor gather(const std::vector<int64_t>& index) const;

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  at::ScalarType dtype() const { return dtype_; }
  int64_t row_bytes() const { return row_bytes_; }
  const std::string& path() const { return path_; }
  const std::string& folder() const { return folder_; }

 private:
  void read_into(void* dst, int64_t first, int64_t n) const;
  std::string folder_, path_;
  int fd_ = -1;
  int64_t rows_ = 0, cols_ = 0, row_bytes_ = 0;
  at::ScalarType dtype_;
};

/// The folder under which streamed attributions make theirs: `given`, else
/// $TMPDIR, else /tmp.
std::string attribution_temp_parent(const std::string& given);

}  // namespace flex::detail
