// Accelerate's nested-value operations over a Communicator. Every collective
// works on the tensor leaves in depth-first order (the same order on every
// rank once the structures are checked equal) and rebuilds the structure.
#include <flex/hooks/errors.h>
#include <flex/parallel/operations.h>

#include <ATen/ATen.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <algorithm>

namespace flex {

namespace {

bool is_tensor(const Value& v) { return v.isTensor(); }

Value apply(const Value& v, const std::function<Value(const Value&)>& fn, const std::function<bool(const Value&)>& test,
            bool error_on_other) {
  if (test(v)) return fn(v);
  if (v.isTuple()) {
    std::vector<Value> out;
    for (const auto& e : v.toTupleRef().elements()) out.push_back(apply(e, fn, test, error_on_other));
    return c10::ivalue::Tuple::create(std::move(out));
  }
  if (v.isList()) {  // tensor lists included: their elements are Values too
    c10::impl::GenericList out(c10::AnyType::get());
    for (const Value& e : v.toListRef()) out.push_back(apply(e, fn, test, error_on_other));
    return out;
  }
  if (v.isGenericDict()) {
    auto in = v.toGenericDict();
    c10::impl::GenericDict out(in.keyType(), c10::AnyType::get());
    for (const auto& kv : in) out.insert(kv.key(), apply(kv.value(), fn, test, error_on_other));
    return out;
  }
  if (error_on_other)
    throw ConfigError("recursively_apply: a leaf of type " + v.tagKind() + " is not of the type the function applies to");
  return v;
}

/// The tensor leaves, depth-first.
std::vector<at::Tensor> leaves(const Value& v) {
  std::vector<at::Tensor> out;
  recursively_apply([&](const Value& t) { out.push_back(t.toTensor()); return t; }, v);
  return out;
}

/// `v` with its tensor leaves replaced, in order, by `ts`.
Value with_leaves(const Value& v, const std::vector<at::Tensor>& ts) {
  size_t i = 0;
  return recursively_apply([&](const Value&) { return Value(ts.at(i++)); }, v);
}

/// The structure of `v`, and per tensor its dtype and (with `shapes`) its
/// shape, else its number of dims.
std::string signature(const Value& v, bool shapes) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) return "T(undefined)";
    std::string s = std::string("T(") + c10::toString(t.scalar_type()) + ",";
    if (shapes) {
      for (int64_t d : t.sizes()) s += std::to_string(d) + "x";
    } else {
      s += std::to_string(t.dim()) + "d";
    }
    return s + ")";
  }
  std::string s;
  if (v.isTuple()) {
    s = "(";
    for (const auto& e : v.toTupleRef().elements()) s += signature(e, shapes) + ",";
    return s + ")";
  }
  if (v.isList()) {
    s = "[";
    for (const Value& e : v.toListRef()) s += signature(e, shapes) + ",";
    return s + "]";
  }
  if (v.isGenericDict()) {
    s = "{";
    for (const auto& kv : v.toGenericDict()) s += (kv.key().isString() ? kv.key().toStringRef() : kv.key().tagKind()) + ":" + signature(kv.value(), shapes) + ",";
    return s + "}";
  }
  return v.tagKind();
}

at::Tensor bytes_tensor(const std::string& s) {
  at::Tensor t = at::empty({static_cast<int64_t>(s.size())}, at::kByte);
  std::copy(s.begin(), s.end(), t.data_ptr<uint8_t>());
  return t;
}

std::string tensor_bytes(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return std::string(reinterpret_cast<const char*>(c.data_ptr<uint8_t>()), static_cast<size_t>(c.numel()));
}

/// Every rank's signature of `v`; the same typed error on every rank when
/// they differ (each rank sees all of them, so all decide alike):
/// ConfigError for another structure / dtype / number of dims, ShapeError
/// for other shapes where `shapes` must match.
void require_same(Communicator& comm, const Value& v, bool shapes, const std::string& op) {
  const std::string structure = signature(v, false);
  const std::string sizes = shapes ? signature(v, true) : "";
  const auto all = comm.all_gather(bytes_tensor(structure + '\n' + sizes));
  const std::string first = tensor_bytes(all[0]);
  for (size_t r = 1; r < all.size(); ++r) {
    const std::string other = tensor_bytes(all[r]);
    if (other == first) continue;
    const auto split = [](const std::string& s) { return std::make_pair(s.substr(0, s.find('\n')), s.substr(s.find('\n') + 1)); };
    const auto [s0, z0] = split(first);
    const auto [sr, zr] = split(other);
    auto cut = [](const std::string& s) { return s.size() > 200 ? s.substr(0, 200) + "..." : s; };
    const bool same_structure = s0 == sr;
    const std::string msg = op + " on '" + comm.name() + "': rank " + std::to_string(r) + " passed " +
                            cut(same_structure ? zr : sr) + " but rank 0 passed " + cut(same_structure ? z0 : s0);
    if (same_structure)
      throw ShapeError(msg + " (shapes must be equal on every rank; pad_across_processes makes them so)");
    throw ConfigError(msg + " (structure, dtypes and dims must be equal on every rank)");
  }
}

at::Tensor pickle(const Value& v) {
  const std::vector<char> b = torch::jit::pickle_save(v);
  return bytes_tensor(std::string(b.begin(), b.end()));
}

Value unpickle(const at::Tensor& t) {
  const std::string s = tensor_bytes(t);
  return torch::jit::pickle_load(std::vector<char>(s.begin(), s.end()));
}

}  // namespace

Value recursively_apply(const std::function<Value(const Value&)>& fn, const Value& data,
                        const std::function<bool(const Value&)>& test_type, bool error_on_other_type) {
  return apply(data, fn, test_type ? test_type : is_tensor, error_on_other_type);
}

Value gather(Communicator& comm, const Value& data) {
  require_same(comm, data, true, "gather");
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : leaves(data)) out.push_back(at::cat(comm.all_gather(t.dim() == 0 ? t.reshape({1}) : t), 0));
  return with_leaves(data, out);
}

std::vector<Value> gather_object(Communicator& comm, const Value& object) {
  std::vector<Value> out;
  for (const at::Tensor& bytes : comm.all_gather(pickle(object))) {
    Value v = unpickle(bytes);
    if (v.isList()) {
      for (const Value& e : v.toListRef()) out.push_back(e);
    } else {
      out.push_back(v);
    }
  }
  return out;
}

Value broadcast(Communicator& comm, const Value& data, int from_process) {
  require_same(comm, data, true, "broadcast");
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : leaves(data)) {
    at::Tensor c = comm.rank() == from_process ? t.contiguous() : at::empty_like(t, at::MemoryFormat::Contiguous);
    comm.broadcast(c, from_process);
    out.push_back(c);
  }
  return with_leaves(data, out);
}

void broadcast_object_list(Communicator& comm, std::vector<Value>& objects, int from_process) {
  at::Tensor bytes;
  if (comm.rank() == from_process) bytes = pickle(c10::ivalue::Tuple::create(objects));
  comm.broadcast(bytes, from_process);  // allocated on the others with root's size
  if (comm.rank() == from_process) return;
  const Value v = unpickle(bytes);
  const auto& elements = v.toTupleRef().elements();
  objects.assign(elements.begin(), elements.end());
}

Value reduce(Communicator& comm, const Value& data, Reduction reduction, double scale) {
  require_same(comm, data, true, "reduce");
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : leaves(data)) {
    at::Tensor c = t.clone();
    if (reduction != Reduction::None) {
      if (reduction == Reduction::Mean && !c.is_floating_point())
        throw ConfigError(std::string("reduce: the mean of an integer tensor (") + c10::toString(c.scalar_type()) +
                          ") is not an integer; use Reduction::Sum");
      comm.all_reduce(c, ReduceOp::Sum);
      if (reduction == Reduction::Mean) c.div_(comm.size());
    }
    if (scale != 1.0) {
      if (!c.is_floating_point())
        throw ConfigError(std::string("reduce: scale ") + std::to_string(scale) + " on an integer tensor (" +
                          c10::toString(c.scalar_type()) + ")");
      c.mul_(scale);
    }
    out.push_back(c);
  }
  return with_leaves(data, out);
}

Value pad_across_processes(Communicator& comm, const Value& data, int64_t dim, double pad_index, bool pad_first) {
  require_same(comm, data, false, "pad_across_processes");
  const auto ts = leaves(data);
  // One all-gather for every tensor's size along dim (-1: too few dims).
  at::Tensor sizes = at::empty({static_cast<int64_t>(ts.size())}, at::kLong);
  for (size_t i = 0; i < ts.size(); ++i) sizes[static_cast<int64_t>(i)] = dim < ts[i].dim() ? ts[i].size(dim) : -1;
  const at::Tensor largest = std::get<0>(at::stack(comm.all_gather(sizes)).max(0));
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < ts.size(); ++i) {
    const at::Tensor& t = ts[i];
    const int64_t target = largest[static_cast<int64_t>(i)].item<int64_t>();
    if (dim >= t.dim() || t.size(dim) == target) {
      out.push_back(t);
      continue;
    }
    auto shape = t.sizes().vec();
    shape[dim] = target;
    at::Tensor padded = at::full(shape, pad_index, t.options());
    padded.narrow(dim, pad_first ? target - t.size(dim) : 0, t.size(dim)).copy_(t);
    out.push_back(padded);
  }
  return with_leaves(data, out);
}

Value concatenate(const std::vector<Value>& data, int64_t dim) {
  if (data.empty()) throw ConfigError("concatenate: no values");
  const std::string first = signature(data[0], false);
  std::vector<std::vector<at::Tensor>> per_value;
  for (size_t i = 0; i < data.size(); ++i) {
    if (signature(data[i], false) != first)
      throw ConfigError("concatenate: value " + std::to_string(i) + " has another structure than value 0");
    per_value.push_back(leaves(data[i]));
  }
  std::vector<at::Tensor> out;
  for (size_t k = 0; k < per_value[0].size(); ++k) {
    std::vector<at::Tensor> parts;
    for (const auto& v : per_value) {
      if (v[k].dim() == 0) throw ShapeError("concatenate: tensor leaf " + std::to_string(k) + " is 0-d");
      parts.push_back(v[k]);
    }
    out.push_back(at::cat(parts, dim));
  }
  return with_leaves(data[0], out);
}

Value slice_tensors(const Value& data, int64_t start, int64_t stop) {
  return recursively_apply([&](const Value& v) { return Value(v.toTensor().slice(0, start, stop)); }, data);
}

Value convert_to_fp32(const Value& data) {
  return recursively_apply(
      [](const Value& v) {
        const at::Tensor& t = v.toTensor();
        return Value(t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16 ? t.to(at::kFloat) : t);
      },
      data);
}

nlohmann::json listify(const Value& data) {
  if (data.isTensor()) {
    const at::Tensor t = data.toTensor().cpu();
    if (t.dim() == 0) return t.is_floating_point() ? nlohmann::json(t.item<double>()) : t.scalar_type() == at::kBool ? nlohmann::json(t.item<bool>()) : nlohmann::json(t.item<int64_t>());
    nlohmann::json a = nlohmann::json::array();
    for (int64_t i = 0; i < t.size(0); ++i) a.push_back(listify(Value(t[i])));
    return a;
  }
  if (data.isTuple() || data.isList()) {
    nlohmann::json a = nlohmann::json::array();
    if (data.isTuple()) {
      for (const auto& e : data.toTupleRef().elements()) a.push_back(listify(e));
    } else {
      for (const Value& e : data.toListRef()) a.push_back(listify(e));
    }
    return a;
  }
  if (data.isGenericDict()) {
    nlohmann::json o = nlohmann::json::object();
    for (const auto& kv : data.toGenericDict()) o[kv.key().isString() ? kv.key().toStringRef() : kv.key().tagKind()] = listify(kv.value());
    return o;
  }
  if (data.isInt()) return data.toInt();
  if (data.isDouble()) return data.toDouble();
  if (data.isBool()) return data.toBool();
  if (data.isString()) return data.toStringRef();
  if (data.isNone()) return nullptr;
  throw UnsupportedError("listify: a value of type " + data.tagKind() + " has no JSON form");
}

}  // namespace flex
