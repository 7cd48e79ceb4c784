#include <flex/kernels/sequential_blas.h>

// MKL's per-thread setting, when libtorch carries MKL (its x86 wheels
// export it); weak, so a libtorch built on another BLAS still links. The C
// entry point: the lower-case names are Fortran's (an int by pointer).
extern "C" int MKL_Set_Num_Threads_Local(int nt) __attribute__((weak));

namespace flex {

SequentialBlas::SequentialBlas() {
  if (MKL_Set_Num_Threads_Local) saved_ = MKL_Set_Num_Threads_Local(1);
}

SequentialBlas::~SequentialBlas() {
  // 0 restores the global setting, which is what the thread had unless it set its own.
  if (MKL_Set_Num_Threads_Local) MKL_Set_Num_Threads_Local(saved_);
}

}  // namespace flex
