// Every architecture against Transformers 5.23 (tests/data/golden5, made by
// scripts/golden/make_golden5.py): checkpoints written by 5.23's
// save_pretrained (configs in the 5.x form, rope settings inside
// "rope_parameters") load, and a left-padded batch gives 5.23's logits and
// the same output from every block and the final norm, at every position the
// attention mask keeps, within atol 1e-5 / rtol 1e-4 (fp32).
#include "golden_util.h"

#include <map>

#include "test_util.h"

using namespace flex;
using models_test::close;
using models_test::golden5;
using models_test::kept;

namespace {

class Golden5 : public ::testing::TestWithParam<std::string> {};

TEST_P(Golden5, LogitsAndBlocksMatchTransformers5) {
  const std::string name = GetParam();
  const auto manifest = models_test::read_json(golden5("manifest.json"));
  ASSERT_EQ(manifest["transformers"], "5.23.0");
  auto gt = SafetensorsFile::open(golden5(name + ".golden.safetensors"));
  auto model = load_pretrained(golden5(name), at::kFloat);
  EXPECT_EQ(model->class_name(), manifest["cases"][name]["class"].get<std::string>());

  std::map<std::string, std::string> hooked;
  for (const auto& m : manifest["cases"][name]["captured"]) hooked[m] = m;
  std::map<std::string, at::Tensor> outputs;
  const auto handles = models_test::record_outputs(*model, hooked, outputs);
  const at::Tensor mask = gt->get("attention_mask");
  const at::Tensor logits = models_test::masked_logits(*model, gt->get("input_ids"), mask);
  EXPECT_TRUE(close(kept(logits, mask), kept(gt->get("logits"), mask), name + " logits"));
  for (const auto& m : manifest["cases"][name]["captured"]) {
    const std::string n = m;
    ASSERT_TRUE(outputs.count(n)) << n << " was not called";
    EXPECT_TRUE(close(kept(outputs[n], mask), kept(gt->get("out." + n), mask), name + " " + n));
  }
}

INSTANTIATE_TEST_SUITE_P(Transformers5, Golden5, ::testing::ValuesIn(models_test::golden5_cases("manifest.json")),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
