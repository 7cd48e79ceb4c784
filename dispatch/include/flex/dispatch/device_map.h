#pragma once
// Device maps: which device each module (or tensor) of a model lives on, as
// Accelerate's infer_auto_device_map returns them and Transformers stores them
// in `model.hf_device_map`. A device is a GPU ordinal, "cpu" or "disk".
//
// JSON form (Transformers' hf_device_map, key order kept):
//   {"transformer.h.0": 0, "lm_head": "cpu", "transformer.h.1": "disk"}
#include <torch/nn/module.h>

#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace flex {

/// Where a module goes: GPU `index`, the CPU, or disk (offloaded, run on the
/// main device). Ordered as Accelerate orders budgets: GPUs by index, cpu, disk.
class MapDevice {
 public:
  enum class Kind : uint8_t { kGpu, kCpu, kDisk };

  MapDevice() = default;  // cpu
  /// A GPU ordinal; negative ordinals throw DeviceMapError.
  MapDevice(int gpu_index);  // NOLINT: implicit, so {"x", 0} reads as in Python
  /// Parses "cpu", "disk", "0", "cuda", "cuda:1"; anything else throws
  /// DeviceMapError naming the string and the accepted forms.
  MapDevice(const char* name);         // NOLINT
  MapDevice(const std::string& name);  // NOLINT

  static MapDevice gpu(int index) { return MapDevice(index); }
  static MapDevice cpu() { return MapDevice(); }
  static MapDevice disk();

  Kind kind() const { return kind_; }
  bool is_gpu() const { return kind_ == Kind::kGpu; }
  bool is_cpu() const { return kind_ == Kind::kCpu; }
  bool is_disk() const { return kind_ == Kind::kDisk; }
  /// The GPU ordinal (-1 for cpu and disk).
  int index() const { return index_; }

  /// "0", "cpu", "disk".
  std::string str() const;
  /// The torch device a module placed here lives on: cuda:i or cpu. Disk
  /// throws UnsupportedError: offloaded weights run on the main device.
  c10::Device torch_device() const;

  bool operator==(const MapDevice& o) const { return kind_ == o.kind_ && index_ == o.index_; }
  bool operator!=(const MapDevice& o) const { return !(*this == o); }
  bool operator<(const MapDevice& o) const;

 private:
  Kind kind_ = Kind::kCpu;
  int index_ = -1;
};

std::ostream& operator<<(std::ostream& os, const MapDevice& d);

/// An ordered map module name -> device. "" is the whole model.
class DeviceMap {
 public:
  using Entry = std::pair<std::string, MapDevice>;

  DeviceMap() = default;
  DeviceMap(std::initializer_list<Entry> entries);

  /// Sets `name`'s device: replaces in place when present, else appends.
  void set(const std::string& name, MapDevice device);
  /// Removes `name`; false when it was absent.
  bool erase(const std::string& name);
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  std::optional<MapDevice> find(const std::string& name) const;
  /// The device of `name`; NotFoundError naming it (and close keys) otherwise.
  MapDevice at(const std::string& name) const;
  /// The device of a module or tensor: the entry for `name` or for its
  /// closest dotted ancestor ("" included); nullopt when none covers it.
  std::optional<MapDevice> device_of(const std::string& name) const;

  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  const std::vector<Entry>& entries() const { return entries_; }
  std::vector<Entry>::const_iterator begin() const { return entries_.begin(); }
  std::vector<Entry>::const_iterator end() const { return entries_.end(); }
  std::vector<std::string> keys() const;
  /// Distinct devices in first-use order.
  std::vector<MapDevice> devices() const;

  /// hf_device_map JSON; indent < 0 gives one line.
  std::string to_json(int indent = -1) const;
  /// Parses hf_device_map JSON. Bad JSON or a non-object gives
  /// FileFormatError, an unknown device or a non-device value DeviceMapError;
  /// both name `source` (a file name) and, where it applies, the key.
  static DeviceMap from_json(const std::string& text, const std::string& source = "device map");
  /// Reads a JSON file (IOError when it cannot be read).
  static DeviceMap load(const std::string& path);
  /// Writes JSON to `path` through a temporary file and a rename.
  void save(const std::string& path, int indent = 2) const;

  /// The same mapping; key order is ignored (Accelerate's clean_device_map
  /// iterates a set, so order carries no meaning).
  bool operator==(const DeviceMap& o) const;
  bool operator!=(const DeviceMap& o) const { return !(*this == o); }

 private:
  void reindex();
  std::vector<Entry> entries_;
  std::unordered_map<std::string, size_t> index_;
};

std::ostream& operator<<(std::ostream& os, const DeviceMap& map);

/// Accelerate's clean_device_map: wherever every key under a prefix maps to
/// the same device and there is more than one such key, they collapse into the
/// prefix, recursively from "" down. {a.x:0, a.y:0, b:1} -> {a:0, b:1}.
/// A collapsed prefix takes the position of its first key (upstream appends
/// it; the mapping is the same).
DeviceMap clean_device_map(DeviceMap map);

/// Accelerate's check_device_map: every state-dict key of `module`
/// (parameters and persistent buffers) must be covered by a key equal to it or
/// an ancestor of it (or ""). Otherwise DeviceMapError listing the uncovered
/// keys. Keys that name no module or tensor only warn (on stderr).
void check_device_map(const torch::nn::Module& module, const DeviceMap& map);

/// State-dict key names of `module`: parameters and persistent buffers, in
/// PyTorch's order, tied tensors under every name.
std::vector<std::string> state_dict_keys(const torch::nn::Module& module);

}  // namespace flex
