#include "flex/dispatch/safetensors.h"

#include "flex/dispatch/atomic_file.h"
#include "flex/dispatch/dtypes.h"
#include "flex/dispatch/mapped_file.h"

#include <flex/hooks/errors.h>
#include <flex/hooks/module.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>

namespace flex {
namespace {

using json = nlohmann::json;

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw FileFormatError("safetensors file " + path + ": " + what);
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// A non-negative JSON integer, or -1.
int64_t as_index(const json& j) {
  if (j.is_number_unsigned()) {
    uint64_t v = j.get<uint64_t>();
    return v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? -1 : static_cast<int64_t>(v);
  }
  if (j.is_number_integer()) {
    int64_t v = j.get<int64_t>();
    return v < 0 ? -1 : v;
  }
  return -1;
}

TensorInfo parse_entry(const std::string& path, const std::string& name, const json& e) {
  const std::string where = "tensor '" + name + "'";
  if (!e.is_object()) bad(path, where + ": entry is not a JSON object");
  auto dt = e.find("dtype");
  auto sh = e.find("shape");
  auto off = e.find("data_offsets");
  if (dt == e.end() || !dt->is_string()) bad(path, where + ": missing or non-string \"dtype\"");
  if (sh == e.end() || !sh->is_array()) bad(path, where + ": missing or non-array \"shape\"");
  if (off == e.end() || !off->is_array() || off->size() != 2)
    bad(path, where + ": \"data_offsets\" must be an array [begin, end]");
  TensorInfo info;
  info.dtype_name = dt->get<std::string>();
  int bits = safetensors_dtype_bits(info.dtype_name);
  if (bits == 0) bad(path, where + ": unknown dtype \"" + info.dtype_name + "\"");
  try {
    info.dtype = safetensors_to_scalar_type(info.dtype_name, where);
  } catch (const UnsupportedError&) {
    info.dtype = at::ScalarType::Undefined;  // reported when the tensor is read
  }
  // numel * bits without overflow: keep the product below 2^63.
  unsigned __int128 total_bits = static_cast<unsigned>(bits);
  for (const auto& d : *sh) {
    int64_t v = as_index(d);
    if (v < 0) bad(path, where + ": shape " + sh->dump() + " has a non-integer or negative size");
    info.shape.push_back(v);
    total_bits *= static_cast<uint64_t>(v);
    if (total_bits > (static_cast<unsigned __int128>(1) << 66)) bad(path, where + ": shape " + sh->dump() + " is too large");
  }
  int64_t b = as_index((*off)[0]), en = as_index((*off)[1]);
  if (b < 0 || en < 0) bad(path, where + ": data_offsets " + off->dump() + " are not non-negative integers");
  info.begin = static_cast<uint64_t>(b);
  info.end = static_cast<uint64_t>(en);
  if (info.end < info.begin) bad(path, where + ": data_offsets " + off->dump() + " end before they begin");
  if (total_bits % 8 != 0) bad(path, where + ": " + info.dtype_name + " tensor of shape " + sh->dump() + " does not fill whole bytes");
  uint64_t expect = static_cast<uint64_t>(total_bits / 8);
  if (info.end - info.begin != expect)
    bad(path, where + ": data_offsets " + off->dump() + " hold " + std::to_string(info.end - info.begin) +
                  " bytes but " + info.dtype_name + " shape " + sh->dump() + " needs " + std::to_string(expect));
  return info;
}

std::string json_string(const std::string& s, const std::string& what) {
  try {
    return json(s).dump();
  } catch (const json::exception&) {
    throw ConfigError(what + " \"" + s + "\" is not valid UTF-8");
  }
}

}  // namespace

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->map_ = MappedFile::open(path);
  const uint64_t size = f->map_->size();
  if (size < 8) bad(path, "file is " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  const uint8_t* base = f->map_->data();
  const uint64_t n = read_u64_le(base);
  if (n > kSafetensorsMaxHeader)
    bad(path, "header length " + std::to_string(n) + " exceeds the limit of " + std::to_string(kSafetensorsMaxHeader) + " bytes");
  if (n > size - 8)
    bad(path, "header length " + std::to_string(n) + " goes beyond the end of the file (" + std::to_string(size) + " bytes)");
  f->data_offset_ = 8 + n;
  const char* hp = reinterpret_cast<const char*>(base + 8);
  if (n == 0 || hp[0] != '{') bad(path, "header does not start with '{'");

  // nlohmann keeps the last of duplicate keys silently; the callback sees them all.
  std::set<std::string> seen;
  std::string duplicate;
  json header;
  try {
    header = json::parse(hp, hp + n, [&](int depth, json::parse_event_t ev, json& parsed) {
      if (ev == json::parse_event_t::key && depth == 1) {
        const auto& k = parsed.get_ref<const std::string&>();
        if (!seen.insert(k).second && duplicate.empty()) duplicate = k;
      }
      return true;
    });
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers that overflow
    bad(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!duplicate.empty()) bad(path, "duplicate tensor name '" + duplicate + "' in the header");
  if (!header.is_object()) bad(path, "header is not a JSON object");

  std::vector<std::pair<std::string, TensorInfo>> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) bad(path, "\"__metadata__\" is not a JSON object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) bad(path, "\"__metadata__\" value of '" + m.key() + "' is not a string");
        f->metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    entries.emplace_back(it.key(), parse_entry(path, it.key(), *it));
  }
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    if (a.second.begin != b.second.begin) return a.second.begin < b.second.begin;
    if (a.second.end != b.second.end) return a.second.end < b.second.end;
    return a.first < b.first;
  });
  const uint64_t data_size = size - f->data_offset_;
  uint64_t pos = 0;
  for (const auto& [name, info] : entries) {
    if (info.begin != pos) {
      if (info.begin < pos)
        bad(path, "tensor '" + name + "' at [" + std::to_string(info.begin) + ", " + std::to_string(info.end) +
                      ") overlaps the previous tensor, which ends at " + std::to_string(pos));
      bad(path, "hole in the data: bytes [" + std::to_string(pos) + ", " + std::to_string(info.begin) +
                    ") before tensor '" + name + "' belong to no tensor");
    }
    if (info.end > data_size)
      bad(path, "tensor '" + name + "' at [" + std::to_string(info.begin) + ", " + std::to_string(info.end) +
                    ") is out of range: the data section has " + std::to_string(data_size) + " bytes");
    pos = info.end;
  }
  if (pos != data_size)
    bad(path, "the tensors cover " + std::to_string(pos) + " bytes but the data section has " +
                  std::to_string(data_size) + " bytes");
  for (auto& [name, info] : entries) {
    f->names_.push_back(name);
    f->infos_.emplace(name, std::move(info));
  }
  return f;
}

uint64_t SafetensorsFile::file_size() const { return map_->size(); }

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = infos_.find(name);
  if (it == infos_.end()) {
    throw NotFoundError("tensor '" + name + "' is not in safetensors file " + path_ + closest_names_text(name, names_));
  }
  return it->second;
}

at::Tensor SafetensorsFile::get(const std::string& name) const {
  const TensorInfo& i = info(name);
  if (i.dtype == at::ScalarType::Undefined)
    safetensors_to_scalar_type(i.dtype_name, "tensor '" + name + "' in " + path_);  // throws
  return map_->view(data_offset_ + i.begin, i.shape, i.dtype);
}

std::vector<std::pair<std::string, at::Tensor>> safetensors_order(
    std::vector<std::pair<std::string, at::Tensor>> tensors) {
  std::stable_sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) {
    int ra = safetensors_alignment_rank(safetensors_dtype_name(a.second.scalar_type(), "tensor '" + a.first + "'"));
    int rb = safetensors_alignment_rank(safetensors_dtype_name(b.second.scalar_type(), "tensor '" + b.first + "'"));
    if (ra != rb) return ra < rb;
    return a.first < b.first;  // char_traits<char>: bytewise, like Rust
  });
  return tensors;
}

std::string safetensors_header(const std::vector<std::pair<std::string, at::Tensor>>& sorted,
                               const std::map<std::string, std::string>& metadata) {
  std::string h = "{";
  bool first = true;
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    for (const auto& [k, v] : metadata) {
      if (!first) h += ",";
      first = false;
      h += json_string(k, "metadata key") + ":" + json_string(v, "metadata value");
    }
    h += "}";
    first = false;
  }
  uint64_t offset = 0;
  for (const auto& [name, t] : sorted) {
    if (!first) h += ",";
    first = false;
    const std::string what = "tensor '" + name + "'";
    uint64_t nbytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    h += json_string(name, "tensor name") + ":{\"dtype\":\"" + safetensors_dtype_name(t.scalar_type(), what) +
         "\",\"shape\":[";
    for (int64_t d = 0; d < t.dim(); ++d) {
      if (d) h += ",";
      h += std::to_string(t.size(d));
    }
    h += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + nbytes) + "]}";
    offset += nbytes;
  }
  h += "}";
  h.append((8 - h.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + h;
}

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::set<std::string> names;
  for (const auto& [name, t] : tensors) {
    const std::string what = "saving " + path + ": tensor '" + name + "'";
    if (name == "__metadata__") throw ConfigError(what + ": the name is reserved for metadata");
    if (!names.insert(name).second) throw ConfigError(what + " is given twice");
    if (!t.defined()) throw ConfigError(what + " is undefined");
    if (t.is_meta()) throw UnsupportedError(what + " is on the meta device and has no data to save");
    safetensors_dtype_name(t.scalar_type(), what);
  }
  auto sorted = safetensors_order(tensors);
  std::string header = safetensors_header(sorted, metadata);
  AtomicFile out(path);
  out.write(header);
  for (const auto& [name, t] : sorted) {
    at::Tensor c = t.to(at::kCPU).contiguous();
    out.write(c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
  }
  out.commit();
}

}  // namespace flex
