// --quantize-embeddings (PretrainedOptions::quantize_embeddings, design
// decision 52): the input embedding stored as int8 / nf4 / q8_0 / q6_k keeps
// its module name, class and hooks; a lookup equals the same rows of the
// table dequantized whole (bit for bit), which is within each format's
// rounding of the float table; the error it adds to the logits and the bytes
// it saves are printed (docs/gguf.md's table); a tied head keeps the float
// table; the default leaves the model bit-identical; typed errors.
#include <flex/dispatch/safetensors.h>
#include <flex/hooks/errors.h>
#include <flex/models/auto_model.h>
#include <flex/models/config.h>
#include <flex/models/from_pretrained.h>
#include <flex/models/quantized_embedding.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>

#include "expect_error.h"
#include "quantize_fixtures.h"
#include "test_util.h"

namespace {

std::shared_ptr<flex::CausalLM> load(const std::string& model, const std::string& embeddings) {
  flex::PretrainedOptions o;
  o.quantize_embeddings = embeddings;
  return flex::from_pretrained(flex_test::fixture("models/" + model), o);
}

// Bytes the embedding holds: its weight and the format's buffers.
int64_t embedding_bytes(flex::Embedding& e) {
  int64_t n = 0;
  for (const auto& t : e.parameters()) n += t.numel() * t.element_size();
  for (const auto& t : e.buffers()) n += t.numel() * t.element_size();
  return n;
}

// The embedding's output for `ids`, at `threads` threads.
at::Tensor lookup(flex::Embedding& e, const at::Tensor& ids, int threads) {
  const int before = at::get_num_threads();
  at::set_num_threads(threads);
  at::Tensor out = e(ids);
  at::set_num_threads(before);
  return out;
}

// The error bound on one dequantized value relative to the largest |value|
// of its row: int8 (per row) and q8_0 (per 32) half a step of max/127 plus
// the float16 scale's rounding (127 * 2^-11 steps); nf4 half NF4's largest
// code gap (-1 to -0.696: 0.152) of its block's absmax; q6_k d |sc| + 16 d
// (ggml_quantize.h), about max/32 + max/254.
double relative_bound(const std::string& f) { return f == "nf4" ? 0.16 : f == "q6_k" ? 0.05 : 0.006; }

void check_quantized(flex::CausalLM& lm, flex::CausalLM& ref, const std::string& what, const std::string& f,
                     const at::Tensor& ids) {
  at::NoGradGuard no_grad;
  auto e = lm.input_embeddings();
  auto e0 = ref.input_embeddings();
  ASSERT_NE(e->weight_format(), nullptr) << what;
  EXPECT_EQ(e->class_name(), e0->class_name()) << what;
  EXPECT_EQ(e->weight.scalar_type(), f == "int8" ? at::kChar : at::kByte) << what;
  const at::Tensor table = e->float_weight();
  const at::Tensor exact = e0->weight.detach();
  ASSERT_EQ(table.sizes(), exact.sizes());
  EXPECT_EQ(table.scalar_type(), exact.scalar_type());
  // Lookups are rows of the whole dequantized table, bit for bit, at 1 and 2 threads.
  const at::Tensor want = table.index_select(0, ids.reshape({-1})).view({ids.size(0), ids.size(1), -1});
  EXPECT_TRUE(flex_test::equal(lookup(*e, ids, 1), want)) << what;
  EXPECT_TRUE(flex_test::equal(lookup(*e, ids, 2), want)) << what;
  // ... and the table is the float one within the format's rounding.
  const double table_err = ((table - exact).abs().max() / exact.abs().max()).item<double>();
  const at::Tensor row_err = (table - exact).abs().amax(-1) / exact.abs().amax(-1).clamp_min(1e-30);
  EXPECT_LE(row_err.max().item<double>(), relative_bound(f)) << what << " worst row " << row_err.argmax().item<int64_t>();
  // A tied head keeps the float table.
  auto* head = dynamic_cast<flex::DenseLayer*>(lm.get_submodule(flex::output_head_name(lm)).get());
  if (lm.config().tie_word_embeddings) {
    EXPECT_EQ(head->weight_format(), nullptr) << what;
    EXPECT_TRUE(flex_test::equal(head->weight, exact)) << what;
  }
  const at::Tensor a = lm.logits(ids), b = ref.logits(ids);
  const double rel = ((a - b).abs().max() / b.abs().max()).item<double>();
  const double agree = a.argmax(-1).eq(b.argmax(-1)).to(at::kDouble).mean().item<double>();
  const int64_t bytes = embedding_bytes(*e), float_bytes = exact.numel() * exact.element_size();
  std::printf("[ embed    ] %-17s %-5s table %.2e, max|logits - float| / max|float logits| %.2e, greedy agreement %.3f; "
              "%lld bytes for %lld (%.2fx smaller)\n",
              what.c_str(), f.c_str(), table_err, rel, agree, static_cast<long long>(bytes),
              static_cast<long long>(float_bytes), static_cast<double>(float_bytes) / bytes);
  // Stated in docs/gguf.md (measured on these random fixtures).
  EXPECT_LE(rel, f == "nf4" ? 0.3 : f == "q6_k" ? 0.05 : 0.02) << what;
  EXPECT_GE(agree, f == "nf4" ? 0.7 : 0.9) << what;
  EXPECT_LT(bytes, float_bytes) << what;
}

class QuantizedEmbeddings : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(QuantizedEmbeddings, LookupsAreTheDequantizedTableAndErrorIsMeasured) {
  const auto& [model, f] = GetParam();
  auto ref = load(model, "none");
  auto lm = load(model, f);
  check_quantized(*lm, *ref, model, f, flex_test::fixture_input_ids());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, QuantizedEmbeddings,
                         ::testing::Combine(::testing::Values("llama", "llama3-rope-tied", "gpt2"),
                                            ::testing::Values("q8_0", "int8", "nf4")),
                         [](const auto& info) { return flex_test::model_format_name(info.param); });

// Q6_K needs 256-value rows: a llama of hidden size 256 built here (random init, fixed seed).
TEST(QuantizedEmbeddingsQ6K, LookupsAreTheDequantizedTableAndErrorIsMeasured) {
  auto [ref, lm] = flex_test::twin_llama256();
  flex::quantize_input_embeddings(*lm, "q6_k");
  check_quantized(*lm, *ref, "llama256 (random)", "q6_k", flex_test::fixture_input_ids());
  // 64-wide rows are not whole Q6_K blocks: a ShapeError naming the format and the module.
  flex_test::expect_error<flex::ShapeError>([] { load("llama", "q6_k"); }, {"q6_k", "model.embed_tokens", "256"});
}

// With --quantize-head too, a tied model's head and embedding are both quantized (each its own copy).
TEST(QuantizedEmbeddingsTied, HeadAndEmbeddingBothQuantized) {
  flex::PretrainedOptions o;
  o.quantize_head = "q8_0";
  o.quantize_embeddings = "int8";
  auto lm = flex::from_pretrained(flex_test::fixture("models/llama3-rope-tied"), o);
  auto* head = dynamic_cast<flex::DenseLayer*>(lm->get_submodule("lm_head").get());
  ASSERT_NE(head->weight_format(), nullptr);
  ASSERT_NE(lm->input_embeddings()->weight_format(), nullptr);
  EXPECT_EQ(lm->input_embeddings()->weight_format()->name(), "int8");
  at::NoGradGuard no_grad;
  EXPECT_TRUE(at::isfinite(lm->logits(flex_test::fixture_input_ids())).all().item<bool>());
}

TEST(QuantizedEmbeddingsDefault, NoneLeavesTheModelBitIdentical) {
  const at::Tensor ids = flex_test::fixture_input_ids();
  for (const std::string m : {"llama", "llama3-rope-tied", "gpt2"}) {
    auto a = flex::from_pretrained(flex_test::fixture("models/" + m));
    auto b = load(m, "none");
    EXPECT_EQ(b->input_embeddings()->weight_format(), nullptr) << m;
    EXPECT_TRUE(flex_test::equal(b->input_embeddings()->weight, a->input_embeddings()->weight)) << m;
    EXPECT_TRUE(flex_test::equal(b->logits(ids), a->logits(ids))) << m;
  }
}

TEST(QuantizedEmbeddingsDefault, TypedErrors) {
  flex_test::expect_error<flex::ConfigError>([] { load("llama", "q4_k"); },
                                             {"--quantize-embeddings", "'q4_k'", "none, int8, nf4, q8_0, q6_k"});
  auto lm = load("llama", "int8");
  flex_test::expect_error<flex::ConfigError>([&] { flex::quantize_input_embeddings(*lm, "q8_0"); },
                                             {"model.embed_tokens", "quantized already", "int8"});
  flex_test::expect_error<flex::ShapeError>([&] { lm->input_embeddings()->operator()(at::tensor(std::vector<int64_t>{-1})); },
                                            {"token id -1", "rows"});
}

}  // namespace
