#include "dense_passes.h"

#include <flex/hooks/errors.h>
#include <flex/hooks/shape_text.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <vector>

namespace flex::detail {

namespace {

// Rows per block: a block's partial column sums are one [D] row of floats.
constexpr int64_t kBlockRows = 64;

void check_dense(const at::Tensor& t, const char* what, const char* fn) {
  if (t.dim() != 2 || t.scalar_type() != at::kFloat || !t.is_contiguous() || !t.device().is_cpu())
    throw ShapeError(std::string(fn) + ": " + what + " must be a contiguous 2-D float CPU tensor, got " +
                     shape_text(t.sizes()));
}

// Column sums of the per-block partials, blocks in order, in double.
template <typename T, typename Out>
void reduce_blocks(const std::vector<T>& partial, int64_t blocks, int64_t D, Out* out) {
  at::parallel_for(0, D, 1024, [&](int64_t f0, int64_t f1) {
    for (int64_t f = f0; f < f1; ++f) {
      double s = 0;
      for (int64_t b = 0; b < blocks; ++b) s += static_cast<double>(partial[b * D + f]);
      out[f] = static_cast<Out>(s);
    }
  });
}

}  // namespace

ReluColumns relu_columns_(at::Tensor& h) {
  check_dense(h, "pre-activations", "relu_columns_");
  const int64_t N = h.size(0), D = h.size(1), blocks = (N + kBlockRows - 1) / kBlockRows;
  float* p = h.data_ptr<float>();
  std::vector<float> sums(blocks * D, 0.0f);
  std::vector<int32_t> counts(blocks * D, 0);
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      float* __restrict__ s = sums.data() + b * D;
      int32_t* __restrict__ c = counts.data() + b * D;
      const int64_t end = std::min(N, (b + 1) * kBlockRows);
      for (int64_t n = b * kBlockRows; n < end; ++n) {
        float* __restrict__ row = p + n * D;
        for (int64_t f = 0; f < D; ++f) {
          const float v = row[f] <= 0.0f ? 0.0f : row[f];
          row[f] = v;
          s[f] += v;
          c[f] += v != 0.0f;
        }
      }
    }
  });
  ReluColumns r;
  r.sums = at::empty({D}, at::kFloat);
  r.fired = at::empty({D}, at::kLong);
  reduce_blocks(sums, blocks, D, r.sums.data_ptr<float>());
  reduce_blocks(counts, blocks, D, r.fired.data_ptr<int64_t>());
  r.nnz = r.fired.sum().item<int64_t>();
  return r;
}

at::Tensor mask_shift_columns_(at::Tensor& q, const at::Tensor& acts, const at::Tensor& shift) {
  check_dense(q, "gradient", "mask_shift_columns_");
  check_dense(acts, "activations", "mask_shift_columns_");
  const int64_t N = q.size(0), D = q.size(1), blocks = (N + kBlockRows - 1) / kBlockRows;
  if (acts.sizes() != q.sizes() || shift.numel() != D)
    throw ShapeError("mask_shift_columns_: gradient " + shape_text(q.sizes()) + ", activations " +
                     shape_text(acts.sizes()) + " and shift " + shape_text(shift.sizes()) + " do not match");
  const at::Tensor sh = shift.to(at::kFloat).contiguous();
  const float* __restrict__ add = sh.const_data_ptr<float>();
  float* qp = q.data_ptr<float>();
  const float* ap = acts.const_data_ptr<float>();
  std::vector<float> sums(blocks * D, 0.0f);
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      float* __restrict__ s = sums.data() + b * D;
      const int64_t end = std::min(N, (b + 1) * kBlockRows);
      for (int64_t n = b * kBlockRows; n < end; ++n) {
        float* __restrict__ row = qp + n * D;
        const float* __restrict__ a = ap + n * D;
        for (int64_t f = 0; f < D; ++f) {
          const float v = a[f] <= 0.0f ? 0.0f : row[f] + add[f];
          row[f] = v;
          s[f] += v;
        }
      }
    }
  });
  at::Tensor out = at::empty({D}, at::kFloat);
  reduce_blocks(sums, blocks, D, out.data_ptr<float>());
  return out;
}

}  // namespace flex::detail
