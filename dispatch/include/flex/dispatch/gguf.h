#pragma once
// GGUF files (llama.cpp's model format): a validating reader over mmap.
//
// Layout (little-endian, versions 2 and 3): "GGUF" | u32 version | u64 tensor
// count | u64 metadata count | metadata (string key, u32 value type, value)
// | tensor infos (string name, u32 n_dims, u64 dims innermost first, u32
// ggml type, u64 offset) | padding to general.alignment (default 32) | data.
// A string is a u64 length and that many bytes; an array is a u32 element
// type, a u64 count and the elements.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace flex {

class MappedFile;

/// GGUF metadata value types, numbered as in the file.
enum class GgufType : uint32_t {
  Uint8 = 0, Int8 = 1, Uint16 = 2, Int16 = 3, Uint32 = 4, Int32 = 5, Float32 = 6,
  Bool = 7, String = 8, Array = 9, Uint64 = 10, Int64 = 11, Float64 = 12,
};
/// "uint32", "array", ...
const char* gguf_type_name(GgufType type);

/// One metadata value. Accessors of the wrong kind throw FileFormatError
/// (GgufFile's getters add the file and key).
class GgufValue {
 public:
  GgufType type() const { return type_; }
  bool is_integer() const;  // the eight integer types
  bool is_float() const;    // float32, float64
  int64_t to_int() const;   // integer types (uint64 above INT64_MAX throws)
  double to_double() const;  // float and integer types
  bool to_bool() const;
  const std::string& to_string() const;
  /// Arrays: the element type, the length, one element, and all elements
  /// of a string / integer / numeric array.
  GgufType element_type() const;
  uint64_t size() const;
  GgufValue at(uint64_t i) const;
  std::vector<std::string> to_strings() const;
  std::vector<int64_t> to_ints() const;
  std::vector<double> to_doubles() const;

 private:
  friend struct GgufParser;
  GgufType type_ = GgufType::Uint8;
  GgufType elem_ = GgufType::Uint8;  // arrays
  uint64_t bits_ = 0;                // scalars: the value's bytes, zero-extended
  uint64_t count_ = 0;               // arrays
  std::string bytes_;                // strings; arrays of fixed-size elements: their bytes
  std::vector<std::string> strings_;  // arrays of strings
  std::vector<GgufValue> items_;      // arrays of arrays
};

/// One tensor of a GGUF file.
struct GgufTensorInfo {
  std::string name;
  uint32_t type = 0;           // ggml type number (flex/kernels/ggml_dequant.h)
  std::vector<int64_t> shape;  // torch order: outermost first (the file's dims reversed)
  uint64_t offset = 0;         // from the start of the data section
  uint64_t nbytes = 0;
  int64_t numel() const;
};

class GgufFile {
 public:
  /// Maps and validates `path`. FileFormatError naming the file and the
  /// field, key or tensor at fault for: a truncated file, a bad magic, a
  /// version other than 2 or 3, an unknown value type, a count or length
  /// larger than the bytes left could hold, arrays nested too deep, a
  /// duplicate key or tensor name, a bad general.alignment, more than 4 or
  /// negative dims, a dims product that overflows, a row not a whole number
  /// of blocks, an unknown ggml type (naming the tensor and the number), an
  /// unaligned, overlapping or out-of-file tensor. IOError when the file
  /// cannot be opened.
  static std::shared_ptr<GgufFile> open(const std::string& path);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  /// Byte offset of the data section in the file.
  uint64_t data_offset() const { return data_offset_; }

  /// Metadata keys in file order.
  const std::vector<std::string>& keys() const { return keys_; }
  bool has(const std::string& key) const { return values_.count(key) > 0; }
  /// NotFoundError naming the file and key when absent.
  const GgufValue& value(const std::string& key) const;
  /// Typed reads: NotFoundError when absent, FileFormatError naming the
  /// file and key for a value of another kind.
  int64_t get_int(const std::string& key) const;
  double get_double(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  std::vector<std::string> get_strings(const std::string& key) const;

  /// Tensor names in file order.
  const std::vector<std::string>& tensor_names() const { return tensor_names_; }
  bool contains(const std::string& name) const { return tensors_.count(name) > 0; }
  /// NotFoundError naming the file and the closest names when absent.
  const GgufTensorInfo& tensor(const std::string& name) const;
  /// The tensor's stored bytes: a zero-copy uint8 view [nbytes].
  at::Tensor raw(const std::string& name) const;
  /// The tensor as float32 in its torch shape (F32: a zero-copy view);
  /// UnsupportedError naming the file, tensor and ggml type for types
  /// ggml_can_dequantize refuses.
  at::Tensor dequantize(const std::string& name) const;

 private:
  friend struct GgufParser;
  GgufFile() = default;
  std::string path_;
  std::shared_ptr<MappedFile> map_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::string> keys_;
  std::unordered_map<std::string, GgufValue> values_;
  std::vector<std::string> tensor_names_;
  std::unordered_map<std::string, GgufTensorInfo> tensors_;
};

}  // namespace flex
