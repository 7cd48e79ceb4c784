// Quantized fixture models: logits stay within stated bounds of the fp32
// golden (Transformers) logits, captures keep every module name and shape,
// get_module_parameter reads the dequantized weight, and checkpoints in
// bitsandbytes' layout (written here tensor by tensor with an independent
// int8 quantizer, or by `convert --quantize`'s writer) load to the same model.
#include <flex/dispatch/checkpoint.h>
#include <flex/dispatch/module_sizes.h>
#include <flex/dispatch/safetensors.h>
#include <flex/flexcore/flex_model.h>
#include <flex/hooks/empty_init.h>
#include <flex/hooks/errors.h>
#include <flex/models/auto_model.h>
#include <flex/models/from_pretrained.h>
#include <flex/quant/quantize_model.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "test_util.h"

namespace fs = std::filesystem;

namespace {

at::Tensor golden_inputs() {
  return flex::SafetensorsFile::open(flex_test::fixture("golden/inputs.safetensors"))->get("input_ids");
}
at::Tensor golden_logits(const std::string& m) {
  return flex::SafetensorsFile::open(flex_test::fixture("golden/" + m + ".safetensors"))->get("logits");
}

std::shared_ptr<flex::CausalLM> load(const std::string& model, const std::string& method) {
  flex::PretrainedOptions o;
  if (method != "fp32") o.quantization = flex::quantization_from_string(method);
  return flex::from_pretrained(flex_test::fixture("models/" + model), o);
}

struct Bound {
  double max_abs_rel;  // max |logits - golden| / max |golden|, at most
  double agreement;    // top-1 agreement with the golden logits, at least
};

// The stated bounds on the fixture models. They are tiny random models (64
// wide, random weights N(0, 1/in), 16 positions), where quantization noise is
// a far larger share of the logits than in trained models; measured worst
// cases: int8 0.027 / 0.875, 4-bit 0.49 / 0.375 (phi3 fp4).
Bound bound_for(const std::string& method) { return method == "int8" ? Bound{0.04, 0.85} : Bound{0.6, 0.3}; }

class QuantizedFixture : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(QuantizedFixture, LogitsStayNearGoldenAndCapturesKeepNames) {
  const auto& [model, method] = GetParam();
  const at::Tensor ids = golden_inputs();
  const at::Tensor gold = golden_logits(model);
  auto lm = load(model, method);
  // Every dense layer but the head computes from its quantized weight.
  int quantized = 0;
  for (const auto& [name, m] : lm->named_flex_modules())
    if (auto* d = dynamic_cast<flex::DenseLayer*>(m.get()); d && d->weight_format()) {
      ++quantized;
      EXPECT_EQ(d->class_name(), method == "int8" ? "Linear8bitLt" : "Linear4bit") << name;
      EXPECT_NE(name, flex::output_head_name(*lm));
    }
  EXPECT_GT(quantized, 4);
  flex::FlexModel fq(lm);
  std::vector<std::string> names;
  for (const auto& [name, m] : lm->named_flex_modules())
    if (!name.empty() && name.find("hook_") == std::string::npos) names.push_back(name);
  for (const auto& n : names) fq.register_forward_hook(std::make_shared<flex::HookFunction>(n));
  const at::Tensor logits = fq.forward(ids);
  const double max_abs = (logits - gold).abs().max().item<double>();
  const double agree = logits.argmax(-1).eq(gold.argmax(-1)).to(at::kDouble).mean().item<double>();
  std::printf("[ quant    ] %-10s %-5s max|logits - golden| %.4f (golden max %.2f), top-1 agreement %.3f\n",
              model.c_str(), method.c_str(), max_abs, gold.abs().max().item<double>(), agree);
  const Bound b = bound_for(method);
  EXPECT_LE(max_abs, b.max_abs_rel * gold.abs().max().item<double>()) << model << " " << method;
  EXPECT_GE(agree, b.agreement) << model << " " << method;
  // Captures: the same names and shapes as the full-precision model's.
  flex::FlexModel ff(load(model, "fp32"));
  for (const auto& n : names) ff.register_forward_hook(std::make_shared<flex::HookFunction>(n));
  ff.forward(ids);
  for (const auto& n : names) {
    auto q = fq.output().find(n), f = ff.output().find(n);
    ASSERT_EQ(q == fq.output().end(), f == ff.output().end()) << n;
    if (f == ff.output().end()) continue;
    ASSERT_EQ(q->second.size(), f->second.size()) << n;
    // Expert rows (NAME#token_index beside them): quantization may route
    // other tokens to an expert, so only the feature dims must agree.
    const bool rows = ff.output().count(n + "#token_index") > 0;
    for (size_t i = 0; i < f->second.size(); ++i) {
      if (rows)
        EXPECT_EQ(q->second[i].sizes().slice(1), f->second[i].sizes().slice(1)) << n;
      else
        EXPECT_EQ(q->second[i].sizes(), f->second[i].sizes()) << n;
      EXPECT_EQ(q->second[i].scalar_type(), f->second[i].scalar_type()) << n;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, QuantizedFixture,
    ::testing::Combine(::testing::Values("gpt2", "llama", "gpt-neox", "mistral", "qwen2", "gemma2", "phi3", "olmo2",
                                         "mixtral", "qwen2_moe"),
                       ::testing::Values("int8", "nf4", "fp4")),
    [](const auto& info) {
      std::string s = std::get<0>(info.param) + "_" + std::get<1>(info.param);
      for (auto& c : s)
        if (c == '-') c = '_';
      return s;
    });

std::string read_text(const std::string& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A bitsandbytes 8-bit folder written here: every Linear but lm_head as
// weight (int8) + SCB + weight_format, quantized by this test's own
// arithmetic (row absmax of the float16 weight, round half to even).
void write_int8_folder(const std::string& src, const std::string& dst) {
  fs::create_directories(dst);
  auto ck = flex::Checkpoint::open(src);
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& key : ck.keys()) {
    at::Tensor t = ck.get(key);
    const bool linear = key.size() > 7 && key.compare(key.size() - 7, 7, ".weight") == 0 && t.dim() == 2 &&
                        key.find("embed") == std::string::npos && key.rfind("lm_head", 0) != 0;
    if (!linear) {
      out.emplace_back(key, t);
      continue;
    }
    const at::Tensor h = t.to(at::kHalf).to(at::kDouble);
    const at::Tensor scb = h.abs().amax(1);
    const at::Tensor cb = at::round(h * 127.0 / scb.unsqueeze(1)).to(at::kChar);
    const std::string layer = key.substr(0, key.size() - 7);
    out.emplace_back(key, cb);
    out.emplace_back(layer + ".SCB", scb.to(at::kFloat));
    out.emplace_back(layer + ".weight_format", at::zeros({}, at::kByte));
  }
  flex::save_safetensors(dst + "/model.safetensors", out, {{"format", "pt"}});
  auto cfg = nlohmann::json::parse(read_text(src + "/config.json"));
  flex::BnbQuantizationConfig q;
  q.load_in_8bit = true;
  cfg["quantization_config"] = flex::bnb_quantization_config_json(q);
  std::ofstream(dst + "/config.json") << cfg.dump(2);
}

TEST(BnbCheckpoint, Int8FolderLoadsWithItsOwnCodesAndScales) {
  flex_test::TempDir tmp;
  const std::string src = flex_test::fixture("models/llama");
  write_int8_folder(src, tmp.str("llama-int8"));
  auto lm = flex::from_pretrained(tmp.str("llama-int8"));
  auto layer = std::dynamic_pointer_cast<flex::DenseLayer>(lm->get_submodule("model.layers.0.self_attn.q_proj"));
  ASSERT_TRUE(layer && layer->weight_format());
  EXPECT_EQ(layer->class_name(), "Linear8bitLt");
  EXPECT_EQ(layer->weight.scalar_type(), at::kChar);
  // get_module_parameter: the dequantized weight, codes * SCB / 127.
  flex::FlexModel fm(lm);
  auto ck = flex::Checkpoint::open(tmp.str("llama-int8"));
  const at::Tensor expect = ck.get("model.layers.0.self_attn.q_proj.weight").to(at::kDouble) *
                            ck.get("model.layers.0.self_attn.q_proj.SCB").to(at::kDouble).unsqueeze(1) / 127.0;
  const at::Tensor got = fm.get_module_parameter("model.layers.0.self_attn.q_proj.weight");
  EXPECT_LT((got.to(at::kDouble) - expect).abs().max().item<double>(), 1e-6);
  // About the model quantizing the full-precision checkpoint while loading
  // gives (this test rounds in double, the loader in float32: a code may differ by one).
  auto fresh = load("llama", "int8");
  EXPECT_LT((lm->logits(golden_inputs()) - fresh->logits(golden_inputs())).abs().max().item<double>(), 0.05);
  // Asking for another method than the folder holds is refused.
  flex::PretrainedOptions o;
  o.quantization = flex::quantization_from_string("nf4");
  EXPECT_THROW(flex::from_pretrained(tmp.str("llama-int8"), o), flex::ConfigError);
}

TEST(BnbCheckpoint, FourBitLayoutRoundTripsThroughTheWriter) {
  flex_test::TempDir tmp;
  for (const bool nested : {false, true}) {
    flex::BnbQuantizationConfig q = flex::quantization_from_string("nf4");
    q.bnb_4bit_use_double_quant = nested;
    flex::PretrainedOptions o;
    o.quantization = q;
    auto lm = flex::from_pretrained(flex_test::fixture("models/gpt2"), o);
    const std::string dir = tmp.str(nested ? "dq" : "plain");
    fs::create_directories(dir);
    flex::save_safetensors(dir + "/model.safetensors", flex::bnb_state_dict(*lm), {{"format", "pt"}});
    auto cfg = nlohmann::json::parse(read_text(flex_test::fixture("models/gpt2/config.json")));
    cfg["quantization_config"] = flex::bnb_quantization_config_json(q);
    std::ofstream(dir + "/config.json") << cfg.dump(2);
    // bitsandbytes' keys, dtypes and shapes (GPT-2's Conv1D c_attn: [out, in] = [192, 64]).
    auto ck = flex::Checkpoint::open(dir);
    const std::string p = "transformer.h.0.attn.c_attn.weight";
    EXPECT_EQ(ck.dtype(p), at::kByte);
    EXPECT_EQ(ck.shape(p), (std::vector<int64_t>{192 * 64 / 2, 1}));
    EXPECT_EQ(ck.dtype(p + ".absmax"), nested ? at::kByte : at::kFloat);
    EXPECT_EQ(ck.shape(p + ".absmax"), (std::vector<int64_t>{192}));
    EXPECT_EQ(ck.shape(p + ".quant_map"), (std::vector<int64_t>{16}));
    EXPECT_EQ(ck.contains(p + ".nested_absmax"), nested);
    const at::Tensor js = ck.get(p + ".quant_state.bitsandbytes__nf4");
    auto state = nlohmann::json::parse(std::string(reinterpret_cast<const char*>(js.contiguous().data_ptr<uint8_t>()),
                                                   static_cast<size_t>(js.numel())));
    EXPECT_EQ(state["shape"], (std::vector<int64_t>{192, 64}));
    EXPECT_EQ(state["blocksize"], 64);
    EXPECT_EQ(state.contains("nested_offset"), nested);
    EXPECT_FALSE(ck.contains("lm_head.weight.absmax"));
    // Loaded back: bitwise the same logits.
    auto back = flex::from_pretrained(dir);
    EXPECT_TRUE(flex_test::equal(back->logits(golden_inputs()), lm->logits(golden_inputs())))
        << (nested ? "nested" : "plain");
  }
}

TEST(QuantizedSizes, FourBitLayersCountHalfAByteAWeightPlusScales) {
  const std::string dir = flex_test::fixture("models/llama");
  std::shared_ptr<flex::CausalLM> model;
  {
    flex::EmptyInit scope(false);
    model = flex::build_causal_lm(flex::load_config(dir));
  }
  flex::plan_quantized_layers(*model, dir, flex::quantization_from_string("nf4"), at::kFloat);
  auto sizes = flex::compute_module_sizes(*model);
  // q_proj 64 x 64: 2048 packed bytes + 64 float32 absmaxes + 16 float32 code values + the JSON state.
  const auto q = std::dynamic_pointer_cast<flex::DenseLayer>(model->get_submodule("model.layers.0.self_attn.q_proj"));
  const double json = static_cast<double>(q->format_tensor("weight_quant_state").numel());
  EXPECT_EQ(sizes["model.layers.0.self_attn.q_proj"], 2048 + 64 * 4 + 16 * 4 + json);
  // The head stays float32.
  EXPECT_EQ(sizes["lm_head"], static_cast<double>(model->output_embeddings()->weight.numel() * 4));
}

TEST(QuantizedOffload, BlocksOnDiskGiveTheInMemoryLogits) {
  flex_test::TempDir tmp;
  auto in_memory = load("llama", "nf4");
  flex::PretrainedOptions o;
  o.quantization = flex::quantization_from_string("nf4");
  flex::DeviceMap map;
  for (const auto& [name, m] : in_memory->named_flex_children())
    if (name != "model") map.set(name, flex::MapDevice::cpu());
  map.set("model.embed_tokens", flex::MapDevice::cpu());
  map.set("model.layers.0", flex::MapDevice::cpu());
  map.set("model.layers.1", flex::MapDevice::disk());
  map.set("model.norm", flex::MapDevice::cpu());
  o.device_map = map;
  o.offload_folder = tmp.str("offload");
  auto offloaded = flex::from_pretrained(flex_test::fixture("models/llama"), o);
  EXPECT_TRUE(fs::exists(tmp.str("offload") + "/index.json"));
  EXPECT_TRUE(flex_test::equal(offloaded->logits(golden_inputs()), in_memory->logits(golden_inputs())));
  // Without an offload folder the quantized disk weights have nowhere to go.
  o.offload_folder.reset();
  EXPECT_THROW(flex::from_pretrained(flex_test::fixture("models/llama"), o), flex::ConfigError);
}

}  // namespace

namespace {

// Accelerate's entry point: a model on meta is planned, loaded and quantized
// from the checkpoint; a loaded model is quantized in place. Both give the
// model from_pretrained(quantization) gives.
TEST(LoadAndQuantizeModel, OnMetaFromWeightsOrInPlace) {
  const std::string dir = flex_test::fixture("models/llama");
  const at::Tensor expect = load("llama", "nf4")->logits(golden_inputs());
  const auto q = flex::quantization_from_string("nf4");
  std::shared_ptr<flex::CausalLM> meta;
  {
    flex::EmptyInit scope(false);
    meta = flex::build_causal_lm(flex::load_config(dir));
  }
  flex::LoadAndQuantizeOptions o;
  o.default_skip = {"lm_head"};
  flex::load_and_quantize_model(*meta, q, dir, o);
  EXPECT_TRUE(flex_test::equal(meta->logits(golden_inputs()), expect));
  auto loaded = flex::load_pretrained(dir);
  flex::load_and_quantize_model(*loaded, q, std::nullopt, o);
  EXPECT_TRUE(flex_test::equal(loaded->logits(golden_inputs()), expect));
  // skip_modules / keep_in_fp32_modules leave layers in full precision.
  flex::BnbQuantizationConfig keep = q;
  keep.keep_in_fp32_modules = {"mlp"};
  auto partly = flex::load_pretrained(dir);
  flex::load_and_quantize_model(*partly, keep, std::nullopt, o);
  EXPECT_FALSE(std::dynamic_pointer_cast<flex::DenseLayer>(partly->get_submodule("model.layers.0.mlp.up_proj"))->weight_format());
  EXPECT_TRUE(std::dynamic_pointer_cast<flex::DenseLayer>(partly->get_submodule("model.layers.0.self_attn.q_proj"))->weight_format());
  // A meta model without weights to load is a typed error.
  std::shared_ptr<flex::CausalLM> empty;
  {
    flex::EmptyInit scope(false);
    empty = flex::build_causal_lm(flex::load_config(dir));
  }
  EXPECT_THROW(flex::load_and_quantize_model(*empty, q, std::nullopt, o), flex::ConfigError);
}

}  // namespace
