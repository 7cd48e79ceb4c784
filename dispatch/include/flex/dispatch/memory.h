#pragma once
// Memory budgets: how many bytes each device may hold (Accelerate's
// max_memory). Bytes are doubles because Accelerate's budgets can be floats
// (get_balanced_memory returns total // n + buffer with float sizes).
#include <flex/dispatch/device_map.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace flex {

/// Accelerate's convert_file_size_to_int: "5GB" = 5e9 (powers of 10),
/// "5GiB" = 5 * 2^30, "5Gb" = 5e9 / 8 (a lowercase final b means bits), same
/// for K and M; fractions allowed ("0.1MB" = 100000). Unlike Accelerate a bare
/// number ("1234") is accepted as bytes. Anything else, or a negative or
/// non-finite size, throws ConfigError naming the string.
int64_t convert_file_size_to_int(const std::string& size);

/// Bytes per device, in the order given (get_max_memory sorts it).
class MaxMemory {
 public:
  using Entry = std::pair<MapDevice, double>;

  MaxMemory() = default;
  MaxMemory(std::initializer_list<Entry> entries);

  /// Sets a budget; ConfigError for a negative or NaN size.
  void set(MapDevice device, double bytes);
  /// Parses a key ("0", "cuda:1", "cpu", "disk"; others, such as "mps", throw
  /// DeviceMapError as Accelerate's "Device mps is not recognized") and a size
  /// (convert_file_size_to_int).
  void set(const std::string& key, const std::string& size);

  bool contains(const MapDevice& device) const;
  std::optional<double> find(const MapDevice& device) const;
  /// The budget of `device`; DeviceMapError naming it when absent.
  double at(const MapDevice& device) const;
  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }
  const std::vector<Entry>& entries() const { return entries_; }
  /// GPU ordinals present, in entry order.
  std::vector<int> gpus() const;

  /// {"0": 1000, "cpu": "2GB"}: numbers are bytes, strings go through
  /// convert_file_size_to_int. Errors name `source` and the key.
  static MaxMemory from_json(const std::string& text, const std::string& source = "max_memory");
  std::string to_json() const;

  /// Same keys and sizes, order ignored.
  bool operator==(const MaxMemory& o) const;
  bool operator!=(const MaxMemory& o) const { return !(*this == o); }

 private:
  std::vector<Entry> entries_;
};

std::ostream& operator<<(std::ostream& os, const MaxMemory& m);

/// Accelerate's get_max_memory. With a budget: a copy ordered GPUs (sorted),
/// cpu, disk; GPU ordinals this process cannot see only warn (on stderr), as
/// upstream. Without: the free memory of every visible GPU and the available
/// RAM of this machine (MemAvailable of /proc/meminfo).
MaxMemory get_max_memory(const std::optional<MaxMemory>& max_memory = std::nullopt);

/// Available RAM in bytes (psutil's virtual_memory().available on Linux).
double available_cpu_memory();

/// Number of GPUs libtorch can use here (0 in a CPU-only libtorch).
int gpu_device_count();

/// Free bytes of every GPU libtorch sees (cudaMemGetInfo on each, through
/// libtorch's CUDA runtime); empty in a CPU build or without a device.
/// Initialises each device's context, as Accelerate's torch.cuda.mem_get_info does.
std::vector<std::pair<int, double>> gpu_free_memory();

}  // namespace flex
