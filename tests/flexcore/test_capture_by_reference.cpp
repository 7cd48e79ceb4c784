// Captures by reference (FlexModel::set_capture_by_reference): a capture
// shares the module's output when nothing changes it later in the forward;
// an output the model changes in place is copied at the hook (from the first
// forward on), and a change that starts only after earlier forwards showed
// none is a ConfigError, never a silently wrong capture. Expected values
// come from running the layers by hand.
#include <flex/flexcore/flex_model.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/nn.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "test_util.h"

namespace {

/// y = lin(x); from forward `change_from` on, y is doubled in place after the hook.
struct ChangesItsChild : flex::Module {
  std::shared_ptr<flex::Linear> lin;
  int calls = 0, change_from;
  explicit ChangesItsChild(int change_from) : Module("ChangesItsChild"), change_from(change_from) {
    lin = add("lin", std::make_shared<flex::Linear>(4, 4));
  }
  flex::Value forward(flex::Inputs in) override {
    at::Tensor y = (*lin)(in.tensor(0));
    if (++calls >= change_from) y.mul_(2);
    return y + 1;
  }
};

at::Tensor by_hand(ChangesItsChild& m, const at::Tensor& x) { return at::linear(x, m.lin->weight, m.lin->bias); }

}  // namespace

TEST(CaptureByReference, UnchangedOutputsAreSharedNotCopied) {
  auto m = std::make_shared<ChangesItsChild>(/*change_from=*/1000);
  flex::FlexModel fm(m);
  fm.register_forward_hook(std::make_shared<flex::HookFunction>("lin"));
  fm.register_forward_hook(std::make_shared<flex::HookFunction>(""));  // the root: its output is returned
  at::NoGradGuard ng;
  for (int f = 0; f < 3; ++f) {
    const at::Tensor x = at::randn({2, 4});
    const at::Tensor out = fm.forward(x);
    ASSERT_EQ(fm.output().at("lin").size(), 1u);
    EXPECT_TRUE(flex_test::equal(fm.output().at("lin")[0], by_hand(*m, x)));
    EXPECT_TRUE(flex_test::equal(fm.output().at("")[0], out));
    // After the first forward (which also copies, to find out), the capture is the output itself.
    if (f > 0) {
      EXPECT_EQ(fm.output().at("")[0].data_ptr(), out.data_ptr()) << "forward " << f;
    }
    fm.clear();
  }
}

TEST(CaptureByReference, AnOutputChangedInPlaceIsCapturedAsItWasAtTheHook) {
  auto m = std::make_shared<ChangesItsChild>(/*change_from=*/1);
  flex::FlexModel fm(m);
  fm.register_forward_hook(std::make_shared<flex::HookFunction>("lin"));
  at::NoGradGuard ng;
  for (int f = 0; f < 3; ++f) {
    const at::Tensor x = at::randn({3, 4});
    fm.forward(x);
    EXPECT_TRUE(flex_test::equal(fm.output().at("lin")[0], by_hand(*m, x))) << "forward " << f;
    fm.clear();
  }
}

TEST(CaptureByReference, AChangeAfterUnchangedForwardsIsAnErrorThenCopied) {
  auto m = std::make_shared<ChangesItsChild>(/*change_from=*/3);
  flex::FlexModel fm(m);
  fm.register_forward_hook(std::make_shared<flex::HookFunction>("lin"));
  at::NoGradGuard ng;
  for (int f = 0; f < 2; ++f) {
    const at::Tensor x = at::randn({3, 4});
    fm.forward(x);
    EXPECT_TRUE(flex_test::equal(fm.output().at("lin")[0], by_hand(*m, x)));
    fm.clear();
  }
  try {
    fm.forward(at::randn({3, 4}));
    FAIL() << "the third forward changes the captured output in place";
  } catch (const flex::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'lin'"), std::string::npos) << e.what();
  }
  fm.clear();
  const at::Tensor x = at::randn({3, 4});
  fm.forward(x);
  EXPECT_TRUE(flex_test::equal(fm.output().at("lin")[0], by_hand(*m, x))) << "copied from then on";
}

TEST(CaptureByReference, OffCopiesEveryCapture) {
  auto m = std::make_shared<ChangesItsChild>(/*change_from=*/1000);
  flex::FlexModel fm(m);
  fm.set_capture_by_reference(false);
  fm.register_forward_hook(std::make_shared<flex::HookFunction>(""));
  at::NoGradGuard ng;
  for (int f = 0; f < 2; ++f) {
    const at::Tensor out = fm.forward(at::randn({2, 4}));
    EXPECT_TRUE(flex_test::equal(fm.output().at("")[0], out));
    EXPECT_NE(fm.output().at("")[0].data_ptr(), out.data_ptr());
    fm.clear();
  }
}
