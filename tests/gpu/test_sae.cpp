// Sparse dictionaries on a CUDA device (the gpu label; each case skips itself
// without one), read from the SAELens fixtures (tests/data/sae, made with
// sae-lens 6.54.12) and moved to the GPU as their user moves them:
// - encode, decode and the forward pass on the GPU against sae-lens's own
//   outputs (golden.safetensors), within test_saelens_fixtures.cpp's
//   tolerance widened for another matmul kernel (float32: rtol 1e-4);
// - spliced into the GPT-2 fixture on the GPU (replace with the error term,
//   replace, a clamped feature): the logits and the features captured at
//   hook_sae_acts_post equal the same splice on the CPU.
#include "gpu_util.h"

#include <flex/dispatch/safetensors.h>
#include <flex/flexcore/flex_model.h>
#include <flex/models/auto_model.h>
#include <flex/sae/feature_edits.h>
#include <flex/sae/load_sae.h>
#include <flex/sae/splice.h>

#include <cstdio>
#include <map>

#include "test_util.h"

using namespace flex;

namespace {

std::string sae_dir(const std::string& name) { return flex_test::data_path("sae/" + name); }

std::map<std::string, at::Tensor> golden(const std::string& name) {
  const auto f = SafetensorsFile::open(sae_dir(name) + "/golden.safetensors");
  std::map<std::string, at::Tensor> out;
  for (const auto& n : f->names()) out[n] = f->get(n).clone();
  return out;
}

::testing::AssertionResult same(const at::Tensor& got, const at::Tensor& want) {
  const double rtol = want.scalar_type() == at::kFloat || want.scalar_type() == at::kDouble ? 1e-4 : 1e-2;
  return flex_test::close(got.cpu(), want, rtol, rtol * 1e-2);
}

std::shared_ptr<SparseDictionary> on_gpu(const std::string& name) {
  auto sae = load_sae(sae_dir(name));
  sae->to(gpu_test::device());
  return sae;
}

class SaeOnGpu : public ::testing::TestWithParam<std::string> {};

TEST_P(SaeOnGpu, EncodeDecodeAndForwardEqualSaeLens) {
  FLEX_REQUIRE_GPU();
  const std::string name = GetParam();
  auto g = golden(name);
  auto sae = on_gpu(name);
  EXPECT_TRUE(gpu_test::all_on(*sae, gpu_test::device())) << name;
  const at::Tensor x = gpu_test::on_device(g.at("x"));
  at::NoGradGuard ng;
  const at::Tensor f = sae->encode(x);
  EXPECT_EQ(f.device(), gpu_test::device());
  EXPECT_TRUE(same(f, g.at("encode"))) << name << " encode";
  EXPECT_TRUE(same(sae->decode(sae->encode(x)), g.at("decode"))) << name << " decode";
  EXPECT_TRUE(same((*sae)(x), g.at("forward"))) << name << " forward";
}

INSTANTIATE_TEST_SUITE_P(AllArchitectures, SaeOnGpu,
                         ::testing::Values("standard", "standard_no_bdec", "standard_layer_norm",
                                           "standard_constant_norm_rescale", "standard_bf16", "gated", "jumprelu",
                                           "topk", "topk_rescale", "batchtopk", "transcoder", "skip_transcoder",
                                           "jumprelu_transcoder", "jumprelu_skip_transcoder", "legacy_pre6",
                                           "gemmascope_like"),
                         [](const auto& info) { return info.param; });

at::Tensor ids() { return at::tensor({3, 17, 42, 7, 99, 5, 11, 64, 2, 8}, at::kLong).view({2, 5}); }

struct Spliced {
  at::Tensor logits, features;
};

// `dict` spliced into the GPT-2 fixture (on the GPU or the CPU) in `mode`,
// features captured at hook_sae_acts_post, optionally feature `clamp` set to 5.
Spliced run_spliced(const std::string& dict, SpliceMode mode, bool gpu, int64_t clamp = -1) {
  std::shared_ptr<CausalLM> lm =
      gpu ? gpu_test::load_on_device(flex_test::fixture("models/gpt2")) : load_pretrained(flex_test::fixture("models/gpt2"));
  auto sae = load_sae(sae_dir(dict));
  if (gpu) sae->to(gpu_test::device());
  FlexModel fm(lm);
  SpliceOptions so;
  so.mode = mode;
  const Splice s = splice_sae(fm, sae, so);
  const std::string acts = s.module + ".sae.hook_sae_acts_post";
  HookFunctionOptions o;
  if (clamp >= 0) o.editing_function = clamp_feature(clamp, 5.0);
  fm.register_forward_hook(std::make_shared<HookFunction>(acts, o));
  at::NoGradGuard ng;
  Spliced out;
  out.logits = fm.forward(gpu ? gpu_test::on_device(ids()) : ids()).cpu();
  EXPECT_EQ(fm.output().count(acts), 1u) << dict;
  if (fm.output().count(acts)) {
    out.features = fm.output().at(acts).at(0);
    EXPECT_EQ(out.features.device(), at::Device(at::kCPU)) << dict << ": feature captures are CPU tensors";
  }
  return out;
}

class SpliceOnGpu : public ::testing::TestWithParam<std::string> {};

TEST_P(SpliceOnGpu, LogitsAndFeaturesEqualTheCpuSplice) {
  FLEX_REQUIRE_GPU();
  const std::string dict = GetParam();
  for (SpliceMode mode : {SpliceMode::ReplaceWithError, SpliceMode::Replace}) {
    const Spliced cpu = run_spliced(dict, mode, false), gpu = run_spliced(dict, mode, true);
    const std::string what = dict + (mode == SpliceMode::Replace ? " replace" : " replace-with-error");
    EXPECT_TRUE(flex_test::close(gpu.logits, cpu.logits, 1e-4, 1e-5)) << what << " logits";
    EXPECT_TRUE(flex_test::close(gpu.features, cpu.features, 1e-4, 1e-5)) << what << " features";
    EXPECT_GT(cpu.features.gt(0).sum().item<int64_t>(), 0) << what << ": no active feature, the test would prove nothing";
    std::printf("%-24s %-18s max |GPU - CPU| logits %.3g, features %.3g\n", dict.c_str(),
                mode == SpliceMode::Replace ? "replace" : "replace-with-error", gpu_test::max_diff(gpu.logits, cpu.logits),
                gpu_test::max_diff(gpu.features, cpu.features));
  }
  // A clamped feature (the most active one on the CPU), with the error term.
  const Spliced base = run_spliced(dict, SpliceMode::ReplaceWithError, false);
  const int64_t feat = base.features.sum({0, 1}).argmax().item<int64_t>();
  const Spliced cpu = run_spliced(dict, SpliceMode::ReplaceWithError, false, feat);
  const Spliced gpu = run_spliced(dict, SpliceMode::ReplaceWithError, true, feat);
  EXPECT_TRUE(flex_test::close(gpu.logits, cpu.logits, 1e-4, 1e-5)) << dict << " clamped feature " << feat;
  EXPECT_GT(gpu_test::max_diff(cpu.logits, base.logits), 1e-4) << dict << ": clamping changed nothing";
}

INSTANTIATE_TEST_SUITE_P(Dictionaries, SpliceOnGpu,
                         // The SAEs, and the one transcoder whose output fits GPT-2's MLP (d_out 64).
                         ::testing::Values("standard", "standard_layer_norm", "gated", "jumprelu", "topk", "batchtopk",
                                           "jumprelu_skip_transcoder"),
                         [](const auto& info) { return info.param; });

}  // namespace
