#pragma once
// Weight storage for memory-bound kernels. A decode step reads every weight
// once; on 4 KB pages the read stalls at every page (a TLB walk, and the
// hardware prefetcher stops at the page's end). On this project's Zen 4 VM a
// 2-thread streaming read was 12% faster from 2 MB pages (design decision 53),
// and the kernel gives them to process memory only where asked
// (transparent_hugepage = madvise, libtorch's allocator does not ask).
#include <ATen/core/Tensor.h>

namespace flex {

/// An uninitialised contiguous CPU tensor whose storage starts on a 2 MiB
/// boundary, a whole number of 2 MiB long, and is advised to the kernel as
/// huge-page memory (madvise MADV_HUGEPAGE: pages are 2 MB where the kernel
/// has them, 4 KB otherwise; the tensor works the same either way). Tensors
/// under 2 MiB are at::empty's. An IOError naming the size if the memory
/// cannot be mapped.
at::Tensor empty_huge_pages(at::IntArrayRef sizes, at::ScalarType dtype);

/// `t` copied into empty_huge_pages storage (contiguous, same values and
/// dtype); `t` itself when it is not on the CPU or under 2 MiB.
at::Tensor to_huge_pages(const at::Tensor& t);

}  // namespace flex
