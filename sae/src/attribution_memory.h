#pragma once
// The working memory of a streamed attribution (design decision 45),
// measured rather than estimated: while a CpuAllocationMeter lives, every
// CPU tensor allocation of the process goes through a counting wrapper of
// the CPU allocator, which keeps the bytes still held and their peak. The
// replicated forward's size per batch row differs by architecture (what
// autograd saves per layer), so attribute() measures it with two probe
// passes and sizes its batch from the measurement. Internal to attribution.
#include <cstdint>

namespace flex::detail {

class CpuAllocationMeter {
 public:
  /// Installs the counting allocator (meters alive at once share it).
  CpuAllocationMeter();
  /// Restores the allocator found when the last meter goes.
  ~CpuAllocationMeter();
  CpuAllocationMeter(const CpuAllocationMeter&) = delete;
  CpuAllocationMeter& operator=(const CpuAllocationMeter&) = delete;

  /// Bytes allocated since this meter was made and not freed yet (other
  /// threads' allocations included).
  int64_t live() const;
  /// The largest live() since the meter was made or reset_peak().
  int64_t peak() const;
  void reset_peak();

 private:
  int64_t base_ = 0;
};

}  // namespace flex::detail
