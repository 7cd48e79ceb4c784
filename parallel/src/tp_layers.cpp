#include <flex/hooks/empty_init.h>
#include <flex/hooks/shape_text.h>
#include <flex/kernels/linear.h>
#include <flex/parallel/tp_autograd.h>
#include <flex/parallel/tp_layers.h>

#include <ATen/ATen.h>

#include <cmath>

namespace flex {

namespace {

const std::shared_ptr<Communicator>& require_comm(const std::shared_ptr<Communicator>& tp, const std::string& cls) {
  if (!tp) throw ConfigError(cls + ": the tensor-parallel communicator is null");
  return tp;
}

int64_t local_len(const ShardSpec& spec, int64_t whole, const Communicator& tp) {
  int64_t n = 0;
  for (const Range& r : shard_ranges(spec, whole, tp.rank(), tp.size())) n += r.length;
  return n;
}

void init_uniform(at::Tensor& t, int64_t fan_in) {
  if (!t.defined() || t.is_meta()) return;
  at::NoGradGuard guard;
  const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
  t.uniform_(-bound, bound);
}

}  // namespace

// --- ShardedModule -------------------------------------------------------------

ShardedModule::ShardedModule(std::string class_name, std::shared_ptr<Communicator> tp)
    : Module(std::move(class_name)), tp_(std::move(tp)) {
  require_comm(tp_, this->class_name());
}

void ShardedModule::load_shard(const std::string& name, const at::Tensor& whole) {
  const ModuleSharding sh = sharding();
  auto it = sh.params.find(name);
  const auto params = named_parameters(/*recurse=*/false);
  const at::Tensor* cur = params.find(name);
  if (it == sh.params.end() || !cur) {
    std::string known;
    for (const auto& kv : sh.params) known += (known.empty() ? "" : ", ") + kv.first;
    throw NotFoundError(class_name() + " has no sharded parameter '" + name + "' (it has: " + known + ")");
  }
  const auto expect = whole_shape(name);
  if (!whole.defined() || !whole.sizes().equals(expect)) {
    throw ShapeError(class_name() + "." + name + ": the whole tensor has shape " +
                     (whole.defined() ? shape_text(whole.sizes()) : std::string("(undefined)")) +
                     ", the unsharded parameter is " + shape_text(expect));
  }
  at::Tensor piece = shard_of(it->second, whole.detach(), tp_rank(), tp_size());
  const c10::Device device = cur->is_meta() ? whole.device() : cur->device();
  piece = piece.to(device, cur->scalar_type()).contiguous();
  set_tensor(name, piece);
}

// --- ColumnParallelLinear ----------------------------------------------------------

ColumnParallelLinear::ColumnParallelLinear(int64_t in, int64_t out, std::shared_ptr<Communicator> tp, Options o)
    : ShardedModule(o.class_name, std::move(tp)),
      in_features(in),
      out_features(out),
      local_out_features(local_len(ShardSpec::fused(0, o.blocks, o.unit), out, *tp_)),
      options(std::move(o)) {
  const auto wshape = options.conv1d_layout ? std::vector<int64_t>{in, local_out_features}
                                            : std::vector<int64_t>{local_out_features, in};
  add_parameter("weight", weight, new_parameter(wshape, options.tensor_options));
  init_uniform(weight, in);
  if (options.bias) {
    add_parameter("bias", bias, new_parameter({local_out_features}, options.tensor_options));
    init_uniform(bias, in);
  }
}

ShardSpec ColumnParallelLinear::out_spec() const { return ShardSpec::fused(-1, options.blocks, options.unit); }

at::Tensor ColumnParallelLinear::compute_local(const at::Tensor& x) const {
  if (x.dim() == 0 || x.size(-1) != in_features) {
    throw ShapeError(class_name() + ": input has " + std::to_string(x.size(-1)) + " features, expected " +
                     std::to_string(in_features) + " (input shape " + shape_text(x.sizes()) + ")");
  }
  return dense_linear(x, weight, bias, options.conv1d_layout ? WeightLayout::InOut : WeightLayout::OutIn);
}

Value ColumnParallelLinear::forward(Inputs inputs) {
  // Each rank's input gradient covers only its output features: summed in backward.
  at::Tensor local = compute_local(copy_to_tp_region(inputs.tensor(0), tp_));
  if (!options.gather_output) return local;
  return gather_from_tp_region(local, out_spec(), tp_);
}

ModuleSharding ColumnParallelLinear::sharding() const {
  ModuleSharding s;
  s.input = ShardSpec::replicated();
  s.output = options.gather_output ? ShardSpec::replicated() : out_spec();
  s.params["weight"] = ShardSpec::fused(options.conv1d_layout ? 1 : 0, options.blocks, options.unit);
  if (options.bias) s.params["bias"] = ShardSpec::fused(0, options.blocks, options.unit);
  return s;
}

std::vector<int64_t> ColumnParallelLinear::whole_shape(const std::string& name) const {
  if (name == "bias") return {out_features};
  return options.conv1d_layout ? std::vector<int64_t>{in_features, out_features}
                               : std::vector<int64_t>{out_features, in_features};
}

// --- RowParallelLinear ----------------------------------------------------------

RowParallelLinear::RowParallelLinear(int64_t in, int64_t out, std::shared_ptr<Communicator> tp, Options o)
    : ShardedModule(o.class_name, std::move(tp)),
      in_features(in),
      out_features(out),
      local_in_features(local_len(ShardSpec::split(0, o.unit), in, *tp_)),
      options(std::move(o)) {
  const auto wshape = options.conv1d_layout ? std::vector<int64_t>{local_in_features, out}
                                            : std::vector<int64_t>{out, local_in_features};
  add_parameter("weight", weight, new_parameter(wshape, options.tensor_options));
  init_uniform(weight, in);
  if (options.bias) {
    add_parameter("bias", bias, new_parameter({out}, options.tensor_options));
    init_uniform(bias, in);
  }
}

namespace {
void check_row_input(const RowParallelLinear& m, int rank, const at::Tensor& x) {
  if (x.dim() == 0 || x.size(-1) != m.local_in_features) {
    throw ShapeError(m.class_name() + ": rank " + std::to_string(rank) + " input " + shape_text(x.sizes()) +
                     " must end in its slice of " + std::to_string(m.local_in_features) + " of the " +
                     std::to_string(m.in_features) + " input features");
  }
}
}  // namespace

at::Tensor RowParallelLinear::compute_local(const at::Tensor& x) const {
  check_row_input(*this, tp_rank(), x);
  const at::Tensor b = (bias.defined() && tp_rank() == 0) ? bias : at::Tensor();
  return dense_linear(x, weight, b, options.conv1d_layout ? WeightLayout::InOut : WeightLayout::OutIn);
}

Value RowParallelLinear::forward(Inputs inputs) {
  at::Tensor x = inputs.tensor(0);
  if (!options.input_is_parallel) {
    if (x.dim() == 0 || x.size(-1) != in_features) {
      throw ShapeError(class_name() + ": input has " + std::to_string(x.size(-1)) + " features, expected " +
                       std::to_string(in_features) + " (input shape " + shape_text(x.sizes()) + ")");
    }
    x = scatter_to_tp_region(x, ShardSpec::split(-1, options.unit), tp_);
  }
  if (!options.reduce_output) return compute_local(x);
  check_row_input(*this, tp_rank(), x);
  // Bias after the reduction, so it is added exactly once.
  at::Tensor partial =
      dense_linear(x, weight, at::Tensor(), options.conv1d_layout ? WeightLayout::InOut : WeightLayout::OutIn);
  at::Tensor y = reduce_from_tp_region(partial, tp_);
  return bias.defined() ? y + bias : y;
}

ModuleSharding RowParallelLinear::sharding() const {
  ModuleSharding s;
  s.input = options.input_is_parallel ? ShardSpec::split(-1, options.unit) : ShardSpec::replicated();
  s.output = options.reduce_output ? ShardSpec::replicated() : ShardSpec::partial_sum();
  s.params["weight"] = ShardSpec::split(options.conv1d_layout ? 0 : 1, options.unit);
  if (options.bias) s.params["bias"] = ShardSpec::replicated();
  return s;
}

std::vector<int64_t> RowParallelLinear::whole_shape(const std::string& name) const {
  if (name == "bias") return {out_features};
  return options.conv1d_layout ? std::vector<int64_t>{in_features, out_features}
                               : std::vector<int64_t>{out_features, in_features};
}

// --- VocabParallelEmbedding ----------------------------------------------------------

namespace {
Range vocab_range(int64_t num, const std::shared_ptr<Communicator>& tp) {
  require_comm(tp, "VocabParallelEmbedding");
  return piece_range(num, 1, tp->rank(), tp->size());
}
}  // namespace

VocabParallelEmbedding::VocabParallelEmbedding(int64_t num, int64_t dim, std::shared_ptr<Communicator> tp,
                                               Options o)
    : ShardedModule(o.class_name, tp),
      num_embeddings(num),
      embedding_dim(dim),
      vocab_start(vocab_range(num, tp).start),
      vocab_end(vocab_range(num, tp).start + vocab_range(num, tp).length),
      options(std::move(o)) {
  add_parameter("weight", weight, new_parameter({vocab_end - vocab_start, dim}, options.tensor_options));
  if (!weight.is_meta()) {
    at::NoGradGuard guard;
    weight.normal_(0.0, 1.0);
  }
}

at::Tensor VocabParallelEmbedding::compute_local(const at::Tensor& ids) const {
  if (ids.numel() > 0) {
    const int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
    if (lo < 0 || hi >= num_embeddings) {
      throw ShapeError(class_name() + ": token id " + std::to_string(lo < 0 ? lo : hi) +
                       " is outside the vocabulary [0, " + std::to_string(num_embeddings) + ")");
    }
  }
  const at::Tensor outside = (ids < vocab_start).logical_or(ids >= vocab_end);
  const at::Tensor local_ids = (ids - vocab_start).masked_fill(outside, 0);
  return at::embedding(weight, local_ids).masked_fill(outside.unsqueeze(-1), 0);
}

Value VocabParallelEmbedding::forward(Inputs inputs) {
  at::Tensor rows = reduce_from_tp_region(compute_local(inputs.tensor(0)), tp_);
  if (options.scale != 0) rows = rows * at::scalar_tensor(options.scale, at::kFloat).to(weight.scalar_type());
  return rows;
}

ModuleSharding VocabParallelEmbedding::sharding() const {
  ModuleSharding s;
  s.input = ShardSpec::replicated();
  s.output = ShardSpec::replicated();
  s.params["weight"] = ShardSpec::split(0);
  return s;
}

std::vector<int64_t> VocabParallelEmbedding::whole_shape(const std::string&) const {
  return {num_embeddings, embedding_dim};
}

}  // namespace flex
