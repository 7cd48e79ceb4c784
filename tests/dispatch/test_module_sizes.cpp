// Module sizes and tied parameters against Accelerate's documented values
// (ModelForTest = Linear(3,4) + BatchNorm1d(4) + Linear(4,5)) and against
// numel x element size counted by hand.
#include <flex/dispatch/module_sizes.h>
#include <flex/dispatch/tied_parameters.h>
#include <flex/hooks/errors.h>

#include <gtest/gtest.h>

#include "toy_models.h"

using flex_test::ModelForTest;

namespace {

std::map<std::string, double> as_map(const flex::ModuleSizes& s) {
  return {s.items().begin(), s.items().end()};
}

/// A module with a bool causal mask (non-persistent) and a float scalar, as GPT-2's attention.
class MaskHolder : public flex::Module {
 public:
  MaskHolder() : Module("MaskHolder") {
    add_parameter("weight", weight, flex::new_parameter({2, 3}));
    add_buffer("bias", mask, at::ones({1, 1, 8, 8}, at::kBool).tril(), /*persistent=*/false);
    add_buffer("masked_bias", masked_bias, at::full({}, -1e4), /*persistent=*/false);
    add_buffer("odd", odd, at::zeros({3}, at::kBool));
  }
  flex::Value forward(flex::Inputs in) override { return in.args.at(0); }
  at::Tensor weight, mask, masked_bias, odd;
};

}  // namespace

TEST(DtypeByteSize, AccelerateCounts) {
  EXPECT_EQ(flex::dtype_byte_size(at::kBool), 0.125);
  EXPECT_EQ(flex::dtype_byte_size(at::kFloat), 4);
  EXPECT_EQ(flex::dtype_byte_size(at::kHalf), 2);
  EXPECT_EQ(flex::dtype_byte_size(at::kBFloat16), 2);
  EXPECT_EQ(flex::dtype_byte_size(at::kDouble), 8);
  EXPECT_EQ(flex::dtype_byte_size(at::kLong), 8);
  EXPECT_EQ(flex::dtype_byte_size(at::kByte), 1);
  EXPECT_EQ(flex::dtype_byte_size(at::kChar), 1);
}

TEST(DtypeFromString, NamesAndErrors) {
  EXPECT_EQ(flex::dtype_from_string("float16"), at::kHalf);
  EXPECT_EQ(flex::dtype_from_string("torch.float16"), at::kHalf);
  EXPECT_EQ(flex::dtype_from_string("bfloat16"), at::kBFloat16);
  EXPECT_EQ(flex::dtype_from_string("float32"), at::kFloat);
  EXPECT_EQ(flex::dtype_from_string("int8"), at::kChar);
  try {
    flex::dtype_from_string("float17");
    FAIL() << "expected ConfigError";
  } catch (const flex::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("float17"), std::string::npos) << e.what();
  }
}

TEST(ComputeModuleSizes, ModelForTestGolden) {
  ModelForTest model;
  auto s = flex::compute_module_sizes(model);
  EXPECT_EQ(s[""], 236);
  EXPECT_EQ(s["linear1"], 64);
  EXPECT_EQ(s["batchnorm"], 72);
  EXPECT_EQ(s["linear2"], 100);
  // Tensor entries: numel x 4 bytes; num_batches_tracked is an int64 scalar.
  EXPECT_EQ(s["linear1.weight"], 12 * 4);
  EXPECT_EQ(s["linear2.bias"], 5 * 4);
  EXPECT_EQ(s["batchnorm.num_batches_tracked"], 8);
  EXPECT_EQ(s["no.such.module"], 0);  // absent names are 0, as upstream's defaultdict
  EXPECT_FALSE(s.contains("no.such.module"));
  EXPECT_EQ(s.total(), 236);
  // Insertion order: parameters (with their prefixes) first, then buffers.
  std::vector<std::string> order;
  for (const auto& it : s.items()) order.push_back(it.first);
  const std::vector<std::string> expected = {"",
                                             "linear1",
                                             "linear1.weight",
                                             "linear1.bias",
                                             "batchnorm",
                                             "batchnorm.weight",
                                             "batchnorm.bias",
                                             "linear2",
                                             "linear2.weight",
                                             "linear2.bias",
                                             "batchnorm.running_mean",
                                             "batchnorm.running_var",
                                             "batchnorm.num_batches_tracked"};
  EXPECT_EQ(order, expected);
}

TEST(ComputeModuleSizes, HalfDtypeShrinksFloatsOnly) {
  ModelForTest model;
  auto s = flex::compute_module_sizes(model, at::kHalf);
  // 16 + 8 + 8 + 25 floats at 2 bytes, num_batches_tracked stays 8.
  EXPECT_EQ(s["linear1"], 32);
  EXPECT_EQ(s["batchnorm"], 8 * 2 + 8 * 2 + 8);
  EXPECT_EQ(s["linear2"], 50);
  EXPECT_EQ(s[""], 32 + 40 + 50);
  // A dtype never grows a tensor: float64 leaves f32 at 4 bytes.
  EXPECT_EQ(flex::compute_module_sizes(model, at::kDouble)[""], 236);
}

TEST(ComputeModuleSizes, SpecialDtypesWin) {
  ModelForTest model;
  auto s = flex::compute_module_sizes(model, at::kHalf, {{"linear2.weight", at::kFloat}});
  EXPECT_EQ(s["linear2.weight"], 80);
  EXPECT_EQ(s["linear2"], 80 + 10);
  auto s2 = flex::compute_module_sizes(model, std::nullopt, {{"linear1.weight", at::kHalf}});
  EXPECT_EQ(s2["linear1"], 24 + 16);
}

TEST(ComputeModuleSizes, BuffersOnlyAndTotalBufferSize) {
  ModelForTest model;
  auto s = flex::compute_module_sizes(model, std::nullopt, {}, /*buffers_only=*/true);
  const std::map<std::string, double> expected = {{"", 40},
                                                  {"batchnorm", 40},
                                                  {"batchnorm.running_mean", 16},
                                                  {"batchnorm.running_var", 16},
                                                  {"batchnorm.num_batches_tracked", 8}};
  EXPECT_EQ(as_map(s), expected);
  EXPECT_EQ(flex::compute_module_total_buffer_size(model), 40);
}

TEST(ComputeModuleSizes, BoolBuffersAreFractionalAndNonPersistentCount) {
  MaskHolder m;
  auto s = flex::compute_module_sizes(m);
  EXPECT_EQ(s["bias"], 64 / 8.0);
  EXPECT_EQ(s["odd"], 3 / 8.0);
  EXPECT_EQ(s["masked_bias"], 4);
  EXPECT_EQ(s[""], 24 + 8 + 0.375 + 4);
  EXPECT_EQ(flex::compute_module_total_buffer_size(m), 8 + 0.375 + 4);
}

TEST(ComputeModuleSizes, MetaModelHasTheSameSizes) {
  std::shared_ptr<ModelForTest> model;
  {
    flex::EmptyInit scope(/*include_buffers=*/true);
    model = std::make_shared<ModelForTest>();
  }
  ASSERT_TRUE(model->linear1->weight.is_meta());
  ASSERT_TRUE(model->batchnorm->running_mean.is_meta());
  EXPECT_EQ(flex::compute_module_sizes(*model)[""], 236);
}

TEST(ComputeModuleSizes, TiedTensorCountedOnceUnderFirstName) {
  ModelForTest model;
  flex::set_module_tensor(model, "linear1.weight", model.linear2->weight);
  auto s = flex::compute_module_sizes(model);
  EXPECT_EQ(s["linear1.weight"], 80);  // linear2's (5, 4) weight, first seen as linear1.weight
  EXPECT_FALSE(s.contains("linear2.weight"));
  EXPECT_EQ(s["linear1"], 96);
  EXPECT_EQ(s["linear2"], 20);
  EXPECT_EQ(s[""], 236 - 48);
}

TEST(MaxLayerSize, LeavesAndNoSplit) {
  ModelForTest model;
  auto sizes = flex::compute_module_sizes(model);
  auto ml = flex::get_max_layer_size(flex::direct_members(model), sizes, {});
  EXPECT_EQ(ml.size, 100);
  EXPECT_EQ(ml.names, std::vector<std::string>{"linear2"});

  auto seq = flex_test::three_models();
  auto ssizes = flex::compute_module_sizes(*seq);
  auto ml3 = flex::get_max_layer_size(flex::direct_members(*seq), ssizes, {});
  EXPECT_EQ(ml3.size, 100);
  EXPECT_EQ(ml3.names, (std::vector<std::string>{"0.linear2", "1.linear2", "2.linear2"}));
  auto ml_ns = flex::get_max_layer_size(flex::direct_members(*seq), ssizes, {"ModelForTest"});
  EXPECT_EQ(ml_ns.size, 236);
  EXPECT_EQ(ml_ns.names, (std::vector<std::string>{"0", "1", "2"}));
}

TEST(MaxLayerSize, CalculateMaximumSizes) {
  auto seq = flex_test::three_models();
  auto m = flex::calculate_maximum_sizes(*seq, {"ModelForTest"});
  EXPECT_EQ(m.total, 3 * 236);
  EXPECT_EQ(m.largest_layer.size, 236);
  auto m2 = flex::calculate_maximum_sizes(*seq);
  EXPECT_EQ(m2.largest_layer.size, 100);
}

TEST(DirectMembers, AccelerateOrder) {
  flex_test::BatchNorm1d bn(4);
  auto members = flex::direct_members(bn, "bn");
  std::vector<std::string> names;
  for (auto& m : members) {
    names.push_back(m.name);
    EXPECT_FALSE(m.is_module());
  }
  EXPECT_EQ(names, (std::vector<std::string>{"bn.weight", "bn.bias", "bn.running_mean", "bn.running_var",
                                             "bn.num_batches_tracked"}));
  EXPECT_EQ(flex::direct_members(bn, "bn", /*with_buffers=*/false).size(), 2u);
}

// --- tied parameters -----------------------------------------------------------

TEST(TiedParameters, FindGroups) {
  ModelForTest model;
  EXPECT_TRUE(flex::find_tied_parameters(model).empty());
  flex::set_module_tensor(model, "linear1.weight", model.linear2->weight);
  auto groups = flex::find_tied_parameters(model);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0], (std::vector<std::string>{"linear1.weight", "linear2.weight"}));
}

TEST(TiedParameters, RetieAfterLoadBrokeTheTie) {
  std::shared_ptr<ModelForTest> model;
  {
    flex::EmptyInit scope;
    model = std::make_shared<ModelForTest>();
  }
  flex::set_module_tensor(*model, "linear1.weight", model->linear2->weight);  // tied, on meta
  const auto groups = flex::find_tied_parameters(*model);
  ASSERT_EQ(groups.size(), 1u);
  // Loading gives one name a real tensor: the tie is broken.
  at::Tensor real = at::arange(20, at::kFloat).reshape({5, 4});
  flex::set_module_tensor(*model, "linear2.weight", real);
  EXPECT_TRUE(flex::find_tied_parameters(*model).empty());
  flex::retie_parameters(*model, groups);
  EXPECT_EQ(model->linear1->weight.unsafeGetTensorImpl(), real.unsafeGetTensorImpl());
  EXPECT_EQ(model->linear2->weight.unsafeGetTensorImpl(), real.unsafeGetTensorImpl());
  EXPECT_EQ(flex::find_tied_parameters(*model), groups);
}

TEST(TiedParameters, RetieUnknownNameIsNotFound) {
  ModelForTest model;
  EXPECT_THROW(flex::retie_parameters(model, {{"linear1.weight", "linear9.weight"}}), flex::NotFoundError);
}

TEST(TiedParameters, SameDeviceCheck) {
  const std::vector<std::vector<std::string>> groups = {{"linear1.weight", "linear2.weight"}};
  EXPECT_TRUE(flex::check_tied_parameters_on_same_device(groups, {{"", 0}}).empty());
  EXPECT_TRUE(flex::check_tied_parameters_on_same_device(groups, {{"linear1", "cpu"}, {"linear2", "cpu"}}).empty());
  auto msgs = flex::check_tied_parameters_on_same_device(groups, {{"linear1", 0}, {"linear2", 1}});
  ASSERT_EQ(msgs.size(), 1u);
  EXPECT_NE(msgs[0].find("linear1.weight: 0"), std::string::npos) << msgs[0];
  EXPECT_NE(msgs[0].find("linear2.weight: 1"), std::string::npos) << msgs[0];
}
