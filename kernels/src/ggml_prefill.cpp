// ggml_linear's prefill: tiles of weight rows dequantized into a per-thread
// buffer and multiplied by a dense GEMM.
#include "ggml_prefill.h"

#include <flex/kernels/ggml_dequant.h>
#include <flex/kernels/linear.h>
#include <flex/kernels/sequential_blas.h>
#include <flex/kernels/target.h>

#include "ggml_gemv_isa.h"
#include "shared_chunks.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

namespace flex::kernel {

namespace {

constexpr int64_t kTileBytes = 1 << 20;  // dequantized float tile per thread in prefill (stays in L2)

void dequantize_rows(uint32_t type, const uint8_t* w, int64_t row_bytes, int64_t K, int64_t r0, int64_t r1, float* out) {
  switch (cpu_isa()) {
#if FLEX_HAVE_X86_KERNELS
    case Isa::Avx512:
    case Isa::Avx512Bf16: return ggml_avx512::dequantize(type, w, row_bytes, K, r0, r1, out);
    case Isa::Avx2: return ggml_avx2::dequantize(type, w, row_bytes, K, r0, r1, out);
#endif
    default:
      for (int64_t j = r0; j < r1; ++j) dequantize_ggml_reference(type, w + j * row_bytes, out + (j - r0) * K, K);
  }
}

// Fast activations: the inputs rounded to bfloat16 once per call, each tile
// of weight rows dequantized (float32, kStageBytes of rows at a time, in L1)
// and rounded to bfloat16, and the tile's product taken by libtorch's
// bfloat16 GEMM (oneDNN's vdpbf16ps kernels: float32 sums, one rounding of
// each output to bfloat16, widened back to float32 here).
constexpr int64_t kBf16TileBytes = 1 << 20;  // bfloat16 tile per thread (oneDNN reorders it)
constexpr int64_t kStageBytes = 1 << 15;     // float32 rows dequantized at a time (L1)

#if FLEX_HAVE_X86_KERNELS
// n floats to bfloat16, round to nearest even (as c10::BFloat16 rounds a
// finite float), 32 at a time.
FLEX_TARGET_AVX512_BF16 void to_bf16(const float* x, at::BFloat16* out, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
    _mm512_storeu_si512(out + i, reinterpret_cast<const __m512i&>(v));
  }
  for (; i < n; ++i) out[i] = at::BFloat16(x[i]);
}
#else
void to_bf16(const float* x, at::BFloat16* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = at::BFloat16(x[i]);
}
#endif

// oneDNN's bfloat16 GEMM, where libtorch has it and the CPU has AVX512_BF16
// (without vdpbf16ps a bf16 product has no faster arithmetic than the
// float tiles, only extra roundings; not measured, no such CPU here).
bool bf16_gemm_applies() {
  return FLEX_HAVE_X86_KERNELS && cpu_isa() == Isa::Avx512Bf16 && at::hasMKLDNN();
}

void prefill_bf16(uint32_t type, const uint8_t* w, int64_t row_bytes, int64_t N, int64_t K, const at::Tensor& xf,
                  at::Tensor& y) {
  const at::Tensor xb = xf.to(at::kBFloat16);
  // Whole 32s of rows: oneDNN's kernels take 16 or 32 columns at a time (a
  // 93-row tile of the 5632-input down projection ran 10% slower than 64).
  // At least 4 tiles where N allows, so that a small product (k and v: 256
  // rows) still feeds 2 threads; the tiles follow from the shapes alone.
  const int64_t quarter = (N / 4 + 31) / 32 * 32;
  const int64_t tile =
      std::min<int64_t>(N, std::max<int64_t>(32, std::min<int64_t>(kBf16TileBytes / (2 * K) / 32 * 32, quarter)));
  const int64_t tiles = (N + tile - 1) / tile;
  const int64_t stage_rows = std::max<int64_t>(1, kStageBytes / (4 * K));
  kernel::shared_chunks(tiles, 1, [&](int64_t t0, int64_t t1) {
    SequentialBlas one_thread;
    std::vector<float> stage(static_cast<size_t>(stage_rows * K));
    at::Tensor wb = at::empty({tile, K}, at::kBFloat16);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r0 = t * tile, r1 = std::min(N, r0 + tile);
      for (int64_t s0 = r0; s0 < r1; s0 += stage_rows) {
        const int64_t s1 = std::min(r1, s0 + stage_rows);
        dequantize_rows(type, w, row_bytes, K, s0, s1, stage.data());
        to_bf16(stage.data(), wb.data_ptr<at::BFloat16>() + (s0 - r0) * K, (s1 - s0) * K);
      }
      y.narrow(1, r0, r1 - r0).copy_(at::mm(xb, wb.narrow(0, 0, r1 - r0).t()));
    }
  });
}

}  // namespace

void ggml_prefill(uint32_t type, const uint8_t* w, int64_t row_bytes, int64_t N, int64_t K, const at::Tensor& xf,
                  at::Tensor& y, GgmlActivations activations) {
  if (activations == GgmlActivations::Q8 && bf16_gemm_applies()) return prefill_bf16(type, w, row_bytes, N, K, xf, y);
  // Prefill: float tiles of rows, each tile's product on its own thread.
  const int64_t tile = std::max<int64_t>(16, std::min<int64_t>(N, kTileBytes / (4 * K)));
  const int64_t tiles = (N + tile - 1) / tile;
  // The tile's GEMM is the one dense_linear picks for a float32 weight
  // (gemm_library(): oneDNN on AMD, where MKL's float32 GEMM takes a
  // generic 256-bit path and made these tiles 2.1x slower than the F32
  // file's product, bench_ggml_kernels --prefill).
  const bool onednn = onednn_applies(xf, at::empty({tile, K}, at::kFloat), at::Tensor());
  kernel::shared_chunks(tiles, 1, [&](int64_t t0, int64_t t1) {
    SequentialBlas one_thread;
    at::Tensor buf = at::empty({tile, K}, at::kFloat);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r0 = t * tile, r1 = std::min(N, r0 + tile);
      dequantize_rows(type, w, row_bytes, K, r0, r1, buf.data_ptr<float>());
      const at::Tensor wt = buf.narrow(0, 0, r1 - r0);
      y.narrow(1, r0, r1 - r0).copy_(onednn ? onednn_linear(xf, wt, at::Tensor()) : at::mm(xf, wt.t()));
    }
  });
}

}  // namespace flex::kernel
