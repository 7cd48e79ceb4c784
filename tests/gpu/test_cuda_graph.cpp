// generate(cuda_graph) on a CUDA device (design decision 51; the gpu label,
// each case skips itself without a GPU): the decode step recorded once as a
// CUDA graph and replayed per token gives
// - bit-equal outputs to the same static step run eagerly on the GPU (every
//   logit and each of 12 capture taps, every call; Llama, GPT-2, Gemma 2),
// - the same greedy tokens as the normal decode on the CPU and on the GPU,
//   whose taps (the eager captures) it matches within 1e-4,
// - with a steering vector and an ablated head (graph nodes): bit-equal to
//   the eager static step with the same edits, the same tokens as the CPU's
//   normal decode with them.
// In a dry run (FLEX_GPU_TEST_DEVICE=cpu) the "graph" side runs static_step
// too, which checks the logic here without a GPU.
#include "../models/golden_util.h"
#include "gpu_util.h"

#include <flex/flexcore/activation_edits.h>
#include <flex/flexcore/flex_model.h>
#include <flex/models/generate.h>
#include <flex/models/static_decode.h>

#include <iostream>

#include "test_util.h"

using namespace flex;

namespace {

std::pair<at::Tensor, at::Tensor> prompts() {
  return pad_left({{31, 120, 25, 102, 49}, {42, 171, 17, 111, 214, 244, 94, 193}}, 0);
}

// 12 modules: per layer of the 2-layer fixtures, the block, its attention,
// MLP, both norms and the attention's output projection (GPT-2: c_proj).
std::vector<std::string> twelve_taps(CausalLM& m) {
  std::vector<std::string> t;
  for (int64_t l = 0; l < 2; ++l) {
    const std::string i = std::to_string(l);
    if (m.config().model_type == "gpt2") {
      const std::string b = "transformer.h." + i;
      for (const char* s : {"", ".attn", ".mlp", ".ln_1", ".ln_2", ".attn.c_proj"}) t.push_back(b + s);
    } else {
      const std::string b = "model.layers." + i;
      for (const char* s : {"", ".self_attn", ".mlp", ".input_layernorm", ".post_attention_layernorm", ".self_attn.o_proj"})
        t.push_back(b + s);
    }
  }
  return t;
}

GenerateOptions opts(CausalLM& m, bool graph, bool static_step) {
  GenerateOptions o;
  o.max_new_tokens = 8;
  o.stop_tokens = std::vector<int64_t>{};
  o.cuda_graph = graph && !gpu_test::dry_run();
  o.static_step = static_step || (graph && gpu_test::dry_run());
  o.static_capacity = 32;
  o.taps = twelve_taps(m);
  o.taps.push_back("lm_head");  // the logits
  return o;
}

void expect_bit_equal(const GenerateOutput& graph, const GenerateOutput& eager, const std::string& what) {
  EXPECT_TRUE(at::equal(graph.sequences.cpu(), eager.sequences.cpu())) << what;
  ASSERT_EQ(graph.taps.size(), 13u) << what;
  for (const auto& [name, calls] : eager.taps) {
    const auto& g = graph.taps.at(name);
    ASSERT_EQ(g.size(), calls.size()) << what << " " << name;
    for (size_t c = 0; c < calls.size(); ++c)
      EXPECT_TRUE(at::equal(g[c].cpu(), calls[c].cpu()))
          << what << " " << name << " call " << c << ": largest |graph - eager| " << gpu_test::max_diff(g[c], calls[c]);
  }
}

void check_model(const std::string& name, bool with_edits) {
  auto dev = gpu_test::load_on_device(models_test::model_dir(name));
  auto cpu = load_pretrained(models_test::model_dir(name), at::kFloat);
  std::unique_ptr<FlexModel> fd, fc;
  if (with_edits) {
    const int64_t c = dev->config().hidden_size;
    const std::string block = dev->config().model_type == "gpt2" ? "transformer.h.0" : "model.layers.0";
    const std::string attn = dev->config().model_type == "gpt2" ? "transformer.h.1.attn" : "model.layers.1.self_attn";
    for (auto* pair : {&fd, &fc}) {
      auto& m = pair == &fd ? dev : cpu;
      *pair = std::make_unique<FlexModel>(m);
      HookFunctionOptions steer;
      steer.save = false;
      // A CPU vector, as the CLI's --steer loads it: the edit keeps its device copy (no copy under capture).
      steer.editing_function = add_vector(at::linspace(-2.0, 2.0, c), 3.0);
      (*pair)->register_forward_hook(std::make_shared<HookFunction>(block, steer));
      HookFunctionOptions ablate;
      ablate.save = false;
      ablate.editing_function = zero_head(1);
      (*pair)->register_forward_hook(std::make_shared<HookFunction>(head_hook_point(*m, attn), ablate));
    }
  }
  auto [ids, mask] = prompts();
  const std::string what = name + (with_edits ? " steered" : "");
  const GenerateOutput graph = generate(*dev, gpu_test::on_device(ids), gpu_test::on_device(mask), opts(*dev, true, false));
  const GenerateOutput eager = generate(*dev, gpu_test::on_device(ids), gpu_test::on_device(mask), opts(*dev, false, true));
  expect_bit_equal(graph, eager, what + " graph vs eager static step");
  // The normal (dynamic-cache) eager decode on the GPU, its taps as eager
  // captures: the same tokens, every tap within float32 rounding (the static
  // step attends over all 32 slots, so bit-equality is not expected here).
  const GenerateOutput dynamic = generate(*dev, gpu_test::on_device(ids), gpu_test::on_device(mask), opts(*dev, false, false));
  EXPECT_TRUE(at::equal(graph.sequences.cpu(), dynamic.sequences.cpu())) << what << ": graph vs GPU normal decode";
  for (const auto& [tap, calls] : dynamic.taps)
    for (size_t c = 0; c < calls.size(); ++c)
      EXPECT_TRUE(models_test::close(graph.taps.at(tap)[c].cpu(), calls[c].cpu(),
                                     what + " " + tap + " call " + std::to_string(c) + " graph vs GPU normal decode",
                                     1e-4, 1e-4));
  GenerateOptions normal = opts(*cpu, false, false);
  const GenerateOutput on_cpu = generate(*cpu, ids, mask, normal);
  EXPECT_TRUE(at::equal(graph.sequences.cpu(), on_cpu.sequences)) << what << ": graph " << graph.sequences
                                                                  << "\nCPU normal decode " << on_cpu.sequences;
  double largest = 0;
  for (const auto& [tap, calls] : on_cpu.taps)
    for (size_t c = 0; c < calls.size(); ++c) largest = std::max(largest, gpu_test::max_diff(graph.taps.at(tap)[c], calls[c]));
  std::cout << what << ": graph vs CPU normal decode, largest tap difference " << largest << "\n";
  EXPECT_LT(largest, 1e-3) << what;
}

TEST(CudaGraphDecode, BitEqualToEagerStaticStepSameTokensAsCpu) {
  FLEX_REQUIRE_GPU();
  // Gemma 2: soft-capping and its sliding window (4) applied at the device slot.
  for (const std::string name : {"llama", "gpt2", "gemma2"}) check_model(name, false);
}

TEST(CudaGraphDecode, SteeringAndAblationAsGraphNodes) {
  FLEX_REQUIRE_GPU();
  check_model("llama", true);
}

TEST(CudaGraphDecode, ReplaysAgainInASecondCall) {
  FLEX_REQUIRE_GPU();
  // A second generate records its own graph in the shared pool: the same tokens.
  auto dev = gpu_test::load_on_device(models_test::model_dir("llama"));
  auto [ids, mask] = prompts();
  const GenerateOutput a = generate(*dev, gpu_test::on_device(ids), gpu_test::on_device(mask), opts(*dev, true, false));
  const GenerateOutput b = generate(*dev, gpu_test::on_device(ids), gpu_test::on_device(mask), opts(*dev, true, false));
  EXPECT_TRUE(at::equal(a.sequences.cpu(), b.sequences.cpu()));
  EXPECT_TRUE(at::equal(a.taps.at("lm_head").back().cpu(), b.taps.at("lm_head").back().cpu()));
}

// A FlexModel capture (save) is host work that replays would skip: it is
// refused in the warm-up, before a graph is recorded, naming the module and
// taps (not a capture silently cut to the recorded steps).
TEST(CudaGraphDecode, AFlexModelCaptureIsRefusedNotCutShort) {
  FLEX_REQUIRE_GPU();
  auto dev = gpu_test::load_on_device(models_test::model_dir("llama"));
  auto [ids, mask] = prompts();
  const at::Tensor on = gpu_test::on_device(ids);
  if (!on.is_cuda()) GTEST_SKIP() << "dry run: no graph is recorded on " << on.device();
  FlexModel fm(dev);
  fm.register_forward_hook(std::make_shared<HookFunction>("model.layers.1.mlp"));
  try {
    generate(*dev, on, gpu_test::on_device(mask), opts(*dev, true, false));
    FAIL() << "a FlexModel capture ran under cuda_graph";
  } catch (const UnsupportedError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("model.layers.1.mlp"), std::string::npos) << msg;
    EXPECT_NE(msg.find("taps"), std::string::npos) << msg;
  }
}

}  // namespace
