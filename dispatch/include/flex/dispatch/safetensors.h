#pragma once
// safetensors files: a validating, zero-copy reader over mmap and a writer that
// reproduces the upstream byte layout exactly.
//
// Layout: u64 little-endian header length N | N bytes of JSON | data. The JSON
// maps names to {"dtype", "shape", "data_offsets": [begin, end)} (offsets into
// the data) plus an optional "__metadata__" string->string map.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace flex {

class MappedFile;

/// Where one tensor lives in a safetensors file.
struct TensorInfo {
  /// at::ScalarType::Undefined for valid safetensors dtypes this project does
  /// not map (U16, U32, U64, F8_*, F4, F6_*, C64); get() then throws UnsupportedError.
  at::ScalarType dtype = at::ScalarType::Undefined;
  std::string dtype_name;  // "F32"
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets relative to the start of the data
  uint64_t nbytes() const { return end - begin; }
};

/// The largest header safetensors accepts (upstream's limit).
constexpr uint64_t kSafetensorsMaxHeader = 100000000;

class SafetensorsFile {
 public:
  /// Maps and fully validates `path`: FileFormatError naming the file and the
  /// fault for a short file, an oversized or truncated header, bad JSON,
  /// malformed entries, unknown dtypes, duplicate names, offsets that are
  /// unsorted, overlapping, leave holes, run out of range or do not match the
  /// shape; IOError when the file cannot be opened.
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return path_; }
  /// Tensor names in data-offset order.
  const std::vector<std::string>& names() const { return names_; }
  bool contains(const std::string& name) const { return infos_.count(name) > 0; }
  /// NotFoundError naming the file and the closest names when absent.
  const TensorInfo& info(const std::string& name) const;
  /// A zero-copy CPU view of the mapping (kept alive by the tensor);
  /// UnsupportedError for unmapped dtypes.
  at::Tensor get(const std::string& name) const;
  /// "__metadata__" ({} when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// Byte offset of the data section in the file (8 + header length).
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  std::shared_ptr<MappedFile> map_;
  uint64_t data_offset_ = 0;
  std::vector<std::string> names_;
  std::unordered_map<std::string, TensorInfo> infos_;
  std::map<std::string, std::string> metadata_;
};

/// Writes tensors (any device; copied to CPU, C order) with upstream's layout:
/// "__metadata__" first (omitted when `metadata` is empty), then entries sorted
/// by dtype alignment (U64 > I64 > F64 > F32 > ... > U8 > BOOL) and then
/// bytewise by name, compact JSON padded with spaces to a multiple of 8. Goes
/// through a temp file + rename. ConfigError for duplicate names,
/// UnsupportedError for meta tensors or unmapped dtypes.
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

/// The serialized header (length prefix + padded JSON) save_safetensors would
/// write for these tensors; exposed for writers that stream the data themselves.
std::string safetensors_header(const std::vector<std::pair<std::string, at::Tensor>>& sorted_tensors,
                               const std::map<std::string, std::string>& metadata);

/// `tensors` in upstream's on-disk order (alignment rank, then name).
std::vector<std::pair<std::string, at::Tensor>> safetensors_order(
    std::vector<std::pair<std::string, at::Tensor>> tensors);

}  // namespace flex
