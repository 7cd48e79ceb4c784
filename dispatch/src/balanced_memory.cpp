#include <flex/dispatch/balanced_memory.h>
#include <flex/hooks/errors.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <unordered_map>
#include <unordered_set>

namespace flex {

namespace {

void index_modules(const torch::nn::Module& m, const std::string& name,
                   std::unordered_map<std::string, const torch::nn::Module*>& out) {
  out.emplace(name, &m);
  for (const auto& c : m.named_children())
    index_modules(*c.value(), name.empty() ? c.key() : name + "." + c.key(), out);
}

/// Names of `items` that are no dotted proper prefix of another name ("" excluded).
std::unordered_set<std::string> leaves(const std::vector<std::pair<std::string, double>>& items) {
  std::unordered_set<std::string> parents;
  for (const auto& [name, size] : items)
    for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', dot + 1))
      parents.insert(name.substr(0, dot));
  std::unordered_set<std::string> out;
  for (const auto& [name, size] : items)
    if (!name.empty() && !parents.count(name)) out.insert(name);
  return out;
}

}  // namespace

MaxMemory get_balanced_memory(const torch::nn::Module& module, const std::optional<MaxMemory>& max_memory,
                              const std::vector<std::string>& no_split, std::optional<at::ScalarType> dtype,
                              const SpecialDtypes& special_dtypes, bool low_zero) {
  const bool user_not_set = !max_memory;
  MaxMemory mm = get_max_memory(max_memory);

  std::vector<int> gpus;  // sorted (get_max_memory orders them), budget > 0
  for (const auto& [d, bytes] : mm.entries())
    if (d.is_gpu() && bytes > 0) gpus.push_back(d.index());
  const size_t n = gpus.size();
  if (n == 0) return mm;
  if (n == 1) {
    low_zero = false;  // nothing to balance against
    if (user_not_set)
      for (const auto& [d, bytes] : mm.entries())
        if (d.is_gpu()) {
          mm.set(d, bytes * 0.9);  // headroom when the budget is the raw free memory
          break;
        }
  }

  const ModuleSizes sizes = compute_module_sizes(module, dtype, special_dtypes);
  const double total = sizes[""];
  double per_gpu = std::floor(total / static_cast<double>(low_zero ? n - 1 : n));

  // Margin: the first block of each no-split class, or the mean leaf module.
  double block = 0;
  if (!no_split.empty()) {
    std::unordered_map<std::string, const torch::nn::Module*> modules;
    index_modules(module, "", modules);
    const std::set<std::string> wanted(no_split.begin(), no_split.end());
    std::unordered_map<std::string, double> first_of_class;
    for (const auto& [name, size] : sizes.items()) {
      if (name.empty()) continue;
      auto it = modules.find(name);
      if (it == modules.end()) continue;  // a tensor
      const std::string cls = module_class_name(*it->second);
      if (wanted.count(cls) && !first_of_class.count(cls)) first_of_class.emplace(cls, size);
      if (first_of_class.size() == wanted.size()) break;
    }
    for (const auto& [cls, size] : first_of_class) block = std::max(block, size);
  }
  // Leaves of the size table are tensors; drop them, and the new leaves are the final modules.
  const auto tensor_leaves = leaves(sizes.items());
  std::vector<std::pair<std::string, double>> modules_only;
  for (const auto& item : sizes.items())
    if (!tensor_leaves.count(item.first)) modules_only.push_back(item);
  const auto final_modules = leaves(modules_only);
  double sum = 0;
  for (const auto& [name, size] : modules_only)
    if (final_modules.count(name)) sum += size;
  const double mean_leaves =
      std::trunc(sum / static_cast<double>(std::max<size_t>(final_modules.size(), 1)));
  per_gpu += std::trunc(1.25 * std::max(block, mean_leaves));

  // Every GPU but the last gets at most per_gpu; the last keeps its budget.
  for (size_t i = 0; i + 1 < n; ++i) {
    const MapDevice d(gpus[i]);
    const double own = mm.at(d);
    const double target = (low_zero && gpus[i] == 0) ? mm.at(MapDevice(0)) : per_gpu;
    mm.set(d, std::min(target, own));
  }
  if (low_zero && mm.contains(MapDevice(0))) {
    // GPU 0 only holds what GPUs 1 .. n-1 cannot.
    double others = 0;
    for (size_t i = 1; i < n; ++i) others += mm.find(MapDevice(static_cast<int>(i))).value_or(0.0);
    mm.set(MapDevice(0), std::min(std::max(0.0, total - others), mm.at(MapDevice(0))));
  }
  return mm;
}

DeviceMap resolve_device_map(const torch::nn::Module& module, const std::string& strategy,
                             const InferDeviceMapOptions& options) {
  if (strategy == "auto" || strategy == "balanced" || strategy == "balanced_low_0") {
    InferDeviceMapOptions o = options;
    o.max_memory = get_balanced_memory(module, options.max_memory, options.no_split_module_classes, options.dtype,
                                       options.special_dtypes, strategy == "balanced_low_0");
    return infer_auto_device_map(module, o);
  }
  if (strategy == "sequential") return infer_auto_device_map(module, options);
  try {
    return DeviceMap{{"", MapDevice(strategy)}};
  } catch (const DeviceMapError&) {
    throw ConfigError("device map '" + strategy +
                      "' is not supported: use \"auto\", \"balanced\", \"balanced_low_0\", \"sequential\", "
                      "a device (\"cpu\", \"disk\", \"0\", \"cuda:1\") or an explicit map");
  }
}

}  // namespace flex
