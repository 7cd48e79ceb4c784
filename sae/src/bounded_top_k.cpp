#include "bounded_top_k.h"
#include "top_k_slots.h"

#include <flex/hooks/errors.h>
#include <flex/hooks/shape_text.h>
#include <flex/kernels/cpu_isa.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

namespace flex::detail {

namespace {

constexpr double kU = 1.0 / 256;  // bfloat16's unit roundoff

// One row's candidates: index, and the bounds of its value.
struct Bounds {
  int64_t index;
  float lo, hi;
};

}  // namespace

BoundedEncoder make_bounded_encoder(const at::Tensor& W_enc) {
  if (W_enc.dim() != 2 || W_enc.scalar_type() != at::kFloat)
    throw ShapeError("bounded top-k: W_enc must be a float32 [d_in, d_sae] matrix, got " + shape_text(W_enc.sizes()));
  BoundedEncoder e;
  e.wT = W_enc.t().contiguous();
  e.w16 = e.wT.to(at::kBFloat16);
  e.norms = e.wT.to(at::kDouble).norm(2, {1}).to(at::kFloat).contiguous();
  return e;
}

bool bounded_top_k_pays() { return cpu_isa() >= Isa::Avx512Bf16; }

SparseCode bounded_top_k_code(const BoundedEncoder& enc, const at::Tensor& s_in, const at::Tensor& b_enc_in, int64_t k) {
  const int64_t N = s_in.size(0), K = s_in.size(1), D = enc.wT.size(0);
  if (s_in.dim() != 2 || K != enc.wT.size(1) || b_enc_in.numel() != D)
    throw ShapeError("bounded top-k: input " + shape_text(s_in.sizes()) + " and b_enc " + shape_text(b_enc_in.sizes()) +
                     " do not fit a [" + std::to_string(K) + ", " + std::to_string(D) + "] encoder");
  if (k < 1 || k > D) throw ConfigError("bounded top-k: k = " + std::to_string(k) + " for " + std::to_string(D) + " features");
  const at::Tensor s = s_in.contiguous();
  const at::Tensor b_enc = b_enc_in.to(at::kFloat).contiguous();
  const at::Tensor approx = at::mm(s.to(at::kBFloat16), enc.w16.t()).contiguous();  // [N, D] bfloat16
  const at::Tensor s_norm = s.to(at::kDouble).norm(2, {1}).to(at::kFloat).contiguous();

  const double gamma = static_cast<double>(K) / (1 << 24) * 1.01;
  const float A = static_cast<float>(2.01 * kU + 4 * gamma), B = static_cast<float>(1.01 * kU + 1.0 / (1 << 22));
  const at::BFloat16* ap = approx.const_data_ptr<at::BFloat16>();
  const float* bp = b_enc.const_data_ptr<float>();
  const float* wn = enc.norms.const_data_ptr<float>();
  const float* sn = s_norm.const_data_ptr<float>();

  // Candidates per row (CSR), found in parallel into per-row vectors.
  std::vector<std::vector<int64_t>> cand(N);
  // Chunk maxima of the lower bounds bound the k-th largest lower bound from below.
  const int64_t cs = top_k_chunk_size(D, k), chunks = (D + cs - 1) / cs;
  at::parallel_for(0, N, kRowGrain, [&](int64_t begin, int64_t end) {
    std::vector<float> lo(D), hi(D), maxima(chunks);
    std::vector<Bounds> got;
    for (int64_t n = begin; n < end; ++n) {
      const at::BFloat16* row = ap + n * D;
      const float scale = A * sn[n];
      for (int64_t f = 0; f < D; ++f) {
        const float p = static_cast<float>(row[f]);
        const float h = p + bp[f];
        const float e = scale * wn[f] + B * (std::abs(p) + std::abs(bp[f]));
        lo[f] = h - e;
        hi[f] = h + e;
      }
      float floor_lo = -INFINITY;  // <= the k-th largest lower bound
      if (chunks > k) {
        for (int64_t c = 0; c < chunks; ++c) {
          const int64_t e = std::min(D, (c + 1) * cs);
          float m = lo[c * cs];
          for (int64_t f = c * cs + 1; f < e; ++f) m = lo[f] > m ? lo[f] : m;
          maxima[c] = m;
        }
        std::nth_element(maxima.begin(), maxima.begin() + (k - 1), maxima.end(), std::greater<float>());
        floor_lo = maxima[k - 1];
      }
      got.clear();
      for (int64_t f = 0; f < D; ++f)
        if (hi[f] >= floor_lo && hi[f] > 0.0f) got.push_back({f, lo[f], hi[f]});
      // The k-th largest lower bound over the whole row: those >= floor_lo
      // with hi <= 0 were left out, but their lower bounds are <= 0 too.
      float kth = floor_lo;
      if (static_cast<int64_t>(got.size()) >= k) {
        std::vector<float> los(got.size());
        for (size_t j = 0; j < got.size(); ++j) los[j] = got[j].lo;
        std::nth_element(los.begin(), los.begin() + (k - 1), los.end(), std::greater<float>());
        kth = std::max(kth, los[k - 1]);
      }
      auto& c = cand[n];
      for (const Bounds& b : got)
        if (b.hi >= kth) c.push_back(b.index);
    }
  });

  // Exact float32 values of the candidates, then the k largest positive ones.
  SparseCode cc;
  cc.rows = N;
  cc.width = D;
  std::vector<int64_t> ptr(N + 1, 0);
  for (int64_t n = 0; n < N; ++n) ptr[n + 1] = ptr[n] + static_cast<int64_t>(cand[n].size());
  cc.indptr = at::tensor(ptr, at::kLong);
  cc.indices = at::empty({ptr[N]}, at::kLong);
  int64_t* ci = cc.indices.data_ptr<int64_t>();
  for (int64_t n = 0; n < N; ++n) std::copy(cand[n].begin(), cand[n].end(), ci + ptr[n]);
  const at::Tensor exact = sampled_dots(cc, s, enc.wT);
  const float* ev = exact.const_data_ptr<float>();

  TopKSlots slots(N, D, k);
  at::parallel_for(0, N, kRowGrain, [&](int64_t begin, int64_t end) {
    std::vector<std::pair<float, int64_t>> row;
    for (int64_t n = begin; n < end; ++n) {
      row.clear();
      for (int64_t j = ptr[n]; j < ptr[n + 1]; ++j) {
        const float v = ev[j] + bp[ci[j]];
        if (v > 0.0f) row.emplace_back(v, ci[j]);
      }
      auto larger = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
      const int64_t keep = std::min<int64_t>(k, row.size());
      std::partial_sort(row.begin(), row.begin() + keep, row.end(), larger);
      std::sort(row.begin(), row.begin() + keep, [](const auto& a, const auto& b) { return a.second < b.second; });
      slots.count[n] = keep;
      for (int64_t j = 0; j < keep; ++j) {
        slots.index[n * k + j] = row[j].second;
        slots.value[n * k + j] = row[j].first;
      }
    }
  });
  return slots.to_code();
}

}  // namespace flex::detail
