#include <flex/kernels/memory_reuse.h>

#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace flex {

bool keep_freed_memory() {
  const char* keep = std::getenv("FLEXMODEL_KEEP_FREED_MEMORY");
  if (keep && std::strcmp(keep, "0") == 0) return false;  // the process's owner said no
#if defined(__GLIBC__)
  // A heap that cannot grow by brk() (another mapping above it) still falls
  // back to mmap() inside glibc, so no allocation fails for these settings.
  const bool no_mmap = mallopt(M_MMAP_MAX, 0) == 1;
  const bool no_trim = mallopt(M_TRIM_THRESHOLD, -1) == 1;  // -1: the heap top is never given back
  const bool pad = mallopt(M_TOP_PAD, 64 << 20) == 1;       // grow the heap 64 MB at a time
  return no_mmap && no_trim && pad;
#else
  return false;
#endif
}

}  // namespace flex
