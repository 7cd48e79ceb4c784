#include <flex/dispatch/tied_parameters.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/module.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <iostream>
#include <unordered_map>

namespace flex {

namespace {

// named_parameters(remove_duplicate=False): every module under every name.
void all_parameters(const torch::nn::Module& m, const std::string& prefix,
                    std::vector<std::pair<std::string, const c10::TensorImpl*>>& out) {
  for (const auto& p : m.named_parameters(false))
    if (p.value().defined()) out.emplace_back(prefix + p.key(), p.value().unsafeGetTensorImpl());
  for (const auto& c : m.named_children()) all_parameters(*c.value(), prefix + c.key() + ".", out);
}

}  // namespace

std::vector<std::vector<std::string>> find_tied_parameters(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, const c10::TensorImpl*>> params;
  all_parameters(module, "", params);
  std::unordered_map<const c10::TensorImpl*, size_t> group_of;
  std::vector<std::vector<std::string>> groups;
  for (const auto& [name, impl] : params) {
    auto it = group_of.find(impl);
    if (it == group_of.end()) {
      group_of.emplace(impl, groups.size());
      groups.push_back({name});
    } else {
      groups[it->second].push_back(name);
    }
  }
  std::vector<std::vector<std::string>> out;
  for (auto& g : groups) {
    if (g.size() < 2) continue;
    std::sort(g.begin(), g.end());
    g.erase(std::unique(g.begin(), g.end()), g.end());  // a module shared under one name twice
    if (g.size() > 1) out.push_back(std::move(g));
  }
  return out;
}

void retie_parameters(Module& module, const std::vector<std::vector<std::string>>& groups) {
  for (const auto& group : groups) {
    at::Tensor source;
    for (const auto& name : group) {
      at::Tensor t = get_module_tensor(module, name);
      if (!t.is_meta()) {
        source = t;
        break;
      }
    }
    if (!source.defined()) continue;
    for (const auto& name : group) {
      if (get_module_tensor(module, name).unsafeGetTensorImpl() != source.unsafeGetTensorImpl())
        set_module_tensor(module, name, source);
    }
  }
}

std::vector<std::string> check_tied_parameters_on_same_device(const std::vector<std::vector<std::string>>& groups,
                                                              const DeviceMap& map) {
  std::vector<std::string> messages;
  for (const auto& group : groups) {
    std::vector<std::string> where;
    bool differ = false;
    std::optional<MapDevice> first;
    bool first_set = false;
    for (const auto& name : group) {
      auto d = map.device_of(name);
      where.push_back(name + ": " + (d ? d->str() : std::string("unmapped")));
      if (!first_set) {
        first = d;
        first_set = true;
      } else if (d != first) {
        differ = true;
      }
    }
    if (!differ) continue;
    std::string msg = "tied parameters are on different devices (";
    for (size_t i = 0; i < where.size(); ++i) msg += (i ? ", " : "") + where[i];
    msg += "); put them on one device or let infer_auto_device_map place them";
    std::cerr << "flex warning: " << msg << "\n";
    messages.push_back(std::move(msg));
  }
  return messages;
}

}  // namespace flex
