#include <flex/hooks/errors.h>
#include <flex/hooks/value.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "test_util.h"

using namespace flex;

TEST(Value, ApplyToTensorsWalksTuplesListsAndDicts) {
  c10::impl::GenericDict d(c10::StringType::get(), c10::TensorType::get());
  d.insert("x", at::ones({2}));
  d.insert("y", at::full({1}, 3.0));
  c10::List<at::Tensor> lst({at::zeros({1}), at::ones({1})});
  Value v = c10::ivalue::Tuple::create({Value(at::ones({1})), Value(d), Value(lst), Value(int64_t(5))});
  Value out = apply_to_tensors(v, [](const at::Tensor& t) { return t + 1; });
  auto elems = out.toTupleRef().elements();
  EXPECT_TRUE(flex_test::equal(elems[0].toTensor(), at::full({1}, 2.0)));
  auto od = elems[1].toGenericDict();
  EXPECT_TRUE(flex_test::equal(od.at("x").toTensor(), at::full({2}, 2.0)));
  EXPECT_TRUE(flex_test::equal(od.at("y").toTensor(), at::full({1}, 4.0)));
  EXPECT_TRUE(flex_test::equal(elems[2].toTensorList().get(1), at::full({1}, 2.0)));
  EXPECT_EQ(elems[3].toInt(), 5);
  // The input is untouched.
  EXPECT_TRUE(flex_test::equal(v.toTupleRef().elements()[0].toTensor(), at::ones({1})));
}

TEST(Value, SendToDeviceSkipsKeys) {
  Inputs in{Value(at::ones({1}))};
  in.set("mask", at::ones({1}));
  in.set("cache", at::ones({1}));
  // Use the meta device as a second device that every build has.
  Inputs out = send_to_device(in, c10::Device(c10::kMeta), {"cache"});
  EXPECT_TRUE(out.tensor(0).is_meta());
  EXPECT_TRUE(out.find("mask")->toTensor().is_meta());
  EXPECT_FALSE(out.find("cache")->toTensor().is_meta());
}

TEST(Value, FindFirstTensorIsDepthFirstPositionalFirst) {
  Inputs in;
  in.args.push_back(Value(int64_t(1)));
  in.args.push_back(c10::ivalue::Tuple::create({Value(), Value(at::full({1}, 7.0))}));
  in.set("later", at::full({1}, 9.0));
  EXPECT_EQ(find_first_tensor(in).item<float>(), 7.0f);
  Inputs only_kw;
  only_kw.set("k", at::full({1}, 9.0));
  EXPECT_EQ(find_first_tensor(only_kw).item<float>(), 9.0f);
  EXPECT_FALSE(find_first_tensor(Inputs{}).defined());
}

TEST(Value, ReplaceTensorLeafByIndex) {
  Value v = c10::ivalue::Tuple::create({Value(at::zeros({1})), Value(), Value(at::ones({1}))});
  Value r = replace_tensor_leaf(v, 1, at::full({1}, 5.0));
  auto leaves = tensor_leaves(r);
  ASSERT_EQ(leaves.size(), 2u);
  EXPECT_EQ(leaves[1].item<float>(), 5.0f);
  EXPECT_EQ(leaves[0].item<float>(), 0.0f);
  EXPECT_THROW(replace_tensor_leaf(v, 2, at::ones({1})), NotFoundError);
}

TEST(Value, MissingPositionalTensorIsTypedError) {
  Inputs in;
  EXPECT_THROW(in.tensor(0), NotFoundError);
}
