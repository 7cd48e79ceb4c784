#include "flex/dispatch/offload_folder.h"

#include "flex/dispatch/atomic_file.h"
#include "flex/dispatch/dtypes.h"
#include "flex/dispatch/mapped_file.h"
#include "flex/dispatch/safetensors.h"

#include <flex/hooks/errors.h>
#include <flex/hooks/module.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <filesystem>

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace flex {

void OffloadIndex::set(const std::string& name, OffloadEntry entry) {
  for (auto& kv : entries_)
    if (kv.first == name) {
      kv.second = std::move(entry);
      return;
    }
  entries_.emplace_back(name, std::move(entry));
}

const OffloadEntry* OffloadIndex::find(const std::string& name) const {
  for (const auto& kv : entries_)
    if (kv.first == name) return &kv.second;
  return nullptr;
}

void OffloadIndex::update(const OffloadIndex& other) {
  for (const auto& kv : other.entries_) set(kv.first, kv.second);
}

std::string OffloadIndex::to_json() const {
  ojson j = ojson::object();
  for (const auto& [name, e] : entries_) {
    ojson v = ojson::object();
    if (e.in_safetensors()) {  // the key order Transformers writes
      v["safetensors_file"] = e.safetensors_file;
      v["weight_name"] = e.weight_name;
      if (!e.dtype.empty()) v["dtype"] = e.dtype;
    } else {
      v["dtype"] = e.dtype;
      v["shape"] = e.shape;
    }
    j[name] = std::move(v);
  }
  // Python's json.dump: indent 2, ", " -> ",\n", ensure_ascii, no final newline.
  return j.dump(2, ' ', true);
}

OffloadIndex OffloadIndex::parse(const std::string& text, const std::string& path) {
  ojson j;
  try {
    j = ojson::parse(text);
  } catch (const ojson::exception& e) {  // parse_error, and out_of_range for numbers that overflow
    throw FileFormatError("offload index " + path + " is not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw FileFormatError("offload index " + path + " is not a JSON object");
  OffloadIndex idx;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string where = "offload index " + path + ": entry '" + it.key() + "'";
    const ojson& v = *it;
    if (!v.is_object()) throw FileFormatError(where + " is not a JSON object");
    OffloadEntry e;
    if (v.contains("safetensors_file")) {
      if (!v["safetensors_file"].is_string() || !v.contains("weight_name") || !v["weight_name"].is_string())
        throw FileFormatError(where + " needs string \"safetensors_file\" and \"weight_name\"");
      e.safetensors_file = v["safetensors_file"].get<std::string>();
      e.weight_name = v["weight_name"].get<std::string>();
      if (v.contains("dtype")) {
        if (!v["dtype"].is_string()) throw FileFormatError(where + ": \"dtype\" is not a string");
        e.dtype = v["dtype"].get<std::string>();
      }
    } else {
      if (!v.contains("dtype") || !v["dtype"].is_string()) throw FileFormatError(where + " has no string \"dtype\"");
      if (!v.contains("shape") || !v["shape"].is_array()) throw FileFormatError(where + " has no \"shape\" array");
      e.dtype = v["dtype"].get<std::string>();
      for (const auto& d : v["shape"]) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0)
          throw FileFormatError(where + ": shape " + v["shape"].dump() + " is not a list of sizes");
        e.shape.push_back(d.get<int64_t>());
      }
    }
    idx.set(it.key(), std::move(e));
  }
  return idx;
}

void offload_weight(const at::Tensor& weight, const std::string& name, const std::string& folder, OffloadIndex& index) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
    throw ConfigError("cannot offload tensor '" + name + "' to " + folder + ": the name must be a plain file name");
  if (!weight.defined()) throw ConfigError("cannot offload tensor '" + name + "': it is undefined");
  if (weight.is_meta())
    throw UnsupportedError("cannot offload tensor '" + name + "' to " + folder + ": it is on the meta device");
  OffloadEntry e;
  e.dtype = numpy_dtype_name(weight.scalar_type(), "offloading tensor '" + name + "'");
  e.shape = weight.sizes().vec();
  // bfloat16 is written as its int16 bits: the same bytes either way.
  at::Tensor c = weight.to(at::kCPU).contiguous();
  AtomicFile out((fs::path(folder) / (name + ".dat")).string());
  out.write(c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());  // 0-d: one element
  out.commit();
  index.set(name, std::move(e));
}

void save_offload_index(const OffloadIndex& index, const std::string& folder) {
  if (index.empty()) return;
  std::string path = (fs::path(folder) / "index.json").string();
  OffloadIndex merged;
  if (fs::is_regular_file(path)) merged = OffloadIndex::parse(read_file(path), path);
  merged.update(index);
  write_file_atomic(path, merged.to_json());
}

OffloadIndex offload_state_dict(const std::string& dir, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw IOError("cannot create offload folder " + dir + ": " + ec.message());
  OffloadIndex index;
  for (const auto& [name, t] : tensors) offload_weight(t, name, dir, index);
  save_offload_index(index, dir);
  return index;
}

OffloadIndex load_offload_index(const std::string& folder) {
  std::string path = (fs::path(folder) / "index.json").string();
  if (!fs::is_regular_file(path)) throw IOError("offload folder " + folder + " has no index.json");
  return OffloadIndex::parse(read_file(path), path);
}

namespace {

std::string resolve_safetensors(const std::string& folder, const std::string& file) {
  // Accelerate opens the path as given (relative to the working directory);
  // a path relative to the offload folder is accepted as well.
  // error_code overloads: a name the OS refuses (too long) is simply not found.
  std::error_code ec;
  if (fs::path(file).is_absolute() || fs::exists(file, ec)) return file;
  fs::path in_folder = fs::path(folder) / file;
  return fs::exists(in_folder, ec) ? in_folder.string() : file;
}

at::Tensor from_safetensors(const SafetensorsFile& f, const std::string& folder, const std::string& name,
                            const OffloadEntry& e) {
  if (!f.contains(e.weight_name))
    throw NotFoundError("offload folder " + folder + ": entry '" + name + "' points at '" + e.weight_name +
                        "', which is not in " + f.path());
  at::Tensor t = f.get(e.weight_name);
  if (!e.dtype.empty()) {
    at::ScalarType dt = numpy_to_scalar_type(e.dtype, "offload folder " + folder + ": entry '" + name + "'");
    if (dt != t.scalar_type()) t = t.to(dt);
  }
  return t;
}

}  // namespace

at::Tensor load_offloaded_weight(const std::string& folder, const std::string& name, const OffloadEntry& e) {
  if (e.in_safetensors()) {
    auto f = SafetensorsFile::open(resolve_safetensors(folder, e.safetensors_file));
    return from_safetensors(*f, folder, name, e);
  }
  const std::string where = "offload folder " + folder + ": entry '" + name + "'";
  at::ScalarType dt = numpy_to_scalar_type(e.dtype, where);
  std::string path = (fs::path(folder) / (name + ".dat")).string();
  auto file = MappedFile::open(path);
  uint64_t numel = 1;
  for (int64_t s : e.shape) numel *= static_cast<uint64_t>(s);
  uint64_t expect = numel * c10::elementSize(dt);
  if (file->size() != expect)
    throw FileFormatError(where + ": " + path + " has " + std::to_string(file->size()) + " bytes, but " + e.dtype +
                          " of shape " + c10::str(at::IntArrayRef(e.shape)) + " needs " + std::to_string(expect));
  return file->view(0, e.shape, dt);  // shape [] views the single stored element
}

void load_offloaded_weights(Module& model, const OffloadIndex& index, const std::string& folder) {
  for (const auto& [name, e] : index.entries()) set_module_tensor(model, name, load_offloaded_weight(folder, name, e));
}

OffloadFolder OffloadFolder::open(const std::string& folder) {
  OffloadFolder f;
  f.folder_ = folder;
  f.index_ = load_offload_index(folder);
  return f;
}

std::vector<std::string> OffloadFolder::names() const {
  std::vector<std::string> out;
  for (const auto& kv : index_.entries()) out.push_back(kv.first);
  return out;
}

at::Tensor OffloadFolder::get(const std::string& name) const {
  const OffloadEntry* e = index_.find(name);
  if (!e) {
    throw NotFoundError("tensor '" + name + "' is not in offload folder " + folder_ + closest_names_text(name, names()));
  }
  return load_offloaded_weight(folder_, name, *e);
}

}  // namespace flex
