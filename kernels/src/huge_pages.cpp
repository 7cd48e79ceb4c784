// empty_huge_pages: an anonymous mapping with 2 MiB slack, trimmed to a
// 2 MiB-aligned run, advised MADV_HUGEPAGE before any page is touched (so
// the first writes fault in huge pages, no later collapse is needed).
#include <flex/hooks/errors.h>
#include <flex/kernels/huge_pages.h>

#include <ATen/ATen.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

namespace flex {

namespace {

constexpr size_t kHuge = size_t(2) << 20;

size_t byte_size(at::IntArrayRef sizes, at::ScalarType dtype) {
  size_t n = c10::elementSize(dtype);
  for (int64_t s : sizes) {
    if (s < 0) throw ShapeError("empty_huge_pages: negative size in " + c10::str(sizes));
    n *= static_cast<size_t>(s);
  }
  return n;
}

}  // namespace

at::Tensor empty_huge_pages(at::IntArrayRef sizes, at::ScalarType dtype) {
  const size_t bytes = byte_size(sizes, dtype);
  if (bytes < kHuge) return at::empty(sizes, at::TensorOptions().dtype(dtype));
  const size_t length = (bytes + kHuge - 1) / kHuge * kHuge;
  void* raw = ::mmap(nullptr, length + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED)
    throw IOError("empty_huge_pages: cannot map " + std::to_string(length) + " bytes for a tensor of shape " +
                  c10::str(sizes) + ": " + std::strerror(errno));
  // Trim the slack so the run starts on a 2 MiB boundary.
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHuge - 1) / kHuge * kHuge;
  if (aligned > start) ::munmap(raw, aligned - start);
  if (const size_t tail = start + length + kHuge - (aligned + length); tail > 0)
    ::munmap(reinterpret_cast<void*>(aligned + length), tail);
  void* p = reinterpret_cast<void*>(aligned);
  (void)::madvise(p, length, MADV_HUGEPAGE);  // advice only: 4 KB pages where there are no huge ones
  return at::from_blob(
      p, sizes, [length](void* q) { ::munmap(q, length); }, at::TensorOptions().dtype(dtype).device(at::kCPU));
}

at::Tensor to_huge_pages(const at::Tensor& t) {
  if (!t.device().is_cpu() || t.nbytes() < kHuge) return t;
  at::Tensor out = empty_huge_pages(t.sizes(), t.scalar_type());
  out.copy_(t);
  return out;
}

}  // namespace flex
