#include <flex/flexcore/save_context.h>
#include <flex/hooks/errors.h>

namespace flex {

const c10::IValue& SaveContext::get(const std::string& key) const {
  auto it = values_.find(key);
  if (it == values_.end()) {
    std::string known;
    for (const auto& kv : values_) known += (known.empty() ? "" : ", ") + kv.first;
    throw NotFoundError("save_ctx has no key '" + key + "' (keys: " + (known.empty() ? "none" : known) + ")");
  }
  return it->second;
}

std::vector<std::string> SaveContext::keys() const {
  std::vector<std::string> out;
  for (const auto& kv : values_) out.push_back(kv.first);
  return out;
}

}  // namespace flex
