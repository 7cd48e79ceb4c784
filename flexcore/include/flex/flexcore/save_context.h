#pragma once
// SaveContext: state shared by every editing function of a FlexModel, kept
// across forward calls (FlexModel's save_ctx). Values are IValues, so tensors,
// numbers, strings and lists all fit.
#include <ATen/core/ivalue.h>

#include <map>
#include <string>
#include <vector>

namespace flex {

class SaveContext {
 public:
  bool has(const std::string& key) const { return values_.count(key) > 0; }
  void set(const std::string& key, c10::IValue v) { values_[key] = std::move(v); }
  /// The value at `key`; NotFoundError listing the keys that exist.
  const c10::IValue& get(const std::string& key) const;
  at::Tensor tensor(const std::string& key) const { return get(key).toTensor(); }
  double scalar(const std::string& key) const { return get(key).toDouble(); }
  void erase(const std::string& key) { values_.erase(key); }
  void clear() { values_.clear(); }
  std::vector<std::string> keys() const;

 private:
  std::map<std::string, c10::IValue> values_;
};

}  // namespace flex
