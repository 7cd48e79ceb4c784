// --quantize-head (PretrainedOptions::quantize_head): the ggml quantizer
// against gguf-py's bytes (Q8_0) and the formats' round-trip bounds through
// the gguf-py-checked dequantizer; logits with a quantized head against an
// independent float64 product of the dequantized head and the final hidden
// state; the error each format adds against the float head, printed; the
// default leaving the model bit-identical; typed errors.
#include <flex/dispatch/safetensors.h>
#include <flex/hooks/errors.h>
#include <flex/kernels/ggml_dequant.h>
#include <flex/kernels/ggml_linear.h>
#include <flex/models/auto_model.h>
#include <flex/models/config.h>
#include <flex/models/from_pretrained.h>
#include <flex/quant/ggml_format.h>
#include <flex/quant/ggml_quantize.h>
#include <flex/quant/bnb_config.h>
#include <flex/quant/weight_formats.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>

#include "quantize_fixtures.h"
#include "test_util.h"

namespace {

constexpr uint32_t kQ8_0 = 8, kQ6_K = 14;

at::Tensor dequantize(uint32_t type, const at::Tensor& bytes, int64_t out, int64_t in) {
  at::Tensor y = at::empty({out, in}, at::kFloat);
  flex::dequantize_ggml_reference(type, bytes.contiguous().data_ptr<uint8_t>(), y.data_ptr<float>(), out * in);
  return y;
}

// The element furthest over `bound`, for the failure messages.
std::string over(const at::Tensor& err, const at::Tensor& bound) {
  const at::Tensor x = (err - bound).flatten();
  const int64_t i = x.argmax().item<int64_t>();
  return "error " + std::to_string(err.flatten()[i].item<double>()) + " over its bound " +
         std::to_string(bound.flatten()[i].item<double>()) + " at flat index " + std::to_string(i);
}

// Largest |a - b| and its flat index, for the failure messages.
std::string worst(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor d = (a.to(at::kDouble) - b.to(at::kDouble)).abs().flatten();
  const int64_t i = d.argmax().item<int64_t>();
  return "largest difference " + std::to_string(d[i].item<double>()) + " at flat index " + std::to_string(i);
}

TEST(GgmlQuantize, Q8_0BytesEqualGgufPy) {
  auto f = flex::SafetensorsFile::open(flex_test::data_path("gguf/q8_0_quantize.safetensors"));
  const at::Tensor w = f->get("weight"), want = f->get("q8_0");
  const at::Tensor got = flex::ggml_quantize(kQ8_0, w);
  ASSERT_EQ(got.sizes(), want.sizes());
  const at::Tensor diff = got.ne(want);
  EXPECT_EQ(diff.sum().item<int64_t>(), 0) << "first differing byte at flat index "
                                           << diff.flatten().to(at::kInt).argmax().item<int64_t>();
}

// Round trip through the gguf-py-checked dequantizer within each format's bound.
TEST(GgmlQuantize, RoundTripWithinFormatBound) {
  at::manual_seed(52);
  at::Tensor w = at::randn({8, 512}, at::kFloat);
  w[1].zero_();
  w[2][7] = 40.f;             // an outlier
  w[3].mul_(1e-3);            // small values
  w[4].slice(0, 0, 16).zero_();  // a zero 16-group inside a Q6_K block
  // Q8_0: |x - d q| <= d / 2 with d the float16 scale, plus d's rounding (2^-11 relative, or 2^-25
  // absolute where d is a float16 subnormal) times |q| <= 127.
  {
    const at::Tensor y = dequantize(kQ8_0, flex::ggml_quantize(kQ8_0, w), 8, 512);
    const at::Tensor amax = w.abs().view({8, 16, 32}).amax(-1, true);
    const at::Tensor bound = (amax / 127 * (0.5 + 127 * std::ldexp(1.0, -11)) + 128 * std::ldexp(1.0, -25)).expand({8, 16, 32}).reshape({8, 512});
    EXPECT_TRUE((y - w).abs().le(bound).all().item<bool>()) << "Q8_0 " << over((y - w).abs(), bound);
  }
  // Q6_K: per value |x - d sc q| <= d |sc| + 16 d (ggml_quantize.h), d = max_group(|m| / 32) / 127
  // in float16 (relative rounding 2^-11, allowed for as 1.001, or 2^-25 absolute where subnormal).
  {
    const at::Tensor y = dequantize(kQ6_K, flex::ggml_quantize(kQ6_K, w), 8, 512);
    const at::Tensor gmax = w.abs().view({8, 2, 16, 16}).amax(-1, true);  // per 16-group
    const at::Tensor d =  // per super-block
        w.abs().view({8, 2, 1, 256}).amax(-1, true) / 32 / 127 * 1.001 + std::ldexp(1.0, -25);
    const at::Tensor step = gmax / 32 * 1.001 + d / 2;  // d |sc| <= |s| + d / 2
    const at::Tensor bound = (step + 16 * d).expand({8, 2, 16, 16}).reshape({8, 512});
    EXPECT_TRUE((y - w).abs().le(bound).all().item<bool>()) << "Q6_K " << over((y - w).abs(), bound);
    EXPECT_EQ(y[1].abs().max().item<float>(), 0.f);
    const double rel = ((y - w).abs().max() / w.abs().max()).item<double>();
    std::printf("[ q6_k     ] round trip: largest |error| / max|w| %.2e (rows N(0,1), 512 wide)\n", rel);
  }
  EXPECT_THROW(flex::ggml_quantize(kQ6_K, at::randn({2, 64})), flex::ShapeError);
  EXPECT_THROW(flex::ggml_quantize(2, at::randn({2, 64})), flex::UnsupportedError);
}

std::shared_ptr<flex::CausalLM> load(const std::string& model, const std::string& head) {
  flex::PretrainedOptions o;
  o.quantize_head = head;
  return flex::from_pretrained(flex_test::fixture("models/" + model), o);
}

// Logits and the final hidden state (the head's input).
std::pair<at::Tensor, at::Tensor> run(flex::CausalLM& lm, const at::Tensor& ids) {
  flex::LMInputs in;
  in.input_ids = ids;
  in.output_hidden_states = true;
  auto out = lm.run(in);
  return {out.logits, out.hidden_states.back()};
}

// The head's weight dequantized by the tested dequantizers (ggml blocks:
// dequantize_ggml_reference on the stored bytes; bitsandbytes: the format's).
at::Tensor head_weight(flex::CausalLM& lm) {
  auto* layer = dynamic_cast<flex::DenseLayer*>(lm.get_submodule(flex::output_head_name(lm)).get());
  if (auto* g = dynamic_cast<const flex::GgmlFormat*>(layer->weight_format().get()))
    return dequantize(g->type(), layer->weight, layer->out_features, layer->in_features);
  return layer->weight_format()->dequantize(*layer).to(at::kFloat);
}

void check_against_float64(flex::CausalLM& lm, const at::Tensor& ids, const std::string& what) {
  auto [logits, hidden] = run(lm, ids);
  const at::Tensor want = at::matmul(hidden.to(at::kDouble), head_weight(lm).to(at::kDouble).t());
  // float32 accumulation over `in` terms: |error| <= in * 2^-24 * sum |h w| (a loose deterministic bound).
  const at::Tensor mag = at::matmul(hidden.abs().to(at::kDouble), head_weight(lm).abs().to(at::kDouble).t());
  const double in = static_cast<double>(hidden.size(-1));
  EXPECT_TRUE((logits.to(at::kDouble) - want).abs().le(mag * in * std::ldexp(1.0, -24) + 1e-30).all().item<bool>())
      << what << ": " << worst(logits, want);
}

class QuantizedHead : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(QuantizedHead, LogitsMatchFloat64AndErrorIsMeasured) {
  const auto& [model, head] = GetParam();
  const at::Tensor ids = flex_test::fixture_input_ids();
  auto ref = load(model, "none");
  auto lm = load(model, head);
  const std::string name = flex::output_head_name(*lm);
  auto* layer = dynamic_cast<flex::DenseLayer*>(lm->get_submodule(name).get());
  ASSERT_NE(layer->weight_format(), nullptr) << name;
  EXPECT_EQ(name, flex::output_head_name(*ref));
  EXPECT_EQ(layer->class_name(), head == "int8" ? "Linear8bitLt" : head == "nf4" ? "Linear4bit" : "Linear");
  // The input embedding stays exact (a tied head got its own quantized copy).
  const at::Tensor e = lm->input_embeddings()->weight, e0 = ref->input_embeddings()->weight;
  EXPECT_TRUE(at::equal(e, e0)) << worst(e, e0);
  if (head != "int8") check_against_float64(*lm, ids, model + " " + head);  // int8 keeps outlier columns in float
  const at::Tensor a = run(*lm, ids).first, b = run(*ref, ids).first;
  const double rel = ((a - b).abs().max() / b.abs().max()).item<double>();
  const double agree = a.argmax(-1).eq(b.argmax(-1)).to(at::kDouble).mean().item<double>();
  std::printf("[ head     ] %-17s %-5s max|logits - float head| / max|float logits| %.2e, greedy agreement %.3f (%lld positions)\n",
              model.c_str(), head.c_str(), rel, agree, static_cast<long long>(ids.numel()));
  // Stated in docs/gguf.md (measured on these 64-wide random fixtures).
  const double bound = head == "nf4" ? 0.15 : head == "int8" ? 0.03 : 0.02;
  EXPECT_LE(rel, bound);
  EXPECT_GE(agree, head == "nf4" ? 0.8 : 0.9);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, QuantizedHead,
                         ::testing::Combine(::testing::Values("llama", "llama3-rope-tied", "gpt2"),
                                            ::testing::Values("q8_0", "int8", "nf4")),
                         [](const auto& info) { return flex_test::model_format_name(info.param); });

// Q6_K needs 256-value rows: a llama of hidden size 256 built here (random init, fixed seed).
TEST(QuantizedHeadQ6K, LogitsMatchFloat64AndErrorIsMeasured) {
  auto [ref, lm] = flex_test::twin_llama256();
  const at::Tensor ids = flex_test::fixture_input_ids();
  flex::quantize_output_head(*lm, "q6_k");
  check_against_float64(*lm, ids, "llama256 q6_k");
  const at::Tensor a = run(*lm, ids).first, b = run(*ref, ids).first;
  const double rel = ((a - b).abs().max() / b.abs().max()).item<double>();
  const double agree = a.argmax(-1).eq(b.argmax(-1)).to(at::kDouble).mean().item<double>();
  std::printf("[ head     ] llama256 (random)  q6_k  max|logits - float head| / max|float logits| %.2e, greedy agreement %.3f\n",
              rel, agree);
  EXPECT_LE(rel, 0.05);
  EXPECT_GE(agree, 0.8);
  // 64-wide rows are not whole Q6_K blocks: a ShapeError naming the type.
  EXPECT_THROW(load("llama", "q6_k"), flex::ShapeError);
}

// A model whose body bitsandbytes quantizes (--quantize int8 / nf4) takes a quantized head too.
TEST(QuantizedHeadWithQuantizedBody, HeadAndBodyBothQuantized) {
  const at::Tensor ids = flex_test::fixture_input_ids();
  for (const auto& [body, head] : std::vector<std::pair<std::string, std::string>>{{"int8", "q8_0"}, {"nf4", "int8"}}) {
    flex::PretrainedOptions o;
    o.quantization = flex::quantization_from_string(body);
    auto ref = flex::from_pretrained(flex_test::fixture("models/llama"), o);
    o.quantize_head = head;
    auto lm = flex::from_pretrained(flex_test::fixture("models/llama"), o);
    auto* up = dynamic_cast<flex::DenseLayer*>(lm->get_submodule("model.layers.0.mlp.up_proj").get());
    EXPECT_EQ(up->class_name(), body == "int8" ? "Linear8bitLt" : "Linear4bit");
    auto* h = dynamic_cast<flex::DenseLayer*>(lm->get_submodule("lm_head").get());
    ASSERT_NE(h->weight_format(), nullptr);
    EXPECT_EQ(h->class_name(), head == "int8" ? "Linear8bitLt" : "Linear");
    if (head != "int8") check_against_float64(*lm, ids, body + " body, " + head + " head");
    const at::Tensor a = run(*lm, ids).first, b = run(*ref, ids).first;
    const double rel = ((a - b).abs().max() / b.abs().max()).item<double>();
    std::printf("[ head     ] llama %s body, %-5s head: max|logits - float head| / max|float logits| %.2e\n", body.c_str(),
                head.c_str(), rel);
    EXPECT_LE(rel, 0.03);
  }
}

TEST(QuantizedHeadDefault, NoneLeavesTheModelBitIdentical) {
  const at::Tensor ids = flex_test::fixture_input_ids();
  for (const std::string m : {"llama", "llama3-rope-tied"}) {
    auto a = flex::from_pretrained(flex_test::fixture("models/" + m));
    auto b = load(m, "none");
    const at::Tensor la = a->logits(ids), lb = b->logits(ids);
    EXPECT_TRUE(at::equal(la, lb)) << m << ": " << worst(la, lb);
    for (const auto& [n, mod] : b->named_flex_modules())
      if (auto* d = dynamic_cast<flex::DenseLayer*>(mod.get())) {
        EXPECT_EQ(d->weight_format(), nullptr) << n;
      }
  }
}

TEST(QuantizedHeadDefault, UnknownFormatIsAConfigErrorNamingTheFlag) {
  try {
    load("llama", "q4_k");
    FAIL() << "no error";
  } catch (const flex::ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--quantize-head"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'q4_k'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("none, int8, nf4, q8_0, q6_k"), std::string::npos) << msg;
  }
}

}  // namespace
