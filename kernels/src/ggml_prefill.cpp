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

}  // namespace

void ggml_prefill(uint32_t type, const uint8_t* w, int64_t row_bytes, int64_t N, int64_t K, const at::Tensor& xf,
                  at::Tensor& y, GgmlActivations activations) {
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
