#include <flex/parallel/activation_layout.h>

namespace flex {

void ActivationLayout::declare(const Module& m, ModuleSharding sharding) { declared_[&m] = std::move(sharding); }

std::optional<ModuleSharding> ActivationLayout::sharding_of(const Module& m) const {
  if (auto* s = dynamic_cast<const ShardedModule*>(&m)) return s->sharding();
  auto it = declared_.find(&m);
  if (it == declared_.end()) return std::nullopt;
  return it->second;
}

ShardSpec ActivationLayout::output_spec(const Module& m) const {
  auto s = sharding_of(m);
  return s ? s->output : ShardSpec::replicated();
}

ShardSpec ActivationLayout::param_spec(const Module& m, const std::string& local_name) const {
  auto s = sharding_of(m);
  if (!s) return ShardSpec::replicated();
  auto it = s->params.find(local_name);
  return it == s->params.end() ? ShardSpec::replicated() : it->second;
}

}  // namespace flex
