// The reader thread behind enable_block_prefetch (flex/dispatch/block_prefetch.h).
//
// It sits between each offloaded module's AlignDevicesHook and its weights
// map: the hook asks for a tensor by name as before; when the tensor's block
// was read ahead the prepared copy is handed over, else the map is read on
// the calling thread as without prefetch. Asking for the first tensor of
// block i queues blocks i+1..i+depth (wrapping to the start: the next decode
// step begins with the first offloaded block again).
//
// CUDA code goes through c10's device-generic stream/event interface, so the
// same source compiles against a CPU or a CUDA libtorch and the CUDA path is
// taken only when the execution device is a CUDA device.
#include <flex/dispatch/align_devices_hook.h>
#include <flex/dispatch/big_modeling.h>
#include <flex/dispatch/block_prefetch.h>
#include <flex/dispatch/pinned_weights.h>
#include <flex/dispatch/weights_map.h>

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

namespace flex {

class BlockPrefetcher {
 public:
  struct Entry {
    std::string key;   // full dotted tensor name
    std::shared_ptr<const WeightsMap> map;  // the module's own map (hook's before prefetch)
    std::string name;  // name within that map
    at::Tensor pinned;  // CPU-resident weight kept pinned (CUDA execution only)
  };
  struct Block {
    std::string name;
    std::vector<Entry> entries;
  };

  BlockPrefetcher(std::vector<Block> blocks, int depth, c10::Device exec)
      : blocks_(std::move(blocks)), depth_(depth), exec_(exec), slots_(blocks_.size()) {
    for (size_t b = 0; b < blocks_.size(); ++b)
      for (const auto& e : blocks_[b].entries) block_of_[e.key] = static_cast<int>(b);
    if (exec_.is_cuda()) {
      c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
      side_stream_ = impl.getStreamFromGlobalPool(exec_, /*isHighPriority=*/false);
    }
    thread_ = std::thread([this] { run(); });
  }

  ~BlockPrefetcher() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  BlockPrefetcher(const BlockPrefetcher&) = delete;
  BlockPrefetcher& operator=(const BlockPrefetcher&) = delete;

  /// The tensor `key` for a forward: prefetched when ready, else `map->get(name)`.
  at::Tensor take(const std::string& key, const WeightsMap& map, const std::string& name) {
    auto it = block_of_.find(key);
    if (it == block_of_.end()) return read_here(map, name);
    const int b = it->second;
    std::unique_lock<std::mutex> lk(mu_);
    if (b != last_block_) {
      last_block_ = b;
      schedule_after(b);
    }
    Slot& s = slots_[static_cast<size_t>(b)];
    if (s.state == State::kQueued) {
      ++stats_.waits;
      cv_.wait(lk, [&] { return s.state != State::kQueued; });
    }
    if (s.state == State::kFailed) {
      std::exception_ptr e = s.error;
      s = Slot{};
      std::rethrow_exception(e);
    }
    if (s.state == State::kReady) {
      auto t = s.tensors.find(key);
      if (t != s.tensors.end()) {
        at::Tensor out = std::move(t->second);
        s.tensors.erase(t);
        if (s.event && !s.waited) {
          // The compute stream waits for the side-stream copy of this block; no device-wide sync.
          c10::impl::VirtualGuardImpl impl(exec_.type());
          s.event->block(impl.getStream(exec_));
          s.waited = true;
        }
        if (out.device().is_cuda()) {
          // Allocated on the side stream, used (and freed) on the compute stream.
          c10::impl::VirtualGuardImpl impl(exec_.type());
          impl.recordDataPtrOnStream(out.storage().data_ptr(), impl.getStream(exec_));
        }
        if (s.tensors.empty()) s = Slot{};
        ++stats_.hits;
        return out;
      }
    }
    ++stats_.misses;
    lk.unlock();
    return read_here(map, name);
  }

  std::map<std::string, std::pair<at::Tensor, at::Tensor>> host_weights() {
    std::map<std::string, std::pair<at::Tensor, at::Tensor>> out;
    std::lock_guard<std::mutex> g(read_mu_);
    for (const auto& b : blocks_)
      for (const auto& e : b.entries)
        if (e.pinned.defined()) out[e.key] = {e.pinned, e.map->get(e.name)};
    return out;
  }

  PrefetchStats stats() const {
    std::lock_guard<std::mutex> lk(mu_);
    PrefetchStats s = stats_;
    s.depth = depth_;
    s.blocks = static_cast<int64_t>(blocks_.size());
    return s;
  }

 private:
  enum class State { kIdle, kQueued, kReady, kFailed };
  struct Slot {
    State state = State::kIdle;
    std::map<std::string, at::Tensor> tensors;
    std::exception_ptr error;
    std::shared_ptr<c10::Event> event;
    bool waited = false;
  };

  at::Tensor read_here(const WeightsMap& map, const std::string& name) {
    // The maps cache file handles and views without locks: one reader at a time.
    std::lock_guard<std::mutex> g(read_mu_);
    return map.get(name);
  }

  // Under mu_.
  void schedule_after(int b) {
    const int n = static_cast<int>(blocks_.size());
    bool queued = false;
    for (int k = 1; k <= depth_ && k < n; ++k) {
      const int next = (b + k) % n;
      Slot& s = slots_[static_cast<size_t>(next)];
      if (s.state != State::kIdle) continue;
      s.state = State::kQueued;
      queue_.push_back(next);
      queued = true;
    }
    if (queued) cv_.notify_all();
  }

  void run() {
    for (;;) {
      int b;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        b = queue_.front();
        queue_.pop_front();
      }
      Slot done;
      int64_t bytes = 0;
      const auto t0 = std::chrono::steady_clock::now();
      try {
        read_block(blocks_[static_cast<size_t>(b)], done, bytes);
        done.state = State::kReady;
      } catch (...) {
        done = Slot{};
        done.state = State::kFailed;
        done.error = std::current_exception();
      }
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      {
        std::lock_guard<std::mutex> lk(mu_);
        slots_[static_cast<size_t>(b)] = std::move(done);
        if (slots_[static_cast<size_t>(b)].state == State::kReady) {
          ++stats_.blocks_prefetched;
          stats_.bytes_prefetched += bytes;
          stats_.read_seconds += secs;
        }
      }
      cv_.notify_all();
    }
  }

  // Host copy of `src`: one large sequential read of the mapped range
  // (announced to the kernel first), into pinned memory for a CUDA device.
  at::Tensor host_copy(const at::Tensor& src) const {
    at::Tensor host = at::empty(src.sizes(), src.options().pinned_memory(exec_.is_cuda()));
    if (src.is_contiguous() && src.device().is_cpu()) {
      const size_t nbytes = static_cast<size_t>(src.numel()) * src.element_size();
      const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
      const auto start = reinterpret_cast<uintptr_t>(src.data_ptr()) & ~(page - 1);
      const auto end = reinterpret_cast<uintptr_t>(src.data_ptr()) + nbytes;
      if (nbytes > 0) (void)madvise(reinterpret_cast<void*>(start), end - start, MADV_WILLNEED);  // advice only
      std::memcpy(host.data_ptr(), src.data_ptr(), nbytes);
    } else {
      host.copy_(src);
    }
    return host;
  }

  // `src` with its pages read in: the kernel is told the range is needed
  // (one large read-ahead), then one byte per page is touched so the reads
  // happen here, on this thread. Tensors not backed by a mapping are returned as they are.
  static at::Tensor make_resident(const at::Tensor& src) {
    if (!src.device().is_cpu() || !src.is_contiguous() || src.numel() == 0) return src;
    const size_t nbytes = static_cast<size_t>(src.numel()) * src.element_size();
    const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const auto begin = reinterpret_cast<uintptr_t>(src.data_ptr());
    const uintptr_t start = begin & ~(page - 1), end = begin + nbytes;
    (void)madvise(reinterpret_cast<void*>(start), end - start, MADV_WILLNEED);  // advice only
    unsigned sum = 0;
    for (uintptr_t p = begin; p < end; p = (p | (page - 1)) + 1) sum += *reinterpret_cast<const volatile unsigned char*>(p);
    (void)sum;
    return src;
  }

  void read_block(const Block& block, Slot& out, int64_t& bytes) {
    const bool cuda = exec_.is_cuda();
    std::optional<c10::StreamGuard> on_side;
    if (cuda) on_side.emplace(*side_stream_);
    for (const auto& e : block.entries) {
      at::Tensor src = e.pinned;
      if (!src.defined()) {
        std::lock_guard<std::mutex> g(read_mu_);
        src = e.map->get(e.name);
      }
      bytes += static_cast<int64_t>(src.numel()) * src.element_size();
      if (src.is_meta()) {
        out.tensors[e.key] = src;
        continue;
      }
      if (!cuda) {
        // A CPU computes on the mapped file itself: making its pages resident
        // is the read ahead; a copy would cost a second pass over memory
        // (measured: half the decode speed, bench_offload --decode).
        out.tensors[e.key] = make_resident(src);
        continue;
      }
      at::Tensor host = e.pinned.defined() ? e.pinned : host_copy(src);
      at::Tensor dev = at::empty(host.sizes(), host.options().device(exec_).pinned_memory(false));
      dev.copy_(host, /*non_blocking=*/true);
      out.tensors[e.key] = dev;
    }
    if (cuda) {
      out.event = std::make_shared<c10::Event>(c10::DeviceType::CUDA);
      out.event->record(*side_stream_);
    }
  }

  std::vector<Block> blocks_;
  std::map<std::string, int> block_of_;
  const int depth_;
  const c10::Device exec_;
  std::optional<c10::Stream> side_stream_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::mutex read_mu_;
  std::vector<Slot> slots_;
  std::deque<int> queue_;
  int last_block_ = -1;
  bool stop_ = false;
  PrefetchStats stats_;
  std::thread thread_;  // last: started once everything above exists
};

namespace {

// The hook's map, with reads going through the prefetcher.
class PrefetchedWeights : public WeightsMap {
 public:
  PrefetchedWeights(std::shared_ptr<BlockPrefetcher> p, std::shared_ptr<const WeightsMap> base, std::string prefix)
      : prefetcher_(std::move(p)), base_(std::move(base)), prefix_(std::move(prefix)) {}
  bool contains(const std::string& name) const override { return base_->contains(name); }
  at::Tensor get(const std::string& name) const override { return prefetcher_->take(prefix_ + name, *base_, name); }
  std::vector<std::string> keys() const override { return base_->keys(); }
  const std::shared_ptr<BlockPrefetcher>& prefetcher() const { return prefetcher_; }

 private:
  std::shared_ptr<BlockPrefetcher> prefetcher_;
  std::shared_ptr<const WeightsMap> base_;
  std::string prefix_;
};

// The device-map entry that places `module` (longest key that is it or an ancestor).
const DeviceMap::Entry* covering_entry(const DeviceMap& map, const std::string& module) {
  const DeviceMap::Entry* best = nullptr;
  for (const auto& e : map) {
    const std::string& k = e.first;
    const bool covers = k.empty() || module == k || (module.size() > k.size() && module.compare(0, k.size(), k) == 0 &&
                                                     module[k.size()] == '.');
    if (covers && (!best || k.size() > best->first.size())) best = &e;
  }
  return best;
}

}  // namespace

std::shared_ptr<BlockPrefetcher> enable_block_prefetch(Module& model, int depth) {
  if (depth <= 0) return nullptr;
  const auto map = hf_device_map(model);
  if (!map) return nullptr;
  std::vector<BlockPrefetcher::Block> blocks;
  std::map<std::string, size_t> index;
  struct Target {
    std::shared_ptr<AlignDevicesHook> hook;
    std::string prefix;
  };
  std::vector<Target> targets;
  std::optional<c10::Device> exec;
  HostCopies pinned;
  const HostCopyFn pin = [](const at::Tensor& t) { return t.is_pinned() ? t : t.pin_memory(); };
  for (const auto& [name, m] : model.named_flex_modules()) {
    auto hook = find_hook<AlignDevicesHook>(m->model_hook());
    if (!hook || !hook->options().offload || !hook->options().weights_map) continue;
    if (std::dynamic_pointer_cast<const PrefetchedWeights>(hook->options().weights_map)) continue;  // already on
    const DeviceMap::Entry* e = covering_entry(*map, name);
    if (!e || e->second.is_gpu()) continue;
    const c10::Device d = hook->options().execution_device.value_or(c10::Device(at::kCPU));
    if (exec && *exec != d) continue;  // one execution device for offloaded blocks (dispatch_model's main device)
    exec = d;
    auto [it, fresh] = index.emplace(e->first, blocks.size());
    if (fresh) blocks.push_back({e->first, {}});
    const std::string prefix = name.empty() ? "" : name + ".";
    const auto& o = hook->options();
    for (const auto& kv : named_module_tensors(*m, o.offload_buffers, o.place_submodules, true)) {
      BlockPrefetcher::Entry entry{prefix + kv.first, o.weights_map, kv.first, {}};
      // CPU-resident weights of a CUDA model: pinned once here, copied from there on every use. The
      // pinned copy replaces the map's tensor, so the host holds these weights once, not twice.
      if (d.is_cuda() && e->second.is_cpu() && o.weights_map->contains(kv.first)) {
        at::Tensor t = pinned.hold(*o.weights_map, kv.first, pin);
        if (t.device().is_cpu() && !t.is_meta()) entry.pinned = t;
      }
      blocks[it->second].entries.push_back(std::move(entry));
    }
    targets.push_back({hook, prefix});
  }
  if (blocks.size() < 2 || !exec) return nullptr;
  auto p = std::make_shared<BlockPrefetcher>(std::move(blocks), depth, *exec);
  for (auto& t : targets) t.hook->options().weights_map = std::make_shared<PrefetchedWeights>(p, t.hook->options().weights_map, t.prefix);
  return p;
}

std::map<std::string, std::pair<at::Tensor, at::Tensor>> block_prefetch_host_weights(Module& model) {
  for (const auto& [name, m] : model.named_flex_modules()) {
    auto hook = find_hook<AlignDevicesHook>(m->model_hook());
    if (!hook) continue;
    if (auto w = std::dynamic_pointer_cast<const PrefetchedWeights>(hook->options().weights_map))
      return w->prefetcher()->host_weights();
  }
  return {};
}

std::optional<PrefetchStats> block_prefetch_stats(Module& model) {
  for (const auto& [name, m] : model.named_flex_modules()) {
    auto hook = find_hook<AlignDevicesHook>(m->model_hook());
    if (!hook) continue;
    if (auto w = std::dynamic_pointer_cast<const PrefetchedWeights>(hook->options().weights_map))
      return w->prefetcher()->stats();
  }
  return std::nullopt;
}

}  // namespace flex
