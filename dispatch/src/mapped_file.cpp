#include "flex/dispatch/mapped_file.h"

#include <flex/hooks/errors.h>

#include <ATen/Functions.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace flex {

std::shared_ptr<MappedFile> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IOError("cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw IOError("cannot stat " + path + ": " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw IOError("not a regular file: " + path);
  }
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (f->size_ > 0) {
    // MAP_PRIVATE + PROT_WRITE: in-place edits of a view (model surgery) are
    // copy-on-write in this process instead of a segfault or a changed file.
    void* p = ::mmap(nullptr, f->size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      throw IOError("cannot mmap " + path + ": " + std::strerror(err));
    }
    f->data_ = static_cast<uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive
  return f;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(data_, size_);
}

at::Tensor MappedFile::view(uint64_t offset, const std::vector<int64_t>& shape,
                            at::ScalarType dtype) const {
  auto opts = at::TensorOptions().dtype(dtype).device(at::kCPU);
  uint8_t* p = data_ ? data_ + offset : nullptr;
  size_t item = c10::elementSize(dtype);
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  if (numel == 0 || p == nullptr) return at::empty(shape, opts);
  if (reinterpret_cast<uintptr_t>(p) % item != 0) {
    at::Tensor out = at::empty(shape, opts);
    std::memcpy(out.data_ptr(), p, static_cast<size_t>(numel) * item);
    return out;
  }
  auto keep = std::const_pointer_cast<MappedFile>(shared_from_this());
  return at::from_blob(p, shape, [keep](void*) mutable { keep.reset(); }, opts);
}

}  // namespace flex
