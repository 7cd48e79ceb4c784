#pragma once
// Dataset-scale capture: a corpus packed into contexts (token_contexts.h)
// runs through a FlexModel batch by batch, and the chosen hooks' per-token
// activations go to an activation dataset (activation_shards.h), written by a
// background thread while the next batch runs.
//
//   flex::FlexModel fm(model);
//   flex::DatasetCaptureOptions o;
//   o.corpus.path = "corpus.jsonl";
//   o.corpus.context_len = 128;
//   o.hooks = {"transformer.h.6"};
//   o.out_dir = "acts";
//   flex::capture_dataset(fm, flex::load_tokenizer(dir), o);
//
// Resumable: started again on the same directory with the same settings, it
// continues after the last complete shard (no token lost or stored twice).
// Memory stays bounded by the shard buffer (max_shard_bytes), the batches
// queued for the writer and the tokenizer's prefetch, whatever the corpus size.
#include <flex/datasets/token_contexts.h>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace flex {

class Communicator;
class FlexModel;
class Tokenizer;

struct DatasetCaptureProgress {
  int64_t contexts = 0;          // done, counting those of earlier runs
  int64_t contexts_total = -1;   // when known (a context limit), else -1
  int64_t tokens_run = 0;        // through the model in this run
  int64_t tokens_stored = 0;     // kept for the shards in this run
  double seconds = 0;            // since this run started
  double corpus_fraction = 0;    // of the corpus read, 0..1
};

/// A per-token tensor the caller derives from each forward (a dictionary's
/// sparse features, say), stored beside the hooks' activations under `name`.
/// take(B, T) runs after every forward, on every rank (it may be collective),
/// and returns [B*T, ...] on the rank that writes (elsewhere: anything):
/// floating tensors are stored in the storage dtype, integer ones as they are.
struct DatasetColumn {
  std::string name;
  std::function<at::Tensor(int64_t B, int64_t T)> take;
};

struct DatasetCaptureOptions {
  TokenContextsOptions corpus;
  /// Modules to capture: each must give one tensor per forward, [B, T, ...]
  /// or [B*T, ...] (ShapeError naming the module otherwise).
  std::vector<std::string> hooks;
  /// Stored after the hooks (hooks and columns may not both be empty).
  std::vector<DatasetColumn> columns;
  std::string out_dir;
  /// Storage dtype of the activations.
  at::ScalarType dtype = at::kFloat;
  /// K > 0: store K positions per context, drawn without replacement from a
  /// generator seeded by (seed, context number), so a resumed run draws the same.
  int64_t random_positions = 0;
  uint64_t seed = 0;
  /// Leave out every token equal to bos_id (ConfigError when bos_id is unset).
  bool exclude_bos = false;
  std::optional<int64_t> bos_id;
  /// Token ids must be below this (0: unchecked); ConfigError naming the dataset otherwise.
  int64_t vocab_size = 0;
  uint64_t max_shard_bytes = 256ull << 20;
  /// Batches waiting for the writer thread at most.
  int64_t write_queue_batches = 2;
  /// Recorded in dataset.json with the settings above (e.g. the model folder).
  nlohmann::json describe = nlohmann::json::object();
  /// Called after every batch on the rank that writes.
  std::function<void(const DatasetCaptureProgress&)> on_progress;
};

struct DatasetCaptureResult {
  int64_t resumed_at = 0;        // contexts stored by earlier runs
  int64_t contexts = 0;          // contexts stored in all
  int64_t tokens_run = 0, tokens_stored = 0;  // in this run
  uint64_t bytes_written = 0;    // in this run
  int64_t tokens_dropped = 0;    // the corpus's last partial context
  double seconds = 0;
};

/// Runs the capture. `tokenizer` is needed for text corpora. With `world`
/// (mpirun, the FlexModel on a mesh), every rank runs the same batches and
/// rank 0, which holds the whole activations, writes; the others return
/// zero counts. The FlexModel's own hooks stay as they are; the capture adds
/// its hooks and removes them before returning.
DatasetCaptureResult capture_dataset(FlexModel& model, std::shared_ptr<const Tokenizer> tokenizer,
                                     const DatasetCaptureOptions& options, Communicator* world = nullptr);

/// The offsets (ascending) of a context that a capture stores: all of them,
/// minus those holding bos_id when exclude_bos, then K drawn at random when
/// random_positions = K > 0. Exposed so a reader can reproduce the choice.
std::vector<int64_t> stored_offsets(const at::Tensor& context_ids, int64_t context_number,
                                    const DatasetCaptureOptions& options);

}  // namespace flex
