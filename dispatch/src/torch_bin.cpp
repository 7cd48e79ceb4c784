// Reading PyTorch .bin files (torch.save's zip format) without Python.
//
// libtorch's own torch::pickle_load cannot read the common case: its unpickler
// turns collections.OrderedDict into None (it expects OrderedDicts only as
// tensor backward hooks), so every `torch.save(model.state_dict())` file fails.
// This is a small, restricted unpickler in the spirit of torch.load(weights_only=True):
// it knows the opcodes torch.save emits (protocols 2-4) and an allowlist of
// globals (OrderedDict, tensor/parameter rebuilders, typed storages); anything
// else is refused with an error naming the file and the global. The zip
// container is read with libtorch's PyTorchStreamReader.
#include "flex/dispatch/checkpoint.h"

#include <flex/hooks/errors.h>

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>

#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <unordered_map>

namespace flex {
namespace {

struct PyVal;
using P = std::shared_ptr<PyVal>;

struct PyVal {
  enum Kind { None, Bool, Int, Float, Str, Tuple, List, Dict, Global, Tensor } kind = None;
  int64_t i = 0;
  double f = 0;
  std::string s;  // Str; Global as "module.name"
  std::vector<P> items;
  std::vector<std::pair<P, P>> dict;
  at::Tensor tensor;
};

P make(PyVal::Kind k) {
  auto p = std::make_shared<PyVal>();
  p->kind = k;
  return p;
}

const std::map<std::string, at::ScalarType>& storage_types() {
  static const std::map<std::string, at::ScalarType> m = {
      {"torch.DoubleStorage", at::kDouble}, {"torch.FloatStorage", at::kFloat},
      {"torch.HalfStorage", at::kHalf},     {"torch.BFloat16Storage", at::kBFloat16},
      {"torch.LongStorage", at::kLong},     {"torch.IntStorage", at::kInt},
      {"torch.ShortStorage", at::kShort},   {"torch.CharStorage", at::kChar},
      {"torch.ByteStorage", at::kByte},     {"torch.BoolStorage", at::kBool},
  };
  return m;
}

class Unpickler {
 public:
  Unpickler(std::string path, const std::string& pkl, caffe2::serialize::PyTorchStreamReader& zip)
      : path_(std::move(path)), data_(pkl), zip_(zip) {}

  P run() {
    while (true) {
      uint8_t op = byte();
      switch (op) {
        case 0x80: byte(); break;       // PROTO
        case 0x95: bytes(8); break;     // FRAME
        case '.': return pop();         // STOP
        case '(': marks_.push_back(stack_.size()); break;
        case '}': stack_.push_back(make(PyVal::Dict)); break;
        case ']': stack_.push_back(make(PyVal::List)); break;
        case ')': stack_.push_back(make(PyVal::Tuple)); break;
        case 't': { auto t = make(PyVal::Tuple); t->items = pop_mark(); stack_.push_back(t); break; }
        case 0x85: case 0x86: case 0x87: {
          size_t n = op - 0x84;
          need(n);
          auto t = make(PyVal::Tuple);
          t->items.assign(stack_.end() - n, stack_.end());
          stack_.resize(stack_.size() - n);
          stack_.push_back(t);
          break;
        }
        case 'l': { auto l = make(PyVal::List); l->items = pop_mark(); stack_.push_back(l); break; }
        case 'd': {
          auto items = pop_mark();
          if (items.size() % 2) fail("odd number of items for DICT");
          auto d = make(PyVal::Dict);
          for (size_t k = 0; k < items.size(); k += 2) d->dict.emplace_back(items[k], items[k + 1]);
          stack_.push_back(d);
          break;
        }
        case 'a': { auto v = pop(); list_top()->items.push_back(v); break; }
        case 'e': { auto items = pop_mark(); auto l = list_top(); l->items.insert(l->items.end(), items.begin(), items.end()); break; }
        case 's': { auto v = pop(); auto k = pop(); set_item(dict_top(), k, v); break; }
        case 'u': {
          auto items = pop_mark();
          if (items.size() % 2) fail("odd number of items for SETITEMS");
          auto d = dict_top();
          for (size_t k = 0; k < items.size(); k += 2) set_item(d, items[k], items[k + 1]);
          break;
        }
        case 'q': memo_[byte()] = top(); break;
        case 'r': memo_[u32()] = top(); break;
        case 0x94: memo_[memo_.size()] = top(); break;
        case 'h': stack_.push_back(memo(byte())); break;
        case 'j': stack_.push_back(memo(u32())); break;
        case 'J': { auto v = make(PyVal::Int); v->i = static_cast<int32_t>(u32()); stack_.push_back(v); break; }
        case 'K': { auto v = make(PyVal::Int); v->i = byte(); stack_.push_back(v); break; }
        case 'M': { int64_t lo = byte(); int64_t hi = byte(); auto v = make(PyVal::Int); v->i = lo | (hi << 8); stack_.push_back(v); break; }
        case 0x8a: {  // LONG1: n-byte little-endian two's complement
          size_t n = byte();
          if (n > 8) fail("integer wider than 64 bits");
          std::string b = bytes(n);
          uint64_t u = 0;
          for (size_t k = 0; k < n; ++k) u |= uint64_t(uint8_t(b[k])) << (8 * k);
          if (n > 0 && n < 8 && (uint8_t(b[n - 1]) & 0x80)) u |= ~uint64_t(0) << (8 * n);
          auto v = make(PyVal::Int);
          v->i = static_cast<int64_t>(u);
          stack_.push_back(v);
          break;
        }
        case 'G': {  // BINFLOAT, big-endian
          std::string b = bytes(8);
          uint64_t u = 0;
          for (int k = 0; k < 8; ++k) u = (u << 8) | uint8_t(b[k]);
          auto v = make(PyVal::Float);
          std::memcpy(&v->f, &u, 8);
          stack_.push_back(v);
          break;
        }
        case 'N': stack_.push_back(make(PyVal::None)); break;
        case 0x88: case 0x89: { auto v = make(PyVal::Bool); v->i = op == 0x88; stack_.push_back(v); break; }
        case 'X': push_str(bytes(u32())); break;
        case 0x8c: push_str(bytes(byte())); break;
        case 0x8d: push_str(bytes(u64())); break;
        case 'c': {
          std::string mod = line(), name = line();
          push_global(mod + "." + name);
          break;
        }
        case 0x93: {
          auto name = pop(), mod = pop();
          if (name->kind != PyVal::Str || mod->kind != PyVal::Str) fail("STACK_GLOBAL without strings");
          push_global(mod->s + "." + name->s);
          break;
        }
        case 'R': { auto args = pop(); auto fn = pop(); stack_.push_back(call(fn, args)); break; }
        case 'b': {
          auto state = pop();
          auto obj = top();
          // OrderedDict state is its _metadata attribute (module versions) and a
          // rebuilt Parameter's state is Python attributes: neither matters here.
          if (obj->kind != PyVal::Dict && obj->kind != PyVal::Tensor) fail("BUILD on an unsupported object");
          break;
        }
        case 'Q': stack_.push_back(persistent_load(pop())); break;
        case '0': pop(); break;
        case '1': pop_mark(); break;
        case '2': stack_.push_back(top()); break;
        default: {
          char buf[8];
          std::snprintf(buf, sizeof buf, "0x%02x", op);
          throw UnsupportedError("PyTorch file " + path_ + ": pickle opcode " + buf + " at byte " +
                                 std::to_string(pos_ - 1) + " is not supported (only tensor state dicts are read)");
        }
      }
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw FileFormatError("PyTorch file " + path_ + ": malformed pickle (" + what + ") at byte " + std::to_string(pos_));
  }
  uint8_t byte() {
    if (pos_ >= data_.size()) fail("unexpected end");
    return static_cast<uint8_t>(data_[pos_++]);
  }
  std::string bytes(uint64_t n) {
    if (n > data_.size() - pos_) fail("unexpected end");
    std::string s = data_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  uint32_t u32() {
    std::string b = bytes(4);
    return uint32_t(uint8_t(b[0])) | uint32_t(uint8_t(b[1])) << 8 | uint32_t(uint8_t(b[2])) << 16 |
           uint32_t(uint8_t(b[3])) << 24;
  }
  uint64_t u64() { uint64_t lo = u32(); return lo | uint64_t(u32()) << 32; }
  std::string line() {
    size_t e = data_.find('\n', pos_);
    if (e == std::string::npos) fail("unterminated GLOBAL");
    std::string s = data_.substr(pos_, e - pos_);
    pos_ = e + 1;
    return s;
  }
  void need(size_t n) const {
    size_t floor = marks_.empty() ? 0 : marks_.back();
    if (stack_.size() < floor + n) fail("stack underflow");
  }
  P pop() { need(1); P v = stack_.back(); stack_.pop_back(); return v; }
  P top() { need(1); return stack_.back(); }
  std::vector<P> pop_mark() {
    if (marks_.empty()) fail("no MARK");
    size_t m = marks_.back();
    marks_.pop_back();
    std::vector<P> items(stack_.begin() + m, stack_.end());
    stack_.resize(m);
    return items;
  }
  P memo(uint64_t k) {
    auto it = memo_.find(k);
    if (it == memo_.end()) fail("memo key " + std::to_string(k) + " missing");
    return it->second;
  }
  P list_top() { P l = top(); if (l->kind != PyVal::List) fail("APPEND to a non-list"); return l; }
  P dict_top() { P d = top(); if (d->kind != PyVal::Dict) fail("SETITEM on a non-dict"); return d; }
  static void set_item(const P& d, const P& k, const P& v) {
    if (k->kind == PyVal::Str)
      for (auto& kv : d->dict)
        if (kv.first->kind == PyVal::Str && kv.first->s == k->s) { kv.second = v; return; }
    d->dict.emplace_back(k, v);
  }
  void push_str(std::string s) { auto v = make(PyVal::Str); v->s = std::move(s); stack_.push_back(v); }
  void push_global(const std::string& name) {
    static const char* allowed[] = {"collections.OrderedDict", "torch._utils._rebuild_tensor_v2",
                                    "torch._utils._rebuild_parameter",
                                    "torch._utils._rebuild_parameter_with_state"};
    bool ok = storage_types().count(name) > 0;
    for (const char* a : allowed) ok = ok || name == a;
    if (!ok)
      throw UnsupportedError("PyTorch file " + path_ + ": refusing to load global '" + name +
                             "' (only tensor state dicts are read, like torch.load(weights_only=True))");
    auto g = make(PyVal::Global);
    g->s = name;
    stack_.push_back(g);
  }
  int64_t as_int(const P& v, const char* what) const {
    if (v->kind != PyVal::Int) fail(std::string(what) + " is not an integer");
    return v->i;
  }
  std::vector<int64_t> as_ints(const P& v, const char* what) const {
    if (v->kind != PyVal::Tuple && v->kind != PyVal::List) fail(std::string(what) + " is not a tuple");
    std::vector<int64_t> out;
    for (const auto& x : v->items) out.push_back(as_int(x, what));
    return out;
  }

  P call(const P& fn, const P& args) {
    if (fn->kind != PyVal::Global || args->kind != PyVal::Tuple) fail("REDUCE on a non-callable");
    const auto& a = args->items;
    if (fn->s == "collections.OrderedDict") return make(PyVal::Dict);
    if (fn->s == "torch._utils._rebuild_tensor_v2") {
      if (a.size() < 4 || a[0]->kind != PyVal::Tensor) fail("bad _rebuild_tensor_v2 arguments");
      const at::Tensor& storage = a[0]->tensor;
      int64_t offset = as_int(a[1], "storage offset");
      auto size = as_ints(a[2], "size");
      auto stride = as_ints(a[3], "stride");
      if (size.size() != stride.size()) fail("size and stride differ in length");
      int64_t extent = 0;  // last element index + 1
      bool empty = false;
      for (size_t d = 0; d < size.size(); ++d) {
        if (size[d] < 0 || stride[d] < 0) fail("negative size or stride");
        if (size[d] == 0) empty = true;
        extent += (size[d] - 1) * stride[d];
      }
      if (offset < 0 || (!empty && offset + extent + 1 > storage.numel()))
        throw FileFormatError("PyTorch file " + path_ + ": tensor of size " + c10::str(at::IntArrayRef(size)) +
                              " at offset " + std::to_string(offset) + " runs past its storage of " +
                              std::to_string(storage.numel()) + " elements");
      auto t = make(PyVal::Tensor);
      t->tensor = at::empty({0}, storage.options()).set_(storage.storage(), offset, size, stride);
      return t;
    }
    if (fn->s == "torch._utils._rebuild_parameter" || fn->s == "torch._utils._rebuild_parameter_with_state") {
      if (a.empty() || a[0]->kind != PyVal::Tensor) fail("bad _rebuild_parameter arguments");
      return a[0];
    }
    fail("calling '" + fn->s + "'");
  }

  P persistent_load(const P& pid) {
    if (pid->kind != PyVal::Tuple || pid->items.size() < 5 || pid->items[0]->kind != PyVal::Str ||
        pid->items[0]->s != "storage" || pid->items[1]->kind != PyVal::Global || pid->items[2]->kind != PyVal::Str)
      fail("unexpected persistent id");
    const std::string& key = pid->items[2]->s;
    auto it = storages_.find(key);
    if (it != storages_.end()) return it->second;
    auto st = storage_types().find(pid->items[1]->s);
    if (st == storage_types().end()) fail("storage type '" + pid->items[1]->s + "'");
    at::ScalarType dtype = st->second;
    int64_t numel = as_int(pid->items[4], "storage size");
    std::string rec = "data/" + key;
    if (!zip_.hasRecord(rec))
      throw FileFormatError("PyTorch file " + path_ + ": storage record '" + rec + "' is missing from the archive");
    auto [ptr, nbytes] = zip_.getRecord(rec);
    size_t need = static_cast<size_t>(numel) * c10::elementSize(dtype);
    if (numel < 0 || nbytes < need)
      throw FileFormatError("PyTorch file " + path_ + ": storage '" + rec + "' has " + std::to_string(nbytes) +
                            " bytes, expected " + std::to_string(need));
    auto holder = std::make_shared<at::DataPtr>(std::move(ptr));
    void* raw = holder->get();
    auto v = make(PyVal::Tensor);
    auto opts = at::TensorOptions().dtype(dtype);
    v->tensor = numel == 0 ? at::empty({0}, opts)
                           : at::from_blob(raw, {numel}, [holder](void*) mutable { holder.reset(); }, opts);
    storages_[key] = v;
    return v;
  }

  std::string path_;
  const std::string& data_;
  caffe2::serialize::PyTorchStreamReader& zip_;
  size_t pos_ = 0;
  std::vector<P> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, P> memo_;
  std::unordered_map<std::string, P> storages_;
};

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> load_torch_bin(const std::string& path) {
  {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw IOError("cannot open PyTorch file " + path);
    char magic[4] = {0, 0, 0, 0};
    in.read(magic, 4);
    if (std::memcmp(magic, "PK\x03\x04", 4) != 0)
      throw UnsupportedError("PyTorch file " + path +
                             " is not in torch.save's zip format (legacy pre-1.6 files are not supported)");
  }
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> zip;
  std::string pkl;
  try {
    zip = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
    if (zip->hasRecord("byteorder")) {
      auto [bo, n] = zip->getRecord("byteorder");
      if (std::string(static_cast<const char*>(bo.get()), n) != "little")
        throw UnsupportedError("PyTorch file " + path + " stores big-endian tensors");
    }
    if (!zip->hasRecord("data.pkl")) throw FileFormatError("PyTorch file " + path + " has no data.pkl record");
    auto [p, n] = zip->getRecord("data.pkl");
    pkl.assign(static_cast<const char*>(p.get()), n);
  } catch (const c10::Error& e) {
    throw FileFormatError("PyTorch file " + path + " is not a readable torch.save archive: " + e.what_without_backtrace());
  }
  P root;
  try {
    root = Unpickler(path, pkl, *zip).run();
  } catch (const c10::Error& e) {
    throw FileFormatError("PyTorch file " + path + ": " + e.what_without_backtrace());
  }
  if (root->kind != PyVal::Dict) throw UnsupportedError("PyTorch file " + path + " does not hold a dict of tensors");
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [k, v] : root->dict) {
    if (k->kind != PyVal::Str) throw UnsupportedError("PyTorch file " + path + " has a non-string key");
    if (v->kind != PyVal::Tensor)
      throw UnsupportedError("PyTorch file " + path + ": value of '" + k->s +
                             "' is not a tensor (a nested checkpoint? only flat state dicts are read)");
    out.emplace_back(k->s, v->tensor);
  }
  return out;
}

}  // namespace flex
