#include "flex/dispatch/checkpoint.h"
#include "flex/dispatch/constants.h"
#include "flex/dispatch/device_map.h"

#include "flex/dispatch/atomic_file.h"
#include "flex/dispatch/safetensors.h"

#include <flex/hooks/errors.h>
#include <flex/hooks/module.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>

namespace fs = std::filesystem;

namespace flex {

struct Checkpoint::Impl {
  struct Shard {
    std::string path;
    std::shared_ptr<SafetensorsFile> st;                        // safetensors shards
    std::vector<std::string> index_keys;                        // .bin shards: names the index gives
    mutable std::vector<std::pair<std::string, at::Tensor>> bin;  // .bin shards, once loaded
    mutable bool loaded = false;
  };
  std::string source;
  std::vector<std::string> files;
  std::vector<Shard> shards;               // parallel to files
  std::map<std::string, size_t> key_file;  // key -> shard index
  mutable std::mutex mu;                   // guards lazy .bin loading

  const Shard& shard_of(const std::string& key) const {
    auto it = key_file.find(key);
    if (it == key_file.end()) {
      std::vector<std::string> all;
      for (const auto& kv : key_file) all.push_back(kv.first);
      throw NotFoundError("tensor '" + key + "' is not in checkpoint " + source + closest_names_text(key, all));
    }
    return shards[it->second];
  }

  const std::vector<std::pair<std::string, at::Tensor>>& bin(const Shard& s) const {
    std::lock_guard<std::mutex> lock(mu);
    if (!s.loaded) {
      s.bin = load_torch_bin(s.path);
      s.loaded = true;
      // An index may only name keys its shard really holds.
      std::set<std::string> have;
      for (const auto& kv : s.bin) have.insert(kv.first);
      for (const auto& k : s.index_keys)
        if (!have.count(k))
          throw FileFormatError("index " + source + " places '" + k + "' in " + s.path + ", which does not hold it");
    }
    return s.bin;
  }

  at::Tensor bin_tensor(const Shard& s, const std::string& key) const {
    for (const auto& kv : bin(s))
      if (kv.first == key) return kv.second;
    throw FileFormatError("index " + source + " places '" + key + "' in " + s.path + ", which does not hold it");
  }
};

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string resolve_folder(const fs::path& dir) {
  for (const char* name : {WEIGHTS_NAME, SAFE_WEIGHTS_NAME})
    if (std::error_code ec; fs::is_regular_file(dir / name, ec)) return (dir / name).string();
  std::vector<std::string> indexes;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && ends_with(e.path().filename().string(), ".index.json"))
      indexes.push_back(e.path().string());
  std::sort(indexes.begin(), indexes.end());
  if (indexes.empty())
    throw NotFoundError("folder " + dir.string() +
                        " holds no checkpoint: no pytorch_model.bin, model.safetensors or *.index.json");
  if (indexes.size() > 1) {
    std::string list;
    for (const auto& i : indexes) list += " " + fs::path(i).filename().string();
    throw FileFormatError("folder " + dir.string() + " holds several index files (" + list.substr(1) +
                          "); pass the one to load");
  }
  return indexes[0];
}

// key -> shard file name (relative to the index's folder), in the index's order.
std::vector<std::pair<std::string, std::string>> read_index(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for numbers that overflow
    throw FileFormatError("index " + path + " is not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw FileFormatError("index " + path + " is not a JSON object");
  const nlohmann::json* map = &j;
  auto wm = j.find("weight_map");
  if (wm != j.end()) map = &*wm;  // else: legacy flat {name: file} map
  if (!map->is_object()) throw FileFormatError("index " + path + ": \"weight_map\" is not a JSON object");
  std::vector<std::pair<std::string, std::string>> out;
  for (auto it = map->begin(); it != map->end(); ++it) {
    if (!it->is_string())
      throw FileFormatError("index " + path + ": entry '" + it.key() + "' does not name a shard file");
    out.emplace_back(it.key(), it->get<std::string>());
  }
  return out;
}

}  // namespace

struct Checkpoint::View {
  Checkpoint stored;
  std::map<std::string, std::string> plain;  // model name -> stored key
  std::map<std::string, CheckpointView::Computed> computed;
  std::map<std::string, std::vector<std::string>> per_file;  // shard -> model names, in file order

  std::vector<std::string> keys() const {
    std::vector<std::string> out;
    for (const auto& kv : plain) out.push_back(kv.first);
    for (const auto& kv : computed) out.push_back(kv.first);
    std::sort(out.begin(), out.end());
    return out;
  }
  std::vector<std::string> keys_in(const std::string& file) const {
    auto it = per_file.find(file);
    if (it != per_file.end()) return it->second;
    stored.keys_in(file);  // throws for a file that is not a shard
    return {};
  }
  const std::string& first_source(const std::string& key) const {
    if (auto p = plain.find(key); p != plain.end()) return p->second;
    if (auto c = computed.find(key); c != computed.end()) return c->second.sources.front();
    std::vector<std::string> all = keys();
    throw NotFoundError("tensor '" + key + "' is not in checkpoint " + stored.source() + closest_names_text(key, all));
  }
  at::Tensor get(const std::string& key) const {
    auto c = computed.find(key);
    if (c == computed.end()) return stored.get(first_source(key));
    std::vector<at::Tensor> in;
    for (const auto& src : c->second.sources) in.push_back(stored.get(src));
    return c->second.compute(in);
  }
};

Checkpoint Checkpoint::open(const std::string& path_in) {
  fs::path path = fs::absolute(path_in).lexically_normal();
  // error_code overloads: a path the OS refuses (too long, no permission)
  // must give a typed error naming it, not std::filesystem_error.
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw IOError("checkpoint " + path.string() + (ec ? " cannot be read: " + ec.message() : " does not exist"));
  std::string file = fs::is_directory(path, ec) ? resolve_folder(path) : path.string();

  auto impl = std::make_shared<Impl>();
  impl->source = file;
  std::map<std::string, std::vector<std::string>> index_keys;  // shard path -> keys the index names
  if (ends_with(file, ".json")) {
    fs::path dir = fs::path(file).parent_path();
    for (const auto& [key, shard] : read_index(file)) {
      std::string sp = (dir / shard).lexically_normal().string();
      index_keys[sp].push_back(key);
    }
    if (index_keys.empty()) throw FileFormatError("index " + file + " lists no tensors");
    for (const auto& kv : index_keys)
      if (std::error_code sec; !fs::is_regular_file(kv.first, sec))
        throw NotFoundError("index " + file + " points at shard " + kv.first + " (for '" + kv.second.front() +
                            "'), which " +
                            (sec && sec != std::errc::no_such_file_or_directory ? "cannot be read: " + sec.message()
                                                                                 : std::string("does not exist")));
  } else {
    index_keys[file] = {};
  }

  for (auto& [sp, keys] : index_keys) {  // std::map: sorted unique shard paths
    Impl::Shard shard;
    shard.path = sp;
    size_t idx = impl->files.size();
    std::vector<std::string> names;
    if (!ends_with(sp, ".safetensors")) {  // Accelerate: anything else goes to torch.load
      shard.index_keys = keys;
      if (keys.empty()) {  // a single .bin: its keys are only known by reading it
        shard.bin = load_torch_bin(sp);
        shard.loaded = true;
        for (const auto& kv : shard.bin) names.push_back(kv.first);
      } else {
        names = keys;
      }
    } else {
      shard.st = SafetensorsFile::open(sp);
      // Accelerate loads whole shards, so every key a shard holds counts.
      names = shard.st->names();
      for (const auto& k : keys)
        if (!shard.st->contains(k))
          throw FileFormatError("index " + file + " places '" + k + "' in " + sp + ", which does not hold it");
    }
    for (const auto& k : names) {
      auto [it, fresh] = impl->key_file.emplace(k, idx);
      if (!fresh)
        throw FileFormatError("tensor '" + k + "' is stored in two shards: " + impl->files[it->second] + " and " + sp);
    }
    impl->files.push_back(sp);
    impl->shards.push_back(std::move(shard));
  }
  Checkpoint c;
  c.impl_ = impl;
  return c;
}

const std::vector<std::string>& Checkpoint::files() const { return impl_->files; }
const std::string& Checkpoint::source() const { return impl_->source; }

std::vector<std::string> Checkpoint::keys() const {
  if (view_) return view_->keys();
  std::vector<std::string> out;
  for (const auto& kv : impl_->key_file) out.push_back(kv.first);
  return out;
}

std::vector<std::string> Checkpoint::keys_in(const std::string& file) const {
  if (view_) return view_->keys_in(file);
  auto it = std::find(impl_->files.begin(), impl_->files.end(), file);
  if (it == impl_->files.end()) {
    std::string f = fs::absolute(file).lexically_normal().string();
    it = std::find(impl_->files.begin(), impl_->files.end(), f);
    if (it == impl_->files.end()) throw NotFoundError("file " + file + " is not a shard of checkpoint " + impl_->source);
  }
  const auto& s = impl_->shards[static_cast<size_t>(it - impl_->files.begin())];
  if (s.st) return s.st->names();
  std::vector<std::string> out;
  if (s.loaded || s.index_keys.empty()) {
    for (const auto& kv : impl_->bin(s)) out.push_back(kv.first);
  } else {
    out = s.index_keys;
  }
  return out;
}

bool Checkpoint::contains(const std::string& key) const {
  if (view_) return view_->plain.count(key) || view_->computed.count(key);
  return impl_->key_file.count(key) > 0;
}

std::string Checkpoint::file_of(const std::string& key) const {
  if (view_) return view_->stored.file_of(view_->first_source(key));
  return impl_->shard_of(key).path;
}

at::Tensor Checkpoint::get(const std::string& key) const {
  if (view_) return view_->get(key);
  const auto& s = impl_->shard_of(key);
  if (s.st) return s.st->get(key);
  return impl_->bin_tensor(s, key);
}

at::ScalarType Checkpoint::dtype(const std::string& key) const {
  if (view_) {
    if (auto c = view_->computed.find(key); c != view_->computed.end()) return c->second.dtype;
    return view_->stored.dtype(view_->first_source(key));
  }
  const auto& s = impl_->shard_of(key);
  if (s.st) {
    const TensorInfo& i = s.st->info(key);
    if (i.dtype == at::ScalarType::Undefined) s.st->get(key);  // throws UnsupportedError
    return i.dtype;
  }
  return impl_->bin_tensor(s, key).scalar_type();
}

std::vector<int64_t> Checkpoint::shape(const std::string& key) const {
  if (view_) {
    if (auto c = view_->computed.find(key); c != view_->computed.end()) return c->second.shape;
    return view_->stored.shape(view_->first_source(key));
  }
  const auto& s = impl_->shard_of(key);
  if (s.st) return s.st->info(key).shape;
  return impl_->bin_tensor(s, key).sizes().vec();
}

bool Checkpoint::is_safetensors() const {
  for (const auto& s : impl_->shards)
    if (!s.st) return false;
  return true;
}

// ---------------------------------------------------------------------------
// A view: the model's names over the stored ones

Checkpoint Checkpoint::with_view(const CheckpointView& view) const {
  auto v = std::make_shared<View>();
  v->stored = view_ ? view_->stored : *this;
  const Checkpoint& st = v->stored;
  std::map<std::string, const CheckpointView::Computed*> by_first_source;
  std::set<std::string> consumed;
  for (const auto& c : view.computed) {
    if (c.sources.empty()) throw FileFormatError("checkpoint " + st.source() + ": computed '" + c.name + "' has no source");
    for (const auto& src : c.sources) {
      if (!st.contains(src))
        throw FileFormatError("checkpoint " + st.source() + " lacks '" + src + "', needed for '" + c.name + "'");
      consumed.insert(src);
    }
    by_first_source[c.sources.front()] = &c;
  }
  auto claim = [&](const std::string& name, const std::string& from) {
    if (v->plain.count(name) || v->computed.count(name))
      throw FileFormatError("checkpoint " + st.source() + ": two tensors give the model's '" + name + "' (one is '" +
                            from + "')");
  };
  for (const auto& file : st.files()) {
    auto& names = v->per_file[file];
    for (const auto& key : st.keys_in(file)) {
      // A dropped part stays dropped, computed (dequantized) or not.
      bool drop = false;
      for (const auto& d : view.dropped) drop = drop || key.rfind(d, 0) == 0;
      if (drop) continue;
      if (auto c = by_first_source.find(key); c != by_first_source.end()) {
        claim(c->second->name, key);
        v->computed.emplace(c->second->name, *c->second);
        names.push_back(c->second->name);
        continue;
      }
      if (consumed.count(key)) continue;
      std::string name = key;
      for (const auto& [from, to] : view.renames)
        if (key.rfind(from, 0) == 0) {
          name = to + key.substr(from.size());
          break;
        }
      claim(name, key);
      v->plain.emplace(name, key);
      names.push_back(name);
    }
  }
  Checkpoint c = *this;
  c.view_ = v;
  return c;
}

std::string Checkpoint::stored_name(const std::string& key) const {
  if (!view_) {
    file_of(key);  // throws the not-found message
    return key;
  }
  if (view_->computed.count(key)) return "";
  return view_->first_source(key);
}

bool Checkpoint::is_computed(const std::string& key) const { return view_ && view_->computed.count(key) > 0; }
bool Checkpoint::has_computed() const { return view_ && !view_->computed.empty(); }

std::vector<std::pair<std::string, at::Tensor>> load_state_dict(const std::string& checkpoint_file,
                                                                const DeviceMap* device_map) {
  const Checkpoint ck = Checkpoint::open(checkpoint_file);
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& key : ck.keys()) {
    at::Tensor t = ck.get(key);
    if (device_map) {
      const auto d = device_map->device_of(key);
      if (!d)
        throw DeviceMapError("load_state_dict(" + ck.source() + "): the device map places no module holding '" + key +
                             "'");
      if (d->is_gpu()) t = t.to(d->torch_device());
    }
    out.emplace_back(key, std::move(t));
  }
  return out;
}

}  // namespace flex
