// GGUF models computing on their quantized blocks (flex/quant/ggml_format.h):
// tests/data/gguf/llama-mixed.gguf (scripts/golden/make_gguf.py) holds one
// Llama block whose matrices are Q4_K, Q4_0, Q5_K, Q6_K, Q4_1, Q5_1, Q5_0
// and a Q8_0 head. Checked: the layers keep the file's bytes (views of the
// mapping), the logits equal Transformers' on gguf-py's dequantized weights
// (12 tokens: the tiled prefill; 5 tokens: the block-decoding GEMV), every
// module's output equals the same file loaded dequantized, and greedy decode
// steps; fast activations within their documented error; 1 and 2 threads
// give the same bits.
#include <flex/dispatch/gguf.h>
#include <flex/dispatch/safetensors.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/value.h>
#include <flex/kernels/ggml_linear.h>
#include <flex/models/from_pretrained.h>
#include <flex/models/generate.h>
#include <flex/quant/ggml_format.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <string>

#include "kernel_test_util.h"
#include "tensor_compare.h"
#include "test_util.h"

using flex_test::data_path;

namespace {

std::string mixed() { return data_path("gguf/llama-mixed.gguf"); }

std::shared_ptr<flex::CausalLM> load(bool quantized, bool fast = false) {
  flex::PretrainedOptions o;
  o.gguf_quantized = quantized;
  o.fast_activations = fast;
  return flex::from_pretrained(mixed(), o);
}

// Every module's first output tensor for `ids`.
std::map<std::string, at::Tensor> capture(flex::CausalLM& model, const at::Tensor& ids) {
  std::map<std::string, at::Tensor> out;
  std::vector<std::pair<std::shared_ptr<flex::Module>, flex::HookHandle>> handles;
  for (auto& [name, m] : model.named_flex_modules()) {
    const std::string n = name;
    handles.emplace_back(m, m->register_forward_hook([&out, n](flex::Module&, const flex::Inputs&, flex::Value& v) {
      at::Tensor t = flex::find_first_tensor(v);
      if (t.defined()) out[n] = t.detach().clone();
    }));
  }
  at::NoGradGuard g;
  model.logits(ids);
  for (auto& [m, h] : handles) h.remove();
  return out;
}

// |a - e| <= tol * max|e| (a per-tensor scale); the largest difference and where on failure.
::testing::AssertionResult close_to_scale(const at::Tensor& a, const at::Tensor& e, double tol) {
  const double scale = e.abs().max().item<double>();
  return flex_test::close(a, e, 0.0, tol * std::max(scale, 1e-6));
}

// Whether `p` lies in a memory mapping of a file whose path ends in `file` (/proc/self/maps).
bool in_mapping_of(const void* p, const std::string& file) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  const auto a = reinterpret_cast<uintptr_t>(p);
  while (std::getline(maps, line)) {
    if (line.size() < file.size() || line.compare(line.size() - file.size(), file.size(), file) != 0) continue;
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) == 2 && a >= lo && a < hi) return true;
  }
  return false;
}

TEST(GgufQuantizedModel, LayersKeepTheFilesBlocks) {
  auto model = load(true);
  auto f = flex::GgufFile::open(mixed());
  const std::map<std::string, std::pair<std::string, uint32_t>> want = {
      {"model.layers.0.self_attn.q_proj", {"blk.0.attn_q.weight", 12}},
      {"model.layers.0.self_attn.k_proj", {"blk.0.attn_k.weight", 2}},
      {"model.layers.0.self_attn.v_proj", {"blk.0.attn_v.weight", 13}},
      {"model.layers.0.self_attn.o_proj", {"blk.0.attn_output.weight", 14}},
      {"model.layers.0.mlp.gate_proj", {"blk.0.ffn_gate.weight", 3}},
      {"model.layers.0.mlp.up_proj", {"blk.0.ffn_up.weight", 7}},
      {"model.layers.0.mlp.down_proj", {"blk.0.ffn_down.weight", 6}},
      {"lm_head", {"output.weight", 8}}};
  for (const auto& [module, g] : want) {
    auto* layer = dynamic_cast<flex::DenseLayer*>(model->get_submodule(module).get());
    ASSERT_TRUE(layer) << module;
    auto fmt = std::dynamic_pointer_cast<const flex::GgmlFormat>(layer->weight_format());
    ASSERT_TRUE(fmt) << module << " is not stored as ggml blocks";
    EXPECT_EQ(fmt->type(), g.second) << module;
    EXPECT_EQ(layer->class_name(), "Linear");
    EXPECT_EQ(layer->weight.scalar_type(), at::kByte);
    EXPECT_EQ(layer->weight.numel(), static_cast<int64_t>(f->tensor(g.first).nbytes)) << module;
    // Rows in the file's order stay views of the mapping; q/k rows are reordered (a copy).
    const bool reordered = module.find("q_proj") != std::string::npos || module.find("k_proj") != std::string::npos;
    EXPECT_EQ(in_mapping_of(layer->weight.data_ptr(), "llama-mixed.gguf"), !reordered) << module;
    if (!reordered) {
      EXPECT_TRUE(flex_test::equal(layer->weight.reshape(-1), f->raw(g.first))) << module;
    }
  }
  // float_weight() is the dequantized weight of the dequantized load.
  auto plain = load(false);
  auto* q = dynamic_cast<flex::DenseLayer*>(model->get_submodule("model.layers.0.self_attn.q_proj").get());
  auto* p = dynamic_cast<flex::DenseLayer*>(plain->get_submodule("model.layers.0.self_attn.q_proj").get());
  EXPECT_FALSE(p->weight_format());
  EXPECT_TRUE(flex_test::equal(q->float_weight(), p->weight));
}

TEST(GgufQuantizedModel, LogitsEqualTransformersOnGgufPyWeights) {
  auto golden = flex::SafetensorsFile::open(data_path("gguf/llama-mixed.logits.safetensors"));
  auto model = load(true);
  for (const char* key : {"prefill", "decode"}) {
    at::NoGradGuard g;
    const at::Tensor logits = model->logits(golden->get(std::string(key) + "_input_ids"));
    EXPECT_TRUE(close_to_scale(logits, golden->get(std::string(key) + "_logits"), 2e-5)) << key;
  }
}

// Stated tolerance: every module's output within 2e-5 of its largest value
// (the dequantized load multiplies the same float weights in another order).
TEST(GgufQuantizedModel, EveryModuleMatchesTheDequantizedModel) {
  auto golden = flex::SafetensorsFile::open(data_path("gguf/llama-mixed.logits.safetensors"));
  auto quant = load(true), plain = load(false);
  for (const char* key : {"prefill", "decode"}) {
    const at::Tensor ids = golden->get(std::string(key) + "_input_ids");
    auto a = capture(*quant, ids), e = capture(*plain, ids);
    ASSERT_EQ(a.size(), e.size());
    EXPECT_GE(a.size(), 12u);
    for (const auto& [name, t] : e) {
      ASSERT_TRUE(a.count(name)) << name;
      EXPECT_TRUE(close_to_scale(a[name], t, 2e-5)) << key << " " << name;
    }
  }
  // Greedy decoding through the KV cache (one-row GEMV steps) picks the same tokens.
  flex::GenerateOptions o;
  o.max_new_tokens = 8;
  const at::Tensor prompt = golden->get("decode_input_ids");
  EXPECT_TRUE(flex_test::equal(flex::generate(*quant, prompt, {}, o).sequences, flex::generate(*plain, prompt, {}, o).sequences));
}

// Fast activations (8-bit inputs per 32): measured worst 1e-2 of the logits'
// scale on this model (docs/gguf.md); asserted within 3e-2, and the argmax
// of each decode position kept.
TEST(GgufQuantizedModel, FastActivationsWithinTheirError) {
  auto golden = flex::SafetensorsFile::open(data_path("gguf/llama-mixed.logits.safetensors"));
  auto fast = load(true, true);
  at::NoGradGuard g;
  const at::Tensor want = golden->get("decode_logits");
  const at::Tensor got = fast->logits(golden->get("decode_input_ids"));
  const double rel = (got - want).abs().max().item<double>() / want.abs().max().item<double>();
  std::cout << "fast activations: largest logit difference / largest logit = " << rel << "\n";
  EXPECT_TRUE(close_to_scale(got, want, 3e-2));
  EXPECT_GT(rel, 0.0);  // the inputs were quantized
  auto* lm = dynamic_cast<flex::DenseLayer*>(fast->get_submodule("lm_head").get());
  EXPECT_EQ(std::dynamic_pointer_cast<const flex::GgmlFormat>(lm->weight_format())->activations(),
            flex::GgmlActivations::Q8);
}

TEST(GgufQuantizedModel, OneAndTwoThreadsGiveTheSameBits) {
  auto golden = flex::SafetensorsFile::open(data_path("gguf/llama-mixed.logits.safetensors"));
  for (bool fast : {false, true}) {
    auto model = load(true, fast);
    for (const char* key : {"prefill", "decode"}) {
      at::NoGradGuard g;
      const at::Tensor ids = golden->get(std::string(key) + "_input_ids");
      at::Tensor one, two;
      {
        flex_test::ThreadsGuard t(1);
        one = model->logits(ids);
      }
      {
        flex_test::ThreadsGuard t(2);
        two = model->logits(ids);
      }
      EXPECT_TRUE(flex_test::equal(one, two)) << key << (fast ? " fast" : "");
    }
  }
}

// A decode step's q/k/v and gate/up run as one grouped product when none is
// hooked (decision 59's grouped GEMV, quantized blocks or float weights); a
// hook on any of them brings back the separate calls, which the hook must
// see. Both give the same bits.
TEST(GgufQuantizedModel, GroupedProjectionsEqualSeparateCalls) {
  auto golden = flex::SafetensorsFile::open(data_path("gguf/llama-mixed.logits.safetensors"));
  for (int mode = 0; mode < 3; ++mode) {  // blocks, blocks with fast activations, dequantized (float GEMV)
    const bool fast = mode == 1;
    auto model = load(mode < 2, fast);
    at::NoGradGuard g;
    for (const char* key : {"prefill", "decode"}) {
      const at::Tensor ids = golden->get(std::string(key) + "_input_ids");
      const at::Tensor grouped = model->logits(ids);
      EXPECT_TRUE(flex_test::equal(grouped, model->logits(ids))) << "repeat " << key;
      int calls = 0;
      std::vector<flex::HookHandle> hooks;
      for (const char* name : {"model.layers.0.self_attn.v_proj", "model.layers.0.mlp.up_proj"})
        hooks.push_back(model->get_submodule(name)->register_forward_hook(
            [&calls](flex::Module&, const flex::Inputs&, flex::Value&) { ++calls; }));
      const at::Tensor separate = model->logits(ids);
      for (auto& h : hooks) h.remove();
      EXPECT_EQ(calls, 2) << key;
      EXPECT_TRUE(flex_test::equal(grouped, separate)) << key << " mode " << mode;
    }
  }
}

}  // namespace
