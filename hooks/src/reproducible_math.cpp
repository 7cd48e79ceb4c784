// Same inputs, same bits, in every run.
//
// The PyTorch wheel's libtorch computes float matrix products with MKL on
// x86, and MKL picks its kernels by the memory alignment of the operands
// unless told otherwise: the same product of the same numbers then differs in
// the last bit from one run to the next (a resumed dataset capture differed
// from the uninterrupted one in 0.07% of its values, by ~1e-7). MKL_CBWR=AUTO
// (Intel's "conditional numerical reproducibility") fixes the choice for a
// given CPU and thread count. Set when this library loads, before anything
// calls MKL; a value already in the environment wins.
#include <cstdlib>

namespace flex {
namespace {

const bool mkl_reproducible_by_default = [] {
  ::setenv("MKL_CBWR", "AUTO", /*overwrite=*/0);
  return true;
}();

}  // namespace
}  // namespace flex
