#pragma once
// Sharding declarations (docs/design.md decision 4): how a tensor-parallel
// module's output or parameter is spread over the ranks of its tensor-parallel
// group, so gathering gives the tensor the unsharded module would have produced.
//
//  - Replicated: every rank holds the whole tensor.
//  - Split along `dim`: the dim is a concatenation of `blocks` (fused
//    projections: GPT-2 c_attn = [q|k|v], a fused gate/up = [gate|up]; one
//    block when `blocks` is empty). Every block is cut into one contiguous
//    piece per rank, and rank r holds [block0_r | block1_r | ...]. Gathering
//    re-assembles [block0_0 block0_1 ... | block1_0 block1_1 ...], i.e. [q|k|v],
//    not the interleaved [q0 k0 v0 q1 k1 v1].
//    Pieces are whole multiples of `unit` (a head: head_dim, or GPT-NeoX's
//    per-head [q k v] triple of 3*head_dim). Uneven splits follow
//    numpy.array_split over units: the first (units % ranks) ranks get one
//    unit more. A block of fewer units than ranks is rejected (ShapeError).
//    Key/value heads of grouped-query attention follow the query heads
//    instead (`groups`, one entry per block, 0 = plain): with G query heads
//    per key/value head, rank r holds every key/value head its array_split
//    share of the query heads uses, so a head is replicated on the ranks
//    whose shares cut its group (3 KV heads over tp=2, 2 KV heads over tp=4).
//    Gathering places each rank's heads at their position; replicas agree.
//    On one rank (`owner` >= 0, expert parallelism): rank `owner` holds
//    the whole dim, the others none of it (a zero-length piece).
//  - PartialSum: the whole tensor is the sum of the ranks' tensors (a
//    row-parallel projection before its all-reduce); gathering reduces.
#include <flex/parallel/communicator.h>

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace flex {

struct ShardSpec {
  enum class Kind { Replicated, Split, PartialSum };
  Kind kind = Kind::Replicated;
  int64_t dim = 0;              // Split: the sharded dim (negative counts from the end)
  std::vector<int64_t> blocks;  // Split: whole sizes of fused sub-blocks along dim
  int64_t unit = 1;             // Split: pieces are multiples of this
  std::vector<int64_t> groups;  // Split: per block, query heads per key/value head (0 or empty: plain)
  int owner = -1;               // Split: >= 0: that rank holds all of dim, the others nothing

  static ShardSpec replicated() { return {}; }
  static ShardSpec split(int64_t dim, int64_t unit = 1) { return {Kind::Split, dim, {}, unit, {}}; }
  static ShardSpec fused(int64_t dim, std::vector<int64_t> blocks, int64_t unit = 1, std::vector<int64_t> groups = {}) {
    return {Kind::Split, dim, std::move(blocks), unit, std::move(groups)};
  }
  /// `width` features of key/value heads (of `unit` features each) following
  /// the array_split of `group` times as many query heads.
  static ShardSpec kv_heads(int64_t dim, int64_t width, int64_t unit, int64_t group) {
    return {Kind::Split, dim, {width}, unit, {group}};
  }
  /// All of `dim` on rank `owner`, none of it elsewhere (a whole expert per rank).
  static ShardSpec on_rank(int64_t dim, int owner) { return {Kind::Split, dim, {}, 1, {}, owner}; }
  static ShardSpec partial_sum() { return {Kind::PartialSum, 0, {}, 1, {}}; }
  /// GPT-NeoX's query_key_value: the dim is num_heads consecutive [q k v]
  /// triples of `per_head` (= 3*head_dim) features; ranks hold whole heads,
  /// so the pieces are contiguous and gathering is a concatenation.
  static ShardSpec interleaved_heads(int64_t dim, int64_t per_head) { return split(dim, per_head); }

  bool is_split() const { return kind == Kind::Split; }
  bool is_partial_sum() const { return kind == Kind::PartialSum; }
  bool is_replicated() const { return kind == Kind::Replicated; }
  /// "split(dim=-1, blocks=[64,64,64], unit=16)", "partial_sum", "replicated".
  std::string describe() const;
  bool operator==(const ShardSpec& o) const {
    return kind == o.kind && dim == o.dim && blocks == o.blocks && unit == o.unit && groups == o.groups &&
           owner == o.owner;
  }
};

/// One contiguous range along the sharded dim.
struct Range {
  int64_t start = 0, length = 0;
};

/// Rank `rank`'s range inside a block of `block_len` (multiple of `unit`), of `size` ranks.
Range piece_range(int64_t block_len, int64_t unit, int rank, int size);
/// The key/value heads (units) of a block of `block_len` that rank `rank`'s
/// share of group * (block_len / unit) query heads uses.
Range group_range(int64_t block_len, int64_t unit, int64_t group, int rank, int size);

/// Rank `rank`'s ranges in a whole of `whole_len` along the dim, one per block, in whole coordinates.
std::vector<Range> shard_ranges(const ShardSpec& spec, int64_t whole_len, int rank, int size);

/// This rank's piece of `whole`. Without fused blocks it is a view (no copy):
/// slicing a memory-mapped checkpoint tensor reads only this rank's bytes.
/// PartialSum: rank 0 gets `whole`, the others zeros (the pieces sum to it).
at::Tensor shard_of(const ShardSpec& spec, const at::Tensor& whole, int rank, int size);

/// The whole tensor from every rank's piece (in rank order), inverse of shard_of.
/// Pieces whose sizes do not fit the spec give ShapeError naming the rank.
at::Tensor assemble(const ShardSpec& spec, const std::vector<at::Tensor>& pieces);

/// The whole tensor on `root` (an undefined tensor on the other ranks):
/// gather + assemble for Split, reduce for PartialSum, no communication for Replicated.
at::Tensor gather_whole(const ShardSpec& spec, const at::Tensor& local, Communicator& comm, int root = 0);

/// The whole tensor on every rank.
at::Tensor all_gather_whole(const ShardSpec& spec, const at::Tensor& local, Communicator& comm);

}  // namespace flex
