// ggml block formats to float32. Each block decoder below follows ggml's
// layout for its type (fp16 scales little-endian at the offsets given); every
// value is one float32 product (and a float32 sum or difference where the
// type has a minimum), rounded at each step as numpy rounds gguf-py's
// dequantizer. This file is compiled with -ffp-contract=off (kernels/
// CMakeLists.txt) so no product is fused into the sum after it.
#include <flex/hooks/errors.h>
#include <flex/kernels/ggml_dequant.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>

namespace flex {
namespace {

// IEEE half to float, exactly (subnormals, infinities and NaN payloads kept).
float ggml_half(const uint8_t* p) {
  const uint32_t h = static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8);
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: mant * 2^-24, renormalised
      int e = -1;
      uint32_t m = mant;
      do {
        m <<= 1;
        ++e;
      } while ((m & 0x400u) == 0);
      bits = sign | ((112u - static_cast<uint32_t>(e)) << 23) | ((m & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint32_t ggml_u32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}

// One block of each type: `b` its bytes, `y` its elements.

void block_f32(const uint8_t* b, float* y) { std::memcpy(y, b, 4); }
void block_f16(const uint8_t* b, float* y) { y[0] = ggml_half(b); }
void block_bf16(const uint8_t* b, float* y) {
  const uint32_t bits = (static_cast<uint32_t>(b[0]) | (static_cast<uint32_t>(b[1]) << 8)) << 16;
  std::memcpy(y, &bits, 4);
}

// Q8_0: fp16 d, 32 int8 q; y = q * d.
void block_q8_0(const uint8_t* b, float* y) {
  const float d = ggml_half(b);
  for (int i = 0; i < 32; ++i) y[i] = static_cast<float>(static_cast<int8_t>(b[2 + i])) * d;
}

// Q4_0: fp16 d, 16 bytes of nibbles: element i < 16 the low nibble of byte i,
// element i + 16 its high nibble; y = d * (q - 8).
void block_q4_0(const uint8_t* b, float* y) {
  const float d = ggml_half(b);
  const uint8_t* qs = b + 2;
  for (int i = 0; i < 16; ++i) {
    y[i] = d * static_cast<float>(static_cast<int>(qs[i] & 0x0f) - 8);
    y[i + 16] = d * static_cast<float>(static_cast<int>(qs[i] >> 4) - 8);
  }
}

// Q4_1: fp16 d, fp16 m, nibbles as Q4_0; y = d * q + m.
void block_q4_1(const uint8_t* b, float* y) {
  const float d = ggml_half(b), m = ggml_half(b + 2);
  const uint8_t* qs = b + 4;
  for (int i = 0; i < 16; ++i) {
    const float lo = d * static_cast<float>(qs[i] & 0x0f);
    const float hi = d * static_cast<float>(qs[i] >> 4);
    y[i] = lo + m;
    y[i + 16] = hi + m;
  }
}

// Q5_0: fp16 d, 32 high bits (bit i of a little-endian u32 for element i),
// nibbles as Q4_0; y = d * (q - 16).
void block_q5_0(const uint8_t* b, float* y) {
  const float d = ggml_half(b);
  const uint32_t qh = ggml_u32(b + 2);
  const uint8_t* qs = b + 6;
  for (int i = 0; i < 16; ++i) {
    const int lo = static_cast<int>((qs[i] & 0x0f) | (((qh >> i) & 1u) << 4));
    const int hi = static_cast<int>((qs[i] >> 4) | (((qh >> (i + 16)) & 1u) << 4));
    y[i] = d * static_cast<float>(lo - 16);
    y[i + 16] = d * static_cast<float>(hi - 16);
  }
}

// Q5_1: fp16 d, fp16 m, high bits and nibbles as Q5_0; y = d * q + m.
void block_q5_1(const uint8_t* b, float* y) {
  const float d = ggml_half(b), m = ggml_half(b + 2);
  const uint32_t qh = ggml_u32(b + 4);
  const uint8_t* qs = b + 8;
  for (int i = 0; i < 16; ++i) {
    const uint32_t lo = (qs[i] & 0x0fu) | (((qh >> i) & 1u) << 4);
    const uint32_t hi = (qs[i] >> 4) | (((qh >> (i + 16)) & 1u) << 4);
    const float a = d * static_cast<float>(lo);
    const float c = d * static_cast<float>(hi);
    y[i] = a + m;
    y[i + 16] = c + m;
  }
}

// The k-quants' 12 bytes of 6-bit scales and minimums for 8 sub-blocks:
// sub-block j < 4 has scale s[j] & 63 and minimum s[j + 4] & 63; j >= 4 takes
// its low 4 bits from s[j + 4] (scale: low nibble, minimum: high nibble) and
// its top 2 bits from the top bits of s[j - 4] (scale) and s[j] (minimum).
void k_scale_min(const uint8_t* s, int j, uint32_t* sc, uint32_t* mn) {
  if (j < 4) {
    *sc = s[j] & 63u;
    *mn = s[j + 4] & 63u;
  } else {
    *sc = (s[j + 4] & 0x0fu) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Q4_K (256 elements): fp16 d, fp16 dmin, 12 scale bytes, 128 bytes of
// nibbles. 32-byte group g holds sub-block 2g in its low nibbles and 2g + 1
// in its high nibbles; y = (d * scale) * q - dmin * min.
void block_q4_k(const uint8_t* b, float* y) {
  const float d = ggml_half(b), dmin = ggml_half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qs = b + 16;
  for (int j = 0; j < 8; ++j) {
    uint32_t sc, mn;
    k_scale_min(scales, j, &sc, &mn);
    const float dl = d * static_cast<float>(sc);
    const float ml = dmin * static_cast<float>(mn);
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) {
      const float p = dl * static_cast<float>((q[l] >> shift) & 0x0f);
      y[32 * j + l] = p - ml;
    }
  }
}

// Q5_K (256): fp16 d, fp16 dmin, 12 scale bytes, 32 bytes of high bits
// (bit j of byte l for element l of sub-block j), 128 bytes of nibbles as Q4_K.
void block_q5_k(const uint8_t* b, float* y) {
  const float d = ggml_half(b), dmin = ggml_half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int j = 0; j < 8; ++j) {
    uint32_t sc, mn;
    k_scale_min(scales, j, &sc, &mn);
    const float dl = d * static_cast<float>(sc);
    const float ml = dmin * static_cast<float>(mn);
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) {
      const uint32_t v = ((q[l] >> shift) & 0x0fu) | (((qh[l] >> j) & 1u) << 4);
      const float p = dl * static_cast<float>(v);
      y[32 * j + l] = p - ml;
    }
  }
}

// Q6_K (256): 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 int8
// scales, fp16 d. Element i, in half h = i / 128 (r = i % 128): low nibble
// of ql[64h + r % 64] (shifted by 4 when r >= 64), high bits
// (qh[32h + r % 32] >> 2 (r / 32)) & 3; y = (d * scale[i / 16]) * (q - 32).
void block_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = ggml_half(b + 208);
  for (int s = 0; s < 16; ++s) {
    const float ds = d * static_cast<float>(sc[s]);
    for (int k = 0; k < 16; ++k) {
      const int i = 16 * s + k;
      const int h = i / 128, r = i % 128;
      const uint32_t lo = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0fu;
      const uint32_t hi = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 3u;
      const int q = static_cast<int>(lo | (hi << 4)) - 32;
      y[i] = ds * static_cast<float>(q);
    }
  }
}

using BlockFn = void (*)(const uint8_t*, float*);

constexpr GgmlTypeInfo kTypes[] = {
    {0, "F32", 1, 4, true},          {1, "F16", 1, 2, true},         {2, "Q4_0", 32, 18, true},
    {3, "Q4_1", 32, 20, true},       {6, "Q5_0", 32, 22, true},      {7, "Q5_1", 32, 24, true},
    {8, "Q8_0", 32, 34, true},       {9, "Q8_1", 32, 40, false},     {10, "Q2_K", 256, 84, false},
    {11, "Q3_K", 256, 110, false},   {12, "Q4_K", 256, 144, true},   {13, "Q5_K", 256, 176, true},
    {14, "Q6_K", 256, 210, true},    {15, "Q8_K", 256, 292, false},  {16, "IQ2_XXS", 256, 66, false},
    {17, "IQ2_XS", 256, 74, false},  {18, "IQ3_XXS", 256, 98, false}, {19, "IQ1_S", 256, 50, false},
    {20, "IQ4_NL", 32, 18, false},   {21, "IQ3_S", 256, 110, false}, {22, "IQ2_S", 256, 82, false},
    {23, "IQ4_XS", 256, 136, false}, {24, "I8", 1, 1, false},        {25, "I16", 1, 2, false},
    {26, "I32", 1, 4, false},        {27, "I64", 1, 8, false},       {28, "F64", 1, 8, false},
    {29, "IQ1_M", 256, 56, false},   {30, "BF16", 1, 2, true},       {34, "TQ1_0", 256, 54, false},
    {35, "TQ2_0", 256, 66, false},   {39, "MXFP4", 32, 17, false},   {40, "NVFP4", 64, 36, false},
    {41, "Q1_0", 128, 18, false},
};

BlockFn block_fn(uint32_t id) {
  switch (id) {
    case 0: return block_f32;
    case 1: return block_f16;
    case 2: return block_q4_0;
    case 3: return block_q4_1;
    case 6: return block_q5_0;
    case 7: return block_q5_1;
    case 8: return block_q8_0;
    case 12: return block_q4_k;
    case 13: return block_q5_k;
    case 14: return block_q6_k;
    case 30: return block_bf16;
    default: return nullptr;
  }
}

// The block function and geometry for `id`, after the argument checks.
BlockFn checked(uint32_t id, int64_t n, const GgmlTypeInfo** info) {
  const GgmlTypeInfo* t = ggml_type_info(id);
  BlockFn fn = block_fn(id);
  if (!t || !fn) throw UnsupportedError("cannot dequantize ggml type " + ggml_type_name(id) +
                                        ": the types taken are F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, "
                                        "Q4_K, Q5_K and Q6_K");
  if (n < 0 || n % t->block != 0)
    throw ShapeError("cannot dequantize " + std::to_string(n) + " elements of ggml type " + t->name +
                     ": not a whole number of " + std::to_string(t->block) + "-element blocks");
  *info = t;
  return fn;
}

}  // namespace

const GgmlTypeInfo* ggml_type_info(uint32_t id) {
  for (const auto& t : kTypes)
    if (t.id == id) return &t;
  return nullptr;
}

std::string ggml_type_name(uint32_t id) {
  const GgmlTypeInfo* t = ggml_type_info(id);
  return t ? std::string(t->name) : "type " + std::to_string(id);
}

bool ggml_can_dequantize(uint32_t id) { return block_fn(id) != nullptr; }

void dequantize_ggml_reference(uint32_t id, const uint8_t* src, float* dst, int64_t n) {
  const GgmlTypeInfo* t = nullptr;
  BlockFn fn = checked(id, n, &t);
  const int64_t blocks = n / t->block;
  for (int64_t i = 0; i < blocks; ++i) fn(src + i * t->block_bytes, dst + i * t->block);
}

void dequantize_ggml(uint32_t id, const uint8_t* src, float* dst, int64_t n) {
  const GgmlTypeInfo* t = nullptr;
  BlockFn fn = checked(id, n, &t);
  const int64_t blocks = n / t->block;
  // About 16k elements per task; each block is written by one task only.
  const int64_t grain = std::max<int64_t>(1, 16384 / t->block);
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t i = b0; i < b1; ++i) fn(src + i * t->block_bytes, dst + i * t->block);
  });
}

}  // namespace flex
