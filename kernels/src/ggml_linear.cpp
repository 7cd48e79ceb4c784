// ggml_linear: the dispatch (shapes, instruction set, threads), the scalar
// reference of both activation modes, the Q8 quantization of the inputs, and
// the tiled prefill. The vector kernels are ggml_gemv_avx512.cpp and
// ggml_gemv_avx2.cpp.
#include <flex/hooks/errors.h>
#include <flex/kernels/ggml_dequant.h>
#include <flex/kernels/ggml_linear.h>
#include <flex/kernels/linear.h>
#include <flex/kernels/sequential_blas.h>
#include <flex/kernels/target.h>

#include "ggml_gemv_isa.h"
#include "ggml_prefill.h"
#include "shared_chunks.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace flex {

namespace {

float half_bits(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return static_cast<float>(c10::Half(h, c10::Half::from_bits()));
}

// Scalar reference, float inputs: the row dequantized by the tested
// dequantizer, then one float32 sum per output in element order.
void gemv_scalar(uint32_t type, const uint8_t* w, int64_t row_bytes, int64_t N, int64_t K, const float* x, int64_t M,
                 float* y, int64_t r0, int64_t r1) {
  std::vector<float> row(static_cast<size_t>(K));
  for (int64_t j = r0; j < r1; ++j) {
    dequantize_ggml_reference(type, w + j * row_bytes, row.data(), K);
    for (int64_t m = 0; m < M; ++m) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc += row[k] * x[m * K + k];
      y[m * N + j] = acc;
    }
  }
}

// A block's integer codes u and, per 16 elements, the affine map A u + C to
// its weights (the Q8 activations' reference).
void block_codes(uint32_t type, const uint8_t* p, int* u, float* A, float* C) {
  auto scale_min = [](const uint8_t* s, int j, float* sc, float* mn) {
    if (j < 4) {
      *sc = static_cast<float>(s[j] & 63u);
      *mn = static_cast<float>(s[j + 4] & 63u);
    } else {
      *sc = static_cast<float>((s[j + 4] & 0x0fu) | ((s[j - 4] >> 6) << 4));
      *mn = static_cast<float>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
  };
  switch (type) {
    case 8: {
      const float d = half_bits(p);
      for (int i = 0; i < 32; ++i) u[i] = static_cast<int8_t>(p[2 + i]);
      A[0] = A[1] = d;
      C[0] = C[1] = 0.0f;
      return;
    }
    case 2:
    case 3:
    case 6:
    case 7: {
      const bool has_min = type == 3 || type == 7, five = type == 6 || type == 7;
      const float d = half_bits(p);
      const float c = has_min ? half_bits(p + 2) : (five ? -16.0f : -8.0f) * d;
      const uint8_t* q = p + (has_min ? 4 : 2);
      uint32_t qh = 0;
      if (five) {
        std::memcpy(&qh, q, 4);
        q += 4;
      }
      for (int i = 0; i < 16; ++i) {
        u[i] = (q[i] & 15) | (five ? static_cast<int>(((qh >> i) & 1u) << 4) : 0);
        u[i + 16] = (q[i] >> 4) | (five ? static_cast<int>(((qh >> (i + 16)) & 1u) << 4) : 0);
      }
      A[0] = A[1] = d;
      C[0] = C[1] = c;
      return;
    }
    case 12:
    case 13: {
      const bool five = type == 13;
      const float d = half_bits(p), dmin = half_bits(p + 2);
      const uint8_t* qh = p + 16;
      const uint8_t* qs = p + (five ? 48 : 16);
      for (int j = 0; j < 8; ++j) {
        float sc, mn;
        scale_min(p + 4, j, &sc, &mn);
        A[2 * j] = A[2 * j + 1] = d * sc;
        C[2 * j] = C[2 * j + 1] = -dmin * mn;
        for (int l = 0; l < 32; ++l)
          u[32 * j + l] = ((qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 15) | (five ? ((qh[l] >> j) & 1) << 4 : 0);
      }
      return;
    }
    case 14: {
      const float d = half_bits(p + 208);
      const int8_t* sc = reinterpret_cast<const int8_t*>(p + 192);
      for (int i = 0; i < 256; ++i) {
        const int h = i / 128, r = i % 128;
        const int lo = (p[64 * h + r % 64] >> (4 * (r / 64))) & 15;
        const int hi = (p[128 + 32 * h + r % 32] >> (2 * (r / 32))) & 3;
        u[i] = lo | (hi << 4);
      }
      for (int g = 0; g < 16; ++g) {
        A[g] = d * static_cast<float>(sc[g]);
        C[g] = -32.0f * A[g];
      }
      return;
    }
    default:
      return;
  }
}

// Scalar reference, Q8 inputs: per 16 values, dx (A sum(u q) + C sum(q)).
void gemv_q8_scalar(uint32_t type, const uint8_t* w, int64_t row_bytes, int64_t N, int64_t K, const Q8Rows& x,
                    float* y, int64_t r0, int64_t r1) {
  const GgmlTypeInfo* t = ggml_type_info(type);
  const int64_t block = t->block, bytes = t->block_bytes;
  int u[256];
  float A[16], C[16];
  for (int64_t j = r0; j < r1; ++j)
    for (int64_t m = 0; m < x.M; ++m) {
      float acc = 0.0f;
      for (int64_t b = 0; b < K / block; ++b) {
        block_codes(type, w + j * row_bytes + b * bytes, u, A, C);
        for (int64_t g = 0; g < block / 16; ++g) {
          const int64_t e = b * block + 16 * g;
          int32_t s = 0;
          for (int i = 0; i < 16; ++i) s += u[16 * g + i] * x.q[m * K + e + i];
          const float dx = x.d[m * (K / 32) + e / 32];
          acc += dx * (A[g] * static_cast<float>(s) + C[g] * static_cast<float>(x.s16[m * (K / 16) + e / 16]));
        }
      }
      y[m * N + j] = acc;
    }
}

Isa effective(Isa isa) {
  const Isa supported = cpu_isa_supported();
  return static_cast<int>(isa) > static_cast<int>(supported) ? supported : isa;
}

// The inputs as Q8Rows: per 32 values d = max|x| / 127, q = round(x / d).
// One buffer per thread, reused from call to call (a decode step makes ~150
// of these calls; their allocations were a visible part of a small call).
struct Q8Buffer {
  std::vector<int8_t> q, qn, qk;
  std::vector<float> d, ds16, ds32;
  std::vector<int32_t> s16;
  Q8Rows rows(int64_t M) const {
    return {q.data(),  d.data(), s16.data(), ds16.data(), ds32.data(), qn.empty() ? nullptr : qn.data(),
            qk.empty() ? nullptr : qk.data(), M};
  }
};

// Where the codes of block i's half h go in the reordered copies (Q8Rows::qn
// per 4 blocks, Q8Rows::qk per 8 blocks: sub-blocks 0, 2, 1, 3, 4, 6, 5, 7).
}  // namespace
int64_t q8_nibble_at(int64_t i, int h) { return 128 * (i / 4) + 64 * h + 16 * (i % 4); }
int64_t q8_kquant_at(int64_t i, int h) {
  static constexpr int kOrder[8] = {0, 2, 1, 3, 4, 6, 5, 7};
  return 256 * (i / 8) + 32 * kOrder[i % 8] + 16 * h;
}
namespace {

// The scalar quantizer (the reference; ggml_avx512::quantize_q8 gives the same bits).
void quantize_q8_scalar(const float* x, int64_t blocks, const Q8Out& o) {
  for (int64_t i = 0; i < blocks; ++i) {
    const float* v = x + 32 * i;
    float amax = 0.0f;
    for (int k = 0; k < 32; ++k) amax = std::max(amax, std::fabs(v[k]));
    const float d = amax / 127.0f, inv = d > 0.0f ? 1.0f / d : 0.0f;
    o.d[i] = d;
    for (int h = 0; h < 2; ++h) {
      int32_t s = 0;
      for (int k = 16 * h; k < 16 * h + 16; ++k) {
        // Round to nearest even (as nearbyint and the vector conversion do),
        // by adding and taking away 1.5 * 2^23 (exact for |r| <= 127).
        const float r = std::clamp(v[k] * inv, -127.0f, 127.0f);
        const int q = static_cast<int>((r + 12582912.0f) - 12582912.0f);
        o.q[32 * i + k] = static_cast<int8_t>(q);
        s += q;
      }
      o.s16[2 * i + h] = s;
      o.ds16[2 * i + h] = d * static_cast<float>(s);
      if (o.qn) std::memcpy(o.qn + q8_nibble_at(i, h), o.q + 32 * i + 16 * h, 16);
      if (o.qk) std::memcpy(o.qk + q8_kquant_at(i, h), o.q + 32 * i + 16 * h, 16);
    }
    o.ds32[i] = d * static_cast<float>(o.s16[2 * i] + o.s16[2 * i + 1]);
  }
}

const Q8Buffer& quantize_q8(Isa isa, const float* x, int64_t M, int64_t K) {
  thread_local Q8Buffer b;
  const auto n = static_cast<size_t>(M * K);
  b.q.resize(n);
  b.d.resize(n / 32);
  b.s16.resize(n / 16);
  b.ds16.resize(n / 16);
  b.ds32.resize(n / 32);
  // The nibble-ordered copy (Q8Rows::qn): 4 blocks' first halves, then their
  // last halves, so 4 blocks of 4-bit codes meet their inputs as stored.
  b.qn.resize((K / 32) % 8 == 0 ? n : 0);
  // The Q4_K-ordered copy (Q8Rows::qk): a 64-byte load of Q4_K codes holds
  // sub-blocks 2j and 2j + 2 in its low nibbles, 2j + 1 and 2j + 3 in its high.
  b.qk.resize(K % 256 == 0 ? n : 0);
  const Q8Out o{b.q.data(), b.d.data(), b.s16.data(), b.ds16.data(), b.ds32.data(),
                b.qn.empty() ? nullptr : b.qn.data(), b.qk.empty() ? nullptr : b.qk.data()};
  const Isa e = effective(isa);
#if FLEX_HAVE_X86_KERNELS
  if (e == Isa::Avx512 || e == Isa::Avx512Bf16) {
    ggml_avx512::quantize_q8(x, M * K / 32, o);
    return b;
  }
#endif
  quantize_q8_scalar(x, M * K / 32, o);
  return b;
}

void check_type(uint32_t type) {
  if (!ggml_linear_supports(type))
    throw UnsupportedError("ggml_linear: ggml type " + ggml_type_name(type) +
                           " is not computed on; the types taken are Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K");
}

void run_rows(Isa isa, uint32_t type, const uint8_t* w, int64_t row_bytes, int64_t N, int64_t K, const float* x,
              int64_t M, const Q8Rows* q8, float* y, int64_t r0, int64_t r1) {
  switch (effective(isa)) {
#if FLEX_HAVE_X86_KERNELS
    case Isa::Avx512:
    case Isa::Avx512Bf16:
      if (q8) return ggml_avx512::gemv_q8(type, w, row_bytes, N, K, *q8, y, r0, r1);
      return ggml_avx512::gemv(type, w, row_bytes, N, K, x, M, y, r0, r1);
    case Isa::Avx2:
      if (q8) return ggml_avx2::gemv_q8(type, w, row_bytes, N, K, *q8, y, r0, r1);
      return ggml_avx2::gemv(type, w, row_bytes, N, K, x, M, y, r0, r1);
#endif
    default:
      if (q8) return gemv_q8_scalar(type, w, row_bytes, N, K, *q8, y, r0, r1);
      return gemv_scalar(type, w, row_bytes, N, K, x, M, y, r0, r1);
  }
}

// Rows per chunk of a decode product: about 4 chunks per thread, whole
// 32-row groups. Each thread then streams long runs of consecutive rows; 32-row
// chunks dealt out alternately cut every thread's stream into 36 KB pieces
// (Q4_0, 2048 inputs), and 2 threads read only 1.1x one thread's GB/s.
int64_t decode_chunk_rows(int64_t N, int64_t M) {
  if (M > kGgmlGemvRows) return 64;
  const int64_t per = (N + 4 * at::get_num_threads() - 1) / (4 * at::get_num_threads());
  return std::max<int64_t>(32, (per + 31) / 32 * 32);
}

}  // namespace

bool ggml_linear_supports(uint32_t type) {
  switch (type) {
    case 2: case 3: case 6: case 7: case 8: case 12: case 13: case 14: return true;
    default: return false;
  }
}

int64_t ggml_row_bytes(uint32_t type, int64_t in) {
  const GgmlTypeInfo* t = ggml_type_info(type);
  if (!t) throw UnsupportedError("unknown ggml type " + ggml_type_name(type));
  if (in % t->block != 0)
    throw ShapeError("a row of " + std::to_string(in) + " elements is not whole " + t->name + " blocks of " +
                     std::to_string(t->block));
  return in / t->block * t->block_bytes;
}

void ggml_gemv(Isa isa, uint32_t type, const uint8_t* weight, int64_t out, int64_t in, const float* x, int64_t m,
               float* y, int64_t r0, int64_t r1, GgmlActivations activations) {
  check_type(type);
  const int64_t row_bytes = ggml_row_bytes(type, in);
  if (activations == GgmlActivations::Q8) {
    const Q8Rows rows = quantize_q8(isa, x, m, in).rows(m);
    run_rows(isa, type, weight, row_bytes, out, in, x, m, &rows, y, r0, r1);
  } else {
    run_rows(isa, type, weight, row_bytes, out, in, x, m, nullptr, y, r0, r1);
  }
}

namespace {

// The checks of one weight and its input (ShapeError naming what disagrees); the weight's row bytes.
int64_t checked_row_bytes(uint32_t type, const at::Tensor& weight, int64_t N, int64_t K, const at::Tensor& x,
                          const at::Tensor& bias) {
  check_type(type);
  const int64_t row_bytes = ggml_row_bytes(type, K);
  if (weight.scalar_type() != at::kByte || !weight.is_contiguous() || weight.numel() != N * row_bytes)
    throw ShapeError("ggml_linear: a " + std::string(ggml_type_name(type)) + " weight [" + std::to_string(N) + ", " +
                     std::to_string(K) + "] is " + std::to_string(N * row_bytes) + " contiguous bytes; got " +
                     std::to_string(weight.numel()) + " " + std::string(c10::toString(weight.scalar_type())));
  if (x.dim() == 0 || x.size(-1) != K)
    throw ShapeError("ggml_linear: input of shape " + c10::str(x.sizes()) + " for a weight of " + std::to_string(K) +
                     " input features");
  if (!at::isFloatingType(x.scalar_type()))
    throw ShapeError("ggml_linear: input dtype " + std::string(c10::toString(x.scalar_type())) + " is not a floating type");
  if (bias.defined() && (bias.dim() != 1 || bias.size(0) != N))
    throw ShapeError("ggml_linear: bias of shape " + c10::str(bias.sizes()) + " for " + std::to_string(N) + " outputs");
  return row_bytes;
}

// y [M, N] float32 (bias added) back to x's dtype and shape.
at::Tensor finish(at::Tensor y, const at::Tensor& x, const at::Tensor& bias) {
  if (bias.defined()) y.add_(bias.to(at::kFloat));
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = y.size(1);
  return y.to(x.scalar_type()).view(out_shape);
}

}  // namespace

at::Tensor ggml_linear(uint32_t type, const at::Tensor& weight, int64_t N, int64_t K, const at::Tensor& x,
                       const at::Tensor& bias, GgmlActivations activations) {
  const int64_t row_bytes = checked_row_bytes(type, weight, N, K, x, bias);
  const at::Tensor xf = x.reshape({-1, K}).to(at::kFloat).contiguous();
  const int64_t M = xf.size(0);
  const uint8_t* w = weight.data_ptr<uint8_t>();
  at::Tensor y = at::empty({M, N}, xf.options());
  // Prefill (more than kGgmlGemvRows rows) takes the float tiles in both
  // modes: since the tiles' GEMM is oneDNN's, they are as fast as the
  // integer kernel or faster (bench_ggml_kernels, 128 rows, 2 threads,
  // interleaved: Q4_0 20.0-21.0 ms float vs 24.0-25.9 Q8, Q4_K 18.5-18.7 vs
  // 18.7-18.8; 1 thread Q8_0 15.5 vs 19.5, Q6_K 15.0 vs 18.7), and exact.
  if (M <= kGgmlGemvRows) {
    const Isa isa = cpu_isa();
    float* yp = y.data_ptr<float>();
    const float* xp = xf.data_ptr<float>();
    Q8Rows rows{};
    if (activations == GgmlActivations::Q8) rows = quantize_q8(isa, xp, M, K).rows(M);
    const Q8Rows* qp = activations == GgmlActivations::Q8 ? &rows : nullptr;
    // Each output column whole on one thread: the same bits for any thread count.
    kernel::shared_chunks(N, decode_chunk_rows(N, M),
                  [&](int64_t r0, int64_t r1) { run_rows(isa, type, w, row_bytes, N, K, xp, M, qp, yp, r0, r1); });
  } else {
    kernel::ggml_prefill(type, w, row_bytes, N, K, xf, y, activations);
  }
  return finish(std::move(y), x, bias);
}

std::vector<at::Tensor> ggml_linear_group(const std::vector<GgmlWeight>& weights, int64_t K, const at::Tensor& x,
                                          GgmlActivations activations) {
  std::vector<int64_t> row_bytes;
  int64_t total = 0;
  for (const GgmlWeight& g : weights) {
    row_bytes.push_back(checked_row_bytes(g.type, g.weight, g.out, K, x, g.bias));
    total += g.out;
  }
  const at::Tensor xf = x.reshape({-1, K}).to(at::kFloat).contiguous();
  const int64_t M = xf.size(0);
  std::vector<at::Tensor> out;
  if (M > kGgmlGemvRows) {  // prefill: each product is large enough alone
    for (const GgmlWeight& g : weights) out.push_back(ggml_linear(g.type, g.weight, g.out, K, xf, g.bias, activations));
    for (at::Tensor& y : out) {
      std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
      shape.back() = y.size(1);
      y = y.to(x.scalar_type()).view(shape);
    }
    return out;
  }
  const Isa isa = cpu_isa();
  const float* xp = xf.data_ptr<float>();
  Q8Rows rows{};
  if (activations == GgmlActivations::Q8) rows = quantize_q8(isa, xp, M, K).rows(M);
  const Q8Rows* qp = activations == GgmlActivations::Q8 ? &rows : nullptr;
  // The chunks of all weights in one list (none straddles two weights), at
  // the chunk size of one product of all their rows.
  struct Chunk {
    size_t weight;
    int64_t r0, r1;
  };
  std::vector<Chunk> chunks;
  const int64_t per = decode_chunk_rows(total, M);
  std::vector<float*> yp;
  std::vector<const uint8_t*> wp;
  for (size_t i = 0; i < weights.size(); ++i) {
    out.push_back(at::empty({M, weights[i].out}, xf.options()));
    yp.push_back(out.back().data_ptr<float>());
    wp.push_back(weights[i].weight.const_data_ptr<uint8_t>());
    for (int64_t r = 0; r < weights[i].out; r += per) chunks.push_back({i, r, std::min(weights[i].out, r + per)});
  }
  kernel::shared_chunks(static_cast<int64_t>(chunks.size()), 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const Chunk& ch = chunks[static_cast<size_t>(c)];
      const GgmlWeight& g = weights[ch.weight];
      run_rows(isa, g.type, wp[ch.weight], row_bytes[ch.weight], g.out, K, xp, M, qp, yp[ch.weight], ch.r0, ch.r1);
    }
  });
  for (size_t i = 0; i < weights.size(); ++i) out[i] = finish(std::move(out[i]), x, weights[i].bias);
  return out;
}

}  // namespace flex
