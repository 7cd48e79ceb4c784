// Open MPI backend. See mpi_communicator.h for the process-lifetime rules.
//
// Protocol of one collective: (1) every rank sends a small header (operation,
// dtype, shape, root, ...) to every other rank on a private communicator and
// receives theirs, with a deadline; a rank whose header does not arrive is
// named in the timeout error. (2) Every rank validates the same headers, so
// errors are raised identically everywhere. (3) The payload moves with a
// nonblocking MPI collective, polled until done or the deadline passes.
#include <flex/parallel/mpi_communicator.h>

#include <flex/hooks/shape_text.h>

#ifdef FLEX_HAVE_MPI

#include <ATen/ATen.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <sstream>
#include <thread>

namespace flex {
namespace {

// --- process lifetime ---------------------------------------------------------

bool g_we_initialised = false;
std::terminate_handler g_previous_terminate = nullptr;

bool mpi_live() {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  return inited && !finalized;
}

void world_rank_size(int& rank, int& size) {
  rank = -1;
  size = -1;
  if (!mpi_live()) return;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
}

// An uncaught exception on one rank must stop all of them: name the rank and
// abort the job (mpirun then kills the others) rather than leave the rest
// waiting in a collective for a partner that is gone.
[[noreturn]] void flex_terminate() {
  if (mpi_live()) {
    int rank, size;
    world_rank_size(rank, size);
    std::string what = "unknown exception";
    if (auto ep = std::current_exception()) {
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
    } else {
      what = "std::terminate without an active exception";
    }
    std::fprintf(stderr, "flex: rank %d of %d failed: %s; aborting all ranks\n", rank, size, what.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (g_previous_terminate) g_previous_terminate();
  std::abort();
}

// Runs at exit() and at return from main. A non-zero status on one rank
// aborts the job so the others stop now; status 0 finalises MPI if we
// initialised it.
void flex_on_exit(int status, void*) {
  if (!mpi_live()) return;
  if (status != 0) {
    int rank, size;
    world_rank_size(rank, size);
    std::fprintf(stderr, "flex: rank %d of %d exited with status %d; aborting all ranks\n", rank, size, status);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, status);
    return;
  }
  if (g_we_initialised) MPI_Finalize();
}

void ensure_mpi() {
  static std::once_flag once;
  std::call_once(once, [] {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
      if (rc != MPI_SUCCESS) throw CommError("MPI_Init_thread failed with code " + std::to_string(rc));
      if (provided < MPI_THREAD_FUNNELED) {
        std::fprintf(stderr, "flex: warning: MPI provides thread level %d < FUNNELED\n", provided);
      }
      g_we_initialised = true;
    }
    g_previous_terminate = std::set_terminate(flex_terminate);
    on_exit(flex_on_exit, nullptr);
  });
}

// --- helpers --------------------------------------------------------------------

std::string mpi_error_string(int rc) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(buf, len);
}

// MPI datatype that moves elements of this size bit for bit.
MPI_Datatype move_type(at::ScalarType t) {
  switch (c10::elementSize(t)) {
    case 1: return MPI_BYTE;
    case 2: return MPI_UINT16_T;
    case 4: return MPI_UINT32_T;
    default: return MPI_UINT64_T;
  }
}

// Datatype for reductions (f16/bf16 are widened to float before we get here;
// bool travels as uint8 where max is "or" and min is "and").
MPI_Datatype mpi_reduce_type(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return MPI_DOUBLE;
    case at::kFloat: return MPI_FLOAT;
    case at::kLong: return MPI_INT64_T;
    case at::kInt: return MPI_INT32_T;
    case at::kShort: return MPI_INT16_T;
    case at::kChar: return MPI_INT8_T;
    case at::kByte: case at::kBool: return MPI_UINT8_T;
    default: throw UnsupportedError(std::string("no MPI reduction for dtype ") + c10::toString(t));
  }
}

MPI_Op mpi_op(ReduceOp op, at::ScalarType t) {
  if (t == at::kBool) return op == ReduceOp::Min ? MPI_MIN : MPI_MAX;
  switch (op) {
    case ReduceOp::Sum: return MPI_SUM;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
  }
  return MPI_SUM;
}

bool widened(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

enum Op : int64_t { kBarrier = 1, kBroadcast, kGather, kAllGather, kAllReduce, kReduce, kReduceScatter, kSplit };

const char* op_name(int64_t op) {
  switch (op) {
    case kBarrier: return "barrier";
    case kBroadcast: return "broadcast";
    case kGather: return "gather";
    case kAllGather: return "all_gather";
    case kAllReduce: return "all_reduce";
    case kReduce: return "reduce";
    case kReduceScatter: return "reduce_scatter";
    case kSplit: return "split";
  }
  return "unknown operation";
}

constexpr int kMaxDims = 12;
constexpr int64_t kMagic = 0x666c6578;  // "flex"
constexpr int kHeaderTag = 17;

// One rank's description of the call it is making.
struct Header {
  enum { kMagicIx, kOp, kSeq, kRoot, kDtype, kNdim, kReduceOp, kA, kB, kShape, kLen = kShape + kMaxDims };
  std::array<int64_t, kLen> v{};

  int64_t op() const { return v[kOp]; }
  int64_t ndim() const { return v[kNdim]; }
  bool has_tensor() const { return v[kNdim] >= 0; }
  at::ScalarType dtype() const { return static_cast<at::ScalarType>(v[kDtype]); }
  std::vector<int64_t> shape() const {
    return std::vector<int64_t>(v.begin() + kShape, v.begin() + kShape + std::min<int64_t>(ndim(), kMaxDims));
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape()) n *= d;
    return n;
  }
  std::string describe() const {
    std::ostringstream s;
    s << op_name(op()) << "(";
    if (has_tensor()) {
      s << c10::toString(dtype()) << "[";
      auto sh = shape();
      for (size_t i = 0; i < sh.size(); ++i) s << (i ? "," : "") << sh[i];
      if (ndim() > kMaxDims) s << ",...";
      s << "]";
    } else if (op() == kBroadcast) {
      s << "undefined tensor";
    }
    if (op() == kBroadcast || op() == kGather || op() == kReduce) s << ", root " << v[kRoot];
    if (op() == kAllReduce || op() == kReduce || op() == kReduceScatter) {
      s << ", " << to_string(static_cast<ReduceOp>(v[kReduceOp]));
    }
    if (op() == kSplit) s << "color " << v[kA] << ", key " << v[kB];
    s << ")";
    return s.str();
  }
};

Header make_header(int64_t op, const at::Tensor* t, int64_t root = -1, ReduceOp rop = ReduceOp::Sum) {
  Header h;
  h.v[Header::kMagicIx] = kMagic;
  h.v[Header::kOp] = op;
  h.v[Header::kRoot] = root;
  h.v[Header::kReduceOp] = static_cast<int64_t>(rop);
  h.v[Header::kNdim] = -1;
  if (t && t->defined()) {
    h.v[Header::kDtype] = static_cast<int64_t>(t->scalar_type());
    h.v[Header::kNdim] = t->dim();
    for (int64_t i = 0; i < std::min<int64_t>(t->dim(), kMaxDims); ++i) h.v[Header::kShape + i] = t->size(i);
  }
  return h;
}

int to_count(int64_t n, const std::string& what) {
  if (n > INT_MAX) {
    throw UnsupportedError(what + ": " + std::to_string(n) +
                           " elements exceed MPI's int count; split the tensor into smaller pieces");
  }
  return static_cast<int>(n);
}

// CPU, contiguous, detached view of `t` (a copy only when it must be).
at::Tensor host(const at::Tensor& t) { return t.detach().to(at::kCPU).contiguous(); }

// --- the communicator -----------------------------------------------------------

class MpiCommunicator : public Communicator {
 public:
  // Takes ownership of `comm` (freed on destruction unless it is MPI_COMM_WORLD).
  MpiCommunicator(MPI_Comm comm, std::string name, double timeout_s)
      : data_(comm), name_(std::move(name)), timeout_s_(timeout_s) {
    check(MPI_Comm_set_errhandler(data_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(MPI_Comm_dup(data_, &hdr_), "MPI_Comm_dup");
    check(MPI_Comm_set_errhandler(hdr_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    MPI_Comm_rank(data_, &rank_);
    MPI_Comm_size(data_, &size_);
  }
  ~MpiCommunicator() override {
    // After a timeout requests may still reference the communicators: leak them.
    if (!mpi_live() || !broken_.empty()) return;
    MPI_Comm_free(&hdr_);
    MPI_Comm_free(&data_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  const char* backend() const override { return "mpi"; }

  void barrier() override {
    begin();
    exchange(make_header(kBarrier, nullptr));
  }

  void broadcast(at::Tensor& t, int root) override {
    begin();
    const bool have = t.defined();
    const auto all = exchange(make_header(kBroadcast, have ? &t : nullptr, root));
    same_field(all, Header::kRoot, "root");
    check_root(root, "broadcast");
    const Header& r = all[root];
    if (!r.has_tensor()) fail<ShapeError>("broadcast: the root rank " + std::to_string(root) + " passed an undefined tensor");
    check_dtype_ndim(r, "broadcast", root);
    for (int i = 0; i < size_; ++i) {
      if (i == root || !all[i].has_tensor()) continue;
      if (all[i].dtype() != r.dtype() || all[i].shape() != r.shape()) {
        fail<ShapeError>("broadcast: rank " + std::to_string(i) + " passed " + all[i].describe() +
                         " but root " + std::to_string(root) + " sends " + r.describe());
      }
    }
    const int count = to_count(r.numel(), "broadcast");
    at::Tensor buf;
    if (rank_ == root) {
      buf = host(t);
    } else if (have && t.is_cpu() && t.is_contiguous()) {
      buf = t.detach();
    } else {
      buf = at::empty(r.shape(), at::TensorOptions().dtype(r.dtype()));
    }
    MPI_Request req;
    check(MPI_Ibcast(buf.data_ptr(), count, move_type(r.dtype()), root, data_, &req), "MPI_Ibcast");
    wait({req}, "broadcast", {buf});
    if (rank_ != root) {
      if (!have) {
        t = buf;
      } else if (buf.data_ptr() != t.data_ptr()) {
        at::NoGradGuard g;
        t.detach().copy_(buf);
      }
    }
  }

  void send(const at::Tensor& t, int dst, int tag) override {
    begin();
    check_peer(dst, tag, "send");
    check_tensor(t, "send");
    const at::Tensor buf = host(t);
    const Header h = make_header(0, &buf);
    const at::Tensor hbuf = at::tensor(at::ArrayRef<int64_t>(h.v.data(), Header::kLen), at::kLong);
    const int count = to_count(buf.numel(), "send");
    MPI_Request reqs[2];
    check(MPI_Isend(hbuf.data_ptr(), Header::kLen, MPI_INT64_T, dst, tag, data_, &reqs[0]), "MPI_Isend");
    check(MPI_Isend(buf.data_ptr(), count, move_type(buf.scalar_type()), dst, tag, data_, &reqs[1]), "MPI_Isend");
    wait({reqs[0], reqs[1]}, "send to rank " + std::to_string(dst) + " (tag " + std::to_string(tag) + ")",
         {buf, hbuf});
  }

  at::Tensor recv(int src, int tag) override {
    begin();
    check_peer(src, tag, "recv");
    const std::string what = "recv from rank " + std::to_string(src) + " (tag " + std::to_string(tag) + ")";
    const at::Tensor hbuf = at::empty({Header::kLen}, at::kLong);
    MPI_Request req;
    check(MPI_Irecv(hbuf.data_ptr(), Header::kLen, MPI_INT64_T, src, tag, data_, &req), "MPI_Irecv");
    wait({req}, what, {hbuf}, /*patient=*/true);
    Header h;
    std::copy(hbuf.data_ptr<int64_t>(), hbuf.data_ptr<int64_t>() + Header::kLen, h.v.begin());
    if (h.v[Header::kMagicIx] != kMagic || !h.has_tensor() || h.ndim() > kMaxDims ||
        !is_supported_comm_dtype(h.dtype())) {
      fail<CommError>(what + ": the message is not a tensor sent by flex::Communicator::send");
    }
    at::Tensor out = at::empty(h.shape(), at::TensorOptions().dtype(h.dtype()));
    check(MPI_Irecv(out.data_ptr(), to_count(out.numel(), what), move_type(out.scalar_type()), src, tag, data_, &req),
          "MPI_Irecv");
    wait({req}, what, {out});
    return out;
  }

  std::vector<at::Tensor> gather(const at::Tensor& t, int root) override {
    return gather_impl(t, root, false);
  }
  std::vector<at::Tensor> all_gather(const at::Tensor& t) override { return gather_impl(t, -1, true); }

  void all_reduce(at::Tensor& t, ReduceOp op) override {
    begin();
    check_tensor(t, "all_reduce");
    const auto all = exchange(make_header(kAllReduce, &t, -1, op));
    same_everywhere(all, "all_reduce");
    at::Tensor buf = widened(t.scalar_type()) ? t.detach().to(at::kCPU, at::kFloat).contiguous() : host(t);
    MPI_Request req;
    check(MPI_Iallreduce(MPI_IN_PLACE, buf.data_ptr(), to_count(buf.numel(), "all_reduce"),
                         mpi_reduce_type(buf.scalar_type()), mpi_op(op, t.scalar_type()), data_, &req),
          "MPI_Iallreduce");
    wait({req}, "all_reduce", {buf});
    if (buf.data_ptr() != t.data_ptr()) {
      at::NoGradGuard g;
      t.detach().copy_(buf);
    }
  }

  at::Tensor reduce(const at::Tensor& t, int root, ReduceOp op) override {
    begin();
    check_tensor(t, "reduce");
    const auto all = exchange(make_header(kReduce, &t, root, op));
    same_everywhere(all, "reduce");
    check_root(root, "reduce");
    const at::Tensor buf = widened(t.scalar_type()) ? t.detach().to(at::kCPU, at::kFloat).contiguous() : host(t);
    at::Tensor out = rank_ == root ? at::empty_like(buf) : at::Tensor();
    MPI_Request req;
    check(MPI_Ireduce(buf.data_ptr(), out.defined() ? out.data_ptr() : nullptr, to_count(buf.numel(), "reduce"),
                      mpi_reduce_type(buf.scalar_type()), mpi_op(op, t.scalar_type()), root, data_, &req),
          "MPI_Ireduce");
    wait({req}, "reduce", {buf, out});
    if (!out.defined()) return out;
    return out.to(t.device(), t.scalar_type());
  }

  at::Tensor reduce_scatter(const at::Tensor& t, ReduceOp op) override {
    begin();
    check_tensor(t, "reduce_scatter");
    const auto all = exchange(make_header(kReduceScatter, &t, -1, op));
    same_everywhere(all, "reduce_scatter");
    if (t.dim() == 0 || t.size(0) % size_ != 0) {
      fail<ShapeError>("reduce_scatter: dim 0 of " + shape_text(t.sizes()) + " must be divisible by the " +
                       std::to_string(size_) + " ranks");
    }
    const at::Tensor buf = widened(t.scalar_type()) ? t.detach().to(at::kCPU, at::kFloat).contiguous() : host(t);
    auto sizes = buf.sizes().vec();
    sizes[0] /= size_;
    at::Tensor out = at::empty(sizes, buf.options());
    MPI_Request req;
    check(MPI_Ireduce_scatter_block(buf.data_ptr(), out.data_ptr(), to_count(out.numel(), "reduce_scatter"),
                                    mpi_reduce_type(buf.scalar_type()), mpi_op(op, t.scalar_type()), data_, &req),
          "MPI_Ireduce_scatter_block");
    wait({req}, "reduce_scatter", {buf, out});
    return out.to(t.device(), t.scalar_type());
  }

  std::shared_ptr<Communicator> split(int color, int key, const std::string& name) override {
    begin();
    Header h = make_header(kSplit, nullptr);
    h.v[Header::kA] = color;
    h.v[Header::kB] = key;
    exchange(h);
    // Everyone is here (the header exchange completed), so the blocking split
    // cannot wait on an absent rank.
    MPI_Comm sub = MPI_COMM_NULL;
    check(MPI_Comm_split(data_, color < 0 ? MPI_UNDEFINED : color, key, &sub), "MPI_Comm_split");
    if (sub == MPI_COMM_NULL) return nullptr;
    return std::make_shared<MpiCommunicator>(sub, name, timeout_s_);
  }

 private:
  template <typename E>
  [[noreturn]] void fail(const std::string& msg) const {
    throw E(msg + " [communicator '" + name_ + "', rank " + std::to_string(rank_) + " of " +
            std::to_string(size_) + "]");
  }

  void check(int rc, const char* call) {
    if (rc == MPI_SUCCESS) return;
    broken_ = std::string(call) + " failed: " + mpi_error_string(rc);
    fail<CommError>(broken_);
  }

  void begin() {
    if (!broken_.empty()) {
      fail<CommError>("unusable after an earlier failure (" + broken_ + ")");
    }
    if (!mpi_live()) fail<CommError>("MPI is not initialised or already finalised");
    ++seq_;
  }

  void check_root(int root, const char* what) const {
    if (root < 0 || root >= size_) {
      fail<ConfigError>(std::string(what) + ": root " + std::to_string(root) + " is not a rank");
    }
  }

  void check_peer(int peer, int tag, const char* what) const {
    if (peer < 0 || peer >= size_) {
      fail<ConfigError>(std::string(what) + ": rank " + std::to_string(peer) + " does not exist");
    }
    if (tag < 0 || tag > 32767) {
      fail<ConfigError>(std::string(what) + ": tag " + std::to_string(tag) + " must be in [0, 32767]");
    }
  }

  // Local checks that need no agreement (the rank at fault throws; the
  // others will time out in the header exchange, naming it).
  void check_tensor(const at::Tensor& t, const char* what) const {
    if (!t.defined()) fail<ShapeError>(std::string(what) + ": undefined tensor");
    if (!is_supported_comm_dtype(t.scalar_type())) {
      fail<UnsupportedError>(std::string(what) + ": dtype " + c10::toString(t.scalar_type()) + " is not supported");
    }
    if (t.dim() > kMaxDims) {
      fail<UnsupportedError>(std::string(what) + ": tensors of more than " + std::to_string(kMaxDims) +
                             " dims are not supported, got " + shape_text(t.sizes()));
    }
  }

  void check_dtype_ndim(const Header& h, const char* what, int r) const {
    if (!is_supported_comm_dtype(h.dtype()) || h.ndim() > kMaxDims) {
      fail<UnsupportedError>(std::string(what) + ": rank " + std::to_string(r) + " passed unsupported " + h.describe());
    }
  }

  // Every rank must be making the same kind of call.
  void same_op(const std::vector<Header>& all) const {
    for (int i = 1; i < size_; ++i) {
      if (all[i].op() != all[0].op()) {
        std::ostringstream s;
        s << "collective mismatch at call #" << seq_ << ":";
        for (int r = 0; r < size_; ++r) s << (r ? "," : "") << " rank " << r << " called " << all[r].describe();
        fail<ConfigError>(s.str());
      }
    }
  }

  void same_field(const std::vector<Header>& all, int ix, const char* what) const {
    for (int i = 1; i < size_; ++i) {
      if (all[i].v[ix] != all[0].v[ix]) {
        fail<ConfigError>(std::string(op_name(all[0].op())) + ": ranks disagree on the " + what + ": rank 0 called " +
                          all[0].describe() + ", rank " + std::to_string(i) + " called " + all[i].describe());
      }
    }
  }

  // Same dtype, shape, root and reduction everywhere.
  void same_everywhere(const std::vector<Header>& all, const char* what) const {
    for (int ix : {int(Header::kRoot), int(Header::kReduceOp), int(Header::kDtype), int(Header::kNdim)}) {
      same_field(all, ix, "arguments");
    }
    for (int i = 1; i < size_; ++i) {
      if (all[i].shape() != all[0].shape()) {
        fail<ShapeError>(std::string(what) + ": rank 0 passed " + all[0].describe() + " but rank " +
                         std::to_string(i) + " passed " + all[i].describe());
      }
    }
  }

  std::vector<at::Tensor> gather_impl(const at::Tensor& t, int root, bool everyone) {
    begin();
    const char* what = everyone ? "all_gather" : "gather";
    check_tensor(t, what);
    const auto all = exchange(make_header(everyone ? kAllGather : kGather, &t, root));
    same_field(all, Header::kRoot, "root");
    if (!everyone) check_root(root, what);
    for (int i = 1; i < size_; ++i) {
      if (all[i].dtype() != all[0].dtype() || all[i].ndim() != all[0].ndim()) {
        fail<ShapeError>(std::string(what) + ": rank 0 passed " + all[0].describe() + " but rank " +
                         std::to_string(i) + " passed " + all[i].describe() + " (dtype and dims must agree)");
      }
    }
    std::vector<int> counts(size_), displs(size_);
    int64_t total = 0;
    for (int i = 0; i < size_; ++i) {
      counts[i] = to_count(all[i].numel(), what);
      displs[i] = to_count(total, what);
      total += all[i].numel();
    }
    to_count(total, what);
    const at::Tensor buf = host(t);
    const bool receives = everyone || rank_ == root;
    at::Tensor flat = receives ? at::empty({total}, buf.options()) : at::Tensor();
    const MPI_Datatype dt = move_type(buf.scalar_type());
    MPI_Request req;
    if (everyone) {
      check(MPI_Iallgatherv(buf.data_ptr(), counts[rank_], dt, flat.data_ptr(), counts.data(), displs.data(), dt,
                            data_, &req),
            "MPI_Iallgatherv");
    } else {
      check(MPI_Igatherv(buf.data_ptr(), counts[rank_], dt, receives ? flat.data_ptr() : nullptr, counts.data(),
                         displs.data(), dt, root, data_, &req),
            "MPI_Igatherv");
    }
    wait({req}, what, {buf, flat});
    std::vector<at::Tensor> out;
    if (!receives) return out;
    for (int i = 0; i < size_; ++i) {
      at::Tensor piece = flat.narrow(0, displs[i], counts[i]).view(all[i].shape());
      out.push_back(t.is_cpu() ? piece : piece.to(t.device()));
    }
    return out;
  }

  // Sends `mine` to every rank and receives theirs; validates the operation.
  std::vector<Header> exchange(Header mine) {
    mine.v[Header::kSeq] = seq_;
    // Heap buffers: kept alive past a timeout (see wait()).
    auto storage = std::make_shared<std::vector<Header>>(size_ + 1);
    std::vector<Header>& all_buf = *storage;
    all_buf[size_] = mine;
    all_buf[rank_] = mine;
    if (size_ > 1) {
      const std::string what = std::string(op_name(mine.op())) + " (call #" + std::to_string(seq_) + ")";
      std::vector<MPI_Request> reqs;
      std::vector<int> from;
      if (size_ <= 64) {
        for (int r = 0; r < size_; ++r) {
          if (r == rank_) continue;
          reqs.emplace_back();
          check(MPI_Irecv(all_buf[r].v.data(), Header::kLen, MPI_INT64_T, r, kHeaderTag, hdr_, &reqs.back()),
                "MPI_Irecv");
          from.push_back(r);
        }
        for (int r = 0; r < size_; ++r) {
          if (r == rank_) continue;
          reqs.emplace_back();
          check(MPI_Isend(all_buf[size_].v.data(), Header::kLen, MPI_INT64_T, r, kHeaderTag, hdr_, &reqs.back()),
                "MPI_Isend");
        }
      } else {
        // Many ranks: one collective (a timeout then cannot say who is missing).
        reqs.emplace_back();
        check(MPI_Iallgather(all_buf[size_].v.data(), Header::kLen, MPI_INT64_T, all_buf.data(), Header::kLen,
                             MPI_INT64_T, hdr_,
                             &reqs.back()),
              "MPI_Iallgather");
      }
      if (!poll(reqs)) {
        keep_alive_.push_back(storage);
        std::string missing;
        for (size_t i = 0; i < from.size(); ++i) {
          if (reqs[i] != MPI_REQUEST_NULL) missing += (missing.empty() ? "" : ", ") + std::to_string(from[i]);
        }
        timed_out(what, missing.empty() ? std::string() : "rank(s) " + missing + " never reached it");
      }
      for (int r = 0; r < size_; ++r) {
        if (all_buf[r].v[Header::kMagicIx] != kMagic) {
          fail<CommError>(what + ": rank " + std::to_string(r) + " sent a corrupt header");
        }
      }
    }
    std::vector<Header> all(all_buf.begin(), all_buf.begin() + size_);
    same_op(all);
    return all;
  }

  // `keep`: buffers the requests use; after a timeout they stay allocated
  // (the requests cannot be cancelled) so a late completion writes into them.
  void wait(std::vector<MPI_Request> reqs, const std::string& what, std::vector<at::Tensor> keep = {},
            bool patient = false) {
    if (poll(reqs, patient)) return;
    for (auto& t : keep) keep_alive_.push_back(std::make_shared<at::Tensor>(t));
    timed_out(what);
  }

  [[noreturn]] void timed_out(const std::string& what, const std::string& detail = "") {
    std::ostringstream s;
    s << what << " timed out after " << timeout_s_ << " s";
    if (!detail.empty()) s << ": " << detail;
    broken_ = s.str();
    fail<CommError>(broken_);
  }

  // Polls until every request is done (true) or the deadline passes (false).
  // `patient`: waiting for other ranks to arrive (headers), which may take
  // long: back off to sleeping after 2 ms. Otherwise a payload is moving and
  // MPI only progresses inside MPI_Test (copy-in/copy-out shared memory), so
  // yield without sleeping for the first second.
  bool poll(std::vector<MPI_Request>& reqs, bool patient = true) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    const auto deadline = start + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(timeout_s_));
    std::vector<int> idx(reqs.size());
    while (true) {
      int done = 0;
      check(MPI_Testsome(static_cast<int>(reqs.size()), reqs.data(), &done, idx.data(), MPI_STATUSES_IGNORE),
            "MPI_Testsome");
      if (done == MPI_UNDEFINED) return true;  // all requests are null
      const auto now = clock::now();
      if (now > deadline) return false;
      if (now - start < (patient ? std::chrono::milliseconds(2) : std::chrono::milliseconds(1000))) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

  MPI_Comm data_ = MPI_COMM_NULL;  // payloads and point to point
  MPI_Comm hdr_ = MPI_COMM_NULL;   // collective headers only
  std::string name_;
  double timeout_s_;
  int rank_ = 0, size_ = 1;
  int64_t seq_ = 0;
  std::string broken_;
  std::vector<std::shared_ptr<void>> keep_alive_;
};

}  // namespace

std::shared_ptr<Communicator> make_mpi_world_communicator(const CommOptions& opts) {
  ensure_mpi();
  MPI_Comm world;
  const int rc = MPI_Comm_dup(MPI_COMM_WORLD, &world);
  if (rc != MPI_SUCCESS) throw CommError("MPI_Comm_dup(MPI_COMM_WORLD) failed: " + mpi_error_string(rc));
  return std::make_shared<MpiCommunicator>(world, "world", resolve_timeout(opts));
}

}  // namespace flex

#endif  // FLEX_HAVE_MPI

namespace flex {

std::string mpi_library_version() {
#ifdef FLEX_HAVE_MPI
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  if (MPI_Get_library_version(text, &length) != MPI_SUCCESS) return "unknown version";
  std::string line(text, static_cast<size_t>(std::max(length, 0)));
  const auto end = line.find_first_of("\n\r");  // the first line names the library and version
  if (end != std::string::npos) line.resize(end);
  while (!line.empty() && (line.back() == ',' || line.back() == ' ' || line.back() == '\0')) line.pop_back();
  return line;
#else
  return "";
#endif
}

}  // namespace flex
