#include <flex/parallel/communicator.h>
#include <flex/parallel/local_communicator.h>
#include <flex/parallel/mpi_communicator.h>

#include <ATen/ATen.h>

#include <cstdlib>
#include <mutex>

namespace flex {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

double resolve_timeout(const CommOptions& opts) {
  if (opts.timeout_s > 0) return opts.timeout_s;
  if (const char* env = std::getenv("FLEX_COMM_TIMEOUT")) {
    char* end = nullptr;
    const double v = std::strtod(env, &end);
    if (end != env && v > 0) return v;
    throw ConfigError(std::string("FLEX_COMM_TIMEOUT must be a positive number of seconds, got '") + env + "'");
  }
  return 300.0;
}

bool is_supported_comm_dtype(at::ScalarType t) {
  switch (t) {
    case at::kDouble: case at::kFloat: case at::kHalf: case at::kBFloat16:
    case at::kLong: case at::kInt: case at::kShort: case at::kChar: case at::kByte:
    case at::kBool:
      return true;
    default:
      return false;
  }
}

std::shared_ptr<Communicator> Communicator::create_group(const std::vector<int>& ranks,
                                                         const std::string& name) {
  // Every rank must pass the same list: compare a fingerprint first so a
  // disagreement is the same ConfigError everywhere, not a silent misgrouping.
  std::vector<int64_t> fp{static_cast<int64_t>(ranks.size())};
  for (int r : ranks) fp.push_back(r);
  int64_t h = 1469598103934665603LL;
  for (int64_t v : fp) h = (h ^ v) * 1099511628211LL;
  const auto all = all_gather(at::tensor({h}, at::kLong));
  for (int r = 0; r < size(); ++r) {
    if (all[r].item<int64_t>() != h) {
      throw ConfigError("create_group('" + name + "') on communicator '" + this->name() +
                        "': rank " + std::to_string(r) + " passed a different rank list than rank " +
                        std::to_string(rank()));
    }
  }
  int pos = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= size()) {
      throw ConfigError("create_group('" + name + "'): rank " + std::to_string(ranks[i]) +
                        " is outside communicator '" + this->name() + "' of size " + std::to_string(size()));
    }
    for (size_t j = 0; j < i; ++j) {
      if (ranks[j] == ranks[i]) {
        throw ConfigError("create_group('" + name + "'): rank " + std::to_string(ranks[i]) + " listed twice");
      }
    }
    if (ranks[i] == rank()) pos = static_cast<int>(i);
  }
  return split(pos >= 0 ? 0 : -1, pos, name);
}

bool launched_by_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
}

bool mpi_available() {
#ifdef FLEX_HAVE_MPI
  return true;
#else
  return false;
#endif
}

std::shared_ptr<Communicator> make_world_communicator(const CommOptions& opts) {
  static std::mutex mu;
  static std::shared_ptr<Communicator> world;
  std::lock_guard<std::mutex> lock(mu);
  if (world) return world;
#ifdef FLEX_HAVE_MPI
  if (launched_by_mpirun()) {
    world = make_mpi_world_communicator(opts);
    return world;
  }
#endif
  world = std::make_shared<LocalCommunicator>("world");
  return world;
}

// --- LocalCommunicator -----------------------------------------------------

void LocalCommunicator::check_rank(int r, const char* what) const {
  if (r != 0) {
    throw ConfigError(std::string(what) + " on communicator '" + name_ + "' of size 1: rank " +
                      std::to_string(r) + " does not exist");
  }
}

void LocalCommunicator::check_dtype(const at::Tensor& t, const char* what) const {
  if (!t.defined()) throw ShapeError(std::string(what) + " on communicator '" + name_ + "': undefined tensor");
  if (!is_supported_comm_dtype(t.scalar_type())) {
    throw UnsupportedError(std::string(what) + " on communicator '" + name_ + "': dtype " +
                           std::string(c10::toString(t.scalar_type())) + " is not supported");
  }
}

void LocalCommunicator::broadcast(at::Tensor& t, int root) {
  check_rank(root, "broadcast");
  check_dtype(t, "broadcast");
}

void LocalCommunicator::send(const at::Tensor& t, int dst, int tag) {
  check_rank(dst, "send");
  check_dtype(t, "send");
  queued_[tag].push_back(t.detach().clone());
}

at::Tensor LocalCommunicator::recv(int src, int tag) {
  check_rank(src, "recv");
  auto it = queued_.find(tag);
  if (it == queued_.end() || it->second.empty()) {
    throw CommError("recv(src 0, tag " + std::to_string(tag) + ") on communicator '" + name_ +
                    "' of size 1: nothing was sent, the call would wait forever");
  }
  at::Tensor t = it->second.front();
  it->second.pop_front();
  return t;
}

std::vector<at::Tensor> LocalCommunicator::gather(const at::Tensor& t, int root) {
  check_rank(root, "gather");
  check_dtype(t, "gather");
  return {t.detach().clone()};
}

std::vector<at::Tensor> LocalCommunicator::all_gather(const at::Tensor& t) {
  check_dtype(t, "all_gather");
  return {t.detach().clone()};
}

void LocalCommunicator::all_reduce(at::Tensor& t, ReduceOp) { check_dtype(t, "all_reduce"); }

at::Tensor LocalCommunicator::reduce(const at::Tensor& t, int root, ReduceOp) {
  check_rank(root, "reduce");
  check_dtype(t, "reduce");
  return t.detach().clone();
}

at::Tensor LocalCommunicator::reduce_scatter(const at::Tensor& t, ReduceOp) {
  check_dtype(t, "reduce_scatter");
  if (t.dim() == 0) throw ShapeError("reduce_scatter on communicator '" + name_ + "': needs at least one dim");
  return t.detach().clone();
}

std::shared_ptr<Communicator> LocalCommunicator::split(int color, int, const std::string& name) {
  if (color < 0) return nullptr;
  return std::make_shared<LocalCommunicator>(name);
}

}  // namespace flex
