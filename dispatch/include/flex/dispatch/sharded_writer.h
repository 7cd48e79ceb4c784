#pragma once
// Writing a state dict as a sharded safetensors checkpoint, as Transformers'
// save_pretrained(max_shard_size=...) lays it out:
//   model-00001-of-0000N.safetensors ... + model.safetensors.index.json
//   {"metadata": {"total_size": <bytes>}, "weight_map": {name: shard}}  (sorted keys, indent 2)
#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace flex {

struct ShardedCheckpoint {
  std::vector<std::string> files;                 // absolute shard paths, in shard order
  std::map<std::string, std::string> weight_map;  // name -> shard file name
  uint64_t total_size = 0;                        // bytes of unique tensor data
  std::string index_path;                         // empty when a single model.safetensors was written
};

/// Splits `tensors` greedily in the given order (Transformers' shard_checkpoint):
/// a tensor that would push the current shard over `max_shard_size_bytes`
/// starts a new one; a tensor larger than the limit gets a shard of its own;
/// tensors sharing storage with an earlier one join its shard and are counted
/// once in total_size. Returns, per shard, indices into `tensors`.
std::vector<std::vector<size_t>> plan_shards(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                             uint64_t max_shard_size_bytes, uint64_t* total_size = nullptr);

/// Accelerate's shard_checkpoint: the shards `plan_shards` makes, in memory,
/// named after `weights_name` ("model.safetensors" -> model-00001-of-00003.safetensors,
/// "pytorch_model.bin" -> pytorch_model-00001-of-00003.bin), and the index
/// {"metadata": {"total_size"}, "weight_map"}; a single shard keeps
/// `weights_name` and has no index (index is null). Nothing is written.
struct CheckpointShards {
  std::map<std::string, std::vector<std::pair<std::string, at::Tensor>>> shards;  // file name -> tensors
  nlohmann::json index;  // null for a single shard
};
CheckpointShards shard_checkpoint(const std::vector<std::pair<std::string, at::Tensor>>& state_dict,
                                  uint64_t max_shard_size_bytes = 10'000'000'000ull,
                                  const std::string& weights_name = "pytorch_model.bin");

/// Writes the shards and the index into `dir` (created if needed), every file
/// through a temp file + rename, the index last. When everything fits in one
/// shard, writes `model.safetensors` and no index, as save_pretrained does.
/// Stale shards from earlier saves are left alone. Errors as save_safetensors;
/// ConfigError for a zero limit.
ShardedCheckpoint save_sharded_safetensors(const std::string& dir,
                                           const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                           uint64_t max_shard_size_bytes,
                                           const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

}  // namespace flex
