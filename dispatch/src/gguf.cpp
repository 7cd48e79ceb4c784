// GGUF reader: one pass over the header with a bounds-checked cursor. Every
// count read from the file is checked against the bytes left before anything
// is reserved for it (each element takes at least its minimum encoded size),
// so a hostile count fails with FileFormatError instead of allocating.
#include "flex/dispatch/gguf.h"

#include "flex/dispatch/mapped_file.h"

#include <flex/hooks/errors.h>
#include <flex/hooks/module.h>
#include <flex/kernels/ggml_dequant.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <limits>

namespace flex {

namespace {

constexpr int kGgufMaxDepth = 8;  // arrays of arrays of ...
constexpr uint32_t kGgufMaxDims = 4;

bool gguf_type_known(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::Float64); }

// Encoded size of a fixed-size value type; 0 for string and array.
uint64_t gguf_fixed_size(GgufType t) {
  switch (t) {
    case GgufType::Uint8: case GgufType::Int8: case GgufType::Bool: return 1;
    case GgufType::Uint16: case GgufType::Int16: return 2;
    case GgufType::Uint32: case GgufType::Int32: case GgufType::Float32: return 4;
    case GgufType::Uint64: case GgufType::Int64: case GgufType::Float64: return 8;
    default: return 0;
  }
}

// The fewest bytes one value of type t takes in the file.
uint64_t gguf_min_size(GgufType t) {
  if (t == GgufType::String) return 8;
  if (t == GgufType::Array) return 12;
  return gguf_fixed_size(t);
}

[[noreturn]] void gguf_value_error(const std::string& what) { throw FileFormatError("GGUF value " + what); }

}  // namespace

const char* gguf_type_name(GgufType type) {
  switch (type) {
    case GgufType::Uint8: return "uint8";
    case GgufType::Int8: return "int8";
    case GgufType::Uint16: return "uint16";
    case GgufType::Int16: return "int16";
    case GgufType::Uint32: return "uint32";
    case GgufType::Int32: return "int32";
    case GgufType::Float32: return "float32";
    case GgufType::Bool: return "bool";
    case GgufType::String: return "string";
    case GgufType::Array: return "array";
    case GgufType::Uint64: return "uint64";
    case GgufType::Int64: return "int64";
    case GgufType::Float64: return "float64";
  }
  return "unknown";
}

// The reader; a friend of GgufValue and GgufFile.
struct GgufParser {
  const std::string& path;
  const uint8_t* base;
  uint64_t size;
  uint64_t pos = 0;

  // A scalar of fixed-size type t from its little-endian bytes.
  static GgufValue scalar(GgufType t, const uint8_t* p) {
    GgufValue v;
    v.type_ = t;
    for (int i = static_cast<int>(gguf_fixed_size(t)) - 1; i >= 0; --i) v.bits_ = (v.bits_ << 8) | p[i];
    return v;
  }

  [[noreturn]] void fail(const std::string& what) const { throw FileFormatError("GGUF file " + path + ": " + what); }

  uint64_t left() const { return size - pos; }

  // Fails unless n more bytes are there for `field`.
  void need(uint64_t n, const std::string& field) const {
    if (n > left())
      fail("truncated: " + field + " needs " + std::to_string(n) + " bytes at offset " + std::to_string(pos) +
           " but the file has " + std::to_string(size) + " bytes");
  }
  uint64_t le(int bytes, const std::string& field) {
    need(static_cast<uint64_t>(bytes), field);
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | base[pos + i];
    pos += bytes;
    return v;
  }
  uint32_t u32(const std::string& field) { return static_cast<uint32_t>(le(4, field)); }
  uint64_t u64(const std::string& field) { return le(8, field); }

  std::string str(const std::string& field) {
    const uint64_t n = u64(field + " (string length)");
    if (n > left())
      fail("truncated: " + field + " is a string of " + std::to_string(n) + " bytes but " + std::to_string(left()) +
           " bytes are left at offset " + std::to_string(pos));
    std::string s(reinterpret_cast<const char*>(base + pos), static_cast<size_t>(n));
    pos += n;
    return s;
  }

  // A count of elements that take at least `min_each` bytes each.
  uint64_t count(const std::string& field, uint64_t min_each) {
    const uint64_t n = u64(field);
    if (min_each > 0 && n > left() / min_each)
      fail(field + " is " + std::to_string(n) + ", more than the " + std::to_string(left()) +
           " bytes left could hold (at least " + std::to_string(min_each) +
           " bytes each): the file is truncated or the count corrupt");
    return n;
  }

  GgufType value_type(const std::string& field) {
    const uint32_t t = u32(field);
    if (!gguf_type_known(t)) fail(field + ": unknown value type " + std::to_string(t));
    return static_cast<GgufType>(t);
  }

  GgufValue value(GgufType t, const std::string& field, int depth) {
    GgufValue v;
    v.type_ = t;
    if (t == GgufType::String) {
      v.bytes_ = str(field);
      return v;
    }
    if (t != GgufType::Array) {
      const uint64_t w = gguf_fixed_size(t);
      need(w, field);
      v = scalar(t, base + pos);
      if (t == GgufType::Bool && v.bits_ > 1) fail(field + ": bool byte is " + std::to_string(v.bits_) + ", not 0 or 1");
      pos += w;
      return v;
    }
    if (depth >= kGgufMaxDepth) fail(field + ": arrays nested more than " + std::to_string(kGgufMaxDepth) + " deep");
    v.elem_ = value_type(field + " (array element type)");
    v.count_ = count(field + " (array length)", gguf_min_size(v.elem_));
    if (v.elem_ == GgufType::String) {
      v.strings_.reserve(static_cast<size_t>(v.count_));
      for (uint64_t i = 0; i < v.count_; ++i) v.strings_.push_back(str(field + "[" + std::to_string(i) + "]"));
    } else if (v.elem_ == GgufType::Array) {
      v.items_.reserve(static_cast<size_t>(v.count_));
      for (uint64_t i = 0; i < v.count_; ++i)
        v.items_.push_back(value(GgufType::Array, field + "[" + std::to_string(i) + "]", depth + 1));
    } else {
      const uint64_t n = v.count_ * gguf_fixed_size(v.elem_);  // <= left(), checked by count()
      v.bytes_.assign(reinterpret_cast<const char*>(base + pos), static_cast<size_t>(n));
      if (v.elem_ == GgufType::Bool)
        for (uint64_t i = 0; i < v.count_; ++i)
          if (base[pos + i] > 1) fail(field + "[" + std::to_string(i) + "]: bool byte is " + std::to_string(base[pos + i]) + ", not 0 or 1");
      pos += n;
    }
    return v;
  }

  void parse(GgufFile& f) {
    if (size < 4) fail("truncated: the file is " + std::to_string(size) + " bytes, shorter than the 4-byte magic");
    if (std::memcmp(base, "GGUF", 4) != 0) {
      std::string got;
      for (int i = 0; i < 4; ++i) {
        const char c = static_cast<char>(base[i]);
        got += (c >= 32 && c < 127) ? std::string(1, c) : "\\x" + std::string(1, "0123456789abcdef"[(base[i] >> 4)]) +
                                                               std::string(1, "0123456789abcdef"[base[i] & 15]);
      }
      fail("bad magic \"" + got + "\" (expected \"GGUF\")");
    }
    pos = 4;
    f.version_ = u32("version");
    if (f.version_ != 2 && f.version_ != 3) {
      const uint32_t swapped = __builtin_bswap32(f.version_);
      if (swapped == 2 || swapped == 3) fail("version field is big-endian (version " + std::to_string(swapped) + "); only little-endian GGUF is read");
      fail("unknown version " + std::to_string(f.version_) + " (versions 2 and 3 are read)");
    }
    const uint64_t n_tensors = u64("tensor count");
    // Each key/value takes at least 13 bytes, each tensor info 28 (1 dim):
    // both counts are checked before anything is reserved for them.
    const uint64_t n_kv = count("metadata count", 13);

    f.keys_.reserve(static_cast<size_t>(n_kv));
    for (uint64_t i = 0; i < n_kv; ++i) {
      const std::string key = str("metadata key #" + std::to_string(i));
      const std::string field = "metadata key '" + key + "'";
      const GgufType t = value_type(field + " (value type)");
      GgufValue v = value(t, field, 0);
      if (!f.values_.emplace(key, std::move(v)).second) fail("duplicate " + field);
      f.keys_.push_back(key);
    }
    auto al = f.values_.find("general.alignment");
    if (al != f.values_.end()) {
      const GgufValue& v = al->second;
      if (v.type() != GgufType::Uint32)
        fail(std::string("metadata key 'general.alignment' is a ") + gguf_type_name(v.type()) + ", not a uint32");
      const uint64_t a = v.to_int();
      if (a == 0 || (a & (a - 1)) != 0) fail("metadata key 'general.alignment' is " + std::to_string(a) + ", not a power of two");
      f.alignment_ = a;
    }

    if (n_tensors > left() / 28)
      fail("tensor count is " + std::to_string(n_tensors) + ", more than the " + std::to_string(left()) +
           " bytes left could hold: the file is truncated or the count corrupt");
    f.tensor_names_.reserve(static_cast<size_t>(n_tensors));
    std::vector<GgufTensorInfo> infos;
    infos.reserve(static_cast<size_t>(n_tensors));
    for (uint64_t i = 0; i < n_tensors; ++i) {
      GgufTensorInfo info;
      info.name = str("tensor #" + std::to_string(i) + " name");
      const std::string where = "tensor '" + info.name + "'";
      const uint32_t n_dims = u32(where + " n_dims");
      if (n_dims == 0 || n_dims > kGgufMaxDims)
        fail(where + ": n_dims is " + std::to_string(n_dims) + " (1 to " + std::to_string(kGgufMaxDims) + " taken)");
      std::vector<int64_t> ne;
      unsigned __int128 numel = 1;
      for (uint32_t d = 0; d < n_dims; ++d) {
        const uint64_t x = u64(where + " dim " + std::to_string(d));
        if (x > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
          fail(where + ": dim " + std::to_string(d) + " is " + std::to_string(x) + ", negative as an int64");
        ne.push_back(static_cast<int64_t>(x));
        numel *= x;
        if (numel > static_cast<unsigned __int128>(std::numeric_limits<int64_t>::max()))
          fail(where + ": the product of its dims overflows an int64");
      }
      info.type = u32(where + " type");
      const GgmlTypeInfo* ti = ggml_type_info(info.type);
      if (!ti) fail(where + ": unknown ggml tensor type " + std::to_string(info.type));
      if (ne[0] % ti->block != 0)
        fail(where + ": rows of " + std::to_string(ne[0]) + " elements are not whole " + ti->name + " blocks of " +
             std::to_string(ti->block));
      info.nbytes = static_cast<uint64_t>(numel) / static_cast<uint64_t>(ti->block) * static_cast<uint64_t>(ti->block_bytes);
      if (static_cast<uint64_t>(numel) / static_cast<uint64_t>(ti->block) >
          std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(ti->block_bytes))
        fail(where + ": its size in bytes overflows");
      info.offset = u64(where + " offset");
      if (info.offset % f.alignment_ != 0)
        fail(where + ": offset " + std::to_string(info.offset) + " is not a multiple of the alignment " + std::to_string(f.alignment_));
      info.shape.assign(ne.rbegin(), ne.rend());
      if (f.tensors_.count(info.name) > 0) fail("duplicate tensor name '" + info.name + "'");
      f.tensor_names_.push_back(info.name);
      f.tensors_.emplace(info.name, info);
      infos.push_back(std::move(info));
    }

    // The data section starts at the next multiple of the alignment.
    const uint64_t pad = (f.alignment_ - pos % f.alignment_) % f.alignment_;
    if (n_tensors == 0) {
      f.data_offset_ = std::min(size, pos + std::min(pad, left()));
      return;
    }
    if (pad > left()) fail("truncated: the padding before the tensor data runs past the end of the file");
    f.data_offset_ = pos + pad;
    const uint64_t data_size = size - f.data_offset_;
    std::sort(infos.begin(), infos.end(), [](const GgufTensorInfo& a, const GgufTensorInfo& b) {
      return a.offset != b.offset ? a.offset < b.offset : a.name < b.name;
    });
    uint64_t end = 0;
    const GgufTensorInfo* prev = nullptr;
    for (const auto& t : infos) {
      if (t.offset > data_size || t.nbytes > data_size - t.offset)
        fail("tensor '" + t.name + "' data at [" + std::to_string(t.offset) + ", +" + std::to_string(t.nbytes) +
             ") runs out of the file: the data section has " + std::to_string(data_size) + " bytes");
      if (prev && t.offset < end && t.nbytes > 0)
        fail("tensor '" + t.name + "' data at offset " + std::to_string(t.offset) + " overlaps tensor '" + prev->name +
             "', which ends at " + std::to_string(end));
      if (t.offset + t.nbytes >= end) {
        end = t.offset + t.nbytes;
        prev = &t;
      }
    }
  }
};

// ---- GgufValue --------------------------------------------------------------

bool GgufValue::is_integer() const {
  switch (type_) {
    case GgufType::Uint8: case GgufType::Int8: case GgufType::Uint16: case GgufType::Int16:
    case GgufType::Uint32: case GgufType::Int32: case GgufType::Uint64: case GgufType::Int64: return true;
    default: return false;
  }
}

bool GgufValue::is_float() const { return type_ == GgufType::Float32 || type_ == GgufType::Float64; }

int64_t GgufValue::to_int() const {
  switch (type_) {
    case GgufType::Uint8: case GgufType::Uint16: case GgufType::Uint32: return static_cast<int64_t>(bits_);
    case GgufType::Int8: return static_cast<int8_t>(bits_);
    case GgufType::Int16: return static_cast<int16_t>(bits_);
    case GgufType::Int32: return static_cast<int32_t>(bits_);
    case GgufType::Int64: return static_cast<int64_t>(bits_);
    case GgufType::Uint64:
      if (bits_ > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        gguf_value_error("uint64 " + std::to_string(bits_) + " does not fit an int64");
      return static_cast<int64_t>(bits_);
    default: gguf_value_error(std::string("is a ") + gguf_type_name(type_) + ", not an integer");
  }
}

double GgufValue::to_double() const {
  if (type_ == GgufType::Float32) {
    float f;
    uint32_t b = static_cast<uint32_t>(bits_);
    std::memcpy(&f, &b, 4);
    return f;
  }
  if (type_ == GgufType::Float64) {
    double d;
    std::memcpy(&d, &bits_, 8);
    return d;
  }
  if (type_ == GgufType::Uint64) return static_cast<double>(bits_);
  if (is_integer()) return static_cast<double>(to_int());
  gguf_value_error(std::string("is a ") + gguf_type_name(type_) + ", not a number");
}

bool GgufValue::to_bool() const {
  if (type_ != GgufType::Bool) gguf_value_error(std::string("is a ") + gguf_type_name(type_) + ", not a bool");
  return bits_ != 0;
}

const std::string& GgufValue::to_string() const {
  if (type_ != GgufType::String) gguf_value_error(std::string("is a ") + gguf_type_name(type_) + ", not a string");
  return bytes_;
}

GgufType GgufValue::element_type() const {
  if (type_ != GgufType::Array) gguf_value_error(std::string("is a ") + gguf_type_name(type_) + ", not an array");
  return elem_;
}

uint64_t GgufValue::size() const {
  element_type();  // throws for a non-array
  return count_;
}

GgufValue GgufValue::at(uint64_t i) const {
  if (i >= size()) gguf_value_error("index " + std::to_string(i) + " is out of an array of " + std::to_string(count_));
  if (elem_ == GgufType::Array) return items_[i];
  if (elem_ == GgufType::String) {
    GgufValue v;
    v.type_ = GgufType::String;
    v.bytes_ = strings_[i];
    return v;
  }
  const uint64_t w = gguf_fixed_size(elem_);
  return GgufParser::scalar(elem_, reinterpret_cast<const uint8_t*>(bytes_.data()) + i * w);
}

std::vector<std::string> GgufValue::to_strings() const {
  if (size() > 0 && elem_ != GgufType::String)
    gguf_value_error(std::string("is an array of ") + gguf_type_name(elem_) + ", not of strings");
  return strings_;
}

std::vector<int64_t> GgufValue::to_ints() const {
  std::vector<int64_t> out;
  out.reserve(size());
  for (uint64_t i = 0; i < count_; ++i) out.push_back(at(i).to_int());
  return out;
}

std::vector<double> GgufValue::to_doubles() const {
  std::vector<double> out;
  out.reserve(size());
  for (uint64_t i = 0; i < count_; ++i) out.push_back(at(i).to_double());
  return out;
}

int64_t GgufTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // checked against overflow when read
  return n;
}

// ---- GgufFile -----------------------------------------------------------------

std::shared_ptr<GgufFile> GgufFile::open(const std::string& path) {
  std::shared_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->map_ = MappedFile::open(path);
  GgufParser p{path, f->map_->data(), f->map_->size()};
  p.parse(*f);
  return f;
}

const GgufValue& GgufFile::value(const std::string& key) const {
  auto it = values_.find(key);
  if (it == values_.end()) {
    throw NotFoundError("metadata key '" + key + "' is not in GGUF file " + path_ + closest_names_text(key, keys_, "keys"));
  }
  return it->second;
}

namespace {

// f() with a value error re-thrown naming the file and key.
template <class F>
auto gguf_read_key(const std::string& path, const std::string& key, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const FileFormatError& e) {
    throw FileFormatError("GGUF file " + path + ": metadata key '" + key + "': " + e.what());
  }
}

}  // namespace

int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue& v = value(key);
  return gguf_read_key(path_, key, [&] { return v.to_int(); });
}

double GgufFile::get_double(const std::string& key) const {
  const GgufValue& v = value(key);
  return gguf_read_key(path_, key, [&] { return v.to_double(); });
}

std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = value(key);
  return gguf_read_key(path_, key, [&] { return v.to_string(); });
}

std::vector<std::string> GgufFile::get_strings(const std::string& key) const {
  const GgufValue& v = value(key);
  return gguf_read_key(path_, key, [&] { return v.to_strings(); });
}

const GgufTensorInfo& GgufFile::tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    throw NotFoundError("tensor '" + name + "' is not in GGUF file " + path_ + closest_names_text(name, tensor_names_));
  }
  return it->second;
}

at::Tensor GgufFile::raw(const std::string& name) const {
  const GgufTensorInfo& t = tensor(name);
  return map_->view(data_offset_ + t.offset, {static_cast<int64_t>(t.nbytes)}, at::kByte);
}

at::Tensor GgufFile::dequantize(const std::string& name) const {
  const GgufTensorInfo& t = tensor(name);
  if (!ggml_can_dequantize(t.type))
    throw UnsupportedError("GGUF file " + path_ + ": tensor '" + name + "' is of ggml type " + ggml_type_name(t.type) +
                           " (" + std::to_string(t.type) + "), which flexmodel does not dequantize (F32, F16, BF16, "
                           "Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K are read)");
  if (t.type == 0) return map_->view(data_offset_ + t.offset, t.shape, at::kFloat);
  at::Tensor out = at::empty(t.shape, at::TensorOptions().dtype(at::kFloat));
  dequantize_ggml(t.type, map_->data() + data_offset_ + t.offset, out.data_ptr<float>(), t.numel());
  return out;
}

}  // namespace flex
