#include <flex/dispatch/module_sizes.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/module.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <unordered_set>

namespace flex {

double dtype_byte_size(at::ScalarType dtype) {
  if (dtype == at::kBool) return 1.0 / 8.0;
  return static_cast<double>(c10::elementSize(dtype));
}

at::ScalarType dtype_from_string(const std::string& name) {
  std::string n = name;
  if (n.rfind("torch.", 0) == 0) n = n.substr(6);
  static const std::pair<const char*, at::ScalarType> table[] = {
      {"float32", at::kFloat}, {"float", at::kFloat},     {"fp32", at::kFloat},     {"float16", at::kHalf},
      {"half", at::kHalf},     {"fp16", at::kHalf},       {"bfloat16", at::kBFloat16}, {"bf16", at::kBFloat16},
      {"float64", at::kDouble}, {"double", at::kDouble},  {"int64", at::kLong},     {"long", at::kLong},
      {"int32", at::kInt},     {"int", at::kInt},         {"int16", at::kShort},    {"short", at::kShort},
      {"int8", at::kChar},     {"uint8", at::kByte},      {"bool", at::kBool},      {"complex64", at::kComplexFloat},
      {"complex128", at::kComplexDouble},
  };
  for (const auto& e : table)
    if (n == e.first) return e.second;
  throw ConfigError("unknown dtype '" + name +
                    "'; expected a torch dtype name such as float32, float16, bfloat16, int8 or bool");
}

double ModuleSizes::operator[](const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? 0.0 : items_[it->second].second;
}

void ModuleSizes::add(const std::string& name, double bytes) {
  auto it = index_.find(name);
  if (it == index_.end()) {
    index_.emplace(name, items_.size());
    items_.emplace_back(name, bytes);
  } else {
    items_[it->second].second += bytes;
  }
}

namespace {

// PyTorch's named_parameters()/named_buffers() with remove_duplicate=True:
// modules pre-order, each module once, each tensor once (first name wins).
void walk_tensors(const torch::nn::Module& m, const std::string& prefix, bool buffers,
                  std::unordered_set<const torch::nn::Module*>& seen_modules,
                  std::unordered_set<const c10::TensorImpl*>& seen_tensors,
                  std::vector<std::pair<std::string, at::Tensor>>& out) {
  if (!seen_modules.insert(&m).second) return;
  const auto own = buffers ? m.named_buffers(false) : m.named_parameters(false);
  for (const auto& t : own) {
    if (!t.value().defined()) continue;
    if (!seen_tensors.insert(t.value().unsafeGetTensorImpl()).second) continue;
    out.emplace_back(prefix + t.key(), t.value());
  }
  for (const auto& c : m.named_children()) walk_tensors(*c.value(), prefix + c.key() + ".", buffers, seen_modules, seen_tensors, out);
}

std::vector<std::pair<std::string, at::Tensor>> unique_tensors(const torch::nn::Module& m, bool buffers) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  std::unordered_set<const torch::nn::Module*> seen_modules;
  std::unordered_set<const c10::TensorImpl*> seen_tensors;
  walk_tensors(m, "", buffers, seen_modules, seen_tensors, out);
  return out;
}

bool keeps_own_size(at::ScalarType t) {
  // Accelerate: str(dtype).startswith(("torch.uint", "torch.int", "torch.bool")).
  return at::isIntegralType(t, /*includeBool=*/true);
}

}  // namespace

ModuleSizes compute_module_sizes(const torch::nn::Module& module, std::optional<at::ScalarType> dtype,
                                 const SpecialDtypes& special_dtypes, bool buffers_only) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  if (!buffers_only) tensors = unique_tensors(module, /*buffers=*/false);
  for (auto& b : unique_tensors(module, /*buffers=*/true)) tensors.push_back(std::move(b));

  ModuleSizes sizes;
  for (const auto& [name, t] : tensors) {
    const double numel = static_cast<double>(t.numel());
    double size;
    auto special = special_dtypes.find(name);
    if (special != special_dtypes.end())
      size = numel * dtype_byte_size(special->second);
    else if (!dtype || keeps_own_size(t.scalar_type()))
      size = numel * dtype_byte_size(t.scalar_type());
    else
      size = numel * std::min(dtype_byte_size(*dtype), dtype_byte_size(t.scalar_type()));
    // Every dotted prefix of the name, "" and the full name included.
    sizes.add("", size);
    for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', dot + 1))
      sizes.add(name.substr(0, dot), size);
    sizes.add(name, size);
  }
  return sizes;
}

double compute_module_total_buffer_size(const torch::nn::Module& module, std::optional<at::ScalarType> dtype,
                                        const SpecialDtypes& special_dtypes) {
  return compute_module_sizes(module, dtype, special_dtypes, /*buffers_only=*/true)[""];
}

std::string module_class_name(const torch::nn::Module& module) {
  if (const auto* fm = dynamic_cast<const Module*>(&module)) return fm->class_name();
  return module.name();
}

std::vector<NamedMember> direct_members(const torch::nn::Module& module, const std::string& prefix,
                                        bool with_buffers) {
  const std::string p = prefix.empty() ? "" : prefix + ".";
  std::vector<NamedMember> out;
  for (const auto& t : module.named_parameters(false))
    if (t.value().defined()) out.push_back({p + t.key(), nullptr, t.value()});
  for (const auto& c : module.named_children()) out.push_back({p + c.key(), c.value(), at::Tensor()});
  if (with_buffers)
    for (const auto& t : module.named_buffers(false))
      if (t.value().defined()) out.push_back({p + t.key(), nullptr, t.value()});
  return out;
}

MaxLayer get_max_layer_size(const std::vector<NamedMember>& members, const ModuleSizes& sizes,
                            const std::vector<std::string>& no_split) {
  MaxLayer best;
  std::vector<NamedMember> stack(members.rbegin(), members.rend());  // back = next
  while (!stack.empty()) {
    NamedMember m = std::move(stack.back());
    stack.pop_back();
    bool leaf = true;
    if (m.is_module() && !m.module->named_children().is_empty() &&
        std::find(no_split.begin(), no_split.end(), module_class_name(*m.module)) == no_split.end()) {
      leaf = false;
      auto children = m.module->named_children();
      for (auto it = children.end(); it != children.begin();) {
        --it;
        stack.push_back({m.name + "." + it->key(), it->value(), at::Tensor()});
      }
    }
    if (!leaf) continue;
    const double size = sizes[m.name];
    if (size > best.size) {
      best.size = size;
      best.names = {m.name};
    } else if (size == best.size) {
      best.names.push_back(m.name);
    }
  }
  return best;
}

MaximumSizes calculate_maximum_sizes(const torch::nn::Module& module, const std::vector<std::string>& no_split) {
  ModuleSizes sizes = compute_module_sizes(module);
  MaximumSizes out;
  out.total = sizes[""];
  out.largest_layer = get_max_layer_size(direct_members(module), sizes, no_split);
  return out;
}

}  // namespace flex
