// bitsandbytes' arithmetic (quantize.h), vectorised with ATen. The code
// choices follow the CUDA kernels (strict '>' decision thresholds, NaN of an
// all-zero block to code 0), which wrote the checkpoints people download.
#include "kernel_util.h"
#include "quantize_rows.h"

#include <flex/hooks/errors.h>
#include <flex/quant/quantize.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

namespace flex {

namespace {

// The QLoRA paper's NF4 values, as bitsandbytes hard-codes them.
constexpr std::array<float, 16> kNf4{-1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
                                     -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
                                     0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f,
                                     0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f,
                                     0.7229568362236023f, 1.0f};
// e2m1 with bitsandbytes' bias: magnitudes {0, 0.0625, 8, 12, 4, 6, 2, 3} / 12 by bits, bit 3 the sign.
const std::array<float, 16> kFp4 = [] {
  const float m[8] = {0.0f, 0.0625f, 8.0f, 12.0f, 4.0f, 6.0f, 2.0f, 3.0f};
  std::array<float, 16> t{};
  for (int i = 0; i < 8; ++i) {
    t[i] = m[i] / 12.0f;
    t[i + 8] = i == 0 ? 0.0f : -m[i] / 12.0f;
  }
  return t;
}();
// The CUDA kernel's FP4 magnitude thresholds (not exactly the midpoints) and
// the magnitude bits of each interval, in increasing magnitude.
constexpr float kFp4Thresholds[7] = {0.00260417f, 0.0859375f, 0.20833333f, 0.29166667f,
                                     0.4166667f,  0.583333f,  0.8333333f};
constexpr int64_t kFp4Bits[8] = {0, 1, 6, 7, 4, 5, 2, 3};

// bitsandbytes' create_dynamic_map(signed=True): for i in 0..6, the means of
// consecutive points of linspace(0.1, 1, 2^i + 1) times 10^(i-6), both signs,
// plus 0 and 1. linspace is evaluated as the canonical table has it (two
// fused multiply-adds from either end) rather than by this torch's linspace,
// whose rounding differs between versions.
const std::array<float, 256> kDynamic = [] {
  std::vector<float> v;
  for (int i = 0; i < 7; ++i) {
    const int steps = (1 << i) + 1;
    const float step = (1.0f - 0.1f) / static_cast<float>(steps - 1);
    std::vector<float> b(steps);
    for (int j = 0; j < steps; ++j)
      b[j] = j < steps / 2 ? std::fma(static_cast<float>(j), step, 0.1f)
                           : std::fma(-static_cast<float>(steps - 1 - j), step, 1.0f);
    const float scale = static_cast<float>(std::pow(10.0, i - 6));
    for (int j = 0; j + 1 < steps; ++j) {
      const float mean = (b[j] + b[j + 1]) * 0.5f;
      v.push_back(scale * mean);
      v.push_back(-(scale * mean));
    }
  }
  v.push_back(0.0f);
  v.push_back(1.0f);
  std::sort(v.begin(), v.end());
  std::array<float, 256> t{};
  if (v.size() != 256) throw std::logic_error("dynamic code has " + std::to_string(v.size()) + " values");
  std::copy(v.begin(), v.end(), t.begin());
  return t;
}();

at::Tensor table(const float* p, int64_t n) { return at::from_blob(const_cast<float*>(p), {n}, at::kFloat).clone(); }

// Python's repr(float): shortest round-trip digits, fixed for 1e-4 <= |x| < 1e16.
std::string python_float_repr(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string s(buf, r.ptr);
  std::string sign;
  if (s[0] == '-') {
    sign = "-";
    s = s.substr(1);
  }
  const size_t e = s.find('e');
  std::string digits = s.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp = std::stoi(s.substr(e + 1));
  const int k = static_cast<int>(digits.size());
  if (exp >= -4 && exp < 16) {
    if (exp >= k - 1) return sign + digits + std::string(exp - k + 1, '0') + ".0";
    if (exp >= 0) return sign + digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    return sign + "0." + std::string(-exp - 1, '0') + digits;
  }
  std::string mant = digits.substr(0, 1) + (k > 1 ? "." + digits.substr(1) : "");
  const std::string ex = std::to_string(std::abs(exp));
  return sign + mant + "e" + (exp < 0 ? "-" : "+") + (ex.size() < 2 ? "0" + ex : ex);
}

std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kDouble: return "float64";
    default: throw ConfigError(std::string("4-bit weights of dtype ") + c10::toString(t) + " are not supported");
  }
}

at::ScalarType dtype_of(const std::string& s, const std::string& where) {
  if (s == "float32") return at::kFloat;
  if (s == "float16") return at::kHalf;
  if (s == "bfloat16") return at::kBFloat16;
  if (s == "float64") return at::kDouble;
  throw ConfigError(where + ": unknown dtype '" + s + "' in the quant state");
}

// Blocks of `blocksize` over the flattened x (the tail padded with zeros).
at::Tensor blocks_of(const at::Tensor& x, int64_t blocksize) {
  const int64_t n = x.numel(), nb = (n + blocksize - 1) / blocksize;
  at::Tensor flat = x.reshape({-1}).to(at::kFloat);
  if (nb * blocksize != n) flat = at::constant_pad_nd(flat, {0, nb * blocksize - n}, 0.0);
  return flat.view({nb, blocksize});
}

void check_blocksize(int64_t b) {
  if (b < 32 || b > 4096 || (b & (b - 1)) != 0)
    throw ConfigError("block size must be a power of two in [32, 4096], got " + std::to_string(b));
}


// Values [e0, e0 + len) of a contiguous floating tensor as float32, with
// .to(kFloat)'s rounding: float32 in place, bfloat16 and float16 widened
// into `buf` here (exact), other dtypes through ATen.
const float* float_run(const at::Tensor& flat, int64_t e0, int64_t len, std::vector<float>& buf) {
  if (flat.scalar_type() == at::kFloat) return flat.data_ptr<float>() + e0;
  if (buf.size() < static_cast<size_t>(len)) buf.resize(len);
  float* out = buf.data();
  if (flat.scalar_type() == at::kBFloat16) {
    const uint16_t* in = reinterpret_cast<const uint16_t*>(flat.data_ptr()) + e0;
    for (int64_t i = 0; i < len; ++i) {
      const uint32_t bits = static_cast<uint32_t>(in[i]) << 16;
      std::memcpy(out + i, &bits, 4);
    }
  } else if (flat.scalar_type() == at::kHalf) {
    const c10::Half* in = flat.data_ptr<c10::Half>() + e0;
    for (int64_t i = 0; i < len; ++i) out[i] = static_cast<float>(in[i]);
  } else {
    at::from_blob(out, {len}, at::kFloat).copy_(flat.reshape({-1}).narrow(0, e0, len));
  }
  return out;
}

// f(row, float values of the row) for every row of a 2-D floating tensor, rows
// spread over libtorch's threads.
template <typename F>
void for_each_float_row(const at::Tensor& weight, const F& f) {
  const at::Tensor w = weight.detach().contiguous();
  const int64_t rows = w.size(0), cols = w.size(1);
  at::parallel_for(0, rows, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(cols, 1)), [&](int64_t r0, int64_t r1) {
    std::vector<float> buf;
    for (int64_t r = r0; r < r1; ++r) f(r, float_run(w, r * cols, cols, buf));
  });
}

}  // namespace

FourBitType four_bit_type(const std::string& name) {
  if (name == "nf4") return FourBitType::NF4;
  if (name == "fp4") return FourBitType::FP4;
  throw ConfigError("bnb_4bit_quant_type must be 'nf4' or 'fp4', got '" + name + "'");
}

std::string to_string(FourBitType t) { return t == FourBitType::NF4 ? "nf4" : "fp4"; }

const std::array<float, 16>& four_bit_code(FourBitType t) { return t == FourBitType::NF4 ? kNf4 : kFp4; }

const std::array<float, 256>& dynamic_code() { return kDynamic; }

// --- 8-bit -------------------------------------------------------------------

namespace {
constexpr float kInv127 = 7.874015718698502e-3f;  // float32(1/127), as int8_vectorwise_dequant
}  // namespace

Int8Weight quantize_int8_rowwise(const at::Tensor& weight) {
  if (weight.dim() != 2) throw ShapeError("8-bit quantization needs a 2-D weight, got " + std::to_string(weight.dim()) + " dims");
  if (!at::isFloatingType(weight.scalar_type()))
    throw ConfigError(std::string("8-bit quantization needs a floating-point weight, got ") + c10::toString(weight.scalar_type()));
  const int64_t rows = weight.size(0), cols = weight.size(1);
  Int8Weight w;
  w.scb = at::empty({rows}, at::kFloat);
  w.cb = at::empty({rows, cols}, at::kChar);
  float* scb = w.scb.data_ptr<float>();
  int8_t* cb = w.cb.data_ptr<int8_t>();
  // One pass per row, rows in parallel (each row whole on one thread).
  // bitsandbytes converts the weight to float16 first, then scales each row by 127 / absmax.
  for_each_float_row(weight, [&](int64_t r, const float* v) { scb[r] = kernel::quantize_row_int8(v, cols, cb + r * cols); });
  return w;
}

at::Tensor dequantize_int8_rowwise(const at::Tensor& cb, const at::Tensor& scb) {
  return (cb.to(at::kFloat) * scb.to(at::kFloat).unsqueeze(1)) * kInv127;
}

// --- blockwise 8-bit (the nested absmax) ---------------------------------------

Blockwise8 quantize_blockwise_8bit(const at::Tensor& x, const at::Tensor& code, int64_t blocksize) {
  check_blocksize(blocksize);
  if (code.numel() != 256) throw ShapeError("an 8-bit code needs 256 values, got " + std::to_string(code.numel()));
  const int64_t n = x.numel();
  at::Tensor blocks = blocks_of(x, blocksize);
  Blockwise8 q;
  q.absmax = blocks.abs().amax(1);
  at::Tensor scaled = (blocks * (1.0f / q.absmax).unsqueeze(1)).reshape({-1}).narrow(0, 0, n);
  const at::Tensor c = code.to(at::kFloat).contiguous();
  const at::Tensor mids = (c.narrow(0, 0, 255) + c.narrow(0, 1, 255)) * 0.5f;
  const at::Tensor nan = scaled.isnan();
  scaled = scaled.masked_fill(nan, 0.0);
  at::Tensor idx = at::bucketize(scaled, mids);  // #midpoints < x: a tie stays below
  // bitsandbytes' binary search sends a value exactly on a midpoint to the even index.
  const at::Tensor on_mid = idx.lt(255).logical_and(scaled.eq(mids.index({idx.clamp_max(254)})));
  idx = at::where(on_mid.logical_and(idx.remainder(2).eq(1)), idx + 1, idx);
  idx = idx.masked_fill(nan, 0);
  q.codes = idx.to(at::kByte).view(x.sizes());
  return q;
}

at::Tensor dequantize_blockwise_8bit(const at::Tensor& codes, const at::Tensor& absmax, const at::Tensor& code,
                                     int64_t blocksize) {
  const int64_t n = codes.numel();
  const at::Tensor block = at::arange(n, at::TensorOptions().dtype(at::kLong).device(codes.device())).div(blocksize, "floor");
  return code.to(at::kFloat).index({codes.reshape({-1}).to(at::kLong)}) * absmax.to(at::kFloat).index({block});
}

// --- 4-bit --------------------------------------------------------------------

FourBitWeight quantize_4bit(const at::Tensor& weight, FourBitType type, bool double_quant, int64_t blocksize) {
  check_blocksize(blocksize);
  if (!at::isFloatingType(weight.scalar_type()))
    throw ConfigError(std::string("4-bit quantization needs a floating-point weight, got ") + c10::toString(weight.scalar_type()));
  FourBitWeight w;
  w.type = type;
  w.blocksize = blocksize;
  w.shape = weight.sizes().vec();
  w.dtype = weight.scalar_type();
  dtype_name(w.dtype);  // supported?
  const int64_t n = weight.numel(), nb = (n + blocksize - 1) / blocksize;
  const at::Tensor flat = weight.detach().contiguous().view({-1});
  at::Tensor absmax = at::empty({nb}, at::kFloat);
  w.packed = at::empty({(n + 1) / 2, 1}, at::kByte);
  float* am = absmax.data_ptr<float>();
  uint8_t* packed = w.packed.data_ptr<uint8_t>();
  // The decision thresholds in float32, as the tensor path computed them.
  float nf4_thr[15];
  for (int i = 0; i < 15; ++i) nf4_thr[i] = (kNf4[i] + kNf4[i + 1]) * 0.5f;
  const bool nf4 = type == FourBitType::NF4;
  // Blocks spread over libtorch's threads; a chunk of blocks is whole bytes (blocks are even).
  at::parallel_for(0, nb, std::max<int64_t>(1, 16384 / blocksize), [&](int64_t b0, int64_t b1) {
    const int64_t e0 = b0 * blocksize, e1 = std::min(n, b1 * blocksize);
    const int64_t len = e1 - e0;
    // Per-thread buffers, reused from chunk to chunk.
    thread_local std::vector<float> buf;
    thread_local std::vector<uint8_t> codes;
    const float* vals = float_run(flat, e0, len, buf);
    if (codes.size() < static_cast<size_t>(len + 1)) codes.resize(len + 1);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t s0 = b * blocksize - e0, s1 = std::min(e1, (b + 1) * blocksize) - e0;
      const float amax = kernel::abs_max_run(vals + s0, s1 - s0);
      am[b] = amax;
      // x * (1 / absmax); an all-zero block gives NaN, which goes to code 0. NF4: the
      // number of thresholds below x; FP4: the sign bit and the magnitude's code.
      kernel::four_bit_codes(vals + s0, s1 - s0, 1.0f / amax, nf4, nf4_thr, kFp4Thresholds, kFp4Bits,
                             codes.data() + s0);
    }
    // The missing last element of an odd count is quantized as 0.
    codes[len] = nf4 ? 7 : 0;
    for (int64_t i = 0; i < len; i += 2)
      packed[(e0 + i) / 2] = static_cast<uint8_t>(codes[i] << 4 | codes[i + 1]);
  });
  if (!double_quant) {
    w.absmax = absmax;
    return w;
  }
  // The mean in double precision, rounded to float32 (bitsandbytes stores a float32 mean).
  w.offset = static_cast<float>(absmax.to(at::kDouble).mean().item<double>());
  w.nested_code = table(kDynamic.data(), 256);
  Blockwise8 q = quantize_blockwise_8bit(absmax - static_cast<float>(w.offset), w.nested_code, 256);
  w.absmax = q.codes;
  w.nested_absmax = q.absmax;
  return w;
}

at::Tensor unpack_4bit(const at::Tensor& packed, int64_t n) {
  if (packed.scalar_type() != at::kByte || packed.numel() != (n + 1) / 2)
    throw ShapeError("packed 4-bit weight: expected " + std::to_string((n + 1) / 2) + " uint8 bytes for " +
                     std::to_string(n) + " values, got " + std::to_string(packed.numel()) + " of " +
                     c10::toString(packed.scalar_type()));
  const at::Tensor b = packed.reshape({-1});
  const at::Tensor l = b.to(at::kLong);
  return at::stack({l.div(16, "floor"), l.remainder(16)}, 1).reshape({-1}).narrow(0, 0, n);
}

at::Tensor dequantize_4bit(const FourBitWeight& w) {
  int64_t n = 1;
  for (int64_t s : w.shape) n *= s;
  const int64_t blocks = (n + w.blocksize - 1) / w.blocksize;
  if (w.absmax.numel() != blocks)
    throw ShapeError("4-bit weight of " + std::to_string(n) + " values in blocks of " + std::to_string(w.blocksize) +
                     " needs " + std::to_string(blocks) + " absmax values, got " + std::to_string(w.absmax.numel()));
  at::Tensor absmax;
  if (w.nested()) {
    absmax = dequantize_blockwise_8bit(w.absmax, w.nested_absmax, w.nested_code, 256) + static_cast<float>(w.offset);
  } else {
    absmax = w.absmax.to(at::kFloat);
  }
  if (w.packed.scalar_type() != at::kByte || w.packed.numel() != (n + 1) / 2)
    throw ShapeError("packed 4-bit weight: expected " + std::to_string((n + 1) / 2) + " uint8 bytes for " +
                     std::to_string(n) + " values, got " + std::to_string(w.packed.numel()) + " of " +
                     c10::toString(w.packed.scalar_type()));
  // One lookup per byte: a [256, 2] table of (high nibble's value, low nibble's value).
  const auto& code = four_bit_code(w.type);
  std::array<float, 512> pairs{};
  for (int b = 0; b < 256; ++b) {
    pairs[2 * b] = code[b >> 4];
    pairs[2 * b + 1] = code[b & 15];
  }
  const at::Tensor lut = table(pairs.data(), 512).view({256, 2}).to(w.packed.device());
  at::Tensor vals = lut.index_select(0, w.packed.reshape({-1}).to(at::kLong)).view({-1});
  // Padded to whole blocks, scaled per block, cut back to n.
  if (vals.numel() != blocks * w.blocksize) vals = at::constant_pad_nd(vals, {0, blocks * w.blocksize - vals.numel()}, 0.0);
  at::Tensor out = (vals.view({blocks, w.blocksize}) * absmax.unsqueeze(1)).view({-1}).narrow(0, 0, n);
  return out.view(w.shape);
}

// --- the packed quant state ----------------------------------------------------------

std::string quant_state_json(const FourBitWeight& w) {
  std::string s = "{\"quant_type\": \"" + to_string(w.type) + "\", \"blocksize\": " + std::to_string(w.blocksize) +
                  ", \"dtype\": \"" + dtype_name(w.dtype) + "\", \"shape\": [";
  for (size_t i = 0; i < w.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(w.shape[i]);
  s += "]";
  if (w.nested())
    s += ", \"nested_blocksize\": 256, \"nested_dtype\": \"float32\", \"nested_offset\": " + python_float_repr(w.offset);
  return s + "}";
}

void read_quant_state_json(const std::string& text, FourBitWeight& w, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw ConfigError(where + ": the packed quant state is not JSON (" + e.what() + ")");
  }
  auto need = [&](const char* key) -> const nlohmann::json& {
    if (!j.is_object() || !j.contains(key)) throw ConfigError(where + ": the quant state lacks '" + key + "'");
    return j.at(key);
  };
  try {
    w.type = four_bit_type(need("quant_type").get<std::string>());
    w.blocksize = need("blocksize").get<int64_t>();
    check_blocksize(w.blocksize);
    w.dtype = dtype_of(need("dtype").get<std::string>(), where);
    w.shape = need("shape").get<std::vector<int64_t>>();
    for (int64_t s : w.shape)
      if (s < 0 || s > (int64_t{1} << 40)) throw ConfigError(where + ": quant state shape entry " + std::to_string(s));
    if (j.contains("nested_offset")) {
      w.offset = j.at("nested_offset").get<double>();
      if (j.contains("nested_blocksize") && j.at("nested_blocksize").get<int64_t>() != 256)
        throw ConfigError(where + ": nested_blocksize must be 256");
    }
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(where + ": malformed quant state (" + e.what() + ")");
  }
}

at::Tensor quant_state_tensor(const FourBitWeight& w) {
  const std::string s = quant_state_json(w);
  at::Tensor t = at::empty({static_cast<int64_t>(s.size())}, at::kByte);
  std::memcpy(t.data_ptr<uint8_t>(), s.data(), s.size());
  return t;
}

void read_quant_state_tensor(const at::Tensor& bytes, FourBitWeight& w, const std::string& where) {
  if (bytes.scalar_type() != at::kByte || bytes.dim() != 1)
    throw ShapeError(where + ": a packed quant state is a 1-D uint8 tensor");
  const at::Tensor c = bytes.to(at::kCPU).contiguous();
  read_quant_state_json(std::string(reinterpret_cast<const char*>(c.data_ptr<uint8_t>()), static_cast<size_t>(c.numel())),
                        w, where);
}

}  // namespace flex
