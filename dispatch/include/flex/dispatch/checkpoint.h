#pragma once
// A model checkpoint on disk, resolved as Accelerate's load_checkpoint_in_model
// does: one file (.safetensors or a torch.save .bin), a sharded index
// (*.index.json with "weight_map", or a legacy flat {name: file} map), or a
// folder holding pytorch_model.bin, model.safetensors or exactly one *.index.json
// (tried in that order).
#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace flex {

class Checkpoint;

/// How a model's tensors are found in a checkpoint that names or stores them
/// differently (the models layer builds one from the architecture and
/// config.json): renamed prefixes (a multimodal checkpoint's language model),
/// dropped parts (its vision tower), and tensors computed from stored ones
/// when read (load-time dequantization of FP8 / MXFP4 weights).
struct CheckpointView {
  /// Stored-name prefix -> model-name prefix; the first that matches applies.
  std::vector<std::pair<std::string, std::string>> renames;
  /// Stored keys under these prefixes are not part of the model.
  std::vector<std::string> dropped;
  struct Computed {
    std::string name;                  // the model's name
    std::vector<std::string> sources;  // the stored keys it replaces
    std::vector<int64_t> shape;
    at::ScalarType dtype = at::kFloat;
    /// The tensor from the sources (read in order).
    std::function<at::Tensor(const std::vector<at::Tensor>&)> compute;
  };
  std::vector<Computed> computed;
};

class Checkpoint {
 public:
  /// Resolves and opens every shard (safetensors shards are mmapped and
  /// validated at once; .bin shards are read on first use). IOError for a
  /// missing path, NotFoundError for a folder without a checkpoint or an index
  /// naming a missing shard, FileFormatError for a folder with several index
  /// files, a malformed index, a key the index places in a shard that lacks
  /// it, or a key present in two shards.
  static Checkpoint open(const std::string& path);

  /// Shard files (absolute paths), sorted, unique.
  const std::vector<std::string>& files() const;
  /// Every tensor name, sorted.
  std::vector<std::string> keys() const;
  /// The names stored in `file` (one of files()), in file order.
  std::vector<std::string> keys_in(const std::string& file) const;
  bool contains(const std::string& key) const;
  /// The shard holding `key`; NotFoundError with close names otherwise.
  std::string file_of(const std::string& key) const;
  /// safetensors: a zero-copy view of the mapping; .bin: the loaded tensor.
  at::Tensor get(const std::string& key) const;
  at::ScalarType dtype(const std::string& key) const;
  std::vector<int64_t> shape(const std::string& key) const;
  /// True when every shard is a safetensors file.
  bool is_safetensors() const;
  /// The file given to open() after folder resolution (the index or the single file).
  const std::string& source() const;

  /// This checkpoint seen through `view`: keys() and the accessors use the
  /// model's names. FileFormatError when two stored keys get one name or a
  /// computed tensor's source is missing.
  Checkpoint with_view(const CheckpointView& view) const;
  /// The stored key behind model name `key` ("" for a computed tensor).
  std::string stored_name(const std::string& key) const;
  /// Whether `key` is computed when read (so not a view of a file).
  bool is_computed(const std::string& key) const;
  /// Whether any tensor is.
  bool has_computed() const;

  struct Impl;
  struct View;

 private:
  std::shared_ptr<Impl> impl_;
  std::shared_ptr<const View> view_;
};

class DeviceMap;

/// Accelerate's load_state_dict: every tensor of a checkpoint (a file, an
/// index, or a folder, resolved as Checkpoint::open), in sorted name order.
/// Without a device map they stay on the CPU (safetensors: views of the
/// mapping); with one, each goes to the device of its closest mapped module
/// ("disk" loads to the CPU, as upstream). DeviceMapError naming the tensor
/// when the map covers it with no entry.
std::vector<std::pair<std::string, at::Tensor>> load_state_dict(const std::string& checkpoint_file,
                                                                const DeviceMap* device_map = nullptr);

/// Reads a torch.save (zip) file holding a flat dict of tensors, in file
/// order, like torch.load(weights_only=True): only tensors, typed storages,
/// OrderedDict and Parameter rebuilds are accepted; anything else gives
/// UnsupportedError naming the file. Tensors sharing a storage stay views of it.
std::vector<std::pair<std::string, at::Tensor>> load_torch_bin(const std::string& path);

}  // namespace flex
