// A counting wrapper of the CPU allocator (attribution_memory.h). Every
// block keeps data == context, as the default allocator's do, so that
// Allocator::raw_allocate (oneDNN's scratch buffers) works and a block made
// while the meter was installed can be freed after it is gone: the sizes
// live in one map, and a pointer not in it is handed to the original raw
// deleter.
#include "attribution_memory.h"

#include <flex/hooks/errors.h>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <unordered_map>

namespace flex::detail {

namespace {

class CountingCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    if (data == nullptr || inner.get_context() != data) return inner;  // size 0, or a block we cannot wrap
    const c10::Device device = inner.device();
    inner.release_context();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      sizes_[data] = n;
    }
    const int64_t now = live_.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return {data, data, &counted_delete, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &counted_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

  static void counted_delete(void* p) {
    CountingCpuAllocator& self = instance();
    size_t n = 0;
    bool ours = false;
    {
      std::lock_guard<std::mutex> lock(self.mutex_);
      auto it = self.sizes_.find(p);
      if (it != self.sizes_.end()) {
        n = it->second;
        ours = true;
        self.sizes_.erase(it);
      }
    }
    if (ours) self.live_.fetch_sub(static_cast<int64_t>(n));
    self.base_deleter_(p);
  }

  static CountingCpuAllocator& instance() {
    static CountingCpuAllocator* a = new CountingCpuAllocator;  // never destroyed: blocks may outlive everything
    return *a;
  }

  void install() {
    std::lock_guard<std::mutex> lock(install_mutex_);
    if (users_++ > 0) return;
    c10::Allocator* current = c10::GetCPUAllocator();
    if (current == this) return;
    if (current->raw_deleter() == nullptr) {
      --users_;
      throw UnsupportedError("attribution: the CPU allocator in use has no raw deleter; working memory cannot be measured");
    }
    base_ = current;
    base_deleter_ = current->raw_deleter();
    c10::SetCPUAllocator(this, kPriority);
    if (c10::GetCPUAllocator() != this) {
      --users_;
      throw UnsupportedError("attribution: another CPU allocator of higher priority is installed; working memory cannot be measured");
    }
  }
  void uninstall() {
    std::lock_guard<std::mutex> lock(install_mutex_);
    if (--users_ > 0) return;
    c10::SetCPUAllocator(base_, kPriority);
  }

  std::atomic<int64_t> live_{0}, peak_{0};

 private:
  // Equal to the default allocator's registration (0) or above it; the same
  // priority restores the original.
  static constexpr uint8_t kPriority = 0;
  c10::Allocator* base_ = nullptr;
  c10::DeleterFnPtr base_deleter_ = nullptr;
  std::mutex mutex_, install_mutex_;
  std::unordered_map<void*, size_t> sizes_;
  int users_ = 0;
};

}  // namespace

CpuAllocationMeter::CpuAllocationMeter() {
  CountingCpuAllocator& a = CountingCpuAllocator::instance();
  a.install();
  base_ = a.live_.load();
  reset_peak();
}

CpuAllocationMeter::~CpuAllocationMeter() { CountingCpuAllocator::instance().uninstall(); }

int64_t CpuAllocationMeter::live() const { return CountingCpuAllocator::instance().live_.load() - base_; }

int64_t CpuAllocationMeter::peak() const { return CountingCpuAllocator::instance().peak_.load() - base_; }

void CpuAllocationMeter::reset_peak() {
  CountingCpuAllocator& a = CountingCpuAllocator::instance();
  a.peak_.store(a.live_.load());
}

}  // namespace flex::detail
