// A GGUF token_embd kept in its ggml blocks (design decision 52): gathered
// rows equal gguf-py's dequantization of the table (tests/data/gguf/
// embeddings.gguf, scripts/golden/make_gguf_embeddings.py) for every type
// the embedding keeps, at 1 and 2 threads; on model files the embedding's
// output equals the dequantize-at-load model's bit for bit, tied heads
// compute on the same blocks, hooks fire and edits reach the next module.
#include <flex/dispatch/gguf.h>
#include <flex/dispatch/safetensors.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/nn.h>
#include <flex/kernels/ggml_gather.h>
#include <flex/models/from_pretrained.h>
#include <flex/models/quantized_embedding.h>
#include <flex/quant/ggml_format.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "expect_error.h"
#include "test_util.h"

namespace {

using flex_test::data_path;

const char* const kTypes[] = {"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k"};

// Ids out of order, repeated, the last row included, 2-D: [4, 10] (more
// than the kernel's grain of 16 rows, so 2 threads split them).
at::Tensor some_ids(int64_t rows) {
  at::Tensor ids = (at::arange(40, at::kLong) * 7 + 5).remainder(rows);
  ids[3] = rows - 1;
  return ids.view({4, 10});
}

TEST(GgufQuantizedEmbedding, GatheredRowsEqualGgufPyForEveryType) {
  auto f = flex::GgufFile::open(data_path("gguf/embeddings.gguf"));
  auto ref = flex::SafetensorsFile::open(data_path("gguf/embeddings.dequant.safetensors"));
  const int threads = at::get_num_threads();
  for (const char* name : kTypes) {
    SCOPED_TRACE(name);
    const flex::GgufTensorInfo& info = f->tensor(name);
    const at::Tensor want = ref->get(name);
    const int64_t rows = want.size(0), cols = want.size(1);
    const at::Tensor ids = some_ids(rows);
    const at::Tensor want_rows = want.index_select(0, ids.reshape({-1})).view({4, 10, cols});
    // The kernel alone, at 1 and 2 threads.
    for (int t : {1, 2}) {
      at::set_num_threads(t);
      at::Tensor got = at::empty({ids.numel(), cols}, at::kFloat);
      const at::Tensor flat = ids.reshape({-1}).contiguous();
      flex::dequantize_ggml_rows(info.type, f->raw(name).data_ptr<uint8_t>(), rows, cols, flat.data_ptr<int64_t>(),
                                 flat.numel(), got.data_ptr<float>());
      EXPECT_TRUE(flex_test::equal(got.view({4, 10, cols}), want_rows)) << t << " thread(s)";
    }
    at::set_num_threads(threads);
    // An Embedding holding the file's bytes: forward, float_weight, typed errors.
    flex::Embedding e(rows, cols);
    flex::store_ggml_embedding(e, info.type, f->raw(name).view({rows, -1}), at::kFloat);
    EXPECT_EQ(e.weight.scalar_type(), at::kByte);
    EXPECT_EQ(e.class_name(), "Embedding");
    EXPECT_TRUE(flex_test::equal(e(ids), want_rows));
    EXPECT_TRUE(flex_test::equal(e.float_weight(), want));
    flex_test::expect_error<flex::ShapeError>([&] { e(at::tensor(std::vector<int64_t>{1, rows})); },
                                              {"token id " + std::to_string(rows), std::to_string(rows) + " rows"});
    flex_test::expect_error<flex::ShapeError>([&] { e(at::zeros({2}, at::kFloat)); }, {"integers"});
  }
  flex_test::expect_error<flex::ShapeError>(
      [&] {
        flex::Embedding e(12, 256);
        flex::store_ggml_embedding(e, 8, f->raw("q8_0").view({-1}).slice(0, 0, 100), at::kFloat);
      },
      {"Q8_0", "needs", "100"});
}

// The embedding module's output (hook_embed / embed_tokens captures).
at::Tensor embed_output(flex::CausalLM& m, const at::Tensor& ids) {
  at::Tensor out;
  auto h = m.input_embeddings()->register_forward_hook(
      [&](flex::Module&, const flex::Inputs&, flex::Value& v) { out = v.toTensor().clone(); });
  m.logits(ids);
  h.remove();
  return out;
}

struct TiedCase {
  const char* file;
  bool tied;
};

TEST(GgufQuantizedEmbedding, ModelFilesKeepBlocksAndCaptureBitEqualToDequantizeAtLoad) {
  at::NoGradGuard no_grad;
  for (const TiedCase c : {TiedCase{"llama-tiny-q8_0", false}, TiedCase{"llama-tiny-tied-q8_0", true},
                           TiedCase{"gemma2-tiny-q8_0", true}, TiedCase{"gpt2-tiny-q8_0", false}}) {
    SCOPED_TRACE(c.file);
    const std::string path = data_path(std::string("gguf/") + c.file + ".gguf");
    auto golden = flex::SafetensorsFile::open(data_path(std::string("gguf/") + c.file + ".logits.safetensors"));
    const at::Tensor ids = golden->get("input_ids");
    auto q = flex::from_pretrained(path);
    flex::PretrainedOptions o;
    o.gguf_quantized = false;
    auto d = flex::from_pretrained(path, o);
    auto e = q->input_embeddings();
    ASSERT_NE(e->weight_format(), nullptr);
    EXPECT_EQ(e->weight_format()->name(), "Q8_0");
    EXPECT_EQ(e->weight.scalar_type(), at::kByte);
    EXPECT_EQ(e->class_name(), d->input_embeddings()->class_name());
    EXPECT_EQ(d->input_embeddings()->weight_format(), nullptr);
    // Stored bytes: 34 per 32 values (Q8_0) instead of float32's 128.
    EXPECT_EQ(e->weight.numel() * 32, e->num_embeddings * e->embedding_dim * 34);
    EXPECT_TRUE(flex_test::equal(e->float_weight(), d->input_embeddings()->weight));
    EXPECT_TRUE(flex_test::equal(embed_output(*q, ids), embed_output(*d, ids)));
    auto* head = dynamic_cast<flex::DenseLayer*>(q->output_embeddings().get());
    if (c.tied) {
      // The head computes on the embedding's own blocks.
      auto* g = dynamic_cast<const flex::GgmlFormat*>(head->weight_format().get());
      ASSERT_NE(g, nullptr);
      EXPECT_EQ(g->type(), 8u);
      EXPECT_EQ(head->weight.data_ptr(), e->weight.data_ptr());
      EXPECT_EQ(head->class_name(), "Linear");
    }
    EXPECT_TRUE(flex_test::close(q->logits(ids), golden->get("logits"), 0, 1e-5));
  }
}

TEST(GgufQuantizedEmbedding, HooksFireAndEditsReachTheFirstLayer) {
  at::NoGradGuard no_grad;
  auto m = flex::from_pretrained(data_path("gguf/llama-tiny-q8_0.gguf"));
  const at::Tensor ids = at::tensor(std::vector<int64_t>{1, 5, 9, 3}).view({1, 4});
  ASSERT_NE(m->input_embeddings()->weight_format(), nullptr);
  at::Tensor edited, seen;
  auto edit = m->get_submodule("model.embed_tokens")->register_forward_hook([&](flex::Module&, const flex::Inputs&, flex::Value& v) {
    edited = v.toTensor() * 0.5 + 1.0;
    v = flex::Value(edited);
  });
  auto see = m->get_submodule("model.layers.0")->register_forward_pre_hook([&](flex::Module&, flex::Inputs& in) {
    seen = in.tensor(0).clone();
  });
  m->logits(ids);
  edit.remove();
  see.remove();
  ASSERT_TRUE(edited.defined() && seen.defined());
  EXPECT_EQ(edited.sizes(), (at::IntArrayRef{1, 4, m->input_embeddings()->embedding_dim}));
  EXPECT_TRUE(flex_test::equal(seen, edited));
}

// Types a quantized table cannot be asked for twice; the dequantize-at-load
// switch keeps the float table.
TEST(GgufQuantizedEmbedding, QuantizingAQuantizedTableIsAConfigError) {
  flex::PretrainedOptions o;
  o.quantize_embeddings = "q8_0";
  flex_test::expect_error<flex::ConfigError>(
      [&] { flex::from_pretrained(data_path("gguf/llama-tiny-q8_0.gguf"), o); },
      {"model.embed_tokens", "quantized already", "Q8_0"});
}

}  // namespace
