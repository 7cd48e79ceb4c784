#include <flex/parallel/shard_spec.h>

#include <ATen/ATen.h>

#include <sstream>

namespace flex {

namespace {

std::string shape_str(at::IntArrayRef s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? "," : "") << s[i];
  o << "]";
  return o.str();
}

int64_t norm_dim(const ShardSpec& spec, int64_t ndim) {
  const int64_t d = spec.dim < 0 ? spec.dim + ndim : spec.dim;
  if (d < 0 || d >= ndim) {
    throw ShapeError("shard spec " + spec.describe() + " does not fit a tensor of " + std::to_string(ndim) + " dims");
  }
  return d;
}

// The whole sizes of the blocks along the dim.
std::vector<int64_t> block_lens(const ShardSpec& spec, int64_t whole_len) {
  if (spec.blocks.empty()) return {whole_len};
  int64_t sum = 0;
  for (int64_t b : spec.blocks) sum += b;
  if (sum != whole_len) {
    throw ShapeError("shard spec " + spec.describe() + ": the blocks add up to " + std::to_string(sum) +
                     " but the tensor has " + std::to_string(whole_len) + " along the sharded dim");
  }
  return spec.blocks;
}

void check_size(int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw ConfigError("rank " + std::to_string(rank) + " is not in a group of " + std::to_string(size));
  }
}

}  // namespace

std::string ShardSpec::describe() const {
  switch (kind) {
    case Kind::Replicated: return "replicated";
    case Kind::PartialSum: return "partial_sum";
    case Kind::Split: break;
  }
  std::ostringstream s;
  s << "split(dim=" << dim;
  if (!blocks.empty()) s << ", blocks=" << shape_str(blocks);
  if (unit != 1) s << ", unit=" << unit;
  if (!groups.empty()) s << ", kv_groups=" << shape_str(groups);
  if (owner >= 0) s << ", on_rank=" << owner;
  s << ")";
  return s.str();
}

Range piece_range(int64_t block_len, int64_t unit, int rank, int size) {
  check_size(rank, size);
  if (unit < 1) throw ConfigError("shard unit must be >= 1, got " + std::to_string(unit));
  if (block_len % unit != 0) {
    throw ShapeError("cannot shard a block of " + std::to_string(block_len) + " into units of " +
                     std::to_string(unit));
  }
  const int64_t units = block_len / unit;
  if (units < size) {
    throw ShapeError("cannot shard a block of " + std::to_string(units) + " unit(s) of " + std::to_string(unit) +
                     " over " + std::to_string(size) + " ranks: some ranks would get nothing");
  }
  const int64_t base = units / size, rem = units % size;
  const int64_t start = rank * base + std::min<int64_t>(rank, rem);
  const int64_t len = base + (rank < rem ? 1 : 0);
  return {start * unit, len * unit};
}

Range group_range(int64_t block_len, int64_t unit, int64_t group, int rank, int size) {
  if (group < 1) throw ConfigError("a key/value group must be >= 1, got " + std::to_string(group));
  if (unit < 1 || block_len % unit != 0)
    throw ShapeError("cannot cut a block of " + std::to_string(block_len) + " into heads of " + std::to_string(unit));
  const Range q = piece_range(block_len / unit * group, 1, rank, size);
  const int64_t first = q.start / group, last = (q.start + q.length - 1) / group;
  return {first * unit, (last - first + 1) * unit};
}

std::vector<Range> shard_ranges(const ShardSpec& spec, int64_t whole_len, int rank, int size) {
  if (!spec.is_split()) throw ConfigError("shard_ranges needs a split spec, got " + spec.describe());
  std::vector<Range> out;
  int64_t offset = 0;
  const auto lens = block_lens(spec, whole_len);
  if (spec.owner >= 0) {
    check_size(spec.owner, size);
    check_size(rank, size);
    for (int64_t b : lens) {
      out.push_back({offset, rank == spec.owner ? b : 0});
      offset += b;
    }
    return out;
  }
  if (!spec.groups.empty() && spec.groups.size() != lens.size())
    throw ConfigError("shard spec " + spec.describe() + ": one kv group per block is needed");
  for (size_t i = 0; i < lens.size(); ++i) {
    const int64_t b = lens[i];
    const int64_t g = spec.groups.empty() ? 0 : spec.groups[i];
    Range r = g > 0 ? group_range(b, spec.unit, g, rank, size) : piece_range(b, spec.unit, rank, size);
    r.start += offset;
    out.push_back(r);
    offset += b;
  }
  return out;
}

at::Tensor shard_of(const ShardSpec& spec, const at::Tensor& whole, int rank, int size) {
  check_size(rank, size);
  if (!whole.defined()) throw ShapeError("shard_of(" + spec.describe() + "): undefined tensor");
  switch (spec.kind) {
    case ShardSpec::Kind::Replicated: return whole;
    case ShardSpec::Kind::PartialSum: return rank == 0 ? whole : at::zeros_like(whole);
    case ShardSpec::Kind::Split: break;
  }
  const int64_t d = norm_dim(spec, whole.dim());
  const auto ranges = shard_ranges(spec, whole.size(d), rank, size);
  if (ranges.size() == 1) return whole.narrow(d, ranges[0].start, ranges[0].length);
  std::vector<at::Tensor> parts;
  for (const Range& r : ranges) parts.push_back(whole.narrow(d, r.start, r.length));
  return at::cat(parts, d);
}

at::Tensor assemble(const ShardSpec& spec, const std::vector<at::Tensor>& pieces) {
  if (pieces.empty()) throw ConfigError("assemble(" + spec.describe() + "): no pieces");
  const int size = static_cast<int>(pieces.size());
  for (int r = 0; r < size; ++r) {
    if (!pieces[r].defined()) throw ShapeError("assemble(" + spec.describe() + "): rank " + std::to_string(r) + "'s piece is undefined");
  }
  if (spec.is_replicated()) return pieces[0];
  if (spec.is_partial_sum()) {
    at::Tensor sum = pieces[0].clone();
    for (int r = 1; r < size; ++r) {
      if (!pieces[r].sizes().equals(pieces[0].sizes())) {
        throw ShapeError("assemble(partial_sum): rank " + std::to_string(r) + " holds " + shape_str(pieces[r].sizes()) +
                         " but rank 0 holds " + shape_str(pieces[0].sizes()));
      }
      sum.add_(pieces[r]);
    }
    return sum;
  }
  const int64_t d = norm_dim(spec, pieces[0].dim());
  int64_t whole_len = 0;
  for (int r = 0; r < size; ++r) {
    const auto& p = pieces[r];
    bool ok = p.dim() == pieces[0].dim();
    for (int64_t i = 0; ok && i < p.dim(); ++i) ok = i == d || p.size(i) == pieces[0].size(i);
    if (!ok) {
      throw ShapeError("assemble(" + spec.describe() + "): rank " + std::to_string(r) + " holds " +
                       shape_str(p.sizes()) + " but rank 0 holds " + shape_str(pieces[0].sizes()) +
                       " (only dim " + std::to_string(d) + " may differ)");
    }
    whole_len += p.size(d);
  }
  if (!spec.blocks.empty()) {
    whole_len = 0;
    for (int64_t b : spec.blocks) whole_len += b;
  }
  // Where every rank's blocks sit inside its piece, checked against the spec.
  std::vector<std::vector<Range>> ranges(size);
  for (int r = 0; r < size; ++r) {
    ranges[r] = shard_ranges(spec, whole_len, r, size);
    int64_t expect = 0;
    for (const Range& g : ranges[r]) expect += g.length;
    if (pieces[r].size(d) != expect) {
      throw ShapeError("assemble(" + spec.describe() + "): rank " + std::to_string(r) + " holds " +
                       std::to_string(pieces[r].size(d)) + " along dim " + std::to_string(d) + ", expected " +
                       std::to_string(expect) + " for a whole of " + std::to_string(whole_len) + " over " +
                       std::to_string(size) + " ranks");
    }
  }
  const size_t nblocks = ranges[0].size();
  bool overlapping = false;
  for (int64_t g : spec.groups) overlapping = overlapping || g > 0;
  if (overlapping) {
    // Replicated key/value heads: place every rank's ranges (replicas agree).
    std::vector<int64_t> shape = pieces[0].sizes().vec();
    shape[d] = whole_len;
    at::Tensor whole = at::empty(shape, pieces[0].options());
    for (int r = 0; r < size; ++r) {
      int64_t offset = 0;
      for (size_t b = 0; b < nblocks; ++b) {
        whole.narrow(d, ranges[r][b].start, ranges[r][b].length).copy_(pieces[r].narrow(d, offset, ranges[r][b].length));
        offset += ranges[r][b].length;
      }
    }
    return whole;
  }
  std::vector<at::Tensor> parts;
  for (size_t b = 0; b < nblocks; ++b) {
    for (int r = 0; r < size; ++r) {
      int64_t offset = 0;
      for (size_t k = 0; k < b; ++k) offset += ranges[r][k].length;
      parts.push_back(pieces[r].narrow(d, offset, ranges[r][b].length));
    }
  }
  return at::cat(parts, d);
}

at::Tensor gather_whole(const ShardSpec& spec, const at::Tensor& local, Communicator& comm, int root) {
  switch (spec.kind) {
    case ShardSpec::Kind::Replicated: return comm.rank() == root ? local : at::Tensor();
    case ShardSpec::Kind::PartialSum: return comm.reduce(local, root, ReduceOp::Sum);
    case ShardSpec::Kind::Split: break;
  }
  auto pieces = comm.gather(local, root);
  if (comm.rank() != root) return {};
  return assemble(spec, pieces);
}

at::Tensor all_gather_whole(const ShardSpec& spec, const at::Tensor& local, Communicator& comm) {
  switch (spec.kind) {
    case ShardSpec::Kind::Replicated: return local;
    case ShardSpec::Kind::PartialSum: {
      at::Tensor t = local.detach().clone();
      comm.all_reduce(t, ReduceOp::Sum);
      return t;
    }
    case ShardSpec::Kind::Split: break;
  }
  return assemble(spec, comm.all_gather(local));
}

}  // namespace flex
