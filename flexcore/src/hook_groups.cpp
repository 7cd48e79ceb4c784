#include "flex_model_parts.h"

#include <flex/hooks/errors.h>
#include <flex/hooks/nn.h>

namespace flex {

std::vector<HookFunctionPtr> FlexModel::match(const std::string& group,
                                              const std::function<bool(const std::string&)>& pred,
                                              const HookFunctionOptions& options, HookType type,
                                              const std::string& what) {
  std::vector<std::string> names;
  if (type == HookType::Tensor) {
    for (const auto& kv : state_dict(*module_))
      if (kv.second.requires_grad()) names.push_back(kv.first);
  } else {
    for (const auto& nm : module_->named_flex_modules())
      if (!nm.first.empty()) names.push_back(nm.first);
  }
  std::vector<HookFunctionPtr> made;
  for (const auto& n : names) {
    if (!pred(n)) continue;
    auto hf = std::make_shared<HookFunction>(n, options);
    register_hook_function(hf, type);
    entry_for(hf).groups.insert(group);
    known_groups_.insert(group);
    made.push_back(hf);
  }
  if (made.empty())
    throw NotFoundError("hook group '" + group + "': no " +
                        (type == HookType::Tensor ? std::string("parameter") : std::string("module")) +
                        " name matches " + what);
  return made;
}

std::vector<HookFunctionPtr> FlexModel::create_hook_group(const std::string& group, const std::string& substring,
                                                          const HookFunctionOptions& options, HookType type) {
  return match(
      group, [&](const std::string& n) { return n.find(substring) != std::string::npos; }, options, type,
      "substring '" + substring + "'");
}

std::vector<HookFunctionPtr> FlexModel::create_hook_group(const std::string& group, const std::regex& pattern,
                                                          const HookFunctionOptions& options, HookType type) {
  return match(
      group, [&](const std::string& n) { return std::regex_match(n, pattern); }, options, type,
      "the regular expression");
}

void FlexModel::update_hook_groups(const std::vector<HookFunctionPtr>& hooks, const std::string& group) {
  for (const auto& h : hooks) entry_for(h);  // validate all before changing any
  for (const auto& h : hooks) entry_for(h).groups.insert(group);
  known_groups_.insert(group);
}

void FlexModel::update_hook_groups(const std::string& substring, const std::string& group) {
  for (auto& e : entries_)
    if (e->hook->module_name().find(substring) != std::string::npos) e->groups.insert(group);
  known_groups_.insert(group);
}

void FlexModel::remove_hook_groups(const std::vector<HookFunctionPtr>& hooks, const std::string& group) {
  if (group == "all") throw ConfigError("every hook is in group 'all'; it cannot be removed from it");
  for (const auto& h : hooks) entry_for(h);
  for (const auto& h : hooks) entry_for(h).groups.erase(group);
}

void FlexModel::remove_hook_groups(const std::string& substring, const std::string& group) {
  if (group == "all") throw ConfigError("every hook is in group 'all'; it cannot be removed from it");
  for (auto& e : entries_)
    if (e->hook->module_name().find(substring) != std::string::npos) e->groups.erase(group);
}

std::set<std::string> FlexModel::get_hook_function_groups(const HookFunctionPtr& hook) const {
  const Entry* e = find_entry(hook.get());
  if (!e) throw NotFoundError("hook function " + hook->describe() + " is not registered with this FlexModel");
  return e->groups;
}

std::vector<HookFunctionPtr> FlexModel::get_group_hook_functions(const std::string& group) const {
  std::vector<HookFunctionPtr> out;
  for (const auto& e : entries_)
    if (e->groups.count(group)) out.push_back(e->hook);
  return out;
}

std::vector<HookFunctionPtr> FlexModel::hook_functions() const {
  std::vector<HookFunctionPtr> out;
  for (const auto& e : entries_) out.push_back(e->hook);
  return out;
}

}  // namespace flex
