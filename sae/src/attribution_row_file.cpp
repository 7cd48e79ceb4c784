#include "attribution_row_file.h"

#include <flex/hooks/errors.h>

#include <ATen/ATen.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <unistd.h>

namespace flex::detail {

namespace {
// `bytes` between memory at `p` and the file at `offset` through `io`
// (::pread or ::pwrite), at most 1 GiB a call, retried on EINTR. A call
// that fails throws IOError(failure + the system's reason); one that moves
// nothing, IOError(failure + `nothing_moved`).
template <class Io, class Byte>
void transfer_all(Io io, int fd, Byte* p, int64_t bytes, off_t offset, const std::string& failure,
                  const char* nothing_moved) {
  while (bytes > 0) {
    const ssize_t n = io(fd, p, static_cast<size_t>(std::min<int64_t>(bytes, 1 << 30)), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw IOError(failure + (n < 0 ? std::strerror(errno) : nothing_moved));
    p += n;
    offset += n;
    bytes -= n;
  }
}
}  // namespace

std::string attribution_temp_parent(const std::string& given) {
  if (!given.empty()) return given;
  const char* env = std::getenv("TMPDIR");
  return env && *env ? env : "/tmp";
}

RowFile::RowFile(const std::string& parent, const std::string& name, int64_t cols, at::ScalarType dtype)
    : cols_(cols), dtype_(dtype) {
  row_bytes_ = cols * static_cast<int64_t>(c10::elementSize(dtype));
  std::string templ = parent + "/flexmodel-attribution-XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr)
    throw IOError("attribution: cannot make a temporary folder in '" + parent + "': " + std::strerror(errno));
  folder_ = templ;
  path_ = folder_ + "/" + name;
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd_ < 0) {
    const std::string why = std::strerror(errno);
    ::rmdir(folder_.c_str());
    throw IOError("attribution: cannot create '" + path_ + "': " + why);
  }
}

RowFile::~RowFile() {
  if (fd_ >= 0) ::close(fd_);
  ::unlink(path_.c_str());
  ::rmdir(folder_.c_str());
}

void RowFile::append(const at::Tensor& rows) {
  const at::Tensor r = rows.to(dtype_).contiguous();
  if (r.dim() != 2 || r.size(1) != cols_)
    throw ShapeError("attribution: rows of shape " + c10::str(r.sizes()) + " for a file of " + std::to_string(cols_) +
                     " columns");
  transfer_all(::pwrite, fd_, static_cast<const char*>(r.data_ptr()), r.size(0) * row_bytes_,
               static_cast<off_t>(rows_ * row_bytes_), "attribution: cannot write the edge rows to '" + path_ + "': ",
               "no space written");
  rows_ += r.size(0);
}

void RowFile::read_into(void* dst, int64_t first, int64_t n) const {
  transfer_all(::pread, fd_, static_cast<char*>(dst), n * row_bytes_, static_cast<off_t>(first * row_bytes_),
               "attribution: cannot read the edge rows back from '" + path_ + "': ", "the file is shorter than written");
}

at::Tensor RowFile::read(int64_t first, int64_t n) const {
  if (first < 0 || n < 0 || first + n > rows_)
    throw ShapeError("attribution: rows [" + std::to_string(first) + ", " + std::to_string(first + n) + ") of a file of " +
                     std::to_string(rows_));
  at::Tensor out = at::empty({n, cols_}, at::TensorOptions().dtype(dtype_));
  if (n > 0) read_into(out.data_ptr(), first, n);
  return out;
}

at::Tensor RowFile::gather(const std::vector<int64_t>& index) const {
  const int64_t n = static_cast<int64_t>(index.size());
  at::Tensor out = at::empty({n, cols_}, at::TensorOptions().dtype(dtype_));
  char* p = static_cast<char*>(out.data_ptr());
  for (int64_t i = 0; i < n;) {
    // Runs of consecutive rows in one read.
    int64_t j = i + 1;
    while (j < n && index[j] == index[j - 1] + 1) ++j;
    if (index[i] < 0 || index[j - 1] >= rows_)
      throw ShapeError("attribution: row " + std::to_string(index[i] < 0 ? index[i] : index[j - 1]) + " of a file of " +
                       std::to_string(rows_));
    read_into(p + i * row_bytes_, index[i], j - i);
    i = j;
  }
  return out;
}

}  // namespace flex::detail
