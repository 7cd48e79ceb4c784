// Steering, ablation and patching edits (flex/flexcore/activation_edits.h):
// through a FlexModel against the same network evaluated by hand, and
// directly on tensors against slices written out independently.
#include "tiny_lm.h"

#include <flex/flexcore/activation_edits.h>
#include <flex/flexcore/flex_model.h>
#include <flex/hooks/errors.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "tensor_compare.h"

using namespace flex;

namespace {

HookFunctionPtr edit(const std::string& name, EditFn fn) {
  HookFunctionOptions o;
  o.editing_function = std::move(fn);
  o.save = false;
  return std::make_shared<HookFunction>(name, o);
}

// The tiny LM by hand, with `after_block1` applied to block 1's output.
at::Tensor by_hand(tiny::LM& lm, const at::Tensor& ids, const std::function<at::Tensor(at::Tensor)>& after_block1) {
  at::Tensor x = (*lm.wte)(ids);
  for (size_t i = 0; i < 3; ++i) {
    auto b = lm.block(i);
    x = x + (*b->mlp)((*b->ln_1)(x));
    if (i == 1) x = after_block1(x);
  }
  return (*lm.lm_head)((*lm.ln_f)(x));
}

SaveContext ctx;
TrainableModules none;
Module& any_module() {
  static Identity m;
  return m;
}

}  // namespace

TEST(ActivationEdits, SteeringAddsAlphaTimesVectorAtEveryPosition) {
  at::manual_seed(3);
  auto lm = std::make_shared<tiny::LM>(32, 16, 3);
  const at::Tensor ids = at::tensor({1, 5, 7, 2, 9, 4}, at::kLong).view({2, 3});
  const at::Tensor v = at::randn({16});
  FlexModel fm(lm);
  fm.register_forward_hook(edit("h.1", add_vector(v, 2.5)));
  at::NoGradGuard ng;
  const at::Tensor got = fm.forward(ids);
  const at::Tensor want = by_hand(*lm, ids, [&](at::Tensor x) { return x + 2.5 * v; });
  EXPECT_TRUE(flex_test::close(got, want, 1e-5, 1e-6));
}

TEST(ActivationEdits, ZeroActivationAblatesTheModule) {
  at::manual_seed(4);
  auto lm = std::make_shared<tiny::LM>(32, 16, 3);
  const at::Tensor ids = at::tensor({3, 1, 4, 1}, at::kLong).view({1, 4});
  FlexModel fm(lm);
  fm.register_forward_hook(edit("h.1", zero_activation()));
  at::NoGradGuard ng;
  const at::Tensor want = by_hand(*lm, ids, [](at::Tensor x) { return at::zeros_like(x); });
  EXPECT_TRUE(flex_test::close(fm.forward(ids), want, 1e-5, 1e-6));
}

TEST(ActivationEdits, ZeroHeadZeroesOneHeadOnly) {
  const at::Tensor act = at::randn({2, 3, 4, 5});
  const at::Tensor out = zero_head(2)(any_module(), act, ctx, none);
  for (int64_t h = 0; h < 4; ++h) {
    const at::Tensor want = h == 2 ? at::zeros({2, 3, 5}) : act.select(2, h);
    EXPECT_TRUE(flex_test::equal(out.select(2, h), want)) << "head " << h;
  }
  EXPECT_THROW(zero_head(4, "--ablate attn:4")(any_module(), act, ctx, none), ShapeError);
  EXPECT_THROW(zero_head(0)(any_module(), at::randn({2, 3, 20}), ctx, none), ShapeError);
}

TEST(ActivationEdits, PatchLandsOnAbsolutePositionsAcrossCachedCalls) {
  const at::Tensor p = at::randn({1, 3, 4});  // positions 0..2
  EditFn cached = patch_positions(p, /*cached=*/true);
  // The prompt (positions 0, 1), then one position per step (2, 3).
  const at::Tensor prompt = at::randn({2, 2, 4}), step2 = at::randn({2, 1, 4}), step3 = at::randn({2, 1, 4});
  EXPECT_TRUE(flex_test::equal(cached(any_module(), prompt, ctx, none), p.narrow(1, 0, 2).expand({2, 2, 4})));
  EXPECT_TRUE(flex_test::equal(cached(any_module(), step2, ctx, none), p.narrow(1, 2, 1).expand({2, 1, 4})));
  EXPECT_TRUE(flex_test::equal(cached(any_module(), step3, ctx, none), step3));  // past the patch
  // Without a cache every call starts at position 0.
  EditFn plain = patch_positions(p);
  const at::Tensor longer = at::randn({1, 5, 4});
  for (int call = 0; call < 2; ++call) {
    const at::Tensor out = plain(any_module(), longer, ctx, none);
    EXPECT_TRUE(flex_test::equal(out.narrow(1, 0, 3), p));
    EXPECT_TRUE(flex_test::equal(out.narrow(1, 3, 2), longer.narrow(1, 3, 2)));
  }
}

TEST(ActivationEdits, MisfitsAreShapeErrorsNamingTheEdit) {
  const at::Tensor act = at::randn({1, 2, 8});
  try {
    add_vector(at::randn({7}), 1.0, "--steer h.1")(any_module(), act, ctx, none);
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("--steer h.1: vector has 7 elements"), std::string::npos) << e.what();
  }
  EXPECT_THROW(patch_positions(at::randn({1, 2, 9}))(any_module(), act, ctx, none), ShapeError);
  EXPECT_THROW(patch_positions(at::randn({3, 2, 8}))(any_module(), act, ctx, none), ShapeError);
  EXPECT_THROW(add_vector(at::Tensor(), 1.0), ConfigError);
}

TEST(ActivationEdits, HeadHookPointNamesAttentionModulesOnly) {
  auto lm = std::make_shared<tiny::LM>(32, 16, 3);
  EXPECT_THROW(head_hook_point(*lm, "h.1.mlp"), NotFoundError);  // exists, not attention
  EXPECT_THROW(head_hook_point(*lm, "h.9"), NotFoundError);      // does not exist
}
