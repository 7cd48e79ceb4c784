#pragma once
// StreamingSink: captures written to disk as they happen, for activation
// datasets far larger than memory (probes, sparse autoencoders).
//
// Layout of the capture directory:
//   shard-00000.safetensors, shard-00001.safetensors, ...
//       each holds whole forwards only; tensor names are "<forward>/<key>"
//       (forward zero-padded to 8 digits) and "__metadata__" records the
//       forward range {"flexmodel.first_forward", "flexmodel.end_forward"}.
//       A shard is written to a temporary name and renamed, so a shard that
//       exists is complete: the shards themselves are the ground truth.
//   index.json
//       a summary rewritten (atomically) after every shard: forwards done,
//       and per entry {forward, key, shape, dtype, shard, tensor}.
// A module called k times in one forward is stored as key, key@1, ... key@(k-1).
// Memory is bounded by max_shard_bytes plus one forward's captures: a shard
// is flushed at the first forward boundary after the buffer reaches the limit.
// Resuming (the default) after a crash keeps every complete shard, deletes
// leftover temporary files, and continues at the first forward that no shard
// holds; the caller skips inputs [0, forwards_done()).
#include <flex/flexcore/activation_sink.h>

#include <cstdint>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace flex {

class SafetensorsFile;

struct StreamingSinkOptions {
  /// Flush once this many bytes are buffered (at the next forward boundary).
  uint64_t max_shard_bytes = 256ull << 20;
  /// Continue an existing capture in the directory; false requires it empty.
  bool resume = true;
};

class StreamingSink : public ActivationSink {
 public:
  explicit StreamingSink(std::string dir, StreamingSinkOptions options = {});
  /// Flushes what is buffered (complete forwards only).
  ~StreamingSink() override;

  void write(const std::string& key, int64_t forward_index, const at::Tensor& t) override;
  void end_forward(int64_t forward_index) override;
  /// Writes buffered complete forwards now.
  void flush();

  /// Forwards stored on disk or buffered (the next capture belongs to forward number forwards_done()).
  int64_t forwards_done() const { return done_ + static_cast<int64_t>(buffered_forwards_); }
  /// Forwards safely on disk.
  int64_t forwards_on_disk() const { return done_; }
  size_t num_shards() const { return shards_.size(); }
  const std::string& dir() const { return dir_; }

 private:
  void scan_existing();
  void write_index();

  struct Shard {
    std::string file;
    int64_t first, end;
    std::vector<std::pair<std::string, std::vector<int64_t>>> tensors;  // name, shape
    std::vector<std::string> dtypes;
  };
  std::string dir_;
  StreamingSinkOptions options_;
  std::vector<Shard> shards_;
  int64_t done_ = 0;                                       // forwards on disk
  size_t buffered_forwards_ = 0;                           // complete forwards in buffer_
  std::vector<std::pair<std::string, at::Tensor>> buffer_;  // complete forwards, then the current one
  size_t complete_entries_ = 0;                            // entries of buffer_ in complete forwards
  uint64_t buffered_bytes_ = 0;
  std::map<std::string, int> calls_this_forward_;         // a module called twice: key, key@1, ...
};

/// Reads a capture directory written by StreamingSink (from its shards).
class CaptureReader {
 public:
  explicit CaptureReader(const std::string& dir);
  int64_t num_forwards() const { return num_forwards_; }
  /// Every distinct key, sorted.
  std::vector<std::string> keys() const;
  bool contains(int64_t forward, const std::string& key) const;
  /// The capture of `key` in forward `forward` (zero-copy view); NotFoundError otherwise.
  at::Tensor get(int64_t forward, const std::string& key) const;
  /// Every capture of `key`, in forward order.
  std::vector<at::Tensor> all(const std::string& key) const;

 private:
  struct Loc {
    size_t shard;
    std::string tensor;
  };
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::pair<int64_t, std::string>, Loc> entries_;
  int64_t num_forwards_ = 0;
};

/// "<forward>/<key>" as stored in the shards.
std::string capture_tensor_name(int64_t forward, const std::string& key);

}  // namespace flex
