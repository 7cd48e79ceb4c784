// Concurrency: the parts that share state between threads give the same
// results from several threads at once as from one (and run clean under
// ThreadSanitizer, see scripts/ci-sanitizers.sh): the tokenizer's word cache,
// lazily loaded .bin shards of a Checkpoint, shared safetensors mappings,
// EmptyInit's per-thread scope, and StreamingSinks writing side by side.
#include <flex/dispatch/checkpoint.h>
#include <flex/dispatch/safetensors.h>
#include <flex/flexcore/streaming_sink.h>
#include <flex/hooks/empty_init.h>
#include <flex/hooks/nn.h>
#include <flex/tokenizers/tokenizer.h>

#include "test_util.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

using namespace flex;

namespace {

constexpr int kThreads = 4;

template <typename F>
void run_threads(F f) {
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) ts.emplace_back(f, t);
  for (auto& t : ts) t.join();
}

}  // namespace

// Every thread encodes the golden texts (sharing one cache) and must get the golden ids.
TEST(Threads, TokenizerSharedAcrossThreadsGivesGoldenIds) {
  auto tok = load_tokenizer(flex_test::data_path("tokenizers/gpt2"));
  std::ifstream in(flex_test::data_path("tokenizers/gpt2_golden.json"));
  auto g = nlohmann::json::parse(in);
  const auto& cases = g.is_object() && g.contains("cases") ? g["cases"] : g;
  std::atomic<int> mismatches{0}, checked{0};
  run_threads([&](int t) {
    for (int round = 0; round < 3; ++round)
      for (size_t i = t; i < cases.size() + t; ++i) {  // each thread starts elsewhere
        const auto& c = cases[i % cases.size()];
        if (tok->encode(c["text"].get<std::string>(), false) != c["ids"].get<std::vector<int64_t>>()) ++mismatches;
        ++checked;
      }
  });
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(checked.load(), kThreads * 3 * static_cast<int>(cases.size()));
}

// .bin shards load on first use under a mutex; all threads see the same tensors.
TEST(Threads, CheckpointLazyBinLoadingFromManyThreads) {
  auto ref = Checkpoint::open(flex_test::data_path("files/torch-bin-sharded"));
  std::vector<std::pair<std::string, at::Tensor>> want;
  for (const auto& k : ref.keys()) want.emplace_back(k, ref.get(k).clone());
  auto ck = Checkpoint::open(flex_test::data_path("files/torch-bin-sharded"));  // nothing loaded yet
  std::atomic<int> bad{0};
  run_threads([&](int t) {
    for (size_t i = 0; i < want.size(); ++i) {
      const auto& [k, w] = want[(i + t) % want.size()];
      if (!at::equal(ck.get(k), w)) ++bad;
    }
  });
  EXPECT_EQ(bad.load(), 0);
  ASSERT_FALSE(want.empty());
}

TEST(Threads, SafetensorsViewsReadConcurrently) {
  auto f = SafetensorsFile::open(flex_test::fixture("models/gpt2/model.safetensors"));
  std::vector<double> sums;
  for (const auto& n : f->names()) sums.push_back(f->get(n).to(at::kDouble).sum().item<double>());
  std::atomic<int> bad{0};
  run_threads([&](int t) {
    for (size_t i = 0; i < sums.size(); ++i) {
      size_t j = (i + 7 * t) % sums.size();
      if (f->get(f->names()[j]).to(at::kDouble).sum().item<double>() != sums[j]) ++bad;
    }
  });
  EXPECT_EQ(bad.load(), 0);
}

// EmptyInit is per thread: a scope on one thread must not put another
// thread's parameters on meta.
TEST(Threads, EmptyInitScopeIsPerThread) {
  std::atomic<int> wrong{0};
  run_threads([&](int t) {
    for (int i = 0; i < 50; ++i) {
      if (t % 2 == 0) {
        EmptyInit scope;
        Linear l(8, 8);
        if (!l.weight.is_meta()) ++wrong;
      } else {
        Linear l(8, 8);
        if (l.weight.is_meta()) ++wrong;
      }
    }
  });
  EXPECT_EQ(wrong.load(), 0);
}

// Independent sinks in parallel (one per thread) each hold exactly their own data.
TEST(Threads, StreamingSinksSideBySide) {
  flex_test::TempDir tmp;
  run_threads([&](int t) {
    StreamingSink sink(tmp.str("cap" + std::to_string(t)), StreamingSinkOptions{1024, true});
    for (int f = 0; f < 20; ++f) {
      sink.write("x", f, at::full({64}, static_cast<float>(100 * t + f)));
      sink.end_forward(f);
    }
    sink.flush();
  });
  for (int t = 0; t < kThreads; ++t) {
    CaptureReader r(tmp.str("cap" + std::to_string(t)));
    ASSERT_EQ(r.num_forwards(), 20);
    for (int f = 0; f < 20; ++f)
      EXPECT_TRUE(flex_test::equal(r.get(f, "x"), at::full({64}, static_cast<float>(100 * t + f))));
  }
}
