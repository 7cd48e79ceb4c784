#include "flex/dispatch/atomic_file.h"

#include <flex/hooks/errors.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace flex {

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  temp_ = path_ + ".tmp." + std::to_string(::getpid());
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw IOError("cannot create " + temp_ + " (writing " + path_ + "): " + std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_.c_str());
}

void AtomicFile::fail(const std::string& what) {
  int err = errno;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(temp_.c_str());
  throw IOError("writing " + path_ + ": " + what + ": " + std::strerror(err));
}

void AtomicFile::write(const void* data, size_t size) {
  if (fd_ < 0) throw IOError("writing " + path_ + ": file already committed or failed");
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    // Large tensors: write in chunks below the 2 GiB Linux per-call limit.
    size_t chunk = size < (size_t(1) << 30) ? size : (size_t(1) << 30);
    ssize_t n = ::write(fd_, p, chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write failed");
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void AtomicFile::commit() {
  if (fd_ < 0) throw IOError("writing " + path_ + ": file already committed or failed");
  if (::fsync(fd_) != 0) fail("fsync failed");
  if (::close(fd_) != 0) {
    fd_ = -1;
    fail("close failed");
  }
  fd_ = -1;
  if (::rename(temp_.c_str(), path_.c_str()) != 0) fail("rename from " + temp_ + " failed");
  committed_ = true;
  // The rename itself is durable only once the directory is synced.
  std::string dir = std::filesystem::path(path_).parent_path().string();
  if (dir.empty()) dir = ".";
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  AtomicFile f(path);
  f.write(bytes);
  f.commit();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IOError("cannot open " + path + ": " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw IOError("cannot read " + path);
  return ss.str();
}

}  // namespace flex
