#include <flex/dispatch/offload_folder.h>
#include <flex/dispatch/safetensors.h>
#include <flex/dispatch/dtypes.h>
#include <flex/dispatch/weights_map.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/module.h>

#include <ATen/ATen.h>

#include <filesystem>

namespace flex {

StateDictWeights::StateDictWeights(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  for (const auto& kv : tensors) tensors_[kv.first] = kv.second;
}

at::Tensor StateDictWeights::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    auto close = closest_names(name, keys(), 1);
    throw NotFoundError("offloaded weights have no tensor '" + name + "'" +
                        (close.empty() ? std::string() : "; closest: '" + close[0] + "'"));
  }
  return it->second;
}

bool StateDictWeights::replace(const std::string& name, const at::Tensor& t) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return false;
  it->second = t;
  return true;
}

std::vector<std::string> StateDictWeights::keys() const {
  std::vector<std::string> out;
  for (const auto& kv : tensors_) out.push_back(kv.first);
  return out;
}

OffloadedWeightsLoader::OffloadedWeightsLoader(std::shared_ptr<StateDictWeights> state_dict,
                                               std::optional<std::string> save_folder,
                                               std::shared_ptr<const OffloadIndex> index)
    : state_dict_(state_dict ? std::move(state_dict) : std::make_shared<StateDictWeights>()),
      save_folder_(std::move(save_folder)),
      index_(std::move(index)) {
  if (!index_ && save_folder_) index_ = std::make_shared<OffloadIndex>(load_offload_index(*save_folder_));
  if (!index_) index_ = std::make_shared<OffloadIndex>();
}

const std::string& OffloadedWeightsLoader::resolve(const std::string& name) const {
  if (state_dict_->contains(name) || index_->find(name)) return name;
  auto it = aliases_.find(name);
  return it == aliases_.end() ? name : it->second;
}

bool OffloadedWeightsLoader::contains(const std::string& name) const {
  const std::string& n = resolve(name);
  return state_dict_->contains(n) || index_->find(n) != nullptr;
}

at::Tensor OffloadedWeightsLoader::get(const std::string& name) const {
  const std::string& n = resolve(name);
  if (state_dict_->contains(n)) return state_dict_->get(n);
  const OffloadEntry* e = index_->find(n);
  if (!e) {
    std::vector<std::string> all = keys();
    auto close = closest_names(name, all, 1);
    throw NotFoundError("offloaded weights have no tensor '" + name + "'" +
                        (close.empty() ? std::string() : "; closest: '" + close[0] + "'"));
  }
  // Zero-copy views are cached: they cost no anonymous memory (the pages are
  // the file's) and save re-mapping the file on every forward.
  auto cached = views_.find(n);
  if (cached != views_.end()) return cached->second;
  if (e->in_safetensors()) {
    auto& f = files_[e->safetensors_file];
    if (!f) f = SafetensorsFile::open(e->safetensors_file);
    at::Tensor t = f->get(e->weight_name);
    if (!e->dtype.empty()) {
      at::ScalarType want = numpy_to_scalar_type(e->dtype, n);
      if (t.scalar_type() != want) return t.to(want);  // a cast copy: not cached
    }
    views_[n] = t;
    return t;
  }
  if (!save_folder_)
    throw ConfigError("offloaded weight '" + name + "' lives in an offload folder but none was given");
  at::Tensor t = load_offloaded_weight(*save_folder_, n, *e);
  views_[n] = t;
  return t;
}

bool OffloadedWeightsLoader::replace(const std::string& name, const at::Tensor& t) const {
  const std::string& n = resolve(name);
  if (state_dict_->contains(n)) return state_dict_->replace(n, t);
  auto cached = views_.find(n);
  if (cached == views_.end()) return false;
  cached->second = t;
  return true;
}

std::vector<std::string> OffloadedWeightsLoader::keys() const {
  std::vector<std::string> out = state_dict_->keys();
  for (const auto& kv : index_->entries())
    if (!state_dict_->contains(kv.first)) out.push_back(kv.first);
  for (const auto& kv : aliases_) out.push_back(kv.first);
  return out;
}

std::vector<std::string> PrefixedWeights::keys() const {
  std::vector<std::string> out;
  for (const auto& k : base_->keys())
    if (k.rfind(prefix_, 0) == 0) out.push_back(k.substr(prefix_.size()));
  return out;
}

}  // namespace flex
