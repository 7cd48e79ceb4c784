// The command line with sparse dictionaries, against computations done here
// from the dictionary's own file and the model's activations captured
// without it: `capture --sae` (features equal the encoder applied by hand to
// the dense capture, in memory and in dataset shards), `generate --sae`
// (steering a feature is the plain --steer of its decoder row; typed usage
// errors), and `features` on the run.sh model (the trained induction Llama)
// with a token-detector dictionary written here: densities equal the token
// frequencies, examples sit on the feature's token, the logit effect is the
// decoder row times the unembedding; the page opens in headless Chromium.
#include "cli_util.h"
#include "headless_chromium.h"
#include "hf_folder.h"

#include <flex/datasets/activation_shards.h>
#include <flex/dispatch/safetensors.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <regex>

#include "test_util.h"

using cli_test::run;
namespace fs = std::filesystem;

namespace {

const std::string& tiny_model() {
  static flex_test::TempDir dir;
  static const std::string path = dir.str("gpt2");
  static const bool made = [] {
    flex_examples::TinyGpt2Options o;
    o.n_layer = 2;
    o.seed = 5;
    flex_examples::write_tiny_gpt2(path, o);
    return true;
  }();
  (void)made;
  return path;
}

std::string sae(const std::string& name) { return flex_test::data_path("sae/" + name); }

std::map<std::string, at::Tensor> weights(const std::string& name) {
  auto f = flex::SafetensorsFile::open(sae(name) + "/sae_weights.safetensors");
  std::map<std::string, at::Tensor> w;
  for (const auto& n : f->names()) w[n] = f->get(n).to(at::kDouble);
  return w;
}

at::Tensor ids_file(const std::string& path, int64_t rows, int64_t cols, uint64_t seed) {
  at::manual_seed(seed);
  const at::Tensor ids = at::randint(0, 200, {rows, cols}, at::kLong);
  flex::save_safetensors(path, {{"input_ids", ids}});
  return ids;
}

/// Per token: {feature -> value} of the non-padding entries.
std::vector<std::map<int64_t, double>> rows_of(const at::Tensor& indices, const at::Tensor& values) {
  const at::Tensor i = indices.reshape({-1, indices.size(-1)}), v = values.reshape({-1, values.size(-1)}).to(at::kDouble);
  std::vector<std::map<int64_t, double>> out(i.size(0));
  for (int64_t n = 0; n < i.size(0); ++n)
    for (int64_t k = 0; k < i.size(1); ++k)
      if (i[n][k].item<int64_t>() >= 0) out[n][i[n][k].item<int64_t>()] = v[n][k].item<double>();
  return out;
}

/// Features by hand, in float64: relu((x - b_dec?) W_enc + b_enc) then top-k or the threshold.
std::vector<std::map<int64_t, double>> by_hand(const at::Tensor& x, const std::string& name, int64_t k, bool b_dec_in,
                                               bool jump, int64_t keep = 0) {
  auto w = weights(name);
  at::Tensor in = x.reshape({-1, x.size(-1)}).to(at::kDouble);
  if (b_dec_in) in = in - w["b_dec"];
  const at::Tensor pre = at::matmul(in, w["W_enc"]) + w["b_enc"];
  std::vector<std::map<int64_t, double>> out(pre.size(0));
  for (int64_t n = 0; n < pre.size(0); ++n) {
    std::vector<std::pair<double, int64_t>> row;
    for (int64_t f = 0; f < pre.size(1); ++f) {
      const double p = pre[n][f].item<double>();
      const bool on = jump ? p > w["threshold"][f].item<double>() && p > 0 : p > 0;
      if (on) row.emplace_back(-p, f);
    }
    std::sort(row.begin(), row.end());
    const size_t limit = k > 0 ? k : keep > 0 ? keep : row.size();
    for (size_t j = 0; j < row.size() && j < limit; ++j) out[n][row[j].second] = -row[j].first;
  }
  return out;
}

void expect_same(const std::vector<std::map<int64_t, double>>& got, const std::vector<std::map<int64_t, double>>& want,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t n = 0; n < got.size(); ++n) {
    ASSERT_EQ(got[n].size(), want[n].size()) << what << " token " << n;
    for (const auto& [f, v] : want[n]) {
      ASSERT_TRUE(got[n].count(f)) << what << " token " << n << " misses feature " << f;
      EXPECT_NEAR(got[n].at(f), v, 1e-4 + 1e-4 * std::abs(v)) << what << " token " << n << " feature " << f;
    }
  }
}

TEST(CliSae, CaptureWritesEachTokensActiveFeaturesAsTheEncoderGivesThem) {
  flex_test::TempDir dir;
  const std::string ids = dir.str("ids.safetensors");
  ids_file(ids, 3, 7, 1);
  // The dense residual streams without any dictionary.
  auto plain = run({"capture", tiny_model(), "--input-ids", ids, "--hook", "transformer.h.1.hook_resid_post", "--hook",
                    "transformer.h.0.hook_resid_post", "--out", dir.str("plain.safetensors")});
  ASSERT_EQ(plain.code, 0) << plain.err;
  auto dense = flex::SafetensorsFile::open(dir.str("plain.safetensors"));
  // Two dictionaries, one moved to another hook, batches of 2 rows (padded to one width).
  auto r = run({"capture", tiny_model(), "--input-ids", ids, "--sae", sae("topk"), "--sae",
                sae("jumprelu") + "@blocks.0.hook_resid_post", "--batch-size", "2", "--out", dir.str("f.safetensors")});
  ASSERT_EQ(r.code, 0) << r.err;
  auto f = flex::SafetensorsFile::open(dir.str("f.safetensors"));
  // (Batches of 2 rows against 3 take different products, MKL's GEMM or the
  // decode GEMV, which may round differently: a few ulps of the largest
  // logits, ~20 here, where one ulp is 1.9e-6, even on small values.)
  EXPECT_TRUE(flex_test::close(f->get("logits"), dense->get("logits"), 1e-5, 1e-5)) << "observe mode changed the logits";
  const std::string a = "transformer.h.1.hook_resid_post.sae.", b = "transformer.h.0.hook_resid_post.sae.";
  EXPECT_EQ(f->get(a + "feature_indices").sizes(), (std::vector<int64_t>{3, 7, 8}));
  EXPECT_EQ(f->get(a + "feature_indices").scalar_type(), at::kInt);
  expect_same(rows_of(f->get(a + "feature_indices"), f->get(a + "feature_values")),
              by_hand(dense->get("transformer.h.1.hook_resid_post"), "topk", 8, true, false), "topk");
  const auto jump = by_hand(dense->get("transformer.h.0.hook_resid_post"), "jumprelu", 0, false, true);
  expect_same(rows_of(f->get(b + "feature_indices"), f->get(b + "feature_values")), jump, "jumprelu");
  const at::Tensor l0 = f->get(b + "l0").reshape({-1});
  size_t widest = 0;
  for (size_t n = 0; n < jump.size(); ++n) {
    EXPECT_EQ(l0[n].item<int64_t>(), static_cast<int64_t>(jump[n].size())) << "token " << n;
    widest = std::max(widest, jump[n].size());
  }
  EXPECT_EQ(f->get(b + "feature_indices").size(2), static_cast<int64_t>(widest)) << "active: as wide as the widest token";
  ASSERT_GT(widest, 3u) << "too few active features for --sae-features top:3 to cut";

  // top:3 keeps each token's three strongest; l0 still counts them all.
  r = run({"capture", tiny_model(), "--input-ids", ids, "--sae", sae("jumprelu") + "@blocks.0.hook_resid_post",
           "--sae-features", "top:3", "--out", dir.str("top.safetensors")});
  ASSERT_EQ(r.code, 0) << r.err;
  auto t = flex::SafetensorsFile::open(dir.str("top.safetensors"));
  expect_same(rows_of(t->get(b + "feature_indices"), t->get(b + "feature_values")),
              by_hand(dense->get("transformer.h.0.hook_resid_post"), "jumprelu", 0, false, true, 3), "top:3");
  EXPECT_TRUE(flex_test::equal(t->get(b + "l0"), f->get(b + "l0")));
}

// capture --hook takes TransformerLens names and writes each capture under the name given: blocks.1.hook_resid_post
// is the block's output, blocks.0.attn.hook_q the first third of c_attn's output split into 4 heads of 16; a name
// flexmodel has no value for is an error naming it. With a dictionary in observe mode, its decoding hook points
// capture too (they used to capture nothing): hook_sae_recons is the decoder applied by hand to the features the
// encoder gives by hand, hook_sae_output (with the error term) the activation itself.
TEST(CliSae, CaptureTakesTransformerLensNamesAndObservedDecodingHooks) {
  flex_test::TempDir dir;
  const std::string ids = dir.str("ids.safetensors");
  ids_file(ids, 2, 7, 3);
  auto r = run({"capture", tiny_model(), "--input-ids", ids, "--hook", "blocks.1.hook_resid_post", "--hook",
                "blocks.0.attn.hook_q", "--hook", "transformer.h.1.hook_resid_post", "--hook",
                "transformer.h.0.attn.c_attn", "--out", dir.str("tl.safetensors")});
  ASSERT_EQ(r.code, 0) << r.err;
  auto f = flex::SafetensorsFile::open(dir.str("tl.safetensors"));
  EXPECT_TRUE(flex_test::equal(f->get("blocks.1.hook_resid_post"), f->get("transformer.h.1.hook_resid_post")));
  const at::Tensor q = f->get("transformer.h.0.attn.c_attn").narrow(-1, 0, 64).unflatten(-1, {4, 16});
  EXPECT_TRUE(flex_test::equal(f->get("blocks.0.attn.hook_q"), q));
  r = run({"capture", tiny_model(), "--input-ids", ids, "--hook", "blocks.0.attn.hook_attn_scores", "--out",
           dir.str("no.safetensors")});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("blocks.0.attn.hook_attn_scores"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir.str("no.safetensors")));

  const std::string at = "transformer.h.1.hook_resid_post.sae.";
  r = run({"capture", tiny_model(), "--input-ids", ids, "--sae", sae("topk"), "--hook", at + "hook_sae_recons",
           "--hook", at + "hook_sae_output", "--hook", "blocks.1.hook_resid_post", "--out", dir.str("o.safetensors")});
  ASSERT_EQ(r.code, 0) << r.err;
  auto o = flex::SafetensorsFile::open(dir.str("o.safetensors"));
  ASSERT_TRUE(o->contains(at + "hook_sae_recons") && o->contains(at + "hook_sae_output")) << "observe mode captured nothing";
  const at::Tensor x = o->get("blocks.1.hook_resid_post");
  EXPECT_TRUE(flex_test::close(o->get(at + "hook_sae_output"), x, 1e-5, 1e-5)) << "output = recons + error = x";
  auto w = weights("topk");
  const auto features = by_hand(x, "topk", 8, true, false);
  at::Tensor recons = w["b_dec"].expand({static_cast<int64_t>(features.size()), 64}).clone();
  for (size_t n = 0; n < features.size(); ++n)
    for (const auto& [feature, value] : features[n]) recons[n] += value * w["W_dec"][feature];
  EXPECT_TRUE(flex_test::close(o->get(at + "hook_sae_recons").reshape({-1, 64}).to(at::kDouble), recons, 1e-4, 1e-4));
}

TEST(CliSae, DatasetShardsHoldTheFeaturesOfTheirOwnActivations) {
  flex_test::TempDir dir;
  const std::string corpus = dir.str("corpus.safetensors");
  ids_file(corpus, 6, 40, 2);
  auto r = run({"capture", tiny_model(), "--dataset", corpus, "--context-len", "16", "--hook",
                "transformer.h.1.hook_resid_post", "--sae", sae("topk"), "--stream-dir", dir.str("ds"), "--shard-size",
                "20KB"});
  ASSERT_EQ(r.code, 0) << r.err;
  flex::ActivationDataset ds(dir.str("ds"));
  ASSERT_GT(ds.num_shards(), 1u);
  const std::string a = "transformer.h.1.hook_resid_post.sae.";
  int64_t tokens = 0;
  for (size_t s = 0; s < ds.num_shards(); ++s) {
    const auto shard = ds.shard(s);
    const at::Tensor idx = shard.activations.at(a + "feature_indices");
    EXPECT_EQ(idx.scalar_type(), at::kInt);
    EXPECT_EQ(idx.size(1), 8);
    expect_same(rows_of(idx, shard.activations.at(a + "feature_values")),
                by_hand(shard.activations.at("transformer.h.1.hook_resid_post"), "topk", 8, true, false),
                "shard " + std::to_string(s));
    EXPECT_TRUE(shard.activations.at(a + "l0").eq(8).all().item<bool>());
    tokens += shard.size();
  }
  EXPECT_EQ(tokens, 6 * 40 / 16 * 16);
  // Run again: the dataset is complete, nothing is added.
  r = run({"capture", tiny_model(), "--dataset", corpus, "--context-len", "16", "--hook", "transformer.h.1.hook_resid_post",
           "--sae", sae("topk"), "--stream-dir", dir.str("ds"), "--shard-size", "20KB"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(flex::ActivationDataset(dir.str("ds")).num_tokens(), tokens);
  // A dictionary without a fixed L0 needs top:K in shards.
  r = run({"capture", tiny_model(), "--dataset", corpus, "--context-len", "16", "--sae", sae("jumprelu"), "--stream-dir",
           dir.str("ds2")});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("top:K"), std::string::npos) << r.err;
}

TEST(CliSae, SteeringAFeatureIsThePlainSteeringOfItsDecoderRow) {
  flex_test::TempDir dir;
  const std::string ids = dir.str("p.safetensors");
  flex::save_safetensors(ids, {{"input_ids", at::tensor({5, 17, 33, 2}, at::kLong).view({1, 4})}});
  const at::Tensor row = weights("topk")["W_dec"][3].to(at::kFloat);
  flex::save_safetensors(dir.str("row.safetensors"), {{"vector", row}});
  auto steered = run({"generate", tiny_model(), "--input-ids", ids, "--max-new-tokens", "8", "--sae", sae("topk"),
                      "--steer-feature", "3=200"});
  ASSERT_EQ(steered.code, 0) << steered.err;
  auto plain = run({"generate", tiny_model(), "--input-ids", ids, "--max-new-tokens", "8", "--steer",
                    "transformer.h.1.hook_resid_post=" + dir.str("row.safetensors") + ":200"});
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_EQ(steered.out, plain.out);
  auto none = run({"generate", tiny_model(), "--input-ids", ids, "--max-new-tokens", "8"});
  EXPECT_NE(none.out, plain.out) << "steering by 200 changed nothing: the test would prove nothing";
  // replace-with-error with no edit leaves the generation as it was.
  auto spliced = run({"generate", tiny_model(), "--input-ids", ids, "--max-new-tokens", "8", "--sae", sae("topk")});
  EXPECT_EQ(spliced.out, none.out);

  struct Bad {
    std::vector<std::string> extra;
    std::string says;
  };
  for (const Bad& b : std::vector<Bad>{
           {{"--sae", sae("topk"), "--steer-feature", "256=1"}, "outside the dictionary's 256 features"},
           {{"--sae", sae("topk"), "--sae-mode", "observe", "--clamp-feature", "3=1"}, "observe"},
           {{"--sae", sae("topk"), "--sae", sae("jumprelu") + "@blocks.0.hook_resid_post", "--clamp-feature", "3=1"},
            "which of the 2"},
           {{"--clamp-feature", "3=1"}, "--sae"},
           {{"--sae", sae("topk"), "--steer-feature", "3"}, "[I:]F=VALUE"},
           {{"--sae", sae("topk") + "@blocks.0.attn.hook_pattern"}, "d_in 64"},
           {{"--sae", sae("topk") + "@blocks.0.hook_nothing"}, "hook_resid_pre"},
       }) {
    std::vector<std::string> args = {"generate", tiny_model(), "--input-ids", ids, "--max-new-tokens", "2"};
    args.insert(args.end(), b.extra.begin(), b.extra.end());
    auto r = run(args);
    EXPECT_NE(r.code, 0) << b.says;
    EXPECT_NE(r.err.find(b.says), std::string::npos) << r.err;
  }
}

// ---------------------------------------------------------------------------
// flexmodel features on the run.sh model.

struct InductionModel {
  flex_test::TempDir dir;
  std::string model, corpus;
};

const InductionModel& induction() {
  static InductionModel m;
  static const bool made = [] {
    const std::string cmd = cli_test::quote(TRAIN_INDUCTION_EXE) + " --work " + cli_test::quote(m.dir.str("work")) +
                            " >" + cli_test::quote(m.dir.str("train.log")) + " 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cli_test::slurp(m.dir.str("train.log"));
    m.model = m.dir.str("work/induction-llama");
    m.corpus = m.dir.str("work/repeated_ids.safetensors");
    return true;
  }();
  (void)made;
  return m;
}

/// A ReLU dictionary at the embedding whose feature t detects token t: W_dec
/// rows are the unit embedding rows, W_enc their transpose, b_enc minus half
/// each row's norm (a token's own feature reads its full norm).
void write_token_detector(const std::string& dir, const at::Tensor& E) {
  fs::create_directories(dir);
  const at::Tensor norms = E.norm(2, {1}, true);
  const at::Tensor unit = E / norms;
  flex::save_safetensors(dir + "/sae_weights.safetensors",
                         {{"W_enc", unit.t().contiguous()}, {"W_dec", unit.contiguous()},
                          {"b_enc", (-0.5 * norms.squeeze(1)).contiguous()}, {"b_dec", at::zeros({E.size(1)})}});
  nlohmann::json cfg = {{"architecture", "standard"}, {"d_in", E.size(1)}, {"d_sae", E.size(0)},
                        {"dtype", "float32"},         {"device", "cpu"},   {"apply_b_dec_to_input", false},
                        {"normalize_activations", "none"},
                        {"metadata",
                         {{"sae_lens_version", "6.54.12"}, {"hook_name", "blocks.0.hook_resid_pre"},
                          {"model_name", "induction-llama"}}}};
  std::ofstream(dir + "/cfg.json") << cfg.dump(1);
}

nlohmann::json page_data(const std::string& html) {
  std::smatch m;
  EXPECT_TRUE(std::regex_search(html, m, std::regex(R"re(id="feature-data">([^<]*)</script>)re")));
  return nlohmann::json::parse(m[1].str());
}

TEST(CliFeatures, TokenDetectorsOnTheRunShModelShowTheirTokensAndOpenInChromium) {
  const auto& m = induction();
  flex_test::TempDir dir;
  const at::Tensor E = flex::SafetensorsFile::open(m.model + "/model.safetensors")->get("model.embed_tokens.weight")
                           .to(at::kFloat);
  const std::string sae_dir = dir.str("token-sae");
  write_token_detector(sae_dir, E);
  const std::string page = dir.str("features.html");
  auto r = run({"features", sae_dir, m.model, "--dataset", m.corpus, "--context-len", "32", "--top-features", "6",
                "--out", page});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string html = cli_test::slurp(page);
  const auto data = page_data(html);

  // Independently: each token's activation on every feature, from the embedding.
  const at::Tensor corpus = flex::SafetensorsFile::open(m.corpus)->get("input_ids");
  const int64_t contexts = corpus.numel() / 32;
  const at::Tensor ids = corpus.reshape({-1}).narrow(0, 0, contexts * 32);
  const at::Tensor norms = E.norm(2, {1});
  const at::Tensor acts = at::relu(at::matmul(E.index_select(0, ids), (E / norms.unsqueeze(1)).t()) - 0.5 * norms);
  EXPECT_EQ(data["tokens"].get<int64_t>(), ids.numel());
  EXPECT_NEAR(data["mean_l0"].get<double>(), acts.gt(0).sum().item<double>() / ids.numel(), 1e-9);
  ASSERT_EQ(data["features"].size(), 6u);
  const at::Tensor counts = acts.gt(0).sum(0);
  int64_t previous = ids.numel();
  for (const auto& f : data["features"]) {
    const int64_t k = f["index"];
    EXPECT_EQ(f["count"].get<int64_t>(), counts[k].item<int64_t>()) << "feature " << k;
    EXPECT_LE(f["count"].get<int64_t>(), previous) << "not the most frequent first";
    previous = f["count"];
    EXPECT_NEAR(f["max"].get<double>(), acts.select(1, k).max().item<double>(), 1e-4) << "feature " << k;
    int64_t in_hist = 0;
    for (const auto& h : f["histogram"]) in_hist += h.get<int64_t>();
    EXPECT_EQ(in_hist, f["count"].get<int64_t>());
    ASSERT_FALSE(f["examples"].empty());
    for (const auto& ex : f["examples"]) {
      const int64_t t = ex["context"].get<int64_t>() * 32 + ex["position"].get<int64_t>();
      EXPECT_NEAR(ex["value"].get<double>(), acts[t][k].item<double>(), 1e-4);
    }
    EXPECT_EQ(ids[f["examples"][0]["context"].get<int64_t>() * 32 + f["examples"][0]["position"].get<int64_t>()]
                  .item<int64_t>(),
              k)
        << "feature " << k << "'s strongest context is not on its token";
    // Direct logit effect: W_dec[k] . W_U (tied: the embedding).
    const at::Tensor effect = at::matmul(E, E[k] / norms[k]);
    EXPECT_EQ(f["promoted"][0]["id"].get<int64_t>(), effect.argmax().item<int64_t>());
    EXPECT_NEAR(f["promoted"][0]["logit"].get<double>(), effect.max().item<double>(), 1e-4);
    EXPECT_EQ(f["suppressed"][0]["id"].get<int64_t>(), effect.argmin().item<int64_t>());
  }

  const cli_test::HeadlessChromium chromium(dir.str("profile"));
  if (!chromium.found()) GTEST_SKIP() << "no chromium (scripts/install-deps.sh --tests installs it)";
  const std::string dom = dir.str("dom.html");
  ASSERT_EQ(chromium.dump_dom("file://" + page, dom), 0);
  const std::string d = cli_test::slurp(dom);
  auto count = [&](const std::string& what) { return cli_test::count_occurrences(d, what); };
  EXPECT_EQ(count("<section class=\"feature\""), 6u);
  EXPECT_EQ(count("<svg class=\"histogram\""), 6u);
  EXPECT_EQ(count("class=\"logits promoted\""), 6u);
  EXPECT_EQ(count("class=\"logits suppressed\""), 6u);
  EXPECT_GE(count("class=\"example\""), 6u);
  EXPECT_EQ(count("tok focus"), count("class=\"example\""));
  EXPECT_NE(d.find("id=\"summary-table\""), std::string::npos);
  const std::string shot = dir.str("shot.png");
  ASSERT_EQ(chromium.screenshot("file://" + page, shot, 1280, 1400), 0);
  EXPECT_GT(fs::file_size(shot), 20000u) << "a (nearly) blank screenshot";
  if (const char* keep = std::getenv("FLEX_FEATURES_SCREENSHOT")) fs::copy_file(shot, keep, fs::copy_options::overwrite_existing);
}

TEST(CliFeatures, BadInputIsATypedErrorAndWritesNothing) {
  const auto& m = induction();
  flex_test::TempDir dir;
  const std::string page = dir.str("p.html");
  struct Bad {
    std::vector<std::string> args;
    std::string says;
  };
  for (const Bad& b : std::vector<Bad>{
           {{"features", sae("topk") + "@blocks.0.attn.hook_pattern", m.model, "--dataset", m.corpus, "--context-len", "32",
             "--out", page},
            "d_in 64"},
           {{"features", dir.str("none"), m.model, "--dataset", m.corpus, "--out", page}, "does not exist"},
           {{"features", sae("topk") + "@blocks.0.hook_resid_pre", m.model, "--dataset", m.corpus, "--out", page,
             "--features", "999"},
            "outside the dictionary's 256"},
           {{"features", sae("topk"), m.model, "--out", page}, "--dataset"},
       }) {
    auto r = run(b.args);
    EXPECT_NE(r.code, 0) << b.says;
    EXPECT_NE(r.err.find(b.says), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(page)) << b.says;
  }
}

}  // namespace
