// StreamingSink: captures on disk equal in-memory captures; memory stays
// bounded; a capture killed mid-way resumes to exactly the full capture.
#include "tiny_lm.h"

#include <flex/dispatch/safetensors.h>
#include <flex/flexcore/flex_model.h>
#include <flex/flexcore/streaming_sink.h>
#include <flex/hooks/errors.h>

#include "test_util.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <csignal>
#include <fstream>
#include <sys/wait.h>
#include <unistd.h>

using namespace flex;

namespace {

constexpr int kForwards = 12;

at::Tensor batch(int i) {
  at::Tensor ids = at::arange(10, at::kLong).view({2, 5});
  return (ids * (i + 3) + i) % 32;
}

void hook_all(FlexModel& fm) {
  fm.register_forward_hook(std::make_shared<HookFunction>("h.0.mlp"));
  fm.register_forward_hook(std::make_shared<HookFunction>("h.2"));
  fm.register_forward_hook(std::make_shared<HookFunction>("lm_head"));
}

// Runs forwards [sink.forwards_done(), kForwards) through a FlexModel streaming into `dir`.
// With kill_at >= 0, the process kills itself with SIGKILL inside forward kill_at.
void capture_into(const std::shared_ptr<tiny::LM>& lm, const std::string& dir, uint64_t shard_bytes,
                  int kill_at = -1) {
  auto sink = std::make_shared<StreamingSink>(dir, StreamingSinkOptions{shard_bytes, true});
  FlexModel fm(lm);
  hook_all(fm);
  if (kill_at >= 0) {
    HookFunctionOptions o;
    o.save = false;
    o.editing_function = [&, kill_at](Module&, const at::Tensor& t, SaveContext&, TrainableModules&) {
      if (sink->forwards_done() == kill_at) raise(SIGKILL);
      return t;
    };
    fm.register_forward_hook(std::make_shared<HookFunction>("h.1", o));
  }
  fm.set_sink(sink);
  at::NoGradGuard ng;
  for (int64_t i = sink->forwards_done(); i < kForwards; ++i) fm.forward(batch(static_cast<int>(i)));
}

OutputMap in_memory(const std::shared_ptr<tiny::LM>& lm) {
  FlexModel fm(lm);
  hook_all(fm);
  at::NoGradGuard ng;
  for (int i = 0; i < kForwards; ++i) fm.forward(batch(i));
  return fm.output();
}

void expect_full_capture(const std::string& dir, const OutputMap& ref) {
  CaptureReader r(dir);
  ASSERT_EQ(r.num_forwards(), kForwards);
  EXPECT_EQ(r.keys(), (std::vector<std::string>{"h.0.mlp", "h.2", "lm_head"}));
  for (const auto& kv : ref) {
    auto got = r.all(kv.first);
    ASSERT_EQ(got.size(), kv.second.size()) << kv.first;
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(flex_test::equal(got[i], kv.second[i])) << kv.first << " " << i;
  }
}

}  // namespace

TEST(StreamingSink, DiskCaptureEqualsMemoryCaptureAcrossShards) {
  at::manual_seed(0);
  auto lm = std::make_shared<tiny::LM>();
  OutputMap ref = in_memory(lm);
  flex_test::TempDir dir;
  const uint64_t per_forward = (2 * 5 * 16 * 2 + 2 * 5 * 32) * 4;  // bytes captured per forward
  capture_into(lm, dir.str(), 3 * per_forward);
  expect_full_capture(dir.str(), ref);
  // Shards hold whole forwards: 12 forwards, flushed every 3 => 4 shards.
  int shards = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path()))
    shards += e.path().filename().string().rfind("shard-", 0) == 0;
  EXPECT_EQ(shards, 4);
  // The summary index agrees with the shards.
  std::ifstream f(dir.str("index.json"));
  auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j["forwards"].get<int>(), kForwards);
  EXPECT_EQ(j["entries"].size(), 3u * kForwards);
  EXPECT_EQ(j["entries"][0]["shape"], nlohmann::json::array({2, 5, 16}));
}

TEST(StreamingSink, BufferStaysBoundedWhileCapturing) {
  auto lm = std::make_shared<tiny::LM>();
  flex_test::TempDir dir;
  auto sink = std::make_shared<StreamingSink>(dir.str(), StreamingSinkOptions{4096, true});
  FlexModel fm(lm);
  hook_all(fm);
  fm.set_sink(sink);
  at::NoGradGuard ng;
  for (int i = 0; i < kForwards; ++i) {
    fm.forward(batch(i));
    // One forward captures 2560 + 1280 bytes > 4096/2: at most one forward stays buffered.
    EXPECT_GE(sink->forwards_on_disk(), sink->forwards_done() - 1) << i;
  }
}

// Resuming after SIGKILL is tested in tests/reliability/test_crash_safe_writes.cpp,
// which kills a spawned (fork + exec) capture 20 times at random moments: a
// forked child that keeps using libtorch here could deadlock (fork without exec).

TEST(StreamingSink, LeftoverTempFilesAreRemovedAndGapsRejected) {
  auto lm = std::make_shared<tiny::LM>();
  flex_test::TempDir dir;
  capture_into(lm, dir.str(), 1);
  { std::ofstream(dir.str("shard-00012.safetensors.tmp.999")) << "partial"; }
  { StreamingSink again(dir.str()); EXPECT_EQ(again.forwards_done(), kForwards); }
  EXPECT_FALSE(std::filesystem::exists(dir.str("shard-00012.safetensors.tmp.999")));
  EXPECT_THROW(StreamingSink(dir.str(), StreamingSinkOptions{1, /*resume=*/false}), ConfigError);
  std::filesystem::remove(dir.str("shard-00003.safetensors"));
  EXPECT_THROW(CaptureReader{dir.str()}, FileFormatError);
}

TEST(StreamingSink, ModuleCalledTwicePerForwardKeepsBothCaptures) {
  flex_test::TempDir dir;
  {
    StreamingSink sink(dir.str());
    sink.write("m", 0, at::ones({2}));
    sink.write("m", 0, at::zeros({2}));
    sink.end_forward(0);
  }
  CaptureReader r(dir.str());
  EXPECT_TRUE(flex_test::equal(r.get(0, "m"), at::ones({2})));
  EXPECT_TRUE(flex_test::equal(r.get(0, "m@1"), at::zeros({2})));
  EXPECT_THROW(r.get(1, "m"), NotFoundError);
}
