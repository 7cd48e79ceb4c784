#include <flex/dispatch/atomic_file.h>
#include <flex/dispatch/device_map.h>
#include <flex/dispatch/module_sizes.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/module.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <iostream>
#include <set>
#include <sstream>
#include <unordered_set>

namespace flex {

namespace {

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}

int parse_ordinal(const std::string& digits, const std::string& whole) {
  if (digits.size() > 6) throw DeviceMapError("GPU ordinal out of range in device '" + whole + "'");
  return std::stoi(digits);
}

}  // namespace

MapDevice::MapDevice(int gpu_index) : kind_(Kind::kGpu), index_(gpu_index) {
  if (gpu_index < 0)
    throw DeviceMapError("invalid GPU ordinal " + std::to_string(gpu_index) + ": ordinals are >= 0");
}

MapDevice::MapDevice(const char* name) : MapDevice(std::string(name ? name : "")) {}

MapDevice::MapDevice(const std::string& name) {
  if (name == "cpu") return;
  if (name == "disk") {
    kind_ = Kind::kDisk;
    return;
  }
  std::string digits;
  if (all_digits(name)) {
    digits = name;
  } else if (name == "cuda") {
    digits = "0";
  } else if (name.rfind("cuda:", 0) == 0 && all_digits(name.substr(5))) {
    digits = name.substr(5);
  } else {
    throw DeviceMapError("device '" + name +
                         "' is not recognized; devices are GPU ordinals (0, 1, ... or \"cuda:1\"), "
                         "\"cpu\" and \"disk\"");
  }
  kind_ = Kind::kGpu;
  index_ = parse_ordinal(digits, name);
}

MapDevice MapDevice::disk() { return MapDevice("disk"); }

std::string MapDevice::str() const {
  switch (kind_) {
    case Kind::kGpu:
      return std::to_string(index_);
    case Kind::kCpu:
      return "cpu";
    case Kind::kDisk:
      return "disk";
  }
  return "cpu";
}

c10::Device MapDevice::torch_device() const {
  if (is_gpu()) return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index_));
  if (is_cpu()) return c10::Device(c10::DeviceType::CPU);
  throw UnsupportedError("device \"disk\" has no torch device: disk-offloaded modules run on the main device");
}

bool MapDevice::operator<(const MapDevice& o) const {
  if (kind_ != o.kind_) return static_cast<int>(kind_) < static_cast<int>(o.kind_);
  return index_ < o.index_;
}

std::ostream& operator<<(std::ostream& os, const MapDevice& d) {
  if (d.is_gpu()) return os << d.index();
  return os << '"' << d.str() << '"';
}

// --- DeviceMap -------------------------------------------------------------

DeviceMap::DeviceMap(std::initializer_list<Entry> entries) {
  for (const auto& e : entries) set(e.first, e.second);
}

void DeviceMap::set(const std::string& name, MapDevice device) {
  auto it = index_.find(name);
  if (it != index_.end()) {
    entries_[it->second].second = device;
    return;
  }
  index_.emplace(name, entries_.size());
  entries_.emplace_back(name, device);
}

bool DeviceMap::erase(const std::string& name) {
  auto it = index_.find(name);
  if (it == index_.end()) return false;
  entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(it->second));
  reindex();
  return true;
}

void DeviceMap::reindex() {
  index_.clear();
  for (size_t i = 0; i < entries_.size(); ++i) index_.emplace(entries_[i].first, i);
}

std::optional<MapDevice> DeviceMap::find(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return std::nullopt;
  return entries_[it->second].second;
}

MapDevice DeviceMap::at(const std::string& name) const {
  if (auto d = find(name)) return *d;
  std::string msg = "device map has no entry for '" + name + "'";
  auto close = closest_names(name, keys());
  if (!close.empty()) {
    msg += "; closest: ";
    for (size_t i = 0; i < close.size(); ++i) msg += (i ? ", '" : "'") + close[i] + "'";
  }
  throw NotFoundError(msg);
}

std::optional<MapDevice> DeviceMap::device_of(const std::string& name) const {
  std::string cur = name;
  while (true) {
    if (auto d = find(cur)) return d;
    if (cur.empty()) return std::nullopt;
    size_t dot = cur.rfind('.');
    cur = dot == std::string::npos ? std::string() : cur.substr(0, dot);
  }
}

std::vector<std::string> DeviceMap::keys() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& e : entries_) out.push_back(e.first);
  return out;
}

std::vector<MapDevice> DeviceMap::devices() const {
  std::vector<MapDevice> out;
  for (const auto& e : entries_)
    if (std::find(out.begin(), out.end(), e.second) == out.end()) out.push_back(e.second);
  return out;
}

std::string DeviceMap::to_json(int indent) const {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& e : entries_) {
    if (e.second.is_gpu())
      j[e.first] = e.second.index();
    else
      j[e.first] = e.second.str();
  }
  return j.dump(indent);
}

DeviceMap DeviceMap::from_json(const std::string& text, const std::string& source) {
  nlohmann::ordered_json j;
  // The parser keeps one value per key; a key given twice is noticed here.
  std::unordered_set<std::string> top_keys;
  std::string duplicate;
  auto watch = [&](int depth, nlohmann::ordered_json::parse_event_t event, nlohmann::ordered_json& parsed) {
    if (depth == 1 && event == nlohmann::ordered_json::parse_event_t::key && parsed.is_string() &&
        !top_keys.insert(parsed.get<std::string>()).second && duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  try {
    j = nlohmann::ordered_json::parse(text, watch);
  } catch (const nlohmann::json::exception& e) {
    throw FileFormatError(source + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object())
    throw FileFormatError(source + ": a device map must be a JSON object {\"module\": device}, got " +
                          std::string(j.type_name()));
  if (!duplicate.empty()) throw DeviceMapError(source + ": key '" + duplicate + "' appears twice");
  DeviceMap map;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    const auto& v = it.value();
    try {
      if (v.is_number_integer()) {
        const int64_t i = v.get<int64_t>();
        if (i < 0 || i > 1000000) throw DeviceMapError("GPU ordinal " + std::to_string(i) + " is out of range");
        map.set(key, MapDevice(static_cast<int>(i)));
      } else if (v.is_string()) {
        map.set(key, MapDevice(v.get<std::string>()));
      } else {
        throw DeviceMapError("expected a GPU ordinal, \"cpu\" or \"disk\", got " + v.dump());
      }
    } catch (const DeviceMapError& e) {
      throw DeviceMapError(source + ": key '" + key + "': " + e.what());
    }
  }
  return map;
}

DeviceMap DeviceMap::load(const std::string& path) { return from_json(read_file(path), path); }

void DeviceMap::save(const std::string& path, int indent) const { write_file_atomic(path, to_json(indent) + "\n"); }

bool DeviceMap::operator==(const DeviceMap& o) const {
  if (size() != o.size()) return false;
  for (const auto& e : entries_) {
    auto d = o.find(e.first);
    if (!d || *d != e.second) return false;
  }
  return true;
}

std::ostream& operator<<(std::ostream& os, const DeviceMap& map) { return os << map.to_json(); }

// --- clean / check -----------------------------------------------------------

namespace {

bool has_prefix(const std::string& key, const std::string& prefix) {
  return prefix.empty() || key.compare(0, prefix.size(), prefix) == 0;
}

// One pass per tree level over the keys below `module_name` (not over the
// whole map, as upstream does), so cleaning is O(keys x depth).
struct Cleaner {
  const std::vector<DeviceMap::Entry>& entries;
  std::vector<bool> removed;
  std::vector<std::pair<size_t, DeviceMap::Entry>> collapsed;  // (position, entry)
  std::unordered_map<std::string, size_t> position;

  void run(const std::vector<size_t>& group, const std::string& module_name, size_t depth) {
    const std::string prefix = module_name.empty() ? "" : module_name + ".";
    std::vector<size_t> below;
    for (size_t i : group)
      if (has_prefix(entries[i].first, prefix)) below.push_back(i);
    if (below.size() > 1) {
      const MapDevice first = entries[below[0]].second;
      bool same = true;
      for (size_t i : below) same = same && entries[i].second == first;
      if (same) {
        for (size_t i : below) removed[i] = true;
        auto own = position.find(module_name);  // superseded by the collapsed entry
        if (own != position.end()) removed[own->second] = true;
        collapsed.emplace_back(below[0], DeviceMap::Entry(module_name, first));
        return;
      }
    }
    // Group by child: the first depth + 1 dotted components of each key.
    std::vector<std::string> order;
    std::unordered_map<std::string, std::vector<size_t>> children;
    for (size_t i : below) {
      const std::string& key = entries[i].first;
      size_t pos = 0;
      for (size_t d = 0; d <= depth && pos != std::string::npos; ++d) pos = key.find('.', d == 0 ? 0 : pos + 1);
      std::string child = pos == std::string::npos ? key : key.substr(0, pos);
      auto& members = children[child];
      if (members.empty()) order.push_back(child);
      members.push_back(i);
    }
    // A key equal to this module (e.g. "" next to other keys) is a leaf: recursing
    // on it would never end.
    for (const auto& child : order)
      if (child != module_name) run(children[child], child, depth + 1);
  }
};

}  // namespace

DeviceMap clean_device_map(DeviceMap map) {
  const auto& entries = map.entries();
  Cleaner c{entries, std::vector<bool>(entries.size(), false), {}, {}};
  std::vector<size_t> all(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    all[i] = i;
    c.position.emplace(entries[i].first, i);
  }
  c.run(all, "", 0);
  std::unordered_map<size_t, DeviceMap::Entry> at_position(c.collapsed.begin(), c.collapsed.end());
  DeviceMap out;
  for (size_t i = 0; i < entries.size(); ++i) {
    auto col = at_position.find(i);
    if (col != at_position.end()) out.set(col->second.first, col->second.second);
    if (!c.removed[i]) out.set(entries[i].first, entries[i].second);
  }
  return out;
}

namespace {

void collect_state_keys(const torch::nn::Module& m, const std::string& prefix, std::vector<std::string>& out) {
  const auto* fm = dynamic_cast<const Module*>(&m);
  for (const auto& p : m.named_parameters(false))
    if (p.value().defined()) out.push_back(prefix + p.key());
  for (const auto& b : m.named_buffers(false))
    if (b.value().defined() && (!fm || fm->is_persistent_buffer(b.key()))) out.push_back(prefix + b.key());
  for (const auto& c : m.named_children()) collect_state_keys(*c.value(), prefix + c.key() + ".", out);
}

void collect_all_names(const torch::nn::Module& m, const std::string& name, std::unordered_set<std::string>& out) {
  out.insert(name);
  const std::string prefix = name.empty() ? "" : name + ".";
  for (const auto& p : m.named_parameters(false)) out.insert(prefix + p.key());
  for (const auto& b : m.named_buffers(false)) out.insert(prefix + b.key());
  for (const auto& c : m.named_children()) collect_all_names(*c.value(), prefix + c.key(), out);
}

}  // namespace

std::vector<std::string> state_dict_keys(const torch::nn::Module& module) {
  std::vector<std::string> out;
  collect_state_keys(module, "", out);
  return out;
}

void check_device_map(const torch::nn::Module& module, const DeviceMap& map) {
  if (map.contains("")) return;  // the whole model has a device
  std::unordered_set<std::string> names;
  collect_all_names(module, "", names);
  for (const auto& e : map)
    if (!names.count(e.first))
      std::cerr << "flex warning: device map key '" << e.first << "' is not a module or tensor of "
                << module_class_name(module) << "\n";
  std::vector<std::string> missing;
  for (const auto& key : state_dict_keys(module))
    if (!map.device_of(key)) missing.push_back(key);
  if (missing.empty()) return;
  std::string list;
  const size_t shown = std::min<size_t>(missing.size(), 50);
  for (size_t i = 0; i < shown; ++i) list += (i ? ", " : "") + missing[i];
  if (missing.size() > shown) list += ", ... (" + std::to_string(missing.size() - shown) + " more)";
  throw DeviceMapError("the device map gives no device for " + std::to_string(missing.size()) +
                       " parameter(s)/buffer(s): " + list);
}

}  // namespace flex
