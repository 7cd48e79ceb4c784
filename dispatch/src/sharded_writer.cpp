#include "flex/dispatch/sharded_writer.h"
#include "flex/dispatch/constants.h"

#include "flex/dispatch/atomic_file.h"
#include "flex/dispatch/safetensors.h"

#include <flex/hooks/errors.h>

#include <nlohmann/json.hpp>

#include <c10/core/StorageImpl.h>
#include <cstdio>
#include <filesystem>
#include <unordered_map>

namespace fs = std::filesystem;

namespace flex {

std::vector<std::vector<size_t>> plan_shards(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                             uint64_t max_shard_size_bytes, uint64_t* total_size) {
  if (max_shard_size_bytes == 0) throw ConfigError("max_shard_size must be positive");
  std::vector<std::vector<size_t>> shards(1);
  std::unordered_map<const void*, size_t> storage_shard;
  uint64_t current = 0, total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i].second;
    const void* sid = (t.defined() && t.has_storage() && !t.is_meta()) ? t.storage().unsafeGetStorageImpl() : nullptr;
    if (sid) {
      auto it = storage_shard.find(sid);
      if (it != storage_shard.end()) {  // tied: same shard, counted once
        shards[it->second].push_back(i);
        continue;
      }
    }
    uint64_t size = t.defined() ? static_cast<uint64_t>(t.numel()) * t.element_size() : 0;
    // Only split once the current shard holds something, so an oversized
    // tensor ends up alone (the next tensor sees current > limit).
    if (current + size > max_shard_size_bytes && !shards.back().empty()) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(i);
    current += size;
    total += size;
    if (sid) storage_shard[sid] = shards.size() - 1;
  }
  if (shards.back().empty()) shards.pop_back();
  if (total_size) *total_size = total;
  return shards;
}

CheckpointShards shard_checkpoint(const std::vector<std::pair<std::string, at::Tensor>>& state_dict,
                                  uint64_t max_shard_size_bytes, const std::string& weights_name) {
  uint64_t total = 0;
  const auto plan = plan_shards(state_dict, max_shard_size_bytes, &total);
  CheckpointShards out;
  if (plan.size() <= 1) {
    out.shards[weights_name] = state_dict;
    return out;
  }
  // "model.safetensors" -> "model" + "-00001-of-00003" + ".safetensors"
  const size_t dot = weights_name.find('.');
  const std::string stem = weights_name.substr(0, dot), ext = dot == std::string::npos ? "" : weights_name.substr(dot);
  std::map<std::string, std::string> weight_map;
  for (size_t s = 0; s < plan.size(); ++s) {
    char mid[48];
    std::snprintf(mid, sizeof mid, "-%05zu-of-%05zu", s + 1, plan.size());
    const std::string name = stem + mid + ext;
    auto& shard = out.shards[name];
    for (size_t i : plan[s]) {
      shard.push_back(state_dict[i]);
      weight_map[state_dict[i].first] = name;
    }
  }
  out.index["metadata"]["total_size"] = total;
  out.index["weight_map"] = weight_map;
  return out;
}

ShardedCheckpoint save_sharded_safetensors(const std::string& dir,
                                           const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                           uint64_t max_shard_size_bytes,
                                           const std::map<std::string, std::string>& metadata) {
  ShardedCheckpoint out;
  auto plan = plan_shards(tensors, max_shard_size_bytes, &out.total_size);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw IOError("cannot create checkpoint folder " + dir + ": " + ec.message());
  fs::path root = fs::absolute(dir);
  if (plan.size() <= 1) {
    std::string path = (root / SAFE_WEIGHTS_NAME).string();
    save_safetensors(path, tensors, metadata);
    out.files.push_back(path);
    for (const auto& kv : tensors) out.weight_map[kv.first] = SAFE_WEIGHTS_NAME;
    return out;
  }
  const size_t n = plan.size();
  for (size_t s = 0; s < n; ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, n);
    std::vector<std::pair<std::string, at::Tensor>> shard;
    for (size_t i : plan[s]) {
      shard.push_back(tensors[i]);
      out.weight_map[tensors[i].first] = name;
    }
    std::string path = (root / name).string();
    save_safetensors(path, shard, metadata);
    out.files.push_back(path);
  }
  nlohmann::json index;  // std::map-backed: keys sorted, as sort_keys=True
  index["metadata"]["total_size"] = out.total_size;
  index["weight_map"] = out.weight_map;
  out.index_path = (root / SAFE_WEIGHTS_INDEX_NAME).string();
  write_file_atomic(out.index_path, index.dump(2, ' ', true) + "\n");
  return out;
}

}  // namespace flex
