// Quantized fixture models on a CUDA device (the gpu label; each case skips
// itself without one): int8 and nf4, quantized while loading straight onto
// GPU 0 (from_pretrained with quantization and device_map "0"). Every dense
// layer but the head is quantized there too; the logits stay within the CPU
// test's stated bounds of the float32 golden logits (test_quantized_models:
// int8 max |difference| <= 4% of the golden's largest magnitude and top-1
// agreement >= 85%, 4-bit 60% / 30%) and within 1% of that magnitude of the
// same quantized model's logits on the CPU (the same codes and scales; only
// the kernels differ); the measured differences are printed.
#include "gpu_util.h"

#include <flex/dispatch/safetensors.h>
#include <flex/flexcore/flex_model.h>
#include <flex/hooks/nn.h>
#include <flex/quant/quantize_model.h>

#include <cstdio>

#include "test_util.h"

namespace {

at::Tensor golden(const std::string& m, const std::string& key) {
  return flex::SafetensorsFile::open(flex_test::fixture("golden/" + m + ".safetensors"))->get(key);
}

std::shared_ptr<flex::CausalLM> load(const std::string& model, const std::string& method, bool on_gpu) {
  flex::PretrainedOptions o;
  o.quantization = flex::quantization_from_string(method);
  if (on_gpu) o.device_map_strategy = gpu_test::dry_run() ? "cpu" : "0";
  return flex::from_pretrained(flex_test::fixture("models/" + model), o);
}

class QuantizedOnGpu : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(QuantizedOnGpu, LogitsWithinTheBoundsAndNearTheCpuQuantizedModel) {
  FLEX_REQUIRE_GPU();
  const auto& [model, method] = GetParam();
  const at::Tensor ids = golden("inputs", "input_ids"), gold = golden(model, "logits");
  auto gpu = load(model, method, true);
  int quantized = 0;
  for (const auto& [name, m] : gpu->named_flex_modules())
    if (auto* d = dynamic_cast<flex::DenseLayer*>(m.get()); d && d->weight_format()) {
      ++quantized;
      EXPECT_EQ(d->class_name(), method == "int8" ? "Linear8bitLt" : "Linear4bit") << name;
    }
  EXPECT_GT(quantized, 4) << model << " " << method;
  EXPECT_TRUE(gpu_test::all_on(*gpu, gpu_test::device())) << model << " " << method;

  // Through a FlexModel capturing one block, as the CPU test does.
  flex::FlexModel fm(gpu);
  const auto blocks = gpu_test::block_names(*gpu);
  ASSERT_FALSE(blocks.empty());
  fm.register_forward_hook(std::make_shared<flex::HookFunction>(blocks.front()));
  at::Tensor logits;
  {
    at::NoGradGuard ng;
    logits = fm.forward(gpu_test::on_device(ids));
  }
  EXPECT_EQ(logits.device(), gpu_test::device());
  logits = logits.cpu();
  ASSERT_EQ(fm.output().count(blocks.front()), 1u);
  EXPECT_EQ(fm.output().at(blocks.front())[0].device(), at::Device(at::kCPU));

  at::Tensor on_cpu;
  {
    at::NoGradGuard ng;
    on_cpu = load(model, method, false)->logits(ids);
  }
  const double scale = gold.abs().max().item<double>();
  const double vs_golden = (logits - gold).abs().max().item<double>();
  const double vs_cpu = gpu_test::max_diff(logits, on_cpu);
  const double agree = logits.argmax(-1).eq(gold.argmax(-1)).to(at::kDouble).mean().item<double>();
  std::printf("[ quant gpu ] %-10s %-5s max|logits - golden| %.4f, max|GPU - CPU quantized| %.2g (golden max %.2f), "
              "top-1 agreement %.3f\n",
              model.c_str(), method.c_str(), vs_golden, vs_cpu, scale, agree);
  const bool int8 = method == "int8";
  EXPECT_LE(vs_golden, (int8 ? 0.04 : 0.6) * scale) << model << " " << method;
  EXPECT_GE(agree, int8 ? 0.85 : 0.3) << model << " " << method;
  EXPECT_LE(vs_cpu, 0.01 * scale) << model << " " << method << ": the GPU and CPU quantized models differ";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, QuantizedOnGpu,
                         ::testing::Combine(::testing::Values("gpt2", "llama", "gpt-neox", "mistral", "qwen2", "gemma2",
                                                              "phi3", "olmo2", "mixtral", "qwen2_moe"),
                                            ::testing::Values("int8", "nf4")),
                         [](const auto& info) {
                           std::string s = std::get<0>(info.param) + "_" + std::get<1>(info.param);
                           for (auto& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

}  // namespace
