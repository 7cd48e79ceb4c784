#pragma once
// A forward pass allocates and frees the same activation-sized blocks on
// every batch. glibc's malloc serves blocks of 32 MB and more (a batch's
// logits, a dictionary's feature matrix) with fresh mmap()s and gives freed
// heap tops back to the kernel, so each batch page-faults and zeroes its
// memory again: a sixth of a dataset capture's time on GPT-2 small, and
// every capture that keeps its tensors (so frees none before the next
// forward) pays it on each of them.
namespace flex {

/// Makes this process's malloc keep freed memory for reuse: no mmap()ed
/// blocks (large ones come from the heap too) and no trimming of the heap
/// top, so the resident size stays at its high-water mark instead of
/// following each batch up and down. For processes that run many forwards:
/// the command line and the Python package call it first thing. A no-op
/// (returning false) when FLEXMODEL_KEEP_FREED_MEMORY=0 and outside glibc;
/// idempotent. Returns whether the settings took.
bool keep_freed_memory();

}  // namespace flex
