#include <flex/hooks/errors.h>
#include <flex/hooks/value.h>

#include <ATen/core/Tensor.h>

namespace flex {

const at::Tensor& Inputs::tensor(size_t i) const {
  if (i >= args.size() || !args[i].isTensor())
    throw NotFoundError("call has no tensor at positional argument " + std::to_string(i) + " (it has " +
                        std::to_string(args.size()) + " positional arguments)");
  return args[i].toTensor();
}

const Value* Inputs::find(const std::string& key) const {
  for (const auto& kv : kwargs)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

Value* Inputs::find(const std::string& key) {
  for (auto& kv : kwargs)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

at::Tensor Inputs::tensor_or(const std::string& key) const {
  const Value* v = find(key);
  if (v == nullptr || !v->isTensor()) return at::Tensor();
  return v->toTensor();
}

void Inputs::set(const std::string& key, Value v) {
  if (Value* slot = find(key)) {
    *slot = std::move(v);
  } else {
    kwargs.emplace_back(key, std::move(v));
  }
}

namespace {

using TensorFn = std::function<at::Tensor(const at::Tensor&)>;

Value apply_impl(const Value& v, const TensorFn& fn, const std::set<std::string>* skip) {
  if (v.isTensor()) return fn(v.toTensor());
  if (v.isTuple()) {
    std::vector<Value> out;
    for (const auto& e : v.toTupleRef().elements()) out.push_back(apply_impl(e, fn, skip));
    return c10::ivalue::Tuple::create(std::move(out));
  }
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(fn(t));
    return out;
  }
  if (v.isList()) {
    auto in = v.toList();
    c10::impl::GenericList out(in.elementType());
    for (const Value& e : in) out.push_back(apply_impl(e, fn, skip));
    return out;
  }
  if (v.isGenericDict()) {
    auto in = v.toGenericDict();
    c10::impl::GenericDict out(in.keyType(), in.valueType());
    for (const auto& kv : in) {
      bool skipped = skip && kv.key().isString() && skip->count(kv.key().toStringRef());
      out.insert(kv.key(), skipped ? kv.value() : apply_impl(kv.value(), fn, skip));
    }
    return out;
  }
  return v;
}

at::Tensor first_tensor(const Value& v) {
  if (v.isTensor()) return v.toTensor();
  if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements())
      if (auto t = first_tensor(e); t.defined()) return t;
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) return t;
  } else if (v.isList()) {
    for (const Value& e : v.toList())
      if (auto t = first_tensor(e); t.defined()) return t;
  } else if (v.isGenericDict()) {
    for (const auto& kv : v.toGenericDict())
      if (auto t = first_tensor(kv.value()); t.defined()) return t;
  }
  return at::Tensor();
}

}  // namespace

Value apply_to_tensors(const Value& v, const TensorFn& fn) { return apply_impl(v, fn, nullptr); }

Inputs apply_to_tensors(const Inputs& in, const TensorFn& fn, const std::set<std::string>& skip_keys) {
  Inputs out;
  out.args.reserve(in.args.size());
  for (const auto& a : in.args) out.args.push_back(apply_impl(a, fn, &skip_keys));
  for (const auto& kv : in.kwargs) {
    if (skip_keys.count(kv.first)) {
      out.kwargs.push_back(kv);
    } else {
      out.kwargs.emplace_back(kv.first, apply_impl(kv.second, fn, &skip_keys));
    }
  }
  return out;
}

Value send_to_device(const Value& v, const c10::Device& device, const std::set<std::string>& skip_keys) {
  return apply_impl(
      v, [&](const at::Tensor& t) { return t.device() == device ? t : t.to(device); }, &skip_keys);
}

Inputs send_to_device(const Inputs& in, const c10::Device& device, const std::set<std::string>& skip_keys) {
  return apply_to_tensors(
      in, [&](const at::Tensor& t) { return t.device() == device ? t : t.to(device); }, skip_keys);
}

at::Tensor find_first_tensor(const Value& v) { return first_tensor(v); }

at::Tensor find_first_tensor(const Inputs& in) {
  for (const auto& a : in.args)
    if (auto t = first_tensor(a); t.defined()) return t;
  for (const auto& kv : in.kwargs)
    if (auto t = first_tensor(kv.second); t.defined()) return t;
  return at::Tensor();
}

std::vector<at::Tensor> tensor_leaves(const Value& v) {
  std::vector<at::Tensor> out;
  apply_impl(
      v,
      [&](const at::Tensor& t) {
        out.push_back(t);
        return t;
      },
      nullptr);
  return out;
}

Value replace_tensor_leaf(const Value& v, size_t index, const at::Tensor& replacement) {
  size_t seen = 0;
  Value out = apply_impl(
      v, [&](const at::Tensor& t) { return seen++ == index ? replacement : t; }, nullptr);
  if (index >= seen)
    throw NotFoundError("value has " + std::to_string(seen) + " tensors, cannot replace tensor " +
                        std::to_string(index));
  return out;
}

}  // namespace flex
