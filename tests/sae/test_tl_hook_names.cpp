// TransformerLens hook names (as SAELens releases record them) resolve to
// places of our models holding what TransformerLens 4.3's run_with_cache
// gives under those names: golden data from tests/data/tl_hooks (made by
// scripts/golden/make_tl_hooks.py on the golden5 checkpoints of GPT-2,
// Gemma 2 and Gemma 3). Every cached hook is compared.
#include <flex/dispatch/safetensors.h>
#include <flex/flexcore/flex_model.h>
#include <flex/models/auto_model.h>
#include <flex/sae/splice.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "test_util.h"

using namespace flex;

namespace {

class TlHookNames : public ::testing::TestWithParam<std::string> {};

TEST_P(TlHookNames, EveryCachedHookEqualsTheResolvedPlace) {
  const std::string name = GetParam();
  auto golden = SafetensorsFile::open(flex_test::data_path("tl_hooks/" + name + ".safetensors"));
  auto lm = load_pretrained(flex_test::data_path("golden5/" + name));
  const at::Tensor ids = golden->get("input_ids");
  FlexModel fm(lm);
  auto got = std::make_shared<std::map<std::string, at::Tensor>>();
  size_t hooks = 0;
  for (const auto& key : golden->names()) {
    if (key == "input_ids" || key == "logits") continue;
    const HookPointRef at = resolve_hook_name(*lm, key);
    attach_at(fm, at, [got, key](Module&, const at::Tensor& x, SaveContext&, TrainableModules&) {
      (*got)[key] = x.detach().clone();
      return x;
    });
    ++hooks;
  }
  at::NoGradGuard ng;
  const at::Tensor logits = fm.forward(ids);
  EXPECT_TRUE(flex_test::close(logits, golden->get("logits"), 1e-4, 1e-5)) << "logits";
  EXPECT_GE(hooks, 10u);
  for (const auto& key : golden->names()) {
    if (key == "input_ids" || key == "logits") continue;
    ASSERT_TRUE(got->count(key)) << key << " (" << resolve_hook_name(*lm, key).module << ") did not run";
    at::Tensor ours = got->at(key);
    const at::Tensor want = golden->get(key);
    if (key == "hook_pos_embed") ours = ours.expand(want.sizes());  // TransformerLens broadcasts it over the batch
    EXPECT_TRUE(flex_test::close(ours, want, 1e-4, 1e-5))
        << key << " -> " << resolve_hook_name(*lm, key).module;
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, TlHookNames, ::testing::Values("gpt2", "gemma2", "gemma3_text"));

}  // namespace
