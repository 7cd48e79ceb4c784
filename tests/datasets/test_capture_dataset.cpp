// capture_dataset in process (the tokenizer-prefetch and writer threads run
// here, so the sanitizer builds see them): the shards equal a plain loop of
// FlexModel forwards over the same contexts, a capture stopped and resumed
// equals one run, and an error of the writer thread reaches the caller.
#include <flex/datasets/activation_shards.h>
#include <flex/datasets/capture_dataset.h>
#include <flex/dispatch/safetensors.h>
#include <flex/flexcore/flex_model.h>
#include <flex/hooks/errors.h>
#include <flex/models/auto_model.h>
#include <flex/models/causal_lm.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "test_util.h"

namespace fs = std::filesystem;

namespace {

const char* kHook = "transformer.h.1";

flex::DatasetCaptureOptions options(const std::string& ids, const std::string& out) {
  flex::DatasetCaptureOptions o;
  o.corpus.path = ids;
  o.corpus.context_len = 16;
  o.corpus.batch_size = 3;
  o.corpus.prefetch_batches = 2;
  o.hooks = {kHook};
  o.out_dir = out;
  o.max_shard_bytes = 6000;  // a few batches per shard
  o.write_queue_batches = 1;
  return o;
}

at::Tensor all_of(const std::string& dir, const std::string& key) {
  flex::ActivationDataset ds(dir);
  std::vector<at::Tensor> parts;
  for (size_t s = 0; s < ds.num_shards(); ++s) {
    auto sh = ds.shard(s);
    parts.push_back(key == "token_ids" ? sh.token_ids : sh.activations.at(key));
  }
  return at::cat(parts, 0);
}

}  // namespace

TEST(CaptureDataset, EqualsAPlainLoopAndResumesWhereItStopped) {
  flex_test::TempDir tmp;
  at::manual_seed(1);
  const at::Tensor stream = at::randint(0, 256, {16 * 40 + 5}, at::kLong);
  flex::save_safetensors(tmp.str("ids.safetensors"), {{"input_ids", stream}});
  auto model = flex::load_pretrained(flex_test::fixture("models/gpt2"));
  flex::FlexModel fm(model);

  const auto r = flex::capture_dataset(fm, nullptr, options(tmp.str("ids.safetensors"), tmp.str("whole")));
  EXPECT_EQ(r.contexts, 40);
  EXPECT_EQ(r.tokens_dropped, 5);
  EXPECT_EQ(r.tokens_stored, 40 * 16);
  EXPECT_GT(flex::ActivationDataset(tmp.str("whole")).num_shards(), 3u);

  // The same contexts, batch by batch, through the FlexModel by hand.
  std::vector<at::Tensor> want;
  {
    auto h = fm.register_forward_hook(std::make_shared<flex::HookFunction>(kHook));
    at::NoGradGuard ng;
    const at::Tensor ctx = stream.narrow(0, 0, 40 * 16).reshape({40, 16});
    for (int64_t b = 0; b < 40; b += 3) {
      flex::LMInputs in;
      in.input_ids = ctx.narrow(0, b, std::min<int64_t>(3, 40 - b));
      fm.forward(in.to_inputs());
      want.push_back(fm.output().at(kHook)[0].reshape({-1, 64}).clone());
      fm.clear();
    }
    h.remove();
  }
  EXPECT_TRUE(flex_test::equal(all_of(tmp.str("whole"), kHook), at::cat(want, 0)));
  EXPECT_TRUE(flex_test::equal(all_of(tmp.str("whole"), "token_ids"), stream.narrow(0, 0, 40 * 16)));

  // Stopped after 12 contexts (whole batches: the same batches as one run,
  // so the same bits), then resumed.
  auto first = options(tmp.str("ids.safetensors"), tmp.str("parts"));
  first.corpus.max_contexts = 12;
  EXPECT_EQ(flex::capture_dataset(fm, nullptr, first).contexts, 12);
  const auto rest = flex::capture_dataset(fm, nullptr, options(tmp.str("ids.safetensors"), tmp.str("parts")));
  EXPECT_EQ(rest.resumed_at, 12);
  EXPECT_TRUE(flex_test::equal(all_of(tmp.str("parts"), kHook), all_of(tmp.str("whole"), kHook)));
  EXPECT_TRUE(fm.output().empty()) << "the capture's hooks are gone";
}

TEST(CaptureDataset, AWriterThreadErrorReachesTheCaller) {
  flex_test::TempDir tmp;
  flex::save_safetensors(tmp.str("ids.safetensors"), {{"input_ids", at::randint(0, 256, {16 * 60}, at::kLong)}});
  auto model = flex::load_pretrained(flex_test::fixture("models/gpt2"));
  flex::FlexModel fm(model);
  auto o = options(tmp.str("ids.safetensors"), tmp.str("gone"));
  // After the first batch the directory becomes a plain file: the next shard cannot be written.
  o.on_progress = [&](const flex::DatasetCaptureProgress&) {
    if (fs::is_regular_file(tmp.str("gone"))) return;
    std::error_code ec;
    while (fs::exists(tmp.str("gone"))) fs::remove_all(tmp.str("gone"), ec);  // the writer may be adding a file
    std::ofstream(tmp.str("gone")) << "x";
  };
  EXPECT_THROW(flex::capture_dataset(fm, nullptr, o), flex::Error);
}
