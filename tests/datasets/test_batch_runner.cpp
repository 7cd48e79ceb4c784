// The batch runner (flex/datasets/batch_runner.h) and the device facts under
// it (flex::input_device, flex::DeviceError), without a GPU, on the meta
// device (a whole meta forward of every architecture needs the meta kernels
// PyTorch registers from Python: tests/python/test_placement.py runs it):
//  - without the runner, the first module that gets the misplaced ids says so
//    with a DeviceError naming the module and both devices;
//  - batches of a few rows give the whole batch's captures (padding, token
//    index shifts of expert rows), auto batch size halves on out-of-memory.
#include <flex/datasets/batch_runner.h>
#include <flex/dispatch/big_modeling.h>
#include <flex/flexcore/flex_model.h>
#include <flex/flexcore/hook_function.h>
#include <flex/hooks/empty_init.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/nn.h>
#include <flex/models/auto_model.h>
#include <flex/models/config.h>
#include <flex/models/from_pretrained.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <new>

#include "test_util.h"

namespace {

using namespace flex;


std::shared_ptr<CausalLM> meta_model(const std::string& dir) {
  const ModelConfig cfg = load_config(dir);
  EmptyInit everything(/*include_buffers=*/true);
  return build_causal_lm(cfg);
}



TEST(InputDevice, FollowsTheFirstConsumerWhateverThePlacement) {
  const std::string dir = flex_test::fixture("models/gpt2");
  auto cpu = from_pretrained(dir);
  EXPECT_EQ(input_device(*cpu), c10::Device(at::kCPU));
  auto meta = meta_model(dir);
  EXPECT_EQ(input_device(*meta), c10::Device(at::kMeta));
  // A hook with an execution device on the way in decides, not where the weights sit.
  AlignDevicesOptions o;
  o.execution_device = c10::Device(at::kMeta);
  add_hook_to_module(*cpu->get_submodule("transformer.wte"), std::make_shared<AlignDevicesHook>(o));
  EXPECT_EQ(input_device(*cpu), c10::Device(at::kMeta));
}

TEST(BatchRunner, WithoutPlacementTheConsumerNamesItselfAndBothDevices) {
  for (const std::string name : {"gpt2", "llama", "gpt-neox"}) {
    auto model = meta_model(flex_test::fixture("models/" + name));
    FlexModel fm(model);
    LMInputs in;
    in.input_ids = at::zeros({1, 4}, at::kLong);
    const std::string consumer = name == "gpt2" ? "'transformer.wte'" : name == "llama" ? "'model.embed_tokens'"
                                                                                        : "'gpt_neox.embed_in'";
    try {
      fm.forward(in.to_inputs());
      ADD_FAILURE() << name << ": a CPU input into a meta model ran";
    } catch (const DeviceError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(consumer), std::string::npos) << what;
      EXPECT_NE(what.find("cpu"), std::string::npos) << what;
      EXPECT_NE(what.find("meta"), std::string::npos) << what;
    }
  }
}

TEST(BatchRunner, LinearNamesAMisplacedInput) {
  EmptyInit on_meta;
  Linear l(3, 2);
  try {
    l(at::zeros({1, 3}));
    ADD_FAILURE() << "a CPU input into a meta Linear ran";
  } catch (const DeviceError& e) {
    EXPECT_EQ(e.module(), static_cast<const void*>(&l));
    EXPECT_NE(std::string(e.what()).find("Linear"), std::string::npos) << e.what();
  }
}

// Captures of `hooks` for the whole batch in one plain forward, on the CPU.
std::map<std::string, at::Tensor> whole_batch(const std::shared_ptr<CausalLM>& model, const TokenBatch& b,
                                              const std::vector<std::string>& hooks) {
  FlexModel fm(model);
  for (const auto& h : hooks) fm.register_forward_hook(std::make_shared<HookFunction>(h));
  at::NoGradGuard g;
  LMInputs in;
  in.input_ids = b.input_ids;
  in.attention_mask = b.attention_mask;
  fm.forward(in.to_inputs());
  std::map<std::string, at::Tensor> out;
  for (auto& [k, list] : fm.output()) out[k] = list.at(0).detach().clone();
  return out;
}

TEST(BatchRunner, ForwardsOfAFewRowsGiveTheWholeBatchsCaptures) {
  struct Case {
    std::string model;
    std::vector<std::string> hooks;
  };
  for (const Case& c : std::vector<Case>{{"gpt2", {"transformer.h.0", "transformer.h.1.mlp", "lm_head"}},
                                         {"qwen2_moe", {"model.layers.0.mlp.experts.0", "model.layers.1"}}}) {
    auto model = from_pretrained(flex_test::fixture("models/" + c.model));
    const int64_t vocab = model->config().vocab_size;
    TokenBatch b;
    b.input_ids = (at::arange(35, at::kLong) * 7).remainder(vocab).view({5, 7});
    b.attention_mask = at::ones({5, 7}, at::kLong);
    b.attention_mask[3].narrow(0, 0, 3).fill_(0);
    const auto want = whole_batch(model, b, c.hooks);

    FlexModel fm(model);
    for (const auto& h : c.hooks) fm.register_forward_hook(std::make_shared<HookFunction>(h));
    BatchRunner runner(fm, BatchRunnerOptions().batch_size(2));
    EXPECT_EQ(runner.batch_size(b), 2);
    EXPECT_EQ(runner.num_forwards(5), 3);
    std::map<std::string, std::vector<at::Tensor>> got;
    std::vector<int64_t> firsts;
    runner.run(b, 0, [&](const ForwardSlice& s, Value&) {
      firsts.push_back(s.first_token());
      EXPECT_EQ(s.inputs.input_ids.size(0), s.rows);
      for (auto& [k, t] : runner.take_captures(s)) got[k].push_back(t);
    });
    EXPECT_EQ(firsts, (std::vector<int64_t>{0, 14, 28})) << c.model;
    ASSERT_EQ(got.size(), want.size()) << c.model;
    // An expert's rows, per forward, come in routing order: both sides are
    // put in token order (by their own NAME#token_index) before comparing.
    auto in_token_order = [](std::map<std::string, at::Tensor> m) {
      for (auto& [k, t] : m) {
        auto idx = m.find(k + "#token_index");
        if (idx != m.end()) t = t.index_select(0, idx->second.argsort());
      }
      for (auto& [k, t] : m)
        if (k.size() > 12 && k.compare(k.size() - 12, 12, "#token_index") == 0) t = std::get<0>(t.sort());
      return m;
    };
    std::map<std::string, at::Tensor> joined;
    for (auto& [k, list] : got) joined[k] = at::cat(list, 0);
    const auto g_sorted = in_token_order(joined), w_sorted = in_token_order(want);
    for (const auto& [k, w] : w_sorted) {
      ASSERT_TRUE(g_sorted.count(k)) << c.model << ": no capture " << k;
      EXPECT_TRUE(flex_test::close(g_sorted.at(k), w, 1e-5, 1e-5)) << c.model << " " << k;
    }
    if (c.model == "qwen2_moe") {
      bool any_index = false;
      for (const auto& [k, w] : want) any_index = any_index || k.find("#token_index") != std::string::npos;
      EXPECT_TRUE(any_index) << "an expert's captures carry their token indices";
    }
  }
}

// A module that runs out of memory above a number of rows.
class RowLimited : public Module {
 public:
  explicit RowLimited(int64_t limit) : Module("RowLimited"), limit_(limit) { inner = add("inner", std::make_shared<Identity>()); }
  Value forward(Inputs in) override {
    const at::Tensor ids = in.tensor_or("input_ids");
    tried.push_back(ids.size(0));
    if (ids.size(0) > limit_) throw std::bad_alloc();
    return (*inner)(ids.to(at::kFloat));
  }
  std::shared_ptr<Identity> inner;
  std::vector<int64_t> tried;

 private:
  int64_t limit_;
};

TEST(BatchRunner, AutoBatchSizeHalvesUntilAForwardFitsAndDropsTrialCaptures) {
  auto m = std::make_shared<RowLimited>(3);
  FlexModel fm(m);
  fm.register_forward_hook(std::make_shared<HookFunction>("inner"));
  BatchRunner runner(fm, BatchRunnerOptions().auto_batch_size(true));
  TokenBatch b{at::arange(20, at::kLong).view({10, 2}), {}};
  EXPECT_EQ(runner.batch_size(b), 2);
  EXPECT_EQ(m->tried, (std::vector<int64_t>{10, 5, 2}));
  EXPECT_TRUE(fm.output().empty());
  std::vector<at::Tensor> rows;
  runner.run(b, 3, [&](const ForwardSlice& s, Value&) {
    for (auto& [k, t] : runner.take_captures(s)) rows.push_back(t);
  });
  // Forwards 3 and 4 only (a resumed run): rows 6..9.
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_TRUE(flex_test::equal(at::cat(rows, 0), b.input_ids.narrow(0, 6, 4).to(at::kFloat)));
}

TEST(BatchRunner, BadBatchesAreShapeErrors) {
  auto m = std::make_shared<RowLimited>(3);
  FlexModel fm(m);
  BatchRunner runner(fm);
  EXPECT_THROW(runner.batch_size({at::zeros({4}, at::kLong), {}}), ShapeError);
  EXPECT_THROW(runner.batch_size({at::zeros({2, 4}, at::kLong), at::ones({2, 3}, at::kLong)}), ShapeError);
  EXPECT_THROW(runner.num_forwards(4), ConfigError);
  EXPECT_THROW(BatchRunner(fm, BatchRunnerOptions().batch_size(-1)), ConfigError);
}

}  // namespace
