#pragma once
// A library GEMM split between threads adds its partial sums in an order
// that depends on the thread count (PyTorch's wheel: MKL on AMD CPUs splits
// even a 9 x 17 x 256 product). A kernel that promises the same bits for
// any thread count cuts its work into tiles fixed by the shapes alone and
// runs each tile's library product on one thread, under this guard.
namespace flex {

/// While alive, BLAS calls made by this thread run on this thread alone
/// (MKL's thread-local thread count, restored after). A no-op where
/// libtorch's BLAS has no such setting.
class SequentialBlas {
 public:
  SequentialBlas();
  ~SequentialBlas();
  SequentialBlas(const SequentialBlas&) = delete;
  SequentialBlas& operator=(const SequentialBlas&) = delete;

 private:
  int saved_ = 0;
};

}  // namespace flex
