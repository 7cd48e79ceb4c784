#include <flex/dispatch/memory.h>
#include <flex/hooks/errors.h>

#include <ATen/Context.h>
#include <nlohmann/json.hpp>

#ifdef FLEX_TORCH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <mutex>
#include <set>
#include <sstream>

namespace flex {

namespace {

bool ends_with_ci(const std::string& s, const std::string& suffix) {
  if (s.size() < suffix.size()) return false;
  for (size_t i = 0; i < suffix.size(); ++i)
    if (std::toupper(static_cast<unsigned char>(s[s.size() - suffix.size() + i])) != suffix[i]) return false;
  return true;
}

[[noreturn]] void bad_size(const std::string& size) {
  throw ConfigError("size '" + size +
                    "' is not in a valid format: use a number of bytes or a number with a unit, "
                    "like \"5GB\", \"5GiB\" or \"5Gb\" (bits)");
}

// The whole string as a finite number (Python's float()); surrounding spaces allowed.
double parse_number(const std::string& digits, const std::string& whole) {
  size_t b = 0, e = digits.size();
  while (b < e && std::isspace(static_cast<unsigned char>(digits[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(digits[e - 1]))) --e;
  const std::string s = digits.substr(b, e - b);
  if (s.empty() || s.find_first_of("xXpP") != std::string::npos) bad_size(whole);  // no hex floats
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(v)) bad_size(whole);
  return v;
}

int64_t to_bytes(double v, const std::string& whole) {
  if (v < 0 || v >= 9.2e18) bad_size(whole);
  return static_cast<int64_t>(v);  // int() truncates, as upstream
}

}  // namespace

int64_t convert_file_size_to_int(const std::string& size) {
  struct Unit {
    const char* suffix;
    double factor;
    bool decimal;  // GB/MB/KB: a lowercase final 'b' means bits
  };
  static const Unit units[] = {
      {"GIB", 1073741824.0, false}, {"MIB", 1048576.0, false}, {"KIB", 1024.0, false},
      {"GB", 1e9, true},            {"MB", 1e6, true},         {"KB", 1e3, true},
  };
  for (const auto& u : units) {
    const std::string suffix = u.suffix;
    if (!ends_with_ci(size, suffix)) continue;
    const double v = parse_number(size.substr(0, size.size() - suffix.size()), size);
    int64_t bytes = to_bytes(v * u.factor, size);
    if (u.decimal && size.back() == 'b') bytes /= 8;
    return bytes;
  }
  return to_bytes(parse_number(size, size), size);
}

// --- MaxMemory ---------------------------------------------------------------

MaxMemory::MaxMemory(std::initializer_list<Entry> entries) {
  for (const auto& e : entries) set(e.first, e.second);
}

void MaxMemory::set(MapDevice device, double bytes) {
  if (std::isnan(bytes) || bytes < 0)
    throw ConfigError("memory budget for device " + device.str() + " must be >= 0 bytes, got " +
                      std::to_string(bytes));
  for (auto& e : entries_)
    if (e.first == device) {
      e.second = bytes;
      return;
    }
  entries_.emplace_back(device, bytes);
}

namespace {
MapDevice budget_key(const std::string& key) {
  try {
    return MapDevice(key);
  } catch (const DeviceMapError&) {
    throw DeviceMapError("max_memory: device '" + key +
                         "' is not recognized; available devices are integers (GPUs), 'cpu' and 'disk'");
  }
}
}  // namespace

void MaxMemory::set(const std::string& key, const std::string& size) {
  set(budget_key(key), static_cast<double>(convert_file_size_to_int(size)));
}

bool MaxMemory::contains(const MapDevice& device) const { return find(device).has_value(); }

std::optional<double> MaxMemory::find(const MapDevice& device) const {
  for (const auto& e : entries_)
    if (e.first == device) return e.second;
  return std::nullopt;
}

double MaxMemory::at(const MapDevice& device) const {
  if (auto v = find(device)) return *v;
  throw DeviceMapError("max_memory has no budget for device " + device.str());
}

std::vector<int> MaxMemory::gpus() const {
  std::vector<int> out;
  for (const auto& e : entries_)
    if (e.first.is_gpu()) out.push_back(e.first.index());
  return out;
}

MaxMemory MaxMemory::from_json(const std::string& text, const std::string& source) {
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw FileFormatError(source + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw FileFormatError(source + ": max_memory must be a JSON object {\"device\": size}");
  MaxMemory out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const auto& v = it.value();
    try {
      if (v.is_string()) {
        out.set(it.key(), v.get<std::string>());
      } else if (v.is_number()) {
        out.set(budget_key(it.key()), v.get<double>());
      } else {
        throw ConfigError("expected a number of bytes or a size string, got " + v.dump());
      }
    } catch (const DeviceMapError& e) {
      throw DeviceMapError(source + ": " + e.what());
    } catch (const ConfigError& e) {
      throw ConfigError(source + ": key '" + it.key() + "': " + e.what());
    }
  }
  return out;
}

std::string MaxMemory::to_json() const {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& e : entries_) {
    const double v = e.second;
    if (v == std::floor(v) && v < 9e15)
      j[e.first.str()] = static_cast<int64_t>(v);
    else
      j[e.first.str()] = v;
  }
  return j.dump();
}

bool MaxMemory::operator==(const MaxMemory& o) const {
  if (size() != o.size()) return false;
  for (const auto& e : entries_) {
    auto v = o.find(e.first);
    if (!v || *v != e.second) return false;
  }
  return true;
}

std::ostream& operator<<(std::ostream& os, const MaxMemory& m) { return os << m.to_json(); }

// --- what this machine has -------------------------------------------------------

double available_cpu_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  while (in >> key) {
    if (key == "MemAvailable:") {
      double kib = 0;
      in >> kib;
      return kib * 1024.0;
    }
    std::string rest;
    std::getline(in, rest);
  }
  // No /proc (or an old kernel): free pages.
  const long pages = sysconf(_SC_AVPHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
}

std::vector<std::pair<int, double>> gpu_free_memory() {
  std::vector<std::pair<int, double>> out;
#ifdef FLEX_TORCH_CUDA
  // libtorch's own CUDA runtime, on the context libtorch uses (the first GPU
  // run segfaulted in planning from Python while a second copy of the driver,
  // loaded by hand, was queried beside PyTorch's).
  if (!at::hasCUDA()) return out;
  const int n = static_cast<int>(c10::cuda::device_count());
  for (int i = 0; i < n; ++i) {
    c10::cuda::CUDAGuard on(static_cast<c10::DeviceIndex>(i));
    size_t free_bytes = 0, total = 0;
    if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
      cudaGetLastError();  // clear it: the next device is asked afresh
      std::cerr << "flex warning: GPU " << i << " seems unavailable; skipping it\n";
      continue;
    }
    out.emplace_back(i, static_cast<double>(free_bytes));
  }
#endif
  return out;  // a CPU build of libtorch has no GPU to plan for
}

int gpu_device_count() {
#ifdef FLEX_TORCH_CUDA
  return at::hasCUDA() ? static_cast<int>(c10::cuda::device_count()) : 0;
#else
  return 0;
#endif
}

MaxMemory get_max_memory(const std::optional<MaxMemory>& max_memory) {
  if (!max_memory) {
    MaxMemory out;
    if (at::hasCUDA())
      for (const auto& [i, free_bytes] : gpu_free_memory()) out.set(MapDevice(i), free_bytes);
    out.set(MapDevice::cpu(), available_cpu_memory());
    return out;
  }
  std::vector<MaxMemory::Entry> entries = max_memory->entries();
  std::stable_sort(entries.begin(), entries.end(),
                   [](const MaxMemory::Entry& a, const MaxMemory::Entry& b) { return a.first < b.first; });
  const int visible = gpu_device_count();
  static std::mutex warned_mutex;
  static std::set<int> warned;  // once per ordinal: planning code calls this often
  std::lock_guard<std::mutex> lock(warned_mutex);
  MaxMemory out;
  for (const auto& e : entries) {
    if (e.first.is_gpu() && e.first.index() >= visible && warned.insert(e.first.index()).second)
      std::cerr << "flex warning: device " << e.first.index() << " is not available, available GPUs: " << visible
                << " (the budget is still used for planning)\n";
    out.set(e.first, e.second);
  }
  return out;
}

}  // namespace flex
