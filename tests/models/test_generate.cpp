// KV-cache decoding, left padding and generate(), checked against full
// recomputation and against each prompt run alone.
#include "golden_util.h"

#include <flex/hooks/errors.h>
#include <flex/models/generate.h>

#include "test_util.h"

using namespace flex;
using models_test::close;

namespace {

// The Llama-family fixtures' inputs (8 tokens) pass Mistral's and Gemma 2's
// sliding window (4), so cached decoding crosses it.
const std::vector<std::string> kModels = {"gpt2",    "llama", "gpt-neox", "llama3-rope-tied", "mistral",
                                          "qwen2",   "gemma2", "phi3",    "olmo2", "mixtral", "qwen2_moe"};

std::shared_ptr<CausalLM> load(const std::string& name) {
  return load_pretrained(models_test::model_dir(name), at::kFloat);
}

TEST(KVCache, IncrementalDecodingEqualsFullRecomputation) {
  at::NoGradGuard g;
  const at::Tensor ids = models_test::golden_inputs();  // [2, 8]
  for (const auto& name : kModels) {
    auto model = load(name);
    at::Tensor full = model->logits(ids);
    auto cache = c10::make_intrusive<KVCache>();
    std::vector<at::Tensor> parts;
    // A 3-token prefill, a 2-token chunk, then one token at a time.
    for (auto [start, len] : std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {3, 2}, {5, 1}, {6, 1}, {7, 1}}) {
      LMInputs in;
      in.input_ids = ids.narrow(1, start, len);
      in.past_key_values = cache;
      LMOutput out = model->run(in);
      EXPECT_EQ(out.past_key_values.get(), cache.get());
      parts.push_back(out.logits);
    }
    EXPECT_EQ(cache->seq_length(0), 8);
    EXPECT_EQ(cache->num_layers(), model->config().num_hidden_layers);
    EXPECT_TRUE(close(at::cat(parts, 1), full, name + " cached vs full logits"));
    EXPECT_TRUE(close(full, models_test::golden_tensors(name)->get("logits"), name + " full logits vs golden"));
  }
}

TEST(KVCache, LeftPaddedBatchMatchesEachRowAlone) {
  at::NoGradGuard g;
  const at::Tensor ids = models_test::golden_inputs();
  for (const auto& name : kModels) {
    auto model = load(name);
    // Row 0 keeps its last 5 tokens behind 3 pads; row 1 is unpadded.
    auto [batch_ids, mask] = pad_left({{31, 120, 25, 102, 49}, {42, 171, 17, 111, 214, 244, 94, 193}}, 0);
    at::Tensor pos = (mask.cumsum(-1) - 1).masked_fill(mask.eq(0), 1);
    LMInputs in;
    in.input_ids = batch_ids;
    in.attention_mask = mask;
    in.position_ids = pos;
    at::Tensor batched = model->run(in).logits;
    at::Tensor alone0 = model->logits(ids.narrow(0, 0, 1).narrow(1, 0, 5));
    at::Tensor alone1 = model->logits(ids.narrow(0, 1, 1));
    EXPECT_TRUE(close(batched.narrow(0, 0, 1).narrow(1, 3, 5), alone0, name + " padded row"));
    EXPECT_TRUE(close(batched.narrow(0, 1, 1), alone1, name + " unpadded row"));
  }
}

TEST(KVCache, UpdateChecksShapesAndWrapsAsValue) {
  auto cache = c10::make_intrusive<KVCache>();
  auto [k, v] = cache->update(0, at::ones({2, 3, 4, 5}), at::zeros({2, 3, 4, 5}));
  EXPECT_EQ(k.sizes(), (std::vector<int64_t>{2, 3, 4, 5}));
  std::tie(k, v) = cache->update(0, at::full({2, 3, 1, 5}, 2.0), at::full({2, 3, 1, 5}, 3.0));
  EXPECT_EQ(k.size(2), 5);
  EXPECT_EQ(k.select(2, 4).min().item<float>(), 2.0f);
  EXPECT_EQ(k.narrow(2, 0, 4).max().item<float>(), 1.0f);
  EXPECT_EQ(v.select(2, 4).max().item<float>(), 3.0f);
  EXPECT_THROW(cache->update(0, at::ones({1, 3, 1, 5}), at::ones({1, 3, 1, 5})), ShapeError);
  EXPECT_THROW(cache->update(0, at::ones({2, 3, 1}), at::ones({2, 3, 1})), ShapeError);
  Value wrapped = KVCache::as_value(cache);
  EXPECT_EQ(KVCache::from_value(wrapped).get(), cache.get());
  EXPECT_FALSE(KVCache::from_value(Value()));
  EXPECT_THROW(KVCache::from_value(Value(at::ones({1}))), ConfigError);
}

GenerateOptions greedy(int64_t n) {
  GenerateOptions o;
  o.max_new_tokens = n;
  o.stop_tokens = std::vector<int64_t>{};  // run the full length
  return o;
}

TEST(Generate, GreedyTokensAreTheArgmaxOfFullRecomputation) {
  at::NoGradGuard g;
  for (const auto& name : kModels) {
    auto model = load(name);
    const at::Tensor ids = models_test::golden_inputs();
    GenerateOutput out = generate(*model, ids, {}, greedy(6));
    ASSERT_EQ(out.sequences.size(1), 14);
    at::Tensor logits = model->logits(out.sequences);
    at::Tensor expected = logits.narrow(1, 7, 6).argmax(-1);
    EXPECT_TRUE(flex_test::equal(out.sequences.narrow(1, 8, 6), expected)) << name;
    GenerateOptions no_cache = greedy(6);
    no_cache.use_cache = false;
    EXPECT_TRUE(flex_test::equal(generate(*model, ids, {}, no_cache).sequences, out.sequences)) << name;
  }
}

TEST(Generate, BatchedLeftPaddedPromptsEqualEachPromptAlone) {
  const std::vector<std::vector<int64_t>> prompts = {{31, 120, 25}, {42, 171, 17, 111, 214, 244, 94}, {7}};
  for (const auto& name : kModels) {
    auto model = load(name);
    auto [ids, mask] = pad_left(prompts, 0);
    GenerateOutput batched = generate(*model, ids, mask, greedy(8));
    for (size_t i = 0; i < prompts.size(); ++i) {
      at::Tensor alone_ids = at::tensor(prompts[i], at::kLong).unsqueeze(0);
      GenerateOutput alone = generate(*model, alone_ids, {}, greedy(8));
      EXPECT_EQ(batched.new_tokens(static_cast<int64_t>(i)), alone.new_tokens(0)) << name << " prompt " << i;
    }
  }
}

TEST(Generate, StopTokensEndRowsAndPadTheRest) {
  auto model = load("llama");
  const at::Tensor ids = models_test::golden_inputs();
  GenerateOutput free_run = generate(*model, ids, {}, greedy(6));
  const std::vector<int64_t> row0 = free_run.new_tokens(0);
  // Stop on row 0's third token: row 0 ends there, row 1 runs on unless it
  // meets the same token.
  GenerateOptions o = greedy(6);
  o.stop_tokens = std::vector<int64_t>{row0[2]};
  o.pad_token_id = 255;
  GenerateOutput out = generate(*model, ids, {}, o);
  const auto first = std::find(row0.begin(), row0.end(), row0[2]) - row0.begin();
  EXPECT_EQ(out.num_generated[0], first + 1);
  std::vector<int64_t> expected0(row0.begin(), row0.begin() + first + 1);
  EXPECT_EQ(out.new_tokens(0), expected0);
  for (int64_t j = out.prompt_length + first + 1; j < out.sequences.size(1); ++j)
    EXPECT_EQ(out.sequences[0][j].item<int64_t>(), 255);
  const std::vector<int64_t> row1 = free_run.new_tokens(1);
  const std::vector<int64_t> got1 = out.new_tokens(1);
  ASSERT_LE(got1.size(), row1.size());
  EXPECT_TRUE(std::equal(got1.begin(), got1.end(), row1.begin()));
  // The config's eos (2 for llama) is the default stop token.
  GenerateOptions d;
  d.max_new_tokens = 3;
  EXPECT_NO_THROW(generate(*model, ids, {}, d));
}

TEST(Generate, SamplingIsSeededAndFiltersReduceToGreedy) {
  auto model = load("gpt2");
  const at::Tensor ids = models_test::golden_inputs();
  GenerateOptions s = greedy(10);
  s.do_sample = true;
  s.seed = 1234;
  at::Tensor a = generate(*model, ids, {}, s).sequences;
  at::Tensor b = generate(*model, ids, {}, s).sequences;
  EXPECT_TRUE(flex_test::equal(a, b));
  s.seed = 99;
  EXPECT_FALSE(at::equal(a, generate(*model, ids, {}, s).sequences));
  at::Tensor g = generate(*model, ids, {}, greedy(10)).sequences;
  GenerateOptions k1 = s;
  k1.top_k = 1;
  EXPECT_TRUE(flex_test::equal(generate(*model, ids, {}, k1).sequences, g));
  GenerateOptions p0 = s;
  p0.top_p = 1e-6;
  EXPECT_TRUE(flex_test::equal(generate(*model, ids, {}, p0).sequences, g));
}

// Frequencies of draws from known probabilities (0.1, 0.2, 0.3, 0.4).
std::vector<double> frequencies(const GenerateOptions& o, int n = 4000) {
  at::Tensor logits = at::log(at::tensor({0.1, 0.2, 0.3, 0.4}, at::kFloat)).unsqueeze(0).expand({n, 4}).contiguous();
  at::Generator gen = make_cpu_generator(o.seed);
  at::Tensor draws = choose_next_tokens(logits, o, gen);
  std::vector<double> f(4);
  for (int i = 0; i < 4; ++i) f[i] = draws.eq(i).sum().item<double>() / n;
  return f;
}

TEST(Generate, TemperatureTopKTopPFollowTheirDefinitions) {
  GenerateOptions o;
  o.do_sample = true;
  o.seed = 7;
  auto f = frequencies(o);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(f[i], 0.1 * (i + 1), 0.03) << i;
  o.top_k = 2;  // keeps 0.3 and 0.4 -> 3/7, 4/7
  f = frequencies(o);
  EXPECT_EQ(f[0] + f[1], 0.0);
  EXPECT_NEAR(f[2], 3.0 / 7, 0.03);
  o.temperature = 0.5;  // p^2 over the kept two: 9/25, 16/25
  f = frequencies(o);
  EXPECT_NEAR(f[2], 9.0 / 25, 0.03);
  o.top_k = 0;
  o.temperature = 1.0;
  o.top_p = 0.35;  // the smallest set with mass >= 0.35 is {0.4}
  f = frequencies(o);
  EXPECT_EQ(f[3], 1.0);
  o.top_p = 0.65;  // {0.4, 0.3}
  f = frequencies(o);
  EXPECT_EQ(f[0] + f[1], 0.0);
  EXPECT_NEAR(f[3], 4.0 / 7, 0.03);
}

TEST(Generate, BadArgumentsAreTypedErrors) {
  auto model = load("llama");
  const at::Tensor ids = models_test::golden_inputs();
  GenerateOptions o;
  o.do_sample = true;
  o.temperature = 0;
  EXPECT_THROW(generate(*model, ids, {}, o), ConfigError);
  o.temperature = 1;
  o.top_p = 0;
  EXPECT_THROW(generate(*model, ids, {}, o), ConfigError);
  EXPECT_THROW(generate(*model, ids, at::ones({2, 3}), {}), ShapeError);
  EXPECT_THROW(generate(*model, at::full({1, 2}, 256, at::kLong), {}, {}), ShapeError);
  try {
    model->logits(at::full({1, 2}, 300, at::kLong));
    FAIL();
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("300"), std::string::npos) << e.what();
  }
  LMInputs in;
  in.input_ids = ids;
  in.attention_mask = at::ones({2, 5});
  EXPECT_THROW(model->run(in), ShapeError);
  EXPECT_THROW(model->logits(at::ones({2, 3})), ShapeError);  // float ids
  auto gpt2 = load("gpt2");
  EXPECT_THROW(gpt2->logits(at::zeros({1, 65}, at::kLong)), ShapeError);  // n_positions is 64
}

}  // namespace
