#pragma once
// x W^T + b for the decode step: a token's matrix-vector products read every
// weight once, so they run at the speed memory delivers the weight. For
// bfloat16 weights libtorch's GEMV reaches about two thirds of that on the
// CPU; bf16_gemv streams each weight row once into up to 8 input rows
// (AVX512_BF16 vdpbf16ps, or bf16 widened to float + FMA on AVX-512 / AVX2).
#include <ATen/core/Tensor.h>

namespace flex {

/// Input rows bf16_gemv takes in one pass; more rows are a GEMM (at::linear).
constexpr int64_t kGemvMaxRows = 8;

/// How a dense weight is stored: [out, in] (torch.nn.Linear) or [in, out]
/// (GPT-2's Conv1D, where x W is a product with the weight's rows).
enum class WeightLayout { OutIn, InOut };

/// True when dense_linear would take bf16_gemv: CPU tensors, a contiguous
/// bfloat16 weight in `layout`, bfloat16 x [..., in] with at most
/// kGemvMaxRows rows, a bfloat16 bias [out] or none, a vector ISA
/// (cpu_isa() >= Avx2 for OutIn, >= Avx512 for InOut), and no autograd graph
/// to record (the kernel has no backward).
bool gemv_applies(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                  WeightLayout layout = WeightLayout::OutIn);

/// x W^T + b (OutIn, at::linear) or x W + b (InOut, at::addmm), through
/// bf16_gemv when gemv_applies.
at::Tensor dense_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                        WeightLayout layout = WeightLayout::OutIn);

/// The GEMV (float accumulation, one rounding to bfloat16 at the end, bias
/// added in float). Each output is computed whole by one thread: the same
/// bits for any thread count. A ShapeError for mismatched or too many rows,
/// an UnsupportedError for other dtypes, devices or a non-contiguous weight.
/// InOut: each thread owns a band of output columns and streams its part
/// of every weight row, accumulating in float in a per-thread buffer.
at::Tensor bf16_gemv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                     WeightLayout layout = WeightLayout::OutIn);

}  // namespace flex
