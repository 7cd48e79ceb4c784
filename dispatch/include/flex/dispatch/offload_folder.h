#pragma once
// Accelerate's disk-offload folder: index.json plus one <name>.dat per tensor
// (raw C-order little-endian bytes, no header). Folders written here are
// byte-identical to accelerate.utils.offload_state_dict's for the same tensors;
// reads are zero-copy mmap views.
//
// index.json: {name: {"dtype": numpy name, "shape": [...]}} in insertion
// order, json.dump(indent=2). bfloat16 is stored as its int16 bits with dtype
// "bfloat16"; a 0-d tensor is stored as one element with shape []. Entries
// {"safetensors_file", "weight_name", "dtype"} point into a safetensors file
// instead (Transformers writes them when the checkpoint itself is the store).
#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace flex {

class Module;
class SafetensorsFile;

struct OffloadEntry {
  std::string dtype;              // numpy name ("float32", "bfloat16"); may be empty for safetensors entries
  std::vector<int64_t> shape;     // .dat entries
  std::string safetensors_file;   // non-empty: the tensor lives in this safetensors file
  std::string weight_name;        // ... under this name
  bool in_safetensors() const { return !safetensors_file.empty(); }
};

/// An ordered name -> entry map with Python dict.update semantics.
class OffloadIndex {
 public:
  /// Replaces an existing entry in place or appends a new one.
  void set(const std::string& name, OffloadEntry entry);
  const OffloadEntry* find(const std::string& name) const;
  const std::vector<std::pair<std::string, OffloadEntry>>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  /// Adds every entry of `other` (dict.update).
  void update(const OffloadIndex& other);

  /// The bytes json.dump(index, f, indent=2) writes.
  std::string to_json() const;
  /// Parses index.json text; FileFormatError naming `path` for malformed entries.
  static OffloadIndex parse(const std::string& text, const std::string& path);

 private:
  std::vector<std::pair<std::string, OffloadEntry>> entries_;
};

/// Writes `weight` to <folder>/<name>.dat and records it in `index`
/// (Accelerate's offload_weight). ConfigError for names with '/' or empty names.
void offload_weight(const at::Tensor& weight, const std::string& name, const std::string& folder, OffloadIndex& index);

/// Merges `index` into <folder>/index.json (created if absent); nothing when empty.
void save_offload_index(const OffloadIndex& index, const std::string& folder);

/// Every tensor to <dir>/<name>.dat and the index (Accelerate's offload_state_dict).
OffloadIndex offload_state_dict(const std::string& dir,
                                const std::vector<std::pair<std::string, at::Tensor>>& tensors);

/// <folder>/index.json; IOError naming it when missing.
OffloadIndex load_offload_index(const std::string& folder);

/// One tensor of a folder as a zero-copy view of its .dat file (or of the
/// safetensors file an entry points at, cast to the entry's dtype).
at::Tensor load_offloaded_weight(const std::string& folder, const std::string& name, const OffloadEntry& entry);

/// Sets every indexed tensor into `model` (Accelerate's load_offloaded_weights).
void load_offloaded_weights(Module& model, const OffloadIndex& index, const std::string& folder);

/// A read-only offload folder.
class OffloadFolder {
 public:
  static OffloadFolder open(const std::string& folder);
  const std::string& folder() const { return folder_; }
  const OffloadIndex& index() const { return index_; }
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return index_.find(name) != nullptr; }
  /// NotFoundError naming the folder and close names; FileFormatError when the
  /// .dat size does not match the entry; IOError when the file is missing.
  at::Tensor get(const std::string& name) const;

 private:
  std::string folder_;
  OffloadIndex index_;
};

}  // namespace flex
