#pragma once
// x W^T + b for the decode step: a token's matrix-vector products read every
// weight once, so they run at the speed memory delivers the weight.
// libtorch's GEMVs reach about two thirds of that on the CPU (bfloat16 on
// Intel, float32 through MKL on AMD); gemv streams each weight row once into
// up to 8 input rows (bfloat16: AVX512_BF16 vdpbf16ps or widened to float;
// float32: FMA; AVX-512 or AVX2), prefetching ahead of the reads.
#include <ATen/core/Tensor.h>

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
/// gemv when gemv_applies.
at::Tensor dense_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
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

}  // namespace flex
