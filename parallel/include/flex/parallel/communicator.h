#pragma once
// flex::Communicator: the collectives the parallel layer needs, over tensors
// of every supported dtype (f64 f32 f16 bf16 i64 i32 i16 i8 u8 bool).
//
// Every collective is checked before any payload moves: the ranks exchange a
// small header (operation, dtype, shape, root) and all of them validate the
// same facts, so a mismatch (one rank calls all_reduce while another calls
// broadcast, or passes another shape) raises the same typed error on every
// rank instead of corrupting memory or hanging. Waits have a deadline
// (CommOptions::timeout_s): a rank that never arrives gives flex::CommError
// naming it, never a hang.
#include <flex/hooks/errors.h>

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

namespace flex {

/// A communication failure: a timeout, a rank that never arrived, an MPI/NCCL error.
/// The communicator that raised it is unusable afterwards.
class CommError : public Error {
 public:
  using Error::Error;
};

enum class ReduceOp { Sum, Max, Min };

const char* to_string(ReduceOp op);

struct CommOptions {
  /// Longest wait of one operation before CommError. <= 0: the environment
  /// variable FLEX_COMM_TIMEOUT (seconds), else 300 s.
  double timeout_s = 0;
};

/// The timeout actually used for `opts` (resolves the environment default).
double resolve_timeout(const CommOptions& opts);

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// "world", "tp", "pp", "dp", ... used in error messages.
  virtual const std::string& name() const = 0;
  /// "mpi", "nccl", "local".
  virtual const char* backend() const = 0;

  virtual void barrier() = 0;
  /// Root's `t` is copied into every rank's `t`. On other ranks an undefined
  /// `t` is allocated with root's shape and dtype; a defined one must match.
  virtual void broadcast(at::Tensor& t, int root) = 0;
  /// Point to point. recv returns a tensor of the sender's shape and dtype.
  virtual void send(const at::Tensor& t, int dst, int tag = 0) = 0;
  virtual at::Tensor recv(int src, int tag = 0) = 0;
  /// Every rank's tensor on `root` in rank order (shapes may differ between
  /// ranks, dtype and number of dims may not); an empty vector elsewhere.
  virtual std::vector<at::Tensor> gather(const at::Tensor& t, int root) = 0;
  /// Every rank's tensor on every rank, in rank order.
  virtual std::vector<at::Tensor> all_gather(const at::Tensor& t) = 0;
  /// In place, elementwise over ranks (same shape everywhere). On bool, Sum
  /// and Max are logical or, Min is logical and. f16/bf16 are reduced in
  /// float32 and rounded once.
  virtual void all_reduce(at::Tensor& t, ReduceOp op = ReduceOp::Sum) = 0;
  /// Like all_reduce, but only `root` receives the result (returned); other
  /// ranks get an undefined tensor.
  virtual at::Tensor reduce(const at::Tensor& t, int root, ReduceOp op = ReduceOp::Sum) = 0;
  /// `t` (same shape everywhere, dim 0 divisible by size()) is reduced over
  /// ranks and split along dim 0; rank r returns chunk r.
  virtual at::Tensor reduce_scatter(const at::Tensor& t, ReduceOp op = ReduceOp::Sum) = 0;

  /// Collective over this communicator (MPI_Comm_split): ranks with the same
  /// color >= 0 form a group ordered by (key, rank); color < 0 returns nullptr.
  virtual std::shared_ptr<Communicator> split(int color, int key, const std::string& name) = 0;
  /// Collective over this communicator: a group of exactly `ranks` (in that
  /// order, all ranks must pass the same list); ranks outside get nullptr.
  std::shared_ptr<Communicator> create_group(const std::vector<int>& ranks, const std::string& name);
};

/// MPI when launched by mpirun (OMPI_COMM_WORLD_SIZE / PMI_SIZE set) and this
/// build has MPI, a single-process LocalCommunicator otherwise. Calling it
/// twice returns the same world.
std::shared_ptr<Communicator> make_world_communicator(const CommOptions& opts = {});

/// The dtypes the communicators move; anything else is UnsupportedError.
bool is_supported_comm_dtype(at::ScalarType t);

}  // namespace flex
