#pragma once
// Read-ahead of offloaded blocks (design decision 41). While block i of a
// dispatched model computes, a reader thread owned by the prefetcher makes
// the weights of the next `depth` offloaded blocks ready: disk blocks are
// read from the offload folder / safetensors file into host buffers (pinned
// when the execution device is CUDA), CPU-resident blocks of a CUDA model
// (kept pinned from the start) are copied on a side stream, an event
// recorded after the copy that the compute stream waits on. Values are the
// stored bytes, so outputs are bit-equal to no prefetch.
#include <flex/hooks/module.h>

#include <cstdint>
#include <memory>
#include <optional>

namespace flex {

class BlockPrefetcher;

/// What the prefetcher did (cumulative).
struct PrefetchStats {
  int depth = 0;
  int64_t blocks = 0;             ///< offloaded blocks it manages
  int64_t blocks_prefetched = 0;  ///< block reads completed ahead by the reader thread
  int64_t bytes_prefetched = 0;
  double read_seconds = 0;        ///< reader-thread time spent in those reads
  int64_t hits = 0;               ///< tensors served from a prefetched block
  int64_t misses = 0;             ///< tensors read on the calling thread (not prefetched)
  int64_t waits = 0;              ///< times the calling thread waited for a read in flight
};

/// Turns on read-ahead for the offloaded blocks of `model` (dispatched by
/// dispatch_model with offload hooks; blocks are its device map's cpu/disk
/// entries, in call order). depth 0, or a model with fewer than two
/// offloaded blocks: nothing changes and null is returned. The prefetcher
/// lives as long as the model's hooks; its thread is joined when it goes.
/// A read that fails in the thread is rethrown, with its type, by the
/// forward that needs that block.
std::shared_ptr<BlockPrefetcher> enable_block_prefetch(Module& model, int depth);

/// The statistics of the prefetcher attached to `model`, if any.
std::optional<PrefetchStats> block_prefetch_stats(Module& model);

}  // namespace flex
