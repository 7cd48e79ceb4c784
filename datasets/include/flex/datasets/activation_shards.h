#pragma once
// Activation datasets on disk: what `flexmodel capture --dataset` writes, for
// training sparse autoencoders, transcoders and probes.
//
// A dataset directory holds
//   dataset.json    what made it: "format": "flexmodel-activations", "version",
//                   the run's settings (model, dataset, context_len, hooks,
//                   positions, exclude_bos, dtype, seed, ...), and "shapes":
//                   each hook's per-token shape. Written before the first
//                   shard; a resumed run must have the same settings.
//   shard-00000.safetensors, shard-00001.safetensors, ...
//                   consecutive numbers, each the tokens of whole batches:
//       "<hook>"     [n, ...]  every hook's activation of each stored token
//                               (the storage dtype: F32, BF16 or F16)
//       "token_ids"  [n] I64   the token at that position
//       "document"   [n] I64   its document (non-empty line / row) in the corpus
//       "position"   [n] I64   its position in that document (0: the BOS)
//       "context"    [n] I64   the context (window of context_len tokens) it was run in
//       "offset"     [n] I64   its position in that context
//     with "__metadata__": flexmodel.first_context / flexmodel.end_context
//     (the contexts [first, end) it holds; a context whose tokens were all
//     left out is still counted) and flexmodel.cursor (JSON: where the next
//     context begins in the corpus). Tokens are in context order, and in
//     offset order inside a context.
// A shard is written under a temporary name and renamed when complete, so
// every shard present is whole; a killed run resumes after the last one.
//
// Reading it in Python needs only `safetensors`:
//
//   import glob, json
//   from safetensors.torch import load_file
//   for path in sorted(glob.glob("acts/shard-*.safetensors")):
//       shard = load_file(path)
//       x = shard["transformer.h.6"]          # [n, 768]
//       ids = shard["token_ids"]
#include <ATen/core/Tensor.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace flex {

class SafetensorsFile;

/// Names of the per-token index tensors of a shard (not usable as hook names).
const std::vector<std::string>& activation_index_names();

struct ActivationShardWriterOptions {
  /// A shard is written once this many bytes are buffered (at a batch boundary).
  uint64_t max_shard_bytes = 256ull << 20;
  /// Batches waiting for the writer thread at most; add() blocks beyond.
  int64_t queue_batches = 2;
  /// Storage dtype of the activations.
  at::ScalarType dtype = at::kFloat;
};

/// The tokens of one batch to store: per-token tensors of the whole batch,
/// flattened to [B*T], and the rows to keep.
struct ActivationBatch {
  int64_t first_context = 0, end_context = 0;
  std::string cursor;  // where the context after end_context begins (ContextCursor JSON)
  /// [B*T] int64 each: token_ids, document, position, context, offset.
  at::Tensor token_ids, document, position, context, offset;
  /// Flat indices into [B*T] of the tokens to store (undefined: all).
  at::Tensor keep;
  /// Per hook, in the manifest's hook order: [B*T, ...] (any device and
  /// floating dtype; read only by the writer thread, which casts and copies).
  std::vector<at::Tensor> activations;
};

/// Writes an activation dataset from a background thread: add() queues a
/// batch and returns while the previous ones are still being copied into the
/// shard buffers (reused from shard to shard) and written.
class ActivationShardWriter {
 public:
  /// `settings` must hold "hooks" (array of names); other fields are the
  /// caller's. A directory with shards resumes: its dataset.json must have
  /// the same settings (ConfigError naming the first field that differs);
  /// leftover temporary files of a killed run are removed.
  ActivationShardWriter(std::string dir, nlohmann::json settings, ActivationShardWriterOptions options = {});
  /// finish(), logging instead of throwing.
  ~ActivationShardWriter();
  ActivationShardWriter(const ActivationShardWriter&) = delete;
  ActivationShardWriter& operator=(const ActivationShardWriter&) = delete;

  /// Contexts stored before this run (0 for a new dataset) and the cursor
  /// the last shard recorded (nullopt for a new dataset).
  int64_t contexts_done() const { return contexts_done_; }
  const std::optional<std::string>& resume_cursor() const { return resume_cursor_; }

  /// Queues a batch (blocks while queue_batches are waiting). ShapeError
  /// naming the hook when an activation is not [B*T, ...] or its per-token
  /// shape differs from the dataset's; an error of the writer thread is
  /// rethrown here.
  void add(ActivationBatch batch);
  /// Writes what is buffered as the last shard and stops the thread; rethrows
  /// the writer thread's error.
  void finish();

  /// Written by this run so far (shards on disk).
  int64_t tokens_written() const;
  uint64_t bytes_written() const;
  const std::string& dir() const { return dir_; }

 private:
  struct State;
  std::string dir_;
  int64_t contexts_done_ = 0;
  std::optional<std::string> resume_cursor_;
  std::shared_ptr<State> state_;
};

/// One shard's tensors, zero-copy views of the mapped file.
struct ActivationShard {
  std::map<std::string, at::Tensor> activations;  // hook -> [n, ...]
  at::Tensor token_ids, document, position, context, offset;  // [n] int64
  int64_t first_context = 0, end_context = 0;
  int64_t size() const { return token_ids.size(0); }
};

/// A batch drawn from an ActivationDataset.
struct ActivationSample {
  std::map<std::string, at::Tensor> activations;
  at::Tensor token_ids, document, position, context, offset;
  int64_t size() const { return token_ids.size(0); }
};

struct ActivationLoaderOptions {
  int64_t batch_tokens = 4096;
  /// false: tokens in dataset order. true: each pass visits the shards in a
  /// random order, mixing the tokens of `shuffle_window` shards at a time.
  bool shuffle = false;
  int64_t shuffle_window = 2;
  uint64_t seed = 0;
  /// Hooks to return (empty: all).
  std::vector<std::string> hooks;
  /// Keep a last batch smaller than batch_tokens.
  bool keep_last = true;
};

class ActivationLoader;

/// Reads an activation dataset directory.
class ActivationDataset {
 public:
  /// IOError for a missing directory; FileFormatError naming the file for a
  /// missing or bad dataset.json, gaps in the shard numbers or contexts.
  explicit ActivationDataset(const std::string& dir);
  const nlohmann::json& settings() const { return settings_; }
  std::vector<std::string> hooks() const;
  size_t num_shards() const { return files_.size(); }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_contexts() const { return num_contexts_; }
  ActivationShard shard(size_t i) const;
  /// Batches over the whole dataset (one pass).
  ActivationLoader loader(ActivationLoaderOptions options = {}) const;

 private:
  std::string dir_;
  nlohmann::json settings_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::vector<int64_t> shard_tokens_;
  int64_t num_tokens_ = 0, num_contexts_ = 0;
};

/// One pass over an ActivationDataset in batches.
class ActivationLoader {
 public:
  ActivationLoader(const ActivationDataset& dataset, ActivationLoaderOptions options);
  /// The next batch; nullopt after the last.
  std::optional<ActivationSample> next();

 private:
  void refill();
  const ActivationDataset* dataset_;
  ActivationLoaderOptions o_;
  std::vector<size_t> shard_order_;
  size_t next_shard_ = 0;
  std::vector<ActivationShard> window_;  // loaded shards
  std::vector<std::pair<int32_t, int64_t>> rows_;  // (window shard, row) still to hand out
  size_t row_pos_ = 0;
  uint64_t rng_;
};

}  // namespace flex
