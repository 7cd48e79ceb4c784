// NCCL backend; see nccl_communicator.h. Compiled to nothing without NCCL.
#include <flex/parallel/nccl_communicator.h>

#ifndef FLEX_HAVE_NCCL

namespace flex {
bool nccl_available() { return false; }
std::string nccl_library_version() { return ""; }
}  // namespace flex

#else

#include <ATen/ATen.h>
#ifdef FLEX_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <sstream>
#include <thread>

namespace flex {

bool nccl_available() { return true; }

std::string nccl_library_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown version";
  // NCCL_VERSION_CODE: major * 10000 + minor * 100 + patch since 2.9 (major * 1000 + ... before).
  const int major = v >= 10000 ? v / 10000 : v / 1000, rest = v >= 10000 ? v % 10000 : v % 1000;
  return std::to_string(major) + "." + std::to_string(rest / 100) + "." + std::to_string(rest % 100);
}

namespace {

// Makes `device` current for a scope (the CUDA runtime's own call, so this
// file needs no CUDA build of libtorch to compile and link).
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device && cudaSetDevice(device) != cudaSuccess)
      throw CommError("NcclCommunicator: cannot select CUDA device " + std::to_string(device));
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

// The stream collectives run on: PyTorch's current stream of `device` when
// libtorch is a CUDA build (ordered after the kernels that produced the
// tensors); otherwise the legacy default stream, which orders against every
// blocking stream.
cudaStream_t collective_stream(int device) {
#ifdef FLEX_TORCH_CUDA
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
#else
  (void)device;
  return cudaStreamLegacy;
#endif
}

// Movement treats every dtype as bytes; reductions need the element type.
// NCCL has no int16 and no bool reduction: int16 is widened to int32, bool
// travels as uint8 where max is "or" and min is "and".
ncclDataType_t nccl_reduce_type(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return ncclFloat64;
    case at::kFloat: return ncclFloat32;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kLong: return ncclInt64;
    case at::kInt: return ncclInt32;
    case at::kChar: return ncclInt8;
    case at::kByte: case at::kBool: return ncclUint8;
    default: throw UnsupportedError(std::string("no NCCL reduction for dtype ") + c10::toString(t));
  }
}

ncclRedOp_t nccl_op(ReduceOp op, at::ScalarType t) {
  if (t == at::kBool) return op == ReduceOp::Min ? ncclMin : ncclMax;
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<Communicator> bootstrap, int device, double timeout_s)
      : boot_(std::move(bootstrap)), device_(device), timeout_s_(timeout_s) {
    if (!boot_) throw ConfigError("NcclCommunicator: the bootstrap communicator is null");
    name_ = boot_->name();
    rank_ = boot_->rank();
    size_ = boot_->size();
    // Rank 0 makes the id; the bootstrap broadcast is itself checked and timed.
    at::Tensor id_bytes = at::zeros({static_cast<int64_t>(sizeof(ncclUniqueId))}, at::kByte);
    ncclUniqueId id;
    if (rank_ == 0) {
      check(ncclGetUniqueId(&id), "ncclGetUniqueId");
      std::memcpy(id_bytes.data_ptr(), &id, sizeof(id));
    }
    boot_->broadcast(id_bytes, 0);
    std::memcpy(&id, id_bytes.data_ptr(), sizeof(id));
    DeviceScope scope(device_);
    check(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
    boot_->barrier();
  }
  ~NcclCommunicator() override {
    if (comm_) {
      if (broken_.empty()) {
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  const char* backend() const override { return "nccl"; }

  void barrier() override { boot_->barrier(); }

  // broadcast and send/recv first move a small description of the tensor
  // (shape, dtype, CUDA or CPU) on the bootstrap, then the payload on NCCL
  // (CUDA) or the bootstrap (CPU): every rank knows which path to take.
  void broadcast(at::Tensor& t, int root) override {
    live();
    at::Tensor meta = rank_ == root && t.defined() ? describe(t) : at::Tensor();
    boot_->broadcast(meta, root);  // an undefined root tensor fails here, on every rank
    const Meta m = parse(meta);
    if (!m.cuda) return boot_->broadcast(t, root);
    if (rank_ == root) check_cuda(t, "broadcast");
    const bool fits = t.defined() && t.is_cuda() && t.scalar_type() == m.dtype && t.sizes().vec() == m.dims;
    at::Tensor buf = rank_ == root ? t.contiguous()
                                   : (fits && t.is_contiguous() ? t : at::empty(m.dims, opts(m.dtype)));
    run("ncclBroadcast", [&](cudaStream_t s) {
      return ncclBroadcast(buf.data_ptr(), buf.data_ptr(), buf.nbytes(), ncclUint8, root, comm_, s);
    });
    if (rank_ == root) return;
    if (t.defined() && !fits) {
      fail<ShapeError>("broadcast: this rank passed a tensor of another shape, dtype or device than root " +
                       std::to_string(root) + "'s");
    }
    if (!t.defined()) {
      t = buf;
    } else if (buf.data_ptr() != t.data_ptr()) {
      t.copy_(buf);
    }
  }

  void send(const at::Tensor& t, int dst, int tag) override {
    live();
    if (!t.defined()) fail<ShapeError>("send: undefined tensor");
    if (t.is_cuda()) check_cuda(t, "send");
    boot_->send(describe(t), dst, tag);
    if (!t.is_cuda()) return boot_->send(t, dst, tag);
    const at::Tensor buf = t.contiguous();
    run("ncclSend", [&](cudaStream_t s) { return ncclSend(buf.data_ptr(), buf.nbytes(), ncclUint8, dst, comm_, s); });
  }

  /// A CUDA tensor arrives on this communicator's device, a CPU one on the CPU.
  at::Tensor recv(int src, int tag) override {
    live();
    const Meta m = parse(boot_->recv(src, tag));
    if (!m.cuda) return boot_->recv(src, tag);
    at::Tensor out = at::empty(m.dims, opts(m.dtype));
    run("ncclRecv", [&](cudaStream_t s) { return ncclRecv(out.data_ptr(), out.nbytes(), ncclUint8, src, comm_, s); });
    return out;
  }

  std::vector<at::Tensor> gather(const at::Tensor& t, int root) override {
    if (cpu_call(t)) return boot_->gather(t, root);
    auto shapes = boot_->all_gather(describe(t));  // checked: same op on every rank
    check_same_dtype(shapes, "gather");
    const at::Tensor buf = t.contiguous();
    std::vector<at::Tensor> out;
    if (rank_ == root) {
      for (int r = 0; r < size_; ++r) {
        out.push_back(r == root ? buf.clone() : at::empty(parse(shapes[r]).dims, opts(buf.scalar_type())));
      }
    }
    run("gather (ncclSend/ncclRecv)", [&](cudaStream_t s) {
      ncclResult_t rc = ncclGroupStart();
      if (rc != ncclSuccess) return rc;
      if (rank_ == root) {
        for (int r = 0; r < size_; ++r) {
          if (r != root && (rc = ncclRecv(out[r].data_ptr(), out[r].nbytes(), ncclUint8, r, comm_, s)) != ncclSuccess) {
            return rc;
          }
        }
      } else if ((rc = ncclSend(buf.data_ptr(), buf.nbytes(), ncclUint8, root, comm_, s)) != ncclSuccess) {
        return rc;
      }
      return ncclGroupEnd();
    });
    return out;
  }

  std::vector<at::Tensor> all_gather(const at::Tensor& t) override {
    if (cpu_call(t)) return boot_->all_gather(t);
    auto shapes = boot_->all_gather(describe(t));
    check_same_dtype(shapes, "all_gather");
    const at::Tensor buf = t.contiguous();
    std::vector<at::Tensor> out;
    for (int r = 0; r < size_; ++r) {
      out.push_back(r == rank_ ? buf.clone() : at::empty(parse(shapes[r]).dims, opts(buf.scalar_type())));
    }
    run("all_gather (ncclSend/ncclRecv)", [&](cudaStream_t s) {
      ncclResult_t rc = ncclGroupStart();
      if (rc != ncclSuccess) return rc;
      for (int r = 0; r < size_; ++r) {
        if (r == rank_) continue;
        if ((rc = ncclSend(buf.data_ptr(), buf.nbytes(), ncclUint8, r, comm_, s)) != ncclSuccess) return rc;
        if ((rc = ncclRecv(out[r].data_ptr(), out[r].nbytes(), ncclUint8, r, comm_, s)) != ncclSuccess) return rc;
      }
      return ncclGroupEnd();
    });
    return out;
  }

  void all_reduce(at::Tensor& t, ReduceOp op) override {
    if (cpu_call(t)) return boot_->all_reduce(t, op);
    agree(t, "all_reduce");
    at::Tensor buf = widen(t);
    run("ncclAllReduce", [&](cudaStream_t s) {
      return ncclAllReduce(buf.data_ptr(), buf.data_ptr(), buf.numel(), nccl_reduce_type(buf.scalar_type()),
                           nccl_op(op, t.scalar_type()), comm_, s);
    });
    if (buf.data_ptr() != t.data_ptr()) t.copy_(buf);
  }

  at::Tensor reduce(const at::Tensor& t, int root, ReduceOp op) override {
    if (cpu_call(t)) return boot_->reduce(t, root, op);
    agree(t, "reduce");
    at::Tensor buf = widen(t).clone();
    run("ncclReduce", [&](cudaStream_t s) {
      return ncclReduce(buf.data_ptr(), buf.data_ptr(), buf.numel(), nccl_reduce_type(buf.scalar_type()),
                        nccl_op(op, t.scalar_type()), root, comm_, s);
    });
    return rank_ == root ? buf.to(t.scalar_type()) : at::Tensor();
  }

  at::Tensor reduce_scatter(const at::Tensor& t, ReduceOp op) override {
    if (cpu_call(t)) return boot_->reduce_scatter(t, op);
    agree(t, "reduce_scatter");
    if (t.dim() == 0 || t.size(0) % size_ != 0) {
      fail<ShapeError>("reduce_scatter: dim 0 must be divisible by the " + std::to_string(size_) + " ranks");
    }
    at::Tensor buf = widen(t).contiguous();
    auto sizes = buf.sizes().vec();
    sizes[0] /= size_;
    at::Tensor out = at::empty(sizes, buf.options());
    run("ncclReduceScatter", [&](cudaStream_t s) {
      return ncclReduceScatter(buf.data_ptr(), out.data_ptr(), out.numel(), nccl_reduce_type(buf.scalar_type()),
                               nccl_op(op, t.scalar_type()), comm_, s);
    });
    return out.to(t.scalar_type());
  }

  std::shared_ptr<Communicator> split(int color, int key, const std::string& name) override {
    auto sub = boot_->split(color, key, name);
    if (!sub) return nullptr;
    return std::make_shared<NcclCommunicator>(sub, device_, timeout_s_);
  }

 private:
  static constexpr int64_t kMetaTag = 0x6e63636c;  // marks a shape message of ours

  template <typename E>
  [[noreturn]] void fail(const std::string& msg) const {
    throw E(msg + " [nccl communicator '" + name_ + "', rank " + std::to_string(rank_) + " of " +
            std::to_string(size_) + "]");
  }

  void check(ncclResult_t rc, const char* call) {
    if (rc == ncclSuccess) return;
    broken_ = std::string(call) + " failed: " + ncclGetErrorString(rc);
    fail<CommError>(broken_);
  }

  at::TensorOptions opts(at::ScalarType dt) const {
    return at::TensorOptions().dtype(dt).device(at::kCUDA, static_cast<c10::DeviceIndex>(device_));
  }

  void live() const {
    if (!broken_.empty()) fail<CommError>("unusable after an earlier failure (" + broken_ + ")");
  }

  // CPU tensors take the bootstrap communicator. A rank passing a CPU tensor
  // where the others pass CUDA ones makes a different bootstrap call, which
  // the bootstrap's header check reports on every rank.
  bool cpu_call(const at::Tensor& t) {
    live();
    if (t.defined() && !t.is_cuda()) return true;
    if (t.defined()) check_cuda(t, "collective");
    return false;
  }

  void check_cuda(const at::Tensor& t, const char* what) const {
    if (!t.defined()) fail<ShapeError>(std::string(what) + ": undefined tensor");
    if (t.device().index() != device_) {
      fail<ConfigError>(std::string(what) + ": tensor on " + t.device().str() + ", communicator on cuda:" +
                        std::to_string(device_));
    }
    if (!is_supported_comm_dtype(t.scalar_type())) {
      fail<UnsupportedError>(std::string(what) + ": dtype " + c10::toString(t.scalar_type()) + " is not supported");
    }
  }

  struct Meta {
    std::vector<int64_t> dims;
    at::ScalarType dtype = at::kFloat;
    bool cuda = false;
  };
  // [tag, cuda, dtype, dims...] as a CPU int64 tensor.
  static at::Tensor describe(const at::Tensor& t) {
    std::vector<int64_t> v{kMetaTag, t.is_cuda() ? 1 : 0, static_cast<int64_t>(t.scalar_type())};
    for (int64_t d : t.sizes()) v.push_back(d);
    return at::tensor(v, at::kLong);
  }
  Meta parse(const at::Tensor& m) const {
    if (m.scalar_type() != at::kLong || m.dim() != 1 || m.numel() < 3 || m[0].item<int64_t>() != kMetaTag) {
      fail<CommError>("received a message that is not a tensor description of this communicator");
    }
    const int64_t* p = m.data_ptr<int64_t>();
    return {std::vector<int64_t>(p + 3, p + m.numel()), static_cast<at::ScalarType>(p[2]), p[1] != 0};
  }

  void check_same_dtype(const std::vector<at::Tensor>& shapes, const char* what) const {
    for (int r = 1; r < size_; ++r) {
      const Meta a = parse(shapes[0]), b = parse(shapes[r]);
      if (a.dtype != b.dtype || a.dims.size() != b.dims.size() || !a.cuda || !b.cuda) {
        fail<ShapeError>(std::string(what) + ": rank " + std::to_string(r) + " passed another dtype, number of dims or device than rank 0");
      }
    }
  }

  // Same shape and dtype on every rank (checked on the bootstrap, identically everywhere).
  void agree(const at::Tensor& t, const char* what) {
    auto shapes = boot_->all_gather(describe(t));
    for (int r = 1; r < size_; ++r) {
      if (!shapes[r].equal(shapes[0])) {
        fail<ShapeError>(std::string(what) + ": rank " + std::to_string(r) + " passed another shape or dtype than rank 0");
      }
    }
  }

  at::Tensor widen(const at::Tensor& t) const {
    return t.scalar_type() == at::kShort ? t.to(at::kInt) : t.contiguous();
  }

  // Enqueues `enqueue` on the current stream of our device and waits for it
  // with a deadline; on timeout or an asynchronous NCCL error the
  // communicator is aborted so no kernel is left waiting for a dead peer.
  template <typename F>
  void run(const char* what, F&& enqueue) {
    DeviceScope scope(device_);
    cudaStream_t stream = collective_stream(device_);
    check(enqueue(stream), what);
    cudaEvent_t done;
    if (cudaEventCreateWithFlags(&done, cudaEventDisableTiming) != cudaSuccess) fail<CommError>("cudaEventCreate failed");
    cudaEventRecord(done, stream);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                                  std::chrono::duration<double>(timeout_s_));
    while (true) {
      const cudaError_t q = cudaEventQuery(done);
      if (q == cudaSuccess) break;
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (q != cudaErrorNotReady || async != ncclSuccess) {
        broken_ = std::string(what) + ": " + (async != ncclSuccess ? ncclGetErrorString(async) : cudaGetErrorString(q));
        cudaEventDestroy(done);
        fail<CommError>(broken_);
      }
      if (std::chrono::steady_clock::now() > deadline) {
        std::ostringstream s;
        s << what << " timed out after " << timeout_s_ << " s";
        broken_ = s.str();
        cudaEventDestroy(done);
        ncclCommAbort(comm_);
        comm_ = nullptr;
        fail<CommError>(broken_);
      }
      std::this_thread::yield();
    }
    cudaEventDestroy(done);
  }

  std::shared_ptr<Communicator> boot_;
  int device_;
  double timeout_s_;
  std::string name_;
  int rank_ = 0, size_ = 1;
  ncclComm_t comm_ = nullptr;
  std::string broken_;
};

}  // namespace

std::shared_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Communicator> bootstrap, int device_index,
                                                     const CommOptions& opts) {
  return std::make_shared<NcclCommunicator>(std::move(bootstrap), device_index, resolve_timeout(opts));
}

}  // namespace flex

#endif  // FLEX_HAVE_NCCL
