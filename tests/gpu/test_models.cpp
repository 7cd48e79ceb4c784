// Every architecture on a CUDA device (the gpu label; each case skips itself
// without one, tests/gpu/gpu_util.h), loaded through a device map as a user
// loads it (from_pretrained, device_map "0"), the inputs moved to the model's
// device as a Transformers user moves them:
// - float32: the logits and every captured block (routers too) against the
//   Transformers 5.23 goldens (tests/data/golden5, both manifests), within
//   the CPU tests' tolerances (atol 1e-5 / rtol 1e-4, golden_util.h);
// - bf16: the 4.47 fixtures' logits against their float32 goldens within
//   test_golden.cpp's stated bounds (RMS under 3% of the golden's RMS, the
//   largest difference under 6% of its largest magnitude);
// - every module's capture (hook points included) on the GPU equal to the
//   CPU's within the same tolerances, every capture a CPU tensor;
// - generate with the KV cache, without it, with a steering vector and with
//   a patch: the same greedy tokens as on the CPU.
#include "../models/golden_util.h"
#include "gpu_util.h"

#include <flex/flexcore/activation_edits.h>
#include <flex/flexcore/flex_model.h>
#include <flex/models/architecture.h>
#include <flex/models/generate.h>

#include <cstdio>
#include <map>

#include "test_util.h"

using namespace flex;
using models_test::close;
using models_test::golden5;
using models_test::kept;

namespace {

// --- float32 against Transformers 5.23 --------------------------------------------

struct Golden5Case {
  std::string manifest;  // manifest.json or manifest_zoo3.json
  std::string name;
};
void PrintTo(const Golden5Case& c, std::ostream* os) { *os << c.name; }

std::vector<Golden5Case> golden5_cases() {
  std::vector<Golden5Case> out;
  for (const char* m : {"manifest.json", "manifest_zoo3.json"})
    for (const auto& n : models_test::golden5_cases(m)) out.push_back({m, n});
  return out;
}

class Golden5OnGpu : public ::testing::TestWithParam<Golden5Case> {};

TEST_P(Golden5OnGpu, Float32LogitsAndBlocksMatchTransformers5) {
  FLEX_REQUIRE_GPU();
  const Golden5Case c = GetParam();
  const auto manifest = models_test::read_json(golden5(c.manifest));
  ASSERT_EQ(manifest["transformers"], "5.23.0");
  const auto& info = manifest["cases"][c.name];
  const std::string type = models_test::read_json(golden5(c.name + "/config.json"))["model_type"];
  if (!find_architecture(type)) GTEST_SKIP() << "model_type '" << type << "' is not implemented yet";
  auto gt = SafetensorsFile::open(golden5(c.name + ".golden.safetensors"));
  auto model = gpu_test::load_on_device(golden5(c.name));
  EXPECT_TRUE(gpu_test::all_on(*model, gpu_test::device())) << c.name;

  const std::map<std::string, std::string> hooked = models_test::zoo3_hooked(info);
  std::map<std::string, at::Tensor> outputs;
  const auto handles = models_test::record_outputs(*model, hooked, outputs);
  const at::Tensor mask = gt->get("attention_mask");
  const at::Tensor logits =
      models_test::masked_logits(*model, gpu_test::on_device(gt->get("input_ids")), gpu_test::on_device(mask));
  EXPECT_EQ(logits.device(), gpu_test::device()) << c.name;
  EXPECT_TRUE(close(kept(logits.cpu(), mask), kept(gt->get("logits"), mask), c.name + " logits on the GPU"));
  const int64_t b = mask.size(0), t = mask.size(1);
  for (const auto& [n, ours] : hooked) {
    ASSERT_TRUE(outputs.count(n)) << n << " was not called";
    at::Tensor got = outputs[n].cpu();
    if (got.dim() == 2) got = got.reshape({b, t, -1});  // router logits [B*T, E]
    EXPECT_TRUE(close(kept(got, mask), kept(gt->get("out." + n), mask), c.name + " " + n + " on the GPU"));
  }
}

INSTANTIATE_TEST_SUITE_P(Transformers5, Golden5OnGpu, ::testing::ValuesIn(golden5_cases()),
                         [](const ::testing::TestParamInfo<Golden5Case>& i) { return i.param.name; });

// --- the 4.47 fixtures: bf16, every module's capture --------------------------------

struct Fixture {
  std::string model;   // fixtures/models/<model>
  std::string golden;  // fixtures/golden/<golden>.safetensors (float32)
};
void PrintTo(const Fixture& f, std::ostream* os) { *os << f.model; }

std::vector<Fixture> fixtures() {
  return {{"gpt2", "gpt2"},       {"llama", "llama"},     {"gpt-neox", "gpt-neox"},
          {"llama3-rope-tied", "llama3-rope-tied"},       {"llama-sharded", "llama"},
          {"llama-bf16", "llama-bf16-as-f32"},            {"mistral", "mistral"},
          {"qwen2", "qwen2"},     {"gemma2", "gemma2"},   {"phi3", "phi3"},
          {"olmo2", "olmo2"},     {"mixtral", "mixtral"}, {"qwen2_moe", "qwen2_moe"}};
}

std::string test_name(std::string s) {
  for (auto& ch : s)
    if (ch == '-') ch = '_';
  return s;
}

class FixtureOnGpu : public ::testing::TestWithParam<Fixture> {};

// test_golden.cpp's Bf16LogitsWithinBounds on the GPU (weights and
// activations bf16; cuBLAS accumulates bf16 products in float32 as the CPU
// kernels do, so the same bounds hold).
TEST_P(FixtureOnGpu, Bf16LogitsWithinBounds) {
  FLEX_REQUIRE_GPU();
  const Fixture f = GetParam();
  auto model = gpu_test::load_on_device(models_test::model_dir(f.model), "bfloat16");
  EXPECT_TRUE(gpu_test::all_on(*model, gpu_test::device())) << f.model;
  at::Tensor got;
  {
    at::NoGradGuard g;
    got = model->logits(gpu_test::on_device(models_test::golden_inputs()));
  }
  ASSERT_EQ(got.scalar_type(), at::kBFloat16) << f.model;
  EXPECT_EQ(got.device(), gpu_test::device()) << f.model;
  const at::Tensor ref = models_test::golden_tensors(f.golden)->get("logits").to(at::kDouble);
  const at::Tensor diff = got.to(at::kCPU, at::kDouble) - ref;
  const double rms_rel = diff.pow(2).mean().sqrt().item<double>() / ref.pow(2).mean().sqrt().item<double>();
  const double max_rel = diff.abs().max().item<double>() / ref.abs().max().item<double>();
  std::printf("%-18s bf16 logits on %s: rms %.4f, max %.4f of the golden's scale\n", f.model.c_str(),
              gpu_test::device().str().c_str(), rms_rel, max_rel);
  EXPECT_LT(rms_rel, 0.03) << f.model;
  EXPECT_LT(max_rel, 0.06) << f.model;
}

// A FlexModel capturing every module (hook points included: the attention
// probabilities take the eager path) on the CPU and on the GPU.
struct EveryModule {
  std::unique_ptr<FlexModel> fm;
  at::Tensor logits;
  EveryModule(const std::shared_ptr<CausalLM>& model, const at::Tensor& ids) {
    fm = std::make_unique<FlexModel>(model);
    for (const auto& [name, m] : model->named_flex_modules())
      if (!name.empty()) fm->register_forward_hook(std::make_shared<HookFunction>(name));
    at::NoGradGuard g;
    logits = fm->forward(ids);
  }
};

TEST_P(FixtureOnGpu, EveryModuleCaptureEqualsTheCpuCapture) {
  FLEX_REQUIRE_GPU();
  const Fixture f = GetParam();
  const at::Tensor ids = models_test::golden_inputs();
  EveryModule cpu(from_pretrained(models_test::model_dir(f.model)), ids);
  auto model = gpu_test::load_on_device(models_test::model_dir(f.model));
  EveryModule gpu(model, gpu_test::on_device(ids));
  EXPECT_EQ(gpu.logits.device(), gpu_test::device());
  EXPECT_TRUE(close(gpu.logits.cpu(), cpu.logits, f.model + " logits, GPU vs CPU"));
  EXPECT_TRUE(close(gpu.logits.cpu(), models_test::golden_tensors(f.golden)->get("logits"), f.model + " logits vs golden"));
  const OutputMap& a = gpu.fm->output();
  const OutputMap& b = cpu.fm->output();
  ASSERT_EQ(a.size(), b.size()) << f.model;
  double worst = 0;
  std::string worst_at;
  for (const auto& [name, want] : b) {
    ASSERT_TRUE(a.count(name)) << f.model << ": " << name << " captured on the CPU, not on the GPU";
    const auto& got = a.at(name);
    ASSERT_EQ(got.size(), want.size()) << f.model << " " << name;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].device(), at::Device(at::kCPU)) << f.model << " " << name << ": captures are CPU tensors";
      if (!at::isFloatingType(want[i].scalar_type())) {  // "#token_index" rows of an expert
        EXPECT_TRUE(flex_test::equal(got[i], want[i])) << f.model << " " << name;
        continue;
      }
      EXPECT_TRUE(close(got[i], want[i], f.model + " " + name + " GPU vs CPU capture"));
      if (got[i].sizes() == want[i].sizes() && got[i].numel() > 0) {
        const double d = gpu_test::max_diff(got[i], want[i]);
        if (d > worst || worst_at.empty()) worst = d, worst_at = name;
      }
    }
  }
  std::printf("%-18s %zu modules captured; largest |GPU - CPU| %.3g at %s\n", f.model.c_str(), b.size(), worst,
              worst_at.c_str());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureOnGpu, ::testing::ValuesIn(fixtures()),
                         [](const ::testing::TestParamInfo<Fixture>& i) { return test_name(i.param.model); });

// --- generate ---------------------------------------------------------------------

class GenerateOnGpu : public ::testing::TestWithParam<std::string> {};

HookFunctionPtr edit(const std::string& name, EditFn fn) {
  HookFunctionOptions o;
  o.editing_function = std::move(fn);
  o.save = false;
  return std::make_shared<HookFunction>(name, o);
}

// test_generate.cpp's left-padded pair of prompts (the Llama family's 8
// tokens pass Mistral's and Gemma 2's sliding window of 4).
std::pair<at::Tensor, at::Tensor> prompts() {
  return pad_left({{31, 120, 25, 102, 49}, {42, 171, 17, 111, 214, 244, 94, 193}}, 0);
}

GenerateOptions greedy(int64_t n, bool cache = true) {
  GenerateOptions g;
  g.max_new_tokens = n;
  g.stop_tokens = std::vector<int64_t>{};  // no early stop: every row generates n tokens
  g.use_cache = cache;
  return g;
}

// Greedy tokens of `model` for the prompts, with `hooks` attached through a FlexModel.
at::Tensor tokens(const std::shared_ptr<CausalLM>& model, bool on_gpu, const GenerateOptions& g,
                  const std::vector<HookFunctionPtr>& hooks = {}) {
  auto [ids, mask] = prompts();
  if (on_gpu) ids = gpu_test::on_device(ids), mask = gpu_test::on_device(mask);
  FlexModel fm(model);
  for (const auto& h : hooks) fm.register_forward_hook(h);
  at::NoGradGuard ng;
  const GenerateOutput out = generate(*model, ids, mask, g);
  return out.sequences.cpu();
}

TEST_P(GenerateOnGpu, GreedyTokensWithCacheSteeringAndPatchingEqualTheCpus) {
  FLEX_REQUIRE_GPU();
  const std::string name = GetParam();
  auto cpu = from_pretrained(models_test::model_dir(name));
  auto gpu = gpu_test::load_on_device(models_test::model_dir(name));
  const auto blocks = gpu_test::block_names(*cpu);
  ASSERT_FALSE(blocks.empty()) << name;
  const std::string block = blocks.back();

  const at::Tensor plain = tokens(cpu, false, greedy(10));
  EXPECT_TRUE(flex_test::equal(tokens(gpu, true, greedy(10)), plain)) << name << ": KV-cache decoding on the GPU";
  EXPECT_TRUE(flex_test::equal(tokens(gpu, true, greedy(10, false)), plain)) << name << ": without the cache on the GPU";

  // Steering: a fixed vector (CPU; the edit moves it to the activation's device) at the last block.
  at::manual_seed(7);
  const at::Tensor v = at::randn({cpu->config().hidden_size});
  const at::Tensor steered = tokens(cpu, false, greedy(10), {edit(block, add_vector(v, 4.0))});
  EXPECT_TRUE(flex_test::equal(tokens(gpu, true, greedy(10), {edit(block, add_vector(v, 4.0))}), steered))
      << name << ": steered at " << block;

  // Patching: the first 3 positions of the first block's output on another
  // prompt, captured on the CPU, patched in at every step of cached decoding
  // (later positions read them through attention).
  const std::string first = blocks.front();
  FlexModel capture(cpu);
  capture.register_forward_hook(std::make_shared<HookFunction>(first));
  {
    at::NoGradGuard ng;
    capture.forward(at::tensor({7, 99, 5, 11, 64, 2, 8, 13}, at::kLong).view({1, 8}));
  }
  const at::Tensor patch = capture.output().at(first).at(0).narrow(1, 0, 3).contiguous();
  capture.restore();
  const at::Tensor patched = tokens(cpu, false, greedy(10), {edit(first, patch_positions(patch, true))});
  EXPECT_TRUE(flex_test::equal(tokens(gpu, true, greedy(10), {edit(first, patch_positions(patch, true))}), patched))
      << name << ": patched at " << first;
  std::printf("%-18s greedy tokens equal on %s: plain, no cache, steered (%s), patched (%s)\n", name.c_str(),
              gpu_test::device().str().c_str(), at::equal(steered, plain) ? "unchanged" : "changed",
              at::equal(patched, plain) ? "unchanged" : "changed");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GenerateOnGpu,
                         ::testing::Values("gpt2", "llama", "gpt-neox", "llama3-rope-tied", "mistral", "qwen2", "gemma2",
                                           "phi3", "olmo2", "mixtral", "qwen2_moe"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return test_name(i.param); });

}  // namespace
