// The GGUF architectures beyond the Llama family's first five: gemma3,
// olmo2, gpt2, gptneox, qwen2moe, qwen3moe and deepseek2, each a random tiny
// model written as llama.cpp's converter writes it
// (scripts/golden/make_gguf_archs.py: its names and metadata keys, its
// rewrites: GPT-2's transposed Conv1D weights, GPT-NeoX's regrouped q|k|v
// rows, stacked 3-D experts, Gemma's 1 + w norms, DeepSeek's kv_b_proj split
// into k_b / v_b and MQA head count), Q8_0. Checked against Transformers 5.23 on the weights gguf-py
// dequantizes from the same file: the logits, and one module's output
// captured by a forward hook (hooks work unchanged on the GGUF model).
#include <flex/dispatch/atomic_file.h>
#include <flex/dispatch/gguf.h>
#include <flex/dispatch/safetensors.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/value.h>
#include <flex/models/from_pretrained.h>
#include <flex/models/gguf_model.h>
#include <flex/quant/ggml_format.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <fstream>
#include <string>

#include "expect_error.h"
#include "tensor_compare.h"
#include "test_util.h"

using flex_test::data_path;

namespace {

struct Case {
  const char* arch;        // llama.cpp's name, the file's stem
  const char* model_type;  // flexmodel's (Transformers') model_type
  const char* cls;         // the CausalLM class built
  const char* captured;    // the module whose output the golden file holds
};

const Case kCases[] = {
    {"gemma3", "gemma3_text", "Gemma3ForCausalLM", "model.layers.5.self_attn"},
    {"olmo2", "olmo2", "Olmo2ForCausalLM", "model.layers.1.post_feedforward_layernorm"},
    {"gpt2", "gpt2", "GPT2LMHeadModel", "transformer.h.1.mlp"},
    {"gptneox", "gpt_neox", "GPTNeoXForCausalLM", "gpt_neox.layers.1.attention"},
    {"qwen2moe", "qwen2_moe", "Qwen2MoeForCausalLM", "model.layers.1.mlp"},
    {"qwen3moe", "qwen3_moe", "Qwen3MoeForCausalLM", "model.layers.1.mlp"},
    {"deepseek2", "deepseek_v2", "DeepseekV2ForCausalLM", "model.layers.1.self_attn"},  // V2's routing
    {"deepseek2-v3", "deepseek_v3", "DeepseekV3ForCausalLM", "model.layers.1.mlp"},
};

std::string gguf(const Case& c) { return data_path(std::string("gguf/") + c.arch + "-tiny-q8_0.gguf"); }
std::string golden(const Case& c) { return data_path(std::string("gguf/") + c.arch + "-tiny-q8_0.logits.safetensors"); }

class GgufArchitecture : public ::testing::TestWithParam<Case> {};

TEST_P(GgufArchitecture, LogitsAndCaptureEqualTransformers) {
  const Case& c = GetParam();
  auto f = flex::GgufFile::open(gguf(c));
  EXPECT_EQ(flex::gguf_config_json(*f).at("model_type"), c.model_type);
  auto ref = flex::SafetensorsFile::open(golden(c));
  for (bool quantized : {true, false}) {
    flex::PretrainedOptions o;
    o.gguf_quantized = quantized;
    auto m = flex::from_pretrained(gguf(c), o);
    EXPECT_EQ(m->class_name(), c.cls);
    at::Tensor seen;
    auto module = m->get_submodule(c.captured);
    auto handle = module->register_forward_hook([&seen](flex::Module&, const flex::Inputs&, flex::Value& v) {
      seen = flex::find_first_tensor(v).detach().clone();
    });
    at::NoGradGuard no_grad;
    const at::Tensor logits = m->logits(ref->get("input_ids"));
    handle.remove();
    EXPECT_TRUE(flex_test::close(logits, ref->get("logits"), 0, 1e-5)) << c.arch << " quantized=" << quantized;
    ASSERT_TRUE(seen.defined()) << c.captured;
    EXPECT_TRUE(flex_test::close(seen, ref->get("capture"), 0, 1e-5)) << c.arch << " " << c.captured;
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, GgufArchitecture, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           std::string n = i.param.arch;
                           for (char& ch : n) ch = ch == '-' ? '_' : ch;  // gtest names: letters, digits, _
                           return n;
                         });

// Stacked experts become Transformers' per-expert layers, each keeping its
// Q8_0 blocks (a slice of the 3-D tensor) and dequantizing to the slice of
// the dequantized whole.
TEST(GgufArchitectures, ExpertsAreSlicesOfTheStackedTensor) {
  const std::string path = gguf(kCases[4]);
  auto f = flex::GgufFile::open(path);
  const at::Tensor whole = f->dequantize("blk.1.ffn_down_exps.weight");
  ASSERT_EQ(whole.dim(), 3);
  auto m = flex::from_pretrained(path);
  for (int64_t e = 0; e < whole.size(0); ++e) {
    auto* layer = dynamic_cast<flex::DenseLayer*>(
        m->get_submodule("model.layers.1.mlp.experts." + std::to_string(e) + ".down_proj").get());
    ASSERT_TRUE(layer) << e;
    ASSERT_TRUE(std::dynamic_pointer_cast<const flex::GgmlFormat>(layer->weight_format())) << e;
    EXPECT_TRUE(flex_test::equal(layer->float_weight(), whole[e])) << "expert " << e;
  }
  // The shared expert's gate stays F32, as the converter keeps it.
  auto* gate = dynamic_cast<flex::DenseLayer*>(m->get_submodule("model.layers.0.mlp.shared_expert_gate").get());
  ASSERT_TRUE(gate);
  EXPECT_FALSE(gate->weight_format());
  EXPECT_TRUE(flex_test::equal(gate->weight, f->dequantize("blk.0.ffn_gate_inp_shexp.weight")));
}

// Metadata the tensors do not fit: typed errors naming the file and the tensor or key.
TEST(GgufArchitectures, BadMetadataNamesTheFileAndTheField) {
  flex_test::TempDir dir;
  // A uint32 metadata value replaced (the key's bytes, its type 4, then the value).
  auto patched = [&](const Case& c, const std::string& key, uint32_t from, uint32_t to) {
    std::string b = flex::read_file(gguf(c));
    std::string needle = key + std::string("\x04\0\0\0", 4);
    needle.append(reinterpret_cast<const char*>(&from), 4);
    const size_t at = b.find(needle);
    EXPECT_NE(at, std::string::npos) << key;
    std::memcpy(&b[at + key.size() + 4], &to, 4);
    const std::string p = dir.str(std::string(c.arch) + "-" + key + ".gguf");
    std::ofstream(p, std::ios::binary) << b;
    return p;
  };
  // Stacked experts of another count than expert_count.
  const std::string moe = patched(kCases[4], "qwen2moe.expert_count", 4, 5);
  flex_test::expect_error<flex::FileFormatError>([&] { flex::from_pretrained(moe); },
                                                 {moe, "'blk.0.ffn_gate_exps.weight'", "5 experts"});
  // GPT-NeoX's rotary width beyond the head.
  const std::string neox = patched(kCases[3], "gptneox.rope.dimension_count", 8, 99);
  flex_test::expect_error<flex::FileFormatError>([&] { flex::from_pretrained(neox); },
                                                 {neox, "gptneox.rope.dimension_count", "99"});
  // DeepSeek-V3's score correction (exp_probs_b) with softmax gating: neither model's routing.
  const std::string v3 = patched(kCases[7], "deepseek2.expert_gating_func", 2, 1);
  flex_test::expect_error<flex::UnsupportedError>([&] { flex::from_pretrained(v3); },
                                                  {v3, "expert_gating_func is 1", "exp_probs_b"});
}

// RoPE scaling as llama.cpp's converter writes it (scripts/golden/make_gguf_rope.py;
// F32, 24 positions beyond the original context of 16): Llama 3's rope_freqs
// tensor, Qwen2's YaRN keys, Phi-3's rope_factors_long / _short tensors. The
// logits equal Transformers 5.23's on the model with the matching rope_scaling.
struct RopeCase {
  const char* stem;
  const char* rope_type;  // in flexmodel's config for the file
};

class GgufRopeScaling : public ::testing::TestWithParam<RopeCase> {};

TEST_P(GgufRopeScaling, LogitsEqualTransformersBeyondTheOriginalContext) {
  const RopeCase& c = GetParam();
  const std::string path = data_path(std::string("gguf/") + c.stem + ".gguf");
  auto f = flex::GgufFile::open(path);
  EXPECT_EQ(flex::gguf_config_json(*f).at("rope_scaling").at("rope_type"), c.rope_type);
  auto ref = flex::SafetensorsFile::open(data_path(std::string("gguf/") + c.stem + ".logits.safetensors"));
  at::NoGradGuard no_grad;
  auto m = flex::from_pretrained(path);
  const at::Tensor logits = m->logits(ref->get("input_ids"));
  EXPECT_TRUE(flex_test::close(logits, ref->get("logits"), 0, 1e-5)) << c.stem;
  // The same weights with unscaled RoPE give other logits: the scaling is what is checked.
  EXPECT_GT((logits - ref->get("logits_unscaled")).abs().max().item<double>(), 1e-3) << c.stem;
  if (ref->contains("input_ids_short"))  // Phi-3 within its original context: the short factors
    EXPECT_TRUE(flex_test::close(m->logits(ref->get("input_ids_short")), ref->get("logits_short"), 0, 1e-5)) << c.stem;
}

INSTANTIATE_TEST_SUITE_P(Files, GgufRopeScaling,
                         ::testing::Values(RopeCase{"llama3-rope-tiny", "freq_factors"},
                                           RopeCase{"qwen2-yarn-tiny", "yarn"},
                                           RopeCase{"phi3-longrope-tiny", "longrope"}),
                         [](const auto& i) {
                           std::string n = i.param.stem;
                           for (char& ch : n) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return n;
                         });

// A rope tensor under another name is refused by name: the scaling cannot be lost silently.
TEST(GgufRopeScaling, AnUnknownRopeTensorIsRefusedByName) {
  std::string b = flex::read_file(data_path("gguf/llama3-rope-tiny.gguf"));
  const std::string from = "rope_freqs.weight", to = "rope_freqs.wexght";
  const size_t at = b.find(from);
  ASSERT_NE(at, std::string::npos);
  b.replace(at, from.size(), to);
  flex_test::TempDir dir;
  const std::string renamed = dir.str("renamed.gguf");
  std::ofstream(renamed, std::ios::binary) << b;
  flex_test::expect_error<flex::UnsupportedError>([&] { flex::from_pretrained(renamed); },
                                                  {renamed, "'rope_freqs.wexght'"});
}

}  // namespace
