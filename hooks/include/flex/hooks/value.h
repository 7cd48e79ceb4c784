#pragma once
// The generic call of a flex::Module: positional and named arguments in,
// one Value out. Values are c10::IValue so hooks can walk tuples, lists and
// dicts of tensors without knowing a module's signature.
#include <ATen/core/ivalue.h>
#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <c10/core/Device.h>

#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace flex {

using Value = c10::IValue;

/// Positional and named arguments of one call, the C++ form of `*args, **kwargs`.
struct Inputs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;  // in call order

  Inputs() = default;
  Inputs(std::initializer_list<Value> a) : args(a) {}
  explicit Inputs(std::vector<Value> a) : args(std::move(a)) {}

  /// Positional argument `i` as a tensor; throws flex::NotFoundError if absent.
  const at::Tensor& tensor(size_t i) const;
  /// Named argument, or nullptr when absent.
  const Value* find(const std::string& key) const;
  Value* find(const std::string& key);
  /// Named tensor argument, or an undefined tensor when absent or None.
  at::Tensor tensor_or(const std::string& key) const;
  /// Sets (or adds) a named argument.
  void set(const std::string& key, Value v);
};

/// Applies `fn` to every tensor nested in `v` (tuples, lists, string-keyed
/// dicts), rebuilding the containers; other values pass through.
Value apply_to_tensors(const Value& v, const std::function<at::Tensor(const at::Tensor&)>& fn);
Inputs apply_to_tensors(const Inputs& in, const std::function<at::Tensor(const at::Tensor&)>& fn,
                        const std::set<std::string>& skip_keys = {});

/// Moves every tensor in `v` to `device` (Accelerate's send_to_device).
/// Named arguments in `skip_keys` (and dict entries with those keys) are left alone.
Value send_to_device(const Value& v, const c10::Device& device,
                     const std::set<std::string>& skip_keys = {});
Inputs send_to_device(const Inputs& in, const c10::Device& device,
                      const std::set<std::string>& skip_keys = {});

/// The first tensor found depth-first (positional before named), or undefined.
at::Tensor find_first_tensor(const Value& v);
at::Tensor find_first_tensor(const Inputs& in);

/// Every tensor in `v`, depth-first (FlexModel's flatten leaves).
std::vector<at::Tensor> tensor_leaves(const Value& v);

/// Replaces the `index`-th tensor leaf (depth-first) of `v` with `t`.
/// Throws flex::NotFoundError when `v` has fewer leaves.
Value replace_tensor_leaf(const Value& v, size_t index, const at::Tensor& t);

}  // namespace flex
