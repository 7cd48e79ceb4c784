#include <flex/dispatch/atomic_file.h>
#include <flex/dispatch/dtypes.h>
#include <flex/dispatch/safetensors.h>
#include <flex/flexcore/streaming_sink.h>
#include <flex/hooks/errors.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <iostream>

namespace fs = std::filesystem;

namespace flex {

namespace {

constexpr const char* kFirst = "flexmodel.first_forward";
constexpr const char* kEnd = "flexmodel.end_forward";

std::string shard_name(size_t i) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "shard-%05zu.safetensors", i);
  return buf;
}

// "shard-<digits>.safetensors"; returns the number or -1.
long long shard_number(const std::string& n) {
  const std::string pre = "shard-", suf = ".safetensors";
  if (n.size() <= pre.size() + suf.size() || n.rfind(pre, 0) != 0 ||
      n.compare(n.size() - suf.size(), suf.size(), suf) != 0)
    return -1;
  const std::string digits = n.substr(pre.size(), n.size() - pre.size() - suf.size());
  if (digits.empty() || digits.size() > 12 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

struct ScannedShard {
  std::string path;
  std::shared_ptr<SafetensorsFile> file;
  int64_t first, end;
};

int64_t parse_meta(const SafetensorsFile& f, const char* key) {
  auto it = f.metadata().find(key);
  if (it == f.metadata().end())
    throw FileFormatError(f.path() + ": capture shard lacks metadata '" + key + "'");
  try {
    return std::stoll(it->second);
  } catch (const std::exception&) {
    throw FileFormatError(f.path() + ": capture shard metadata '" + key + "' is not a number: " + it->second);
  }
}

// Complete shards of `dir` in order, checked to cover forwards [0, end) without gaps.
std::vector<ScannedShard> scan_shards(const std::string& dir, bool remove_temps) {
  std::vector<std::pair<long long, std::string>> numbered;
  for (const auto& ent : fs::directory_iterator(dir)) {
    const std::string n = ent.path().filename().string();
    if (remove_temps && n.find(".tmp.") != std::string::npos) {
      std::error_code ec;
      fs::remove(ent.path(), ec);  // a write that never committed
    } else if (shard_number(n) >= 0) {
      numbered.emplace_back(shard_number(n), n);
    }
  }
  std::sort(numbered.begin(), numbered.end());
  std::vector<std::string> names;
  for (auto& p : numbered) names.push_back(p.second);
  std::vector<ScannedShard> out;
  int64_t expect = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] != shard_name(i))
      throw FileFormatError(dir + ": capture shards are not numbered consecutively: expected " + shard_name(i) +
                            ", found " + names[i]);
    ScannedShard s;
    s.path = (fs::path(dir) / names[i]).string();
    s.file = SafetensorsFile::open(s.path);
    s.first = parse_meta(*s.file, kFirst);
    s.end = parse_meta(*s.file, kEnd);
    if (s.first != expect || s.end < s.first)
      throw FileFormatError(s.path + ": holds forwards [" + std::to_string(s.first) + ", " + std::to_string(s.end) +
                            ") but the previous shards end at forward " + std::to_string(expect));
    expect = s.end;
    out.push_back(std::move(s));
  }
  return out;
}

std::pair<int64_t, std::string> split_name(const std::string& path, const std::string& name) {
  const size_t slash = name.find('/');
  if (slash == std::string::npos || slash == 0)
    throw FileFormatError(path + ": tensor '" + name + "' is not named <forward>/<key>");
  try {
    return {std::stoll(name.substr(0, slash)), name.substr(slash + 1)};
  } catch (const std::exception&) {
    throw FileFormatError(path + ": tensor '" + name + "' does not start with a forward number");
  }
}

}  // namespace

std::string capture_tensor_name(int64_t forward, const std::string& key) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%08lld/", static_cast<long long>(forward));
  return buf + key;
}

StreamingSink::StreamingSink(std::string dir, StreamingSinkOptions options)
    : dir_(std::move(dir)), options_(options) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_)) throw IOError(dir_ + ": cannot create capture directory: " + ec.message());
  auto existing = scan_shards(dir_, /*remove_temps=*/options_.resume);
  if (!existing.empty() && !options_.resume)
    throw ConfigError(dir_ + ": already holds a capture (" + std::to_string(existing.size()) +
                      " shards); resume it or choose an empty directory");
  for (const auto& s : existing) {
    Shard sh{fs::path(s.path).filename().string(), s.first, s.end, {}, {}};
    for (const auto& n : s.file->names()) {
      sh.tensors.emplace_back(n, s.file->info(n).shape);
      sh.dtypes.push_back(s.file->info(n).dtype_name);
    }
    shards_.push_back(std::move(sh));
    done_ = s.end;
  }
}

StreamingSink::~StreamingSink() {
  try {
    flush();
  } catch (const std::exception& e) {
    std::cerr << "flexmodel: could not flush captures to " << dir_ << ": " << e.what() << "\n";
  }
}

void StreamingSink::write(const std::string& key, int64_t, const at::Tensor& t) {
  int& calls = calls_this_forward_[key];
  const std::string stored = calls == 0 ? key : key + "@" + std::to_string(calls);
  ++calls;
  buffer_.emplace_back(capture_tensor_name(forwards_done(), stored), t);
  buffered_bytes_ += t.numel() * t.element_size();
}

void StreamingSink::end_forward(int64_t) {
  complete_entries_ = buffer_.size();
  ++buffered_forwards_;
  calls_this_forward_.clear();
  if (buffered_bytes_ >= options_.max_shard_bytes) flush();
}

void StreamingSink::flush() {
  if (buffered_forwards_ == 0) return;
  std::vector<std::pair<std::string, at::Tensor>> tensors(buffer_.begin(), buffer_.begin() + complete_entries_);
  const int64_t end = done_ + static_cast<int64_t>(buffered_forwards_);
  Shard sh{shard_name(shards_.size()), done_, end, {}, {}};
  save_safetensors((fs::path(dir_) / sh.file).string(), tensors,
                   {{kFirst, std::to_string(done_)}, {kEnd, std::to_string(end)}});
  for (const auto& kv : tensors) {
    sh.tensors.emplace_back(kv.first, kv.second.sizes().vec());
    // The safetensors name ("F32"), as a resumed capture reads it back from the shards.
    sh.dtypes.push_back(safetensors_dtype_name(kv.second.scalar_type()));
  }
  shards_.push_back(std::move(sh));
  done_ = end;
  buffer_.erase(buffer_.begin(), buffer_.begin() + complete_entries_);
  buffered_bytes_ = 0;
  for (const auto& kv : buffer_) buffered_bytes_ += kv.second.numel() * kv.second.element_size();
  buffered_forwards_ = 0;
  complete_entries_ = 0;
  write_index();
}

void StreamingSink::write_index() {
  nlohmann::json j;
  j["format"] = "flexmodel-capture";
  j["version"] = 1;
  j["forwards"] = done_;
  j["shards"] = nlohmann::json::array();
  j["entries"] = nlohmann::json::array();
  for (const auto& s : shards_) {
    j["shards"].push_back({{"file", s.file}, {"first_forward", s.first}, {"end_forward", s.end}});
    for (size_t i = 0; i < s.tensors.size(); ++i) {
      auto [fwd, key] = split_name(s.file, s.tensors[i].first);
      j["entries"].push_back({{"forward", fwd},
                              {"key", key},
                              {"shape", s.tensors[i].second},
                              {"dtype", s.dtypes[i]},
                              {"shard", s.file},
                              {"tensor", s.tensors[i].first}});
    }
  }
  write_file_atomic((fs::path(dir_) / "index.json").string(), j.dump(1));
}

CaptureReader::CaptureReader(const std::string& dir) {
  if (!fs::is_directory(dir)) throw IOError(dir + ": no such capture directory");
  for (const auto& s : scan_shards(dir, /*remove_temps=*/false)) {
    for (const auto& n : s.file->names()) {
      auto [fwd, key] = split_name(s.path, n);
      entries_[{fwd, key}] = Loc{files_.size(), n};
    }
    files_.push_back(s.file);
    num_forwards_ = s.end;
  }
}

std::vector<std::string> CaptureReader::keys() const {
  std::set<std::string> k;
  for (const auto& e : entries_) k.insert(e.first.second);
  return {k.begin(), k.end()};
}

bool CaptureReader::contains(int64_t forward, const std::string& key) const {
  return entries_.count({forward, key}) > 0;
}

at::Tensor CaptureReader::get(int64_t forward, const std::string& key) const {
  auto it = entries_.find({forward, key});
  if (it == entries_.end())
    throw NotFoundError("capture has no '" + key + "' in forward " + std::to_string(forward) + " (" +
                        std::to_string(num_forwards_) + " forwards)");
  return files_[it->second.shard]->get(it->second.tensor);
}

std::vector<at::Tensor> CaptureReader::all(const std::string& key) const {
  std::vector<at::Tensor> out;
  for (int64_t f = 0; f < num_forwards_; ++f)
    if (contains(f, key)) out.push_back(get(f, key));
  return out;
}

}  // namespace flex
