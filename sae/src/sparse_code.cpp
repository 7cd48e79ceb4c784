#include <flex/sae/sparse_code.h>

#include "top_k_slots.h"

#include <flex/hooks/errors.h>
#include <flex/hooks/shape_text.h>

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <vector>

namespace flex {

using detail::kRowGrain;

namespace {

// True when any of the n values at p is non-zero (-0.0 counts as zero): one
// vectorised OR over the bits, so the mostly-zero rows of a code are skipped
// 16 values at a time.
bool any_nonzero(const float* p, int64_t n) {
  const uint32_t* b = reinterpret_cast<const uint32_t*>(p);
  uint32_t any = 0;
  for (int64_t j = 0; j < n; ++j) any |= b[j] & 0x7fffffffu;
  return any != 0;
}

template <typename T>
bool any_nonzero(const T* p, int64_t n) {
  for (int64_t j = 0; j < n; ++j)
    if (static_cast<float>(p[j]) != 0.0f) return true;
  return false;
}

constexpr int64_t kChunk = 16;

// Calls on(d) for each non-zero entry of a row, in index order.
template <typename T, typename F>
void for_each_nonzero(const T* row, int64_t D, F&& on) {
  for (int64_t c = 0; c < D; c += kChunk) {
    const int64_t n = std::min(kChunk, D - c);
    if (!any_nonzero(row + c, n)) continue;
    for (int64_t d = c; d < c + n; ++d)
      if (static_cast<float>(row[d]) != 0.0f) on(d);
  }
}

}  // namespace

SparseCode sparse_code(const at::Tensor& acts) {
  if (acts.dim() < 1) throw ShapeError("sparse_code: feature activations need at least one dim, got a scalar");
  if (!acts.device().is_cpu()) throw ConfigError("sparse_code: feature activations must be on the CPU");
  SparseCode c;
  c.width = acts.size(-1);
  const at::Tensor a = acts.reshape({-1, c.width}).contiguous();
  c.rows = a.size(0);
  const int64_t N = c.rows, D = c.width;
  std::vector<int64_t> counts(N + 1, 0);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, a.scalar_type(), "sparse_code_count", [&] {
    const scalar_t* p = a.const_data_ptr<scalar_t>();
    at::parallel_for(0, N, kRowGrain, [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) {
        int64_t k = 0;
        for_each_nonzero(p + n * D, D, [&](int64_t) { ++k; });
        counts[n + 1] = k;
      }
    });
  });
  std::partial_sum(counts.begin(), counts.end(), counts.begin());
  c.indptr = at::tensor(counts, at::kLong);
  const int64_t nnz = counts[N];
  c.indices = at::empty({nnz}, at::kLong);
  c.values = at::empty({nnz}, a.options());
  int64_t* idx = c.indices.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, a.scalar_type(), "sparse_code_fill", [&] {
    const scalar_t* p = a.const_data_ptr<scalar_t>();
    scalar_t* val = c.values.data_ptr<scalar_t>();
    at::parallel_for(0, N, kRowGrain, [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) {
        const scalar_t* row = p + n * D;
        int64_t at = counts[n];
        for_each_nonzero(row, D, [&](int64_t d) {
          idx[at] = d;
          val[at] = row[d];
          ++at;
        });
      }
    });
  });
  return c;
}

namespace {

// Ranks candidates: larger value first, then lower index.
struct Candidate {
  float value;
  int64_t index;
  bool operator<(const Candidate& o) const { return value > o.value || (value == o.value && index < o.index); }
};

// The k largest positive values of one row of D floats into `out`, by index.
void top_k_row(const float* row, int64_t D, int64_t k, std::vector<float>& maxima, std::vector<Candidate>& out) {
  out.clear();
  const int64_t s = detail::top_k_chunk_size(D, k), chunks = (D + s - 1) / s;
  float threshold = 0.0f;  // only positive values survive the relu
  if (chunks > k) {
    maxima.resize(chunks);
    for (int64_t c = 0; c < chunks; ++c) {
      const float* p = row + c * s;
      const int64_t n = std::min(s, D - c * s);
      float m = p[0];
      for (int64_t j = 1; j < n; ++j) m = p[j] > m ? p[j] : m;
      maxima[c] = m;
    }
    std::nth_element(maxima.begin(), maxima.begin() + (k - 1), maxima.end(), std::greater<float>());
    threshold = std::max(threshold, maxima[k - 1]);
  }
  // Values strictly above zero and at least the threshold (every value when
  // the threshold is zero is still bounded by D).
  for (int64_t d = 0; d < D; ++d)
    if (row[d] >= threshold && row[d] > 0.0f) out.push_back({row[d], d});
  if (static_cast<int64_t>(out.size()) > k) {
    std::nth_element(out.begin(), out.begin() + (k - 1), out.end());
    out.resize(k);
  }
  std::sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) { return a.index < b.index; });
}

}  // namespace

namespace detail {

int64_t top_k_chunk_size(int64_t D, int64_t k) {
  int64_t s = 64;
  while (s > 1 && D / s < 4 * k) s /= 2;
  return s;
}

SparseCode TopKSlots::to_code() const {
  SparseCode c;
  c.rows = rows;
  c.width = width;
  std::vector<int64_t> ptr(rows + 1, 0);
  std::partial_sum(count.begin(), count.end(), ptr.begin() + 1);
  c.indptr = at::tensor(ptr, at::kLong);
  c.indices = at::empty({ptr[rows]}, at::kLong);
  c.values = at::empty({ptr[rows]}, at::kFloat);
  int64_t* idx = c.indices.data_ptr<int64_t>();
  float* val = c.values.data_ptr<float>();
  for (int64_t n = 0; n < rows; ++n) {
    std::copy_n(index.begin() + n * k, count[n], idx + ptr[n]);
    std::copy_n(value.begin() + n * k, count[n], val + ptr[n]);
  }
  return c;
}

}  // namespace detail

SparseCode top_k_code(const at::Tensor& pre, int64_t k) {
  if (pre.dim() < 1) throw ShapeError("top_k_code: pre-activations need at least one dim, got a scalar");
  if (!pre.device().is_cpu() || pre.scalar_type() != at::kFloat)
    throw ConfigError("top_k_code: pre-activations must be float32 on the CPU");
  const int64_t D = pre.size(-1);
  if (k < 1 || k > D)
    throw ConfigError("top_k_code: k = " + std::to_string(k) + " for rows of " + std::to_string(D) + " features");
  const at::Tensor a = pre.reshape({-1, D}).contiguous();
  const int64_t N = a.size(0);
  // Each row keeps at most k: fill fixed slots of k, then compact.
  detail::TopKSlots slots(N, D, k);
  const float* p = a.const_data_ptr<float>();
  at::parallel_for(0, N, kRowGrain, [&](int64_t begin, int64_t end) {
    std::vector<float> maxima;
    std::vector<Candidate> got;
    for (int64_t n = begin; n < end; ++n) {
      top_k_row(p + n * D, D, k, maxima, got);
      slots.count[n] = static_cast<int64_t>(got.size());
      for (size_t j = 0; j < got.size(); ++j) {
        slots.index[n * k + j] = got[j].index;
        slots.value[n * k + j] = got[j].value;
      }
    }
  });
  return slots.to_code();
}

at::Tensor densify(const SparseCode& code) {
  at::Tensor out = at::zeros({code.rows, code.width}, code.values.options());
  if (code.nnz() == 0) return out;
  const at::Tensor rows = at::repeat_interleave(at::arange(code.rows, at::kLong),
                                                code.indptr.narrow(0, 1, code.rows) - code.indptr.narrow(0, 0, code.rows));
  out.index_put_({rows, code.indices}, code.values);
  return out;
}

at::Tensor decode_sparse(const SparseCode& code, const at::Tensor& W_dec) {
  if (W_dec.dim() != 2 || W_dec.size(0) != code.width)
    throw ShapeError("decode_sparse: decoder " + shape_text(W_dec.sizes()) + " for codes of " +
                     std::to_string(code.width) + " features (need [" + std::to_string(code.width) + ", d_out])");
  const bool native = W_dec.scalar_type() == at::kFloat || W_dec.scalar_type() == at::kDouble;
  const at::Tensor W = (native ? W_dec : W_dec.to(at::kFloat)).contiguous();
  const int64_t N = code.rows, D = W.size(1), F = code.width, nnz = code.nnz();
  at::Tensor out = at::zeros({N, D}, W.options());
  if (N == 0 || nnz == 0) return native ? out : out.to(W_dec.scalar_type());
  // By feature (CSC), so each decoder row is read from memory once and added
  // to every token that uses it while it sits in cache; a token row's entries
  // still arrive in ascending feature order, so each output is summed in the
  // same order whatever the threads. Threads split the output columns.
  const int64_t* ptr = code.indptr.const_data_ptr<int64_t>();
  const int64_t* idx = code.indices.const_data_ptr<int64_t>();
  std::vector<int64_t> col_ptr(F + 1, 0);
  for (int64_t j = 0; j < nnz; ++j) ++col_ptr[idx[j] + 1];
  std::partial_sum(col_ptr.begin(), col_ptr.end(), col_ptr.begin());
  std::vector<int64_t> entry(nnz), token(nnz);
  {
    std::vector<int64_t> fill(col_ptr.begin(), col_ptr.end() - 1);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = ptr[n]; j < ptr[n + 1]; ++j) {
        const int64_t at = fill[idx[j]]++;
        entry[at] = j;
        token[at] = n;
      }
  }
  AT_DISPATCH_FLOATING_TYPES(W.scalar_type(), "decode_sparse", [&] {
    const at::Tensor v = code.values.to(W.scalar_type()).contiguous();
    const scalar_t* val = v.const_data_ptr<scalar_t>();
    const scalar_t* w = W.const_data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    constexpr int64_t kCols = 64;  // columns per task: a cache line's worth of floats x 4
    at::parallel_for(0, (D + kCols - 1) / kCols, 1, [&](int64_t begin, int64_t end) {
      const int64_t c0 = begin * kCols, c1 = std::min(D, end * kCols);
      for (int64_t f = 0; f < F; ++f) {
        const scalar_t* __restrict__ wr = w + f * D;
        for (int64_t e = col_ptr[f]; e < col_ptr[f + 1]; ++e) {
          const scalar_t a = val[entry[e]];
          scalar_t* __restrict__ row = o + token[e] * D;
          for (int64_t d = c0; d < c1; ++d) row[d] += a * wr[d];
        }
      }
    });
  });
  return native ? out : out.to(W_dec.scalar_type());
}

namespace {

// Entries by feature (CSC order): col_ptr[f] .. col_ptr[f+1]-1 index `entry`
// (the CSR entry) and `token` (its row); tokens ascend within a feature.
struct ByFeature {
  std::vector<int64_t> col_ptr, entry, token;
};

ByFeature by_feature(const SparseCode& code) {
  ByFeature b;
  const int64_t F = code.width, nnz = code.nnz();
  const int64_t* ptr = code.indptr.const_data_ptr<int64_t>();
  const int64_t* idx = code.indices.const_data_ptr<int64_t>();
  b.col_ptr.assign(F + 1, 0);
  for (int64_t j = 0; j < nnz; ++j) ++b.col_ptr[idx[j] + 1];
  std::partial_sum(b.col_ptr.begin(), b.col_ptr.end(), b.col_ptr.begin());
  b.entry.resize(nnz);
  b.token.resize(nnz);
  std::vector<int64_t> fill(b.col_ptr.begin(), b.col_ptr.end() - 1);
  for (int64_t n = 0; n < code.rows; ++n)
    for (int64_t j = ptr[n]; j < ptr[n + 1]; ++j) {
      const int64_t at = fill[idx[j]]++;
      b.entry[at] = j;
      b.token[at] = n;
    }
  return b;
}

// A dot product in 16 lanes (each a fixed-order sum the compiler can keep in
// one vector register), added up in lane order: the same bits every run.
float dot(const float* __restrict__ x, const float* __restrict__ y, int64_t D) {
  constexpr int64_t L = 16;
  float lane[L] = {};
  int64_t d = 0;
  for (; d + L <= D; d += L)
    for (int64_t l = 0; l < L; ++l) lane[l] += x[d + l] * y[d + l];
  for (int64_t l = 0; d + l < D; ++l) lane[l] += x[d + l] * y[d + l];
  float s = 0.0f;
  for (int64_t l = 0; l < L; ++l) s += lane[l];
  return s;
}

void check_float_2d(const at::Tensor& t, int64_t rows, const char* what, const char* fn) {
  if (t.dim() != 2 || t.scalar_type() != at::kFloat || !t.is_contiguous() || (rows >= 0 && t.size(0) != rows))
    throw ShapeError(std::string(fn) + ": " + what + " must be a contiguous float [" +
                     (rows >= 0 ? std::to_string(rows) : std::string("n")) + ", D] tensor, got " +
                     shape_text(t.sizes()) + " " + std::string(c10::toString(t.scalar_type())));
}

}  // namespace

void add_code_t_dense_(at::Tensor& out, const SparseCode& code, const at::Tensor& dense, double alpha) {
  check_float_2d(out, code.width, "out", "add_code_t_dense_");
  check_float_2d(dense, code.rows, "dense", "add_code_t_dense_");
  if (out.size(1) != dense.size(1))
    throw ShapeError("add_code_t_dense_: out " + shape_text(out.sizes()) + " and dense " + shape_text(dense.sizes()));
  if (code.nnz() == 0) return;
  const ByFeature b = by_feature(code);
  const at::Tensor v = code.values.to(at::kFloat).contiguous();
  const float* val = v.const_data_ptr<float>();
  const float* x = dense.const_data_ptr<float>();
  float* o = out.data_ptr<float>();
  const int64_t D = dense.size(1);
  const float a = static_cast<float>(alpha);
  at::parallel_for(0, code.width, 64, [&](int64_t f0, int64_t f1) {
    for (int64_t f = f0; f < f1; ++f) {
      float* __restrict__ row = o + f * D;
      for (int64_t e = b.col_ptr[f]; e < b.col_ptr[f + 1]; ++e) {
        const float w = a * val[b.entry[e]];
        const float* __restrict__ xr = x + b.token[e] * D;
        for (int64_t d = 0; d < D; ++d) row[d] += w * xr[d];
      }
    }
  });
}

at::Tensor sampled_dots(const SparseCode& code, const at::Tensor& a, const at::Tensor& b) {
  check_float_2d(a, code.rows, "a", "sampled_dots");
  check_float_2d(b, code.width, "b", "sampled_dots");
  if (a.size(1) != b.size(1))
    throw ShapeError("sampled_dots: a " + shape_text(a.sizes()) + " and b " + shape_text(b.sizes()));
  at::Tensor out = at::empty({code.nnz()}, at::kFloat);
  const int64_t* ptr = code.indptr.const_data_ptr<int64_t>();
  const int64_t* idx = code.indices.const_data_ptr<int64_t>();
  const float* pa = a.const_data_ptr<float>();
  const float* pb = b.const_data_ptr<float>();
  float* o = out.data_ptr<float>();
  const int64_t D = a.size(1);
  at::parallel_for(0, code.rows, kRowGrain, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t j = ptr[n]; j < ptr[n + 1]; ++j) {
        o[j] = dot(pa + n * D, pb + idx[j] * D, D);
      }
  });
  return out;
}

SparseCode with_values(const SparseCode& code, at::Tensor values) {
  if (values.dim() != 1 || values.size(0) != code.nnz())
    throw ShapeError("with_values: " + std::to_string(code.nnz()) + " entries, values " + shape_text(values.sizes()));
  SparseCode c = code;
  c.values = std::move(values);
  return c;
}

StrongestFeatures strongest_features(const SparseCode& code, int64_t width) {
  if (width < 0) throw ConfigError("strongest_features: width must be >= 0, got " + std::to_string(width));
  const int64_t N = code.rows;
  const at::Tensor ptr_t = code.indptr.contiguous();
  const int64_t* ptr = ptr_t.const_data_ptr<int64_t>();
  if (width == 0)
    for (int64_t n = 0; n < N; ++n) width = std::max(width, ptr[n + 1] - ptr[n]);
  StrongestFeatures s;
  s.indices = at::full({N, width}, -1, at::kInt);
  s.values = at::zeros({N, width}, code.values.options());
  s.l0 = (ptr_t.narrow(0, 1, N) - ptr_t.narrow(0, 0, N)).to(at::kInt);
  if (N == 0 || width == 0 || code.nnz() == 0) return s;
  const at::Tensor vf = code.values.to(at::kFloat).contiguous();
  const float* val = vf.const_data_ptr<float>();
  const int64_t* idx = code.indices.const_data_ptr<int64_t>();
  int32_t* oi = s.indices.data_ptr<int32_t>();
  std::vector<int64_t> picked(N * width, -1);  // entry numbers, to copy values in their own dtype
  at::parallel_for(0, N, kRowGrain, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> order;
    for (int64_t n = begin; n < end; ++n) {
      order.resize(ptr[n + 1] - ptr[n]);
      std::iota(order.begin(), order.end(), ptr[n]);
      const int64_t keep = std::min<int64_t>(width, order.size());
      // Indices ascend within a row, so entry order breaks ties by the lower feature.
      std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](int64_t a, int64_t b) {
        return val[a] > val[b] || (val[a] == val[b] && a < b);
      });
      for (int64_t j = 0; j < keep; ++j) {
        oi[n * width + j] = static_cast<int32_t>(idx[order[j]]);
        picked[n * width + j] = order[j];
      }
    }
  });
  const at::Tensor pick = at::tensor(picked, at::kLong).view({N, width});
  const at::Tensor valid = pick.ge(0);
  s.values = at::where(valid, code.values.index_select(0, pick.clamp_min(0).flatten()).view({N, width}),
                       at::zeros({}, code.values.options()));
  return s;
}

}  // namespace flex
