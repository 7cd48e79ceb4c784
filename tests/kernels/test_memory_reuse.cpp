// keep_freed_memory: a 64 MB block freed and allocated again is served from
// memory the process already has (no page faults the second time), where
// glibc's defaults hand it back to the kernel and fault it in again. Page
// faults are counted by getrusage; this binary runs these tests alone, as
// malloc's settings are the process's.
#include <flex/kernels/memory_reuse.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <sys/resource.h>

namespace {

constexpr size_t kBlock = 64u << 20;  // over glibc's largest mmap threshold (32 MB)

long minor_faults() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

// Page faults of allocating kBlock, writing every page, freeing it.
long faults_of_one_block() {
  const long before = minor_faults();
  auto* p = static_cast<char*>(std::malloc(kBlock));
  EXPECT_NE(p, nullptr);
  if (!p) return 0;
  std::memset(p, 1, kBlock);
  // The block escapes to the compiler: the allocation and writes stay.
  asm volatile("" : : "r"(p) : "memory");
  std::free(p);
  return minor_faults() - before;
}

TEST(MemoryReuse, AFreedBlockIsReusedWithoutPageFaults) {
#if !defined(__GLIBC__)
  GTEST_SKIP() << "glibc's malloc only";
#else
  const long pages = static_cast<long>(kBlock / 4096);
  if (std::getenv("GLIBC_TUNABLES") == nullptr) {
    // glibc as it ships: each allocation is a fresh mmap(), every page faults (fewer with huge pages).
    faults_of_one_block();
    EXPECT_GT(faults_of_one_block(), pages / 600) << "the second block did not fault: glibc kept it without being asked";
  }
  ASSERT_TRUE(flex::keep_freed_memory());
  faults_of_one_block();  // the heap grows once
  const long again = faults_of_one_block();
  EXPECT_LT(again, pages / 100) << again << " page faults for a block of " << pages << " pages freed just before";
  EXPECT_TRUE(flex::keep_freed_memory()) << "a second call";
#endif
}

}  // namespace
