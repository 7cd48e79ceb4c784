// find_executable_batch_size: halving after out-of-memory failures (the
// exceptions libtorch's allocators and operator new raise), nothing else.
#include <flex/dispatch/batch_size.h>

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <new>
#include <vector>

namespace {

/// Fails like libtorch's CPU allocator above `limit` rows; records every try.
struct Allocating {
  int64_t limit;
  std::vector<int64_t> tried;
  int64_t operator()(int64_t batch) {
    tried.push_back(batch);
    if (batch > limit) TORCH_CHECK(false, "DefaultCPUAllocator: can't allocate memory: you tried to allocate ", batch << 30, " bytes.");
    return batch * 10;
  }
};

}  // namespace

TEST(FindExecutableBatchSize, HalvesUntilTheFunctionFits) {
  Allocating f{40, {}};
  EXPECT_EQ(flex::find_executable_batch_size(std::ref(f), 128), 320);
  EXPECT_EQ(f.tried, (std::vector<int64_t>{128, 64, 32}));
  Allocating g{1000, {}};
  EXPECT_EQ(flex::find_executable_batch_size(std::ref(g), 128), 1280);  // fits at once
  EXPECT_EQ(g.tried, (std::vector<int64_t>{128}));
}

TEST(FindExecutableBatchSize, EveryOutOfMemoryFormCounts) {
  for (int kind = 0; kind < 3; ++kind) {
    std::vector<int64_t> tried;
    const int64_t got = flex::find_executable_batch_size(
        [&](int64_t b) {
          tried.push_back(b);
          if (b > 5) {
            if (kind == 0) throw std::bad_alloc();
            if (kind == 1) TORCH_CHECK(false, "CUDA out of memory. Tried to allocate 2.00 GiB");
            TORCH_CHECK(false, "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if ...");
          }
          return b;
        },
        24);
    EXPECT_EQ(got, 3) << kind;  // 24, 12, 6 fail; 3 fits
    EXPECT_EQ(tried, (std::vector<int64_t>{24, 12, 6, 3})) << kind;
  }
}

TEST(FindExecutableBatchSize, OtherErrorsAndNoFitAreNotRetried) {
  int calls = 0;
  EXPECT_THROW(flex::find_executable_batch_size([&](int64_t) -> int { ++calls; throw flex::ShapeError("bad shape"); }, 64),
               flex::ShapeError);
  EXPECT_EQ(calls, 1);
  Allocating never{0, {}};
  try {
    flex::find_executable_batch_size(std::ref(never), 8);
    FAIL() << "no batch size fits";
  } catch (const flex::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("batch size 1 still ran out of memory"), std::string::npos) << e.what();
  }
  EXPECT_EQ(never.tried, (std::vector<int64_t>{8, 4, 2, 1}));
  EXPECT_THROW(flex::find_executable_batch_size(std::ref(never), 0), flex::ConfigError);
}
