#pragma once
// x W^T + b for the decode step: a token's matrix-vector products read every
// weight once, so they run at the speed memory delivers the weight.
// libtorch's GEMVs reach about two thirds of that on the CPU (bfloat16 on
// Intel, float32 through MKL on AMD); gemv streams each weight row once into
// up to 8 input rows (bfloat16: AVX512_BF16 vdpbf16ps or widened to float;
// float32: FMA; AVX-512 or AVX2), prefetching ahead of the reads.
#include <ATen/core/Tensor.h>

#include <utility>
#include <vector>

namespace flex {

/// Input rows gemv takes in one pass; more rows are a GEMM (at::linear).
constexpr int64_t kGemvMaxRows = 8;

/// How a dense weight is stored: [out, in] (torch.nn.Linear) or [in, out]
/// (GPT-2's Conv1D, where x W is a product with the weight's rows).
enum class WeightLayout { OutIn, InOut };

/// True when dense_linear would take gemv: CPU tensors, x, weight and bias
/// all bfloat16 or all float32, a contiguous weight in `layout`, x [..., in]
/// with at most kGemvMaxRows rows, a bias [out] or none, a vector ISA
/// (cpu_isa() >= Avx2 for OutIn, >= Avx512 for InOut), and no autograd graph
/// to record (the kernel has no backward).
bool gemv_applies(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                  WeightLayout layout = WeightLayout::OutIn);

/// x W^T + b (OutIn, at::linear) or x W + b (InOut, at::addmm), through
/// gemv when gemv_applies, else through oneDNN when onednn_applies.
at::Tensor dense_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                        WeightLayout layout = WeightLayout::OutIn);

/// Which library multiplies float32 matrices of more rows than gemv takes.
/// libtorch's at::linear / at::mm use MKL, whose float32 GEMM takes a
/// generic path on AMD CPUs: on a 2-core EPYC (Zen 4) oneDNN's was 15-25%
/// faster on transformer-shaped products and 60% on a 50k-vocabulary head.
/// FLEXMODEL_GEMM=mkl|onednn picks one (another value is a ConfigError);
/// unset: oneDNN on AMD CPUs, MKL elsewhere. Both give the same bits for
/// any thread count; they differ from each other in the last bits.
enum class GemmLibrary { Mkl, OneDnn };
GemmLibrary gemm_library();
/// Overrides the choice for this scope (process-wide; tests and benchmarks).
class ScopedGemmLibrary {
 public:
  explicit ScopedGemmLibrary(GemmLibrary library);
  ~ScopedGemmLibrary();
  ScopedGemmLibrary(const ScopedGemmLibrary&) = delete;
  ScopedGemmLibrary& operator=(const ScopedGemmLibrary&) = delete;

 private:
  int previous_;
};

/// True when dense_linear would take oneDNN: gemm_library() is OneDnn and
/// libtorch has oneDNN, CPU float32 x (more than kGemvMaxRows rows), a
/// float32 2-D weight and a bias [out] or none, and no autograd graph to
/// record (oneDNN's product has no backward in libtorch).
bool onednn_applies(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                    WeightLayout layout = WeightLayout::OutIn);
/// x W^T + b through oneDNN (libtorch's mkldnn::_linear_pointwise), for
/// weights in either layout; an UnsupportedError where onednn_applies is
/// false for any reason but the library choice.
at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                         WeightLayout layout = WeightLayout::OutIn);

/// The GEMV, for bfloat16 or float32 (x, weight, bias of one dtype): float
/// accumulation, bias added in float, one rounding to the dtype at the end.
/// Each output is computed whole by one thread: the same bits for any
/// thread count. A ShapeError for mismatched or too many rows, an
/// UnsupportedError for other or mixed dtypes, devices or a non-contiguous
/// weight. InOut: each thread owns a band of output columns and streams its
/// part of every weight row, accumulating in float in a per-thread buffer.
at::Tensor gemv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                WeightLayout layout = WeightLayout::OutIn);

/// x through each OutIn (weight, bias), as one dense_linear call per weight
/// gives, bit for bit; where gemv_applies to all of them, in one
/// parallel region (a decode step's q/k/v or gate/up: three or two small
/// products become one, without a thread start and tail each).
std::vector<at::Tensor> gemv_group(const at::Tensor& x, const std::vector<std::pair<at::Tensor, at::Tensor>>& weights);

}  // namespace flex
