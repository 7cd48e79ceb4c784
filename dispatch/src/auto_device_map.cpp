// infer_auto_device_map, following Accelerate 1.2.1's utils/modeling.py step
// for step (the step numbers refer to the outline in the reference notes).
#include <flex/dispatch/auto_device_map.h>
#include <flex/dispatch/tied_parameters.h>
#include <flex/hooks/errors.h>

#include <algorithm>
#include <deque>
#include <iostream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

namespace flex {

namespace {

using Queue = std::deque<NamedMember>;

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

/// `k` is `name` or lies below it (Accelerate: `name + "." in k + "."`).
bool inside(const std::string& k, const std::string& name) { return starts_with(k + ".", name + "."); }

std::string bytes_str(double v) {
  std::ostringstream os;
  if (v == static_cast<double>(static_cast<int64_t>(v)))
    os << static_cast<int64_t>(v);
  else
    os << v;
  return os.str();
}

class Planner {
 public:
  Planner(const torch::nn::Module& root, const InferDeviceMapOptions& o)
      : o_(o), log_(o.log ? *o.log : std::cerr), no_split_(o.no_split_module_classes) {
    max_memory_ = get_max_memory(o.max_memory);
    for (const auto& e : max_memory_.entries()) devices_.push_back(e.first);
    if (!max_memory_.contains(MapDevice::disk())) devices_.push_back(MapDevice::disk());
    for (const auto& d : devices_)
      if (d.is_gpu()) gpus_.push_back(d);
    if (!gpus_.empty()) main_devices_.push_back(gpus_.front());
    main_devices_.push_back(MapDevice::cpu());
    sizes_ = compute_module_sizes(root, o.dtype, o.special_dtypes);
    tied_ = find_tied_parameters(root);
    for (auto& m : direct_members(root, "", /*with_buffers=*/true))
      if (!skipped(m)) queue_.push_back(std::move(m));
  }

  DeviceMap run();

 private:
  struct Ties {
    double size_with_ties = 0;
    std::vector<std::string> names;  // queued modules holding the tied params, once each
    std::vector<NamedMember> members;
  };

  bool skipped(const NamedMember& m) const { return m.is_module() && o_.skip_module && o_.skip_module(m.name); }
  bool is_main(const MapDevice& d) const {
    return std::find(main_devices_.begin(), main_devices_.end(), d) != main_devices_.end();
  }
  bool splittable(const NamedMember& m) const {
    return m.is_module() && !m.module->named_children().is_empty() &&
           std::find(no_split_.begin(), no_split_.end(), module_class_name(*m.module)) == no_split_.end();
  }
  /// Own parameters then children (no buffers, as upstream when splitting).
  std::vector<NamedMember> split(const NamedMember& m) const {
    std::vector<NamedMember> out;
    for (auto& c : direct_members(*m.module, m.name, /*with_buffers=*/false))
      if (!skipped(c)) out.push_back(std::move(c));
    return out;
  }
  void recompute_max_layer() {
    std::vector<NamedMember> mods;
    for (const auto& m : queue_)
      if (m.is_module()) mods.push_back(m);
    max_layer_ = get_max_layer_size(mods, sizes_, no_split_);
    max_names_ = std::set<std::string>(max_layer_.names.begin(), max_layer_.names.end());
  }
  /// Tied parameters outside `name` whose group has a member inside it.
  std::vector<std::string> outside_ties(const std::string& name) const {
    std::vector<std::string> out;
    for (const auto& group : tied_) {
      bool any_in = false, all_in = true;
      for (const auto& k : group) {
        const bool in = inside(k, name);
        any_in = any_in || in;
        all_in = all_in && in;
      }
      if (!any_in || all_in) continue;
      for (const auto& k : group)
        if (!inside(k, name)) out.push_back(k);
    }
    return out;
  }
  /// Accelerate's get_module_size_with_ties against `queue`. A tied parameter
  /// whose module is no longer queued (already placed) adds nothing; a module
  /// holding several tied parameters is counted once.
  Ties with_ties(const std::vector<std::string>& tied_params, double module_size, const Queue& queue) const {
    Ties t;
    t.size_with_ties = module_size;
    for (const auto& p : tied_params) {
      auto it = std::find_if(queue.begin(), queue.end(), [&](const NamedMember& m) { return inside(p, m.name); });
      if (it == queue.end()) continue;
      if (std::find(t.names.begin(), t.names.end(), it->name) == t.names.end()) {
        t.names.push_back(it->name);
        t.members.push_back(*it);
        t.size_with_ties += sizes_[it->name];
      }
      t.size_with_ties -= sizes_[p];
    }
    return t;
  }
  static size_t index_of(const Queue& q, const std::string& name) {
    for (size_t i = 0; i < q.size(); ++i)
      if (q[i].name == name) return i;
    return q.size();
  }
  /// Accelerate 1.2's fallback_allocate: breadth-first over the queue for the
  /// first (possibly nested) module that fits `limit`; its queued ancestors are
  /// split so that it becomes a queue entry, which is removed and returned.
  bool fallback_allocate(double limit, NamedMember& found) {
    Queue search = queue_;
    bool ok = false;
    while (!search.empty()) {
      NamedMember m = std::move(search.front());
      search.pop_front();
      const Ties t = with_ties(outside_ties(m.name), sizes_[m.name], search);
      if (t.size_with_ties <= limit) {
        found = std::move(m);
        ok = true;
        break;
      }
      if (!splittable(m)) continue;
      auto children = split(m);
      search.insert(search.begin(), children.begin(), children.end());
    }
    if (!ok) return false;
    for (size_t dot = found.name.find('.'); dot != std::string::npos; dot = found.name.find('.', dot + 1)) {
      const size_t idx = index_of(queue_, found.name.substr(0, dot));
      if (idx == queue_.size() || !queue_[idx].is_module()) continue;
      auto children = split(queue_[idx]);
      queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(idx));
      queue_.insert(queue_.begin() + static_cast<std::ptrdiff_t>(idx), children.begin(), children.end());
    }
    const size_t idx = index_of(queue_, found.name);
    if (idx == queue_.size()) return false;
    found = queue_[idx];
    queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(idx));
    return true;
  }

  const InferDeviceMapOptions& o_;
  std::ostream& log_;
  std::vector<std::string> no_split_;
  MaxMemory max_memory_;
  std::vector<MapDevice> devices_, gpus_, main_devices_;
  ModuleSizes sizes_;
  std::vector<std::vector<std::string>> tied_;
  Queue queue_;
  MaxLayer max_layer_;
  std::set<std::string> max_names_;  // max-size layers not yet taken ('/' follows '.' in ASCII)
};

DeviceMap Planner::run() {
  DeviceMap map;
  size_t current = 0;
  std::map<MapDevice, double> used;
  for (const auto& d : devices_) used[d] = 0;
  std::map<MapDevice, double> buffer_sizes;
  std::vector<std::pair<MapDevice, double>> minimum_assignment;
  recompute_max_layer();

  while (!queue_.empty()) {
    NamedMember member = std::move(queue_.front());
    queue_.pop_front();
    const std::string name = member.name;
    if (o_.verbose) log_ << "\nTreating module " << name << ".\n";

    // 2. The largest remaining layer changes once every layer of that size is taken.
    //    (names kept sorted: `name` and everything below it form one range)
    max_names_.erase(name);
    max_names_.erase(max_names_.lower_bound(name + "."), max_names_.lower_bound(name + "/"));
    if (max_names_.empty()) recompute_max_layer();

    const double module_size = sizes_[name];
    const std::vector<std::string> tied_params = outside_ties(name);
    if (o_.verbose && !tied_params.empty()) {
      log_ << "  Tied parameters outside it:";
      for (const auto& p : tied_params) log_ << " " << p;
      log_ << "\n";
    }

    const MapDevice device = devices_.at(current);
    const bool limited = !device.is_disk();
    double cap = limited ? max_memory_.at(device) : std::numeric_limits<double>::infinity();
    double reserved = 0;
    if (is_main(device)) {  // room for the largest layer, kept back unconditionally
      cap -= max_layer_.size;
      reserved = max_layer_.size;
    }
    const Ties ties = with_ties(tied_params, module_size, queue_);
    double& used_here = used[device];

    // 3. It fits, with its tied modules.
    if (!limited || used_here + ties.size_with_ties <= cap) {
      if (o_.verbose) {
        log_ << "Putting " << name;
        if (!ties.names.empty()) {
          log_ << " and";
          for (const auto& n : ties.names) log_ << " " << n;
        } else {
          log_ << " (size=" << bytes_str(module_size) << ")";
        }
        if (limited) log_ << " (available=" << bytes_str(cap - used_here) << ")";
        log_ << " on " << device.str() << ".\n";
      }
      used_here += ties.size_with_ties;
      map.set(name, device);
      for (const auto& tn : ties.names) {
        const size_t idx = index_of(queue_, tn);
        if (idx < queue_.size()) queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(idx));
        map.set(tn, device);
      }
      if (!o_.offload_buffers && member.is_module())
        buffer_sizes[device] += compute_module_total_buffer_size(*member.module, o_.dtype, o_.special_dtypes);
      continue;
    }

    // 4. It fits alone: split one of its tied modules and retry.
    if (!tied_params.empty() && used_here + module_size <= cap) {
      if (o_.verbose)
        log_ << "Not enough space on " << device.str() << " to put " << name << " and its tied modules (available "
             << bytes_str(cap - used_here) << ", needed " << bytes_str(ties.size_with_ties) << ").\n";
      bool split_done = false;
      for (const auto& tm : ties.members) {
        if (!splittable(tm)) continue;
        if (o_.verbose) log_ << "Splitting " << tm.name << ".\n";
        auto children = split(tm);
        const size_t idx = index_of(queue_, tm.name);
        queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(idx));
        queue_.insert(queue_.begin() + static_cast<std::ptrdiff_t>(idx), children.begin(), children.end());
        queue_.push_front(member);
        recompute_max_layer();
        split_done = true;
        break;
      }
      if (split_done) continue;
      if (o_.verbose) log_ << "None of the tied modules can be split, going to the next device.\n";
    }

    // 5. It does not fit: split it when allowed.
    if (used_here + module_size >= cap) {
      if (o_.verbose)
        log_ << "Not enough space on " << device.str() << " to put " << name << " (available "
             << bytes_str(cap - used_here) << ", module size " << bytes_str(module_size) << ").\n";
      if (splittable(member)) {
        if (o_.verbose) log_ << "Splitting " << name << ".\n";
        auto children = split(member);
        queue_.insert(queue_.begin(), children.begin(), children.end());
        recompute_max_layer();
        continue;
      }
      if (o_.verbose) log_ << "This module cannot be split, going to the next device.\n";
    }

    // 6. Nothing placed here yet: try a smaller module further down the queue.
    //    Upstream passes a float limit to convert_file_size_to_int here and
    //    raises for models with fractional sizes; a number is a number here.
    if (o_.fallback_allocation && used_here == 0 && !device.is_disk()) {
      const double limit = max_memory_.at(device) - std::max(max_layer_.size, ties.size_with_ties);
      NamedMember found;
      if (fallback_allocate(limit, found)) {
        if (o_.verbose) log_ << "Fallback: trying " << found.name << " on " << device.str() << ".\n";
        queue_.push_front(member);
        queue_.push_front(std::move(found));
        continue;
      }
    }

    // 7. Next device.
    if (used_here == 0) minimum_assignment.emplace_back(device, ties.size_with_ties + reserved);
    used_here += reserved;
    ++current;
    queue_.push_front(std::move(member));
  }

  if (o_.clean_result) map = clean_device_map(std::move(map));

  // 8. Buffers of modules on cpu/disk stay with the GPU execution unless offloaded.
  const double non_gpu_buffers = buffer_sizes[MapDevice::cpu()] + buffer_sizes[MapDevice::disk()];
  if (non_gpu_buffers > 0 && !o_.offload_buffers && !gpus_.empty()) {
    bool fits = false;
    for (const auto& g : gpus_) fits = fits || max_memory_.at(g) >= non_gpu_buffers + used[g];
    if (!fits)
      log_ << "flex warning: the model needs " << bytes_str(non_gpu_buffers)
           << " bytes of buffers for its offloaded layers, which does not fit the remaining memory of any GPU; "
              "if you run out of memory later, use offload_buffers=true\n";
  }
  if (o_.verbose && !minimum_assignment.empty()) {
    log_ << "No module could be assigned to these devices for lack of memory:\n";
    for (const auto& [d, need] : minimum_assignment)
      log_ << "  - " << d.str() << ": " << bytes_str(need) << " bytes required\n";
  }
  return map;
}

}  // namespace

DeviceMap infer_auto_device_map(const torch::nn::Module& module, const InferDeviceMapOptions& options) {
  return Planner(module, options).run();
}

}  // namespace flex
