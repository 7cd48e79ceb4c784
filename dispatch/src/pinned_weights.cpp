#include <flex/dispatch/pinned_weights.h>

#include <ATen/ATen.h>

namespace flex {

at::Tensor HostCopies::hold(const WeightsMap& map, const std::string& name, const HostCopyFn& copy) {
  at::Tensor t = map.get(name);
  if (!t.defined() || t.is_meta() || !t.device().is_cpu()) return t;
  const Key key{t.data_ptr(), t.sizes().vec(), t.strides().vec(), static_cast<int>(t.scalar_type())};
  if (copies_.count(t.data_ptr())) return t;  // already a copy made here (asked again through another map)
  auto it = done_.find(key);
  // done_ keeps the copies, not the sources: a source freed by the swap below
  // leaves its address behind, but every source was allocated before this
  // runs, so no later source can be found at that address.
  at::Tensor held = it != done_.end() ? it->second : copy(t);
  if (held.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return t;
  done_.emplace(key, held);
  copies_.insert(held.data_ptr());
  // When the map does not hold the tensor (a cast copy, read anew each time)
  // nothing is kept twice; the copy is still the one the prefetcher uses.
  (void)map.replace(name, held);
  return held;
}

}  // namespace flex
