// ggml block quantizers (ggml_quantize.h). Layouts as ggml_dequant.cpp reads
// them; the round trip through dequantize_ggml_reference is what the tests
// check.
#include <flex/hooks/errors.h>
#include <flex/kernels/ggml_dequant.h>
#include <flex/kernels/ggml_linear.h>
#include <flex/quant/ggml_quantize.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace flex {

namespace {

constexpr uint32_t kQ8_0 = 8, kQ6_K = 14;

void put_half(uint8_t* p, float v) {
  const c10::Half h(v);
  std::memcpy(p, &h.x, 2);
}

float half_value(float v) { return static_cast<float>(c10::Half(v)); }

// 32 values into 34 bytes: fp16 d, 32 int8. As gguf-py: id is the float32
// reciprocal of the float32 d (not of the stored half), q = round half away.
void block_q8_0(const float* x, uint8_t* b) {
  float amax = 0.f;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.f;
  const float id = d == 0.f ? 0.f : 1.f / d;
  put_half(b, d);
  for (int i = 0; i < 32; ++i) b[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(std::round(x[i] * id)));
}

// 256 values into 210 bytes: ql[128] (low 4 bits), qh[64] (high 2 bits),
// int8 scales[16], fp16 d. Element j of a 128-half n: l = j % 32, quarter
// k = j / 32; low nibble in ql[n*64 + l + 32*(k&1)] (high half for k >= 2),
// high bits in qh[n*32 + l] at 2k.
void block_q6_k(const float* x, uint8_t* b) {
  float s[16];
  float smax = 0.f;
  for (int g = 0; g < 16; ++g) {
    float m = 0.f;
    for (int i = 0; i < 16; ++i)
      if (std::fabs(x[g * 16 + i]) > std::fabs(m)) m = x[g * 16 + i];
    s[g] = -m / 32.f;
    smax = std::max(smax, std::fabs(s[g]));
  }
  const float d = half_value(smax / 127.f);
  uint8_t* ql = b;
  uint8_t* qh = b + 128;
  int8_t* sc = reinterpret_cast<int8_t*>(b + 192);
  std::memset(b, 0, 210);
  put_half(b + 208, d);
  uint8_t L[256];
  for (int g = 0; g < 16; ++g) {
    const int c = d == 0.f ? 0 : static_cast<int>(std::clamp(std::round(s[g] / d), -127.f, 127.f));
    sc[g] = static_cast<int8_t>(c);
    const float step = d * static_cast<float>(c);
    for (int i = 0; i < 16; ++i) {
      const float q = step == 0.f ? 0.f : std::clamp(std::round(x[g * 16 + i] / step), -32.f, 31.f);
      L[g * 16 + i] = static_cast<uint8_t>(static_cast<int>(q) + 32);
    }
  }
  for (int n = 0; n < 2; ++n)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < 32; ++l) {
        const uint8_t q = L[n * 128 + k * 32 + l];
        ql[n * 64 + l + 32 * (k & 1)] |= static_cast<uint8_t>((q & 0xF) << (k >= 2 ? 4 : 0));
        qh[n * 32 + l] |= static_cast<uint8_t>((q >> 4) << (2 * k));
      }
}

}  // namespace

bool ggml_can_quantize(uint32_t type) { return type == kQ8_0 || type == kQ6_K; }

at::Tensor ggml_quantize(uint32_t type, const at::Tensor& w) {
  if (!ggml_can_quantize(type))
    throw UnsupportedError("quantizing into ggml " + ggml_type_name(type) + " is not implemented (Q8_0, Q6_K are)");
  if (w.dim() != 2)
    throw ShapeError("ggml_quantize: expected a 2-D weight [out, in], got " + std::to_string(w.dim()) + " dims");
  const int64_t out = w.size(0), in = w.size(1);
  const int64_t row = ggml_row_bytes(type, in);  // ShapeError unless whole blocks
  const at::Tensor x = w.detach().to(at::kCPU, at::kFloat).contiguous();
  at::Tensor bytes = at::empty({out, row}, at::kByte);
  const GgmlTypeInfo* info = ggml_type_info(type);
  const int64_t per_row = in / info->block;
  const float* src = x.data_ptr<float>();
  uint8_t* dst = bytes.data_ptr<uint8_t>();
  at::parallel_for(0, out, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t k = 0; k < per_row; ++k) {
        const float* xb = src + r * in + k * info->block;
        uint8_t* bb = dst + r * row + k * info->block_bytes;
        if (type == kQ8_0) block_q8_0(xb, bb);
        else block_q6_k(xb, bb);
      }
  });
  return bytes;
}

}  // namespace flex
