#pragma once
// KVCache: the keys and values of every attention layer seen so far, for
// incremental decoding (Transformers' DynamicCache). A model call that gets
// a cache appends the new keys/values of each layer and attends over all of
// them. It travels through the generic call as a c10 capsule (as_value /
// from_value), so hooks and device alignment pass it through untouched.
#include <flex/hooks/value.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <utility>
#include <vector>

namespace flex {

class KVCache : public torch::CustomClassHolder {
 public:
  KVCache() = default;

  /// Appends `key`/`value` ([B, H_kv, T, D]) to layer `layer` and returns the
  /// whole keys/values of that layer ([B, H_kv, past + T, D]). Throws
  /// ShapeError when batch, heads, head size or dtype differ from what the
  /// layer holds.
  std::pair<at::Tensor, at::Tensor> update(int64_t layer, const at::Tensor& key, const at::Tensor& value);

  /// Tokens held for `layer` (0 when empty; in static mode, the capacity).
  int64_t seq_length(int64_t layer = 0) const;
  int64_t num_layers() const { return static_cast<int64_t>(len_.size()); }
  /// Keys / values of `layer` ([B, H_kv, seq_length, D]); undefined when empty.
  at::Tensor key(int64_t layer) const;
  at::Tensor value(int64_t layer) const;
  /// Forgets everything.
  void clear();

  /// Static mode (the static decode step of generate(cuda_graph), design
  /// decision 51): every layer's buffers become `capacity` slots long (the
  /// tokens held kept in front, the rest zeros), and from then on update()
  /// writes its T keys at the slots `cache_position` ([T] int64, on the
  /// cache's device, read on the device only) with index_copy_ and returns
  /// the whole buffers, so every call has the same shapes and no host scalar
  /// changes between calls. The caller masks the unwritten slots (the
  /// attention mask spans all `capacity` slots). ShapeError when a layer
  /// already holds more than `capacity` tokens.
  void make_static(int64_t capacity, at::Tensor cache_position);
  bool is_static() const { return capacity_ > 0; }
  /// Slots per layer in static mode; 0 otherwise.
  int64_t capacity() const { return capacity_; }
  /// Static mode: the device slots the next update() writes ([T] int64).
  const at::Tensor& cache_position() const { return cache_position_; }

  /// Wraps the cache for Inputs / outputs; from_value returns nullptr for None
  /// and throws flex::ConfigError for any other non-cache value.
  static Value as_value(const c10::intrusive_ptr<KVCache>& cache);
  static c10::intrusive_ptr<KVCache> from_value(const Value& v);

 private:
  std::pair<at::Tensor, at::Tensor> update_static(int64_t layer, const at::Tensor& key, const at::Tensor& value);
  // Per layer: storage with spare capacity along the sequence dim, so a
  // decoding step writes one slice instead of copying the whole history.
  std::vector<at::Tensor> k_, v_;
  std::vector<int64_t> len_;
  int64_t capacity_ = 0;
  at::Tensor cache_position_;
};

}  // namespace flex
