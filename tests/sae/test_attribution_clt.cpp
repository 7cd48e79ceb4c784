// Attribution graphs and interventions through a cross-layer transcoder
// (flex/sae/cross_layer_transcoder.h, design decision 44):
//   - against the independent float64 frozen replacement
//     (tests/common/attribution_reference.h, CLT written out by hand): the
//     active features, every edge equal to the finite difference, and
//     completeness, on the GPT-2 and Gemma 2 (JumpReLU, some thresholds
//     negative) and Llama (ReLU) fixtures; interventions' logits;
//   - side by side with circuit-tracer 0.5.0 (scripts/golden/make_attribution_clt.py:
//     tests/data/attribution/FAMILY-clt/ written by its to_safetensors):
//     the same nodes, edges within 1e-4 relative, the same pruned graph,
//     the same intervened logits;
//   - a CLT reading hook_resid_mid (config.yaml's feature_input_hook: the
//     residual before the MLP's norm) on Llama, against both;
//   - the one-file form equals the folder; typed errors for a mis-shaped CLT.
#include <flex/dispatch/safetensors.h>
#include <flex/hooks/errors.h>
#include <flex/models/auto_model.h>
#include <flex/sae/attribution.h>
#include <flex/sae/attribution_graph.h>
#include <flex/sae/attribution_intervention.h>
#include <flex/sae/cross_layer_transcoder.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>

#include "attribution_reference.h"
#include "attribution_reference_edges.h"
#include "circuit_tracer_golden.h"
#include "expect_error.h"
#include "test_util.h"

using namespace flex;
namespace fs = std::filesystem;

namespace {

std::shared_ptr<CausalLM> model(const std::string& name, at::ScalarType dt = at::kDouble) {
  return load_pretrained(flex_test::fixture("models/" + name), dt);
}

// A random CLT for `m`: JumpReLU with thresholds in [-0.1, 0.3) (circuit-tracer's
// pre * (pre > t): a negative threshold lets a negative activation through), or ReLU.
// The rms of the residual before each MLP's norm (hook_resid_mid) over the prompt.
double residual_rms(CausalLM& m, const at::Tensor& ids) {
  const bool gpt2 = m.base_model_prefix() == "transformer";
  const bool gemma2 = m.class_name() == "Gemma2ForCausalLM";
  std::vector<at::Tensor> seen;
  std::vector<HookHandle> hs;
  for (int64_t l = 0; l < m.config().num_hidden_layers; ++l)
    hs.push_back(m.get_submodule((gpt2 ? "transformer.h." : "model.layers.") + std::to_string(l) +
                                 (gpt2 ? ".ln_2" : gemma2 ? ".pre_feedforward_layernorm" : ".post_attention_layernorm"))
                     ->register_forward_hook([&](Module&, const Inputs& in, Value&) { seen.push_back(in.tensor(0).clone()); }));
  {
    at::NoGradGuard ng;
    m.logits(ids.unsqueeze(0));
  }
  for (auto& h : hs) h.remove();
  return at::cat(seen).pow(2).mean().sqrt().item<double>();
}

std::shared_ptr<CrossLayerTranscoder> random_clt(CausalLM& m, bool jump, const std::string& input_hook = "mlp.hook_in",
                                                 int64_t F = 16, int64_t seed = 44) {
  const int64_t d = m.config().hidden_size, L = m.config().num_hidden_layers;
  double in_scale = m.base_model_prefix() == "transformer" ? 0.25 : 2.0;
  if (input_hook == "hook_resid_mid") in_scale = 2.0 / residual_rms(m, at::tensor({1, 17, 42, 7, 99, 5, 11}, at::kLong));
  at::manual_seed(seed);
  auto c = std::make_shared<CrossLayerTranscoder>();
  c->input_hook = input_hook;
  c->W_enc = (at::randn({L, F, d}) * in_scale / std::sqrt(double(d))).to(at::kDouble);
  c->b_enc = (at::randn({L, F}) * 0.3).to(at::kDouble);
  c->b_dec = (at::randn({L, d}) * 0.1).to(at::kDouble);
  for (int64_t l = 0; l < L; ++l) c->W_dec.push_back((at::randn({F, L - l, d}) * 0.2).to(at::kDouble));
  if (jump) c->threshold = (at::rand({L, F}) * 0.4 - 0.1).to(at::kDouble);
  c->source = "test/clt";
  return c;
}

at::Tensor prompt() { return at::tensor({1, 17, 42, 7, 99, 5, 11}, at::kLong); }

void check_against_reference(const std::string& name, bool jump, const std::string& input_hook = "mlp.hook_in") {
  SCOPED_TRACE(name + " " + input_hook);
  auto m = model(name);
  auto clt = random_clt(*m, jump, input_hook);
  AttributionOptions o;
  o.batch_size = 7;
  o.max_n_logits = 4;
  o.desired_logit_prob = 0.99;
  const AttributionGraph g = attribute(*m, clt, prompt(), o);
  flex_test::AttributionReference ref(*m, *clt, prompt());
  const int64_t L = g.n_layers, S = g.n_features();

  ASSERT_TRUE(flex_test::equal(g.active_features, flex_test::reference_active_features(ref, L)));
  ASSERT_GT(S, 20) << "too few active features to test anything";
  const at::Tensor f = g.active_features.index_select(0, g.selected_features);
  std::vector<at::Tensor> acts;
  for (int64_t i = 0; i < S; ++i)
    acts.push_back(ref.sources.acts[f[i][0].item<int64_t>()][f[i][1].item<int64_t>()][f[i][2].item<int64_t>()]);
  EXPECT_TRUE(flex_test::close(g.activations.index_select(0, g.selected_features), at::stack(acts), 1e-9, 1e-11));
  // This seed gives GPT-2 negative activations (thresholds below 0): circuit-tracer's JumpReLU path.
  if (jump && name == "gpt2") EXPECT_GT(g.activations.lt(0).sum().item<int64_t>(), 0) << "no negative activation";

  // Every edge: frozen(S) - frozen(S with the source zeroed).
  const flex_test::ReferenceEdges r = flex_test::reference_edges(ref, g);
  const at::Tensor &value = r.value, &bias = r.bias, &want = r.edges;
  const int64_t K = g.logit_tokens.size(0), N = g.n_nodes();
  const at::Tensor rows = flex_test::target_rows(g);
  const double scale = want.abs().max().item<double>();
  EXPECT_TRUE(flex_test::close(rows, want, 1e-8, 1e-10 * scale)) << "edges vs frozen-replacement differences";
  const at::Tensor diff = (rows - want).abs();
  const int64_t worst = diff.argmax().item<int64_t>();
  // A layer-0 feature reaches a layer-1 target through its layer-1 decoder
  // too: the edges differ from what its layer-0 decoder alone gives.
  std::cout << name << " CLT: " << S << " features, " << N << " nodes; largest |edge - reference| "
            << diff.max().item<double>() << " at [target row " << worst / rows.size(1) << ", source " << worst % rows.size(1)
            << "] (largest edge " << scale << ")\n";
  const at::Tensor sums = rows.sum(1) + bias;
  const at::Tensor values = at::cat({g.pre_activations.index_select(0, g.selected_features), value.narrow(0, S, K)});
  EXPECT_TRUE(flex_test::close(sums, values, 1e-9, 1e-10)) << "completeness";
  EXPECT_TRUE(flex_test::close(value.narrow(0, 0, S), g.pre_activations.index_select(0, g.selected_features), 1e-9, 1e-10));
  std::cout << name << " CLT: completeness, largest |sum of edges + bias - value| "
            << (sums - values).abs().max().item<double>() << "\n";
}

// The reference with a CLT's decoder into layer 1 zeroed: the edges from
// layer-0 features into logits then change (they write into both layers).
void check_interventions_against_reference(const std::string& name, bool frozen,
                                           const std::string& input_hook = "mlp.hook_in") {
  SCOPED_TRACE(name + " " + input_hook);
  auto m = model(name);
  auto clt = random_clt(*m, /*jump=*/true, input_hook);
  flex_test::AttributionReference ref(*m, *clt, prompt(), /*zero_first=*/false);
  const at::Tensor a2 = ref.sources.acts[0][2], a5 = ref.sources.acts[0][5];
  ASSERT_GT(a2.ne(0).sum().item<int64_t>(), 0);
  ASSERT_GT(a5.ne(0).sum().item<int64_t>(), 0);
  const int64_t on2 = a2.ne(0).nonzero()[0][0].item<int64_t>(), on5 = a5.ne(0).nonzero()[0][0].item<int64_t>();
  const at::Tensor got = intervene(*m, clt, prompt(), {{0, 2, on2, 0.0, false}, {0, -2, on5, 2.5, true}}, frozen);
  const at::Tensor want = ref.edited_logits({{0, 2, on2, 0.0}, {0, 5, on5, 2.5, true}}, frozen);
  const at::Tensor clean = ref.edited_logits({}, true);
  const double moved = (want - clean).abs().max().item<double>();
  EXPECT_GT(moved, 1e-2) << "the edits barely move the logits";
  const double tol = name == "gpt2" ? 1e-11 : 2e-6;  // Llama's plain norms run in float32
  EXPECT_TRUE(flex_test::close(got, want, tol, tol * moved));
  std::cout << name << (frozen ? " frozen" : " unfrozen") << " CLT interventions: largest |logit - reference| "
            << (got - want).abs().max().item<double>() << ", largest change from the edits " << moved << "\n";
}

struct Golden {
  std::string family;
  std::shared_ptr<SafetensorsFile> file =
      SafetensorsFile::open(flex_test::data_path("attribution/" + family + "-clt-circuit-tracer.safetensors"));
  at::Tensor get(const std::string& name) const { return file->get(name); }
  std::string clt_dir() const { return flex_test::data_path("attribution/" + family + "-clt"); }
};

void compare_with_circuit_tracer(const std::string& family) {
  SCOPED_TRACE(family);
  const Golden golden{family};
  auto m = load_pretrained(flex_test::fixture("models/" + family));
  const Transcoders tc = load_attribution_transcoders(golden.clt_dir(), 2);
  ASSERT_TRUE(tc.cross_layer && tc.per_layer.empty()) << "the folder is not read as a CLT";
  // Its config.yaml: GPT-2's reads the MLP input, Llama's the residual before the norm.
  EXPECT_EQ(tc.cross_layer->input_hook, family == "llama" ? "hook_resid_mid" : "mlp.hook_in");
  AttributionOptions o;
  o.batch_size = 16;
  const AttributionGraph g = attribute(*m, tc, golden.get("input_ids"), o);
  flex_test::expect_same_graph_as_circuit_tracer(family + " CLT", g, *golden.file);
  if (::testing::Test::HasFatalFailure()) return;

  // Interventions: circuit-tracer's feature_intervention, frozen and not.
  const at::Tensor ivt = golden.get("interventions");
  std::vector<FeatureIntervention> ivs;
  for (int64_t i = 0; i < ivt.size(0); ++i)
    ivs.push_back({static_cast<int64_t>(ivt[i][0].item<float>()), static_cast<int64_t>(ivt[i][1].item<float>()),
                   static_cast<int64_t>(ivt[i][2].item<float>()), ivt[i][3].item<double>(), false});
  for (bool frozen : {true, false}) {
    const at::Tensor want = golden.get(frozen ? "frozen_logits" : "unfrozen_logits");
    const at::Tensor got = intervene(*m, tc, golden.get("input_ids"), ivs, frozen);
    const double moved = (want - golden.get("clean_logits")).abs().max().item<double>();
    EXPECT_GT(moved, 0.5);
    EXPECT_TRUE(flex_test::close(got, want, 1e-4, 1e-4 * want.abs().max().item<double>())) << (frozen ? "frozen" : "unfrozen");
    std::cout << family << " CLT interventions (" << (frozen ? "frozen" : "unfrozen") << "): largest |logit difference| "
              << (got - want).abs().max().item<double>() << ", largest change from the edits " << moved << "\n";
  }
}

// Writes `clt`'s tensors as circuit-tracer lays them out (edited by `edit`).
void write_clt(const std::string& dir, const Golden& g,
               const std::function<void(std::map<std::string, at::Tensor>&)>& edit = nullptr) {
  std::map<std::string, at::Tensor> all;
  for (const auto& e : fs::directory_iterator(g.clt_dir())) {
    if (e.path().extension() != ".safetensors") continue;  // config.yaml
    auto f = SafetensorsFile::open(e.path().string());
    for (const auto& n : f->names()) all[n] = f->get(n).clone();
  }
  if (edit) edit(all);
  fs::create_directories(dir);
  std::map<std::string, std::vector<std::pair<std::string, at::Tensor>>> files;
  for (auto& [n, t] : all) files[(n.rfind("W_dec", 0) == 0 ? "W_dec_" : "W_enc_") + n.substr(n.rfind('_') + 1)].push_back({n, t});
  for (auto& [stem, ts] : files) save_safetensors(dir + "/" + stem + ".safetensors", ts);
}

}  // namespace

TEST(AttributionClt, Gpt2JumpReluEdgesEqualTheFrozenReplacementsDifferences) { check_against_reference("gpt2", true); }
// Llama: a CLT reading the residual before each MLP's norm (circuit-tracer's hook_resid_mid).
TEST(AttributionClt, LlamaReluResidMidEdgesEqualTheFrozenReplacementsDifferences) {
  check_against_reference("llama", false, "hook_resid_mid");
}
// Gemma 2: the CLT writes after each post-MLP norm (circuit-tracer's hook_mlp_out).
TEST(AttributionClt, Gemma2JumpReluEdgesEqualTheFrozenReplacementsDifferences) { check_against_reference("gemma2", true); }
TEST(AttributionClt, Gpt2InterventionsMatchTheReference) {
  check_interventions_against_reference("gpt2", true);
  check_interventions_against_reference("gpt2", false);
}
TEST(AttributionClt, LlamaResidMidFrozenInterventionsMatchTheReference) {
  check_interventions_against_reference("llama", true, "hook_resid_mid");
}

TEST(AttributionClt, Gpt2SameAsCircuitTracer) { compare_with_circuit_tracer("gpt2"); }
TEST(AttributionClt, LlamaSameAsCircuitTracer) { compare_with_circuit_tracer("llama"); }

TEST(AttributionClt, OneFileReadsAsTheFolder) {
  const Golden g{"gpt2"};
  flex_test::TempDir tmp;
  std::vector<std::pair<std::string, at::Tensor>> all;
  for (const auto& e : fs::directory_iterator(g.clt_dir())) {
    if (e.path().extension() != ".safetensors") continue;  // config.yaml
    auto f = SafetensorsFile::open(e.path().string());
    for (const auto& n : f->names()) all.push_back({n, f->get(n).clone()});
  }
  save_safetensors(tmp.str("clt.safetensors"), all);
  ASSERT_TRUE(is_cross_layer_transcoder(tmp.str("clt.safetensors")));
  const auto a = load_cross_layer_transcoder(g.clt_dir());
  const auto b = load_attribution_transcoders(tmp.str("clt.safetensors"), 2).cross_layer;
  ASSERT_TRUE(b);
  EXPECT_TRUE(flex_test::equal(a->W_enc, b->W_enc));
  EXPECT_TRUE(flex_test::equal(a->threshold, b->threshold));
  EXPECT_TRUE(flex_test::equal(a->W_dec[0], b->W_dec[0]));
  EXPECT_TRUE(flex_test::equal(a->W_dec[1], b->W_dec[1]));
  // What circuit-tracer wrote: W_enc_i [F, d] stacked, W_dec_0 [F, 2, d].
  EXPECT_EQ(a->W_enc.sizes(), at::IntArrayRef({2, 16, 64}));
  EXPECT_EQ(a->W_dec[0].sizes(), at::IntArrayRef({16, 2, 64}));
}

// A CLT's decoders stay as stored (a mapped file) and only the active
// features' rows are converted: a float32 CLT on the float64 model gives the
// graph and interventions of the same values held in float64.
TEST(AttributionClt, StoredFloat32DecodersEqualTheirFloat64Values) {
  auto m = model("gpt2");
  auto c64 = random_clt(*m, true);
  auto c32 = std::make_shared<CrossLayerTranscoder>(*c64);
  c32->W_enc = c64->W_enc.to(at::kFloat);
  c32->b_enc = c64->b_enc.to(at::kFloat);
  c32->b_dec = c64->b_dec.to(at::kFloat);
  c32->threshold = c64->threshold.to(at::kFloat);
  for (auto& w : c32->W_dec) w = w.to(at::kFloat);
  auto exact = std::make_shared<CrossLayerTranscoder>(*c32);  // the float32 values in float64
  exact->W_enc = c32->W_enc.to(at::kDouble);
  exact->b_enc = c32->b_enc.to(at::kDouble);
  exact->b_dec = c32->b_dec.to(at::kDouble);
  exact->threshold = c32->threshold.to(at::kDouble);
  for (auto& w : exact->W_dec) w = w.to(at::kDouble);
  const AttributionGraph a = attribute(*m, c32, prompt()), b = attribute(*m, exact, prompt());
  ASSERT_EQ(a.adjacency.scalar_type(), at::kDouble);
  ASSERT_TRUE(flex_test::equal(a.active_features, b.active_features));
  EXPECT_TRUE(flex_test::close(a.adjacency, b.adjacency, 1e-12, 1e-12));
  const std::vector<FeatureIntervention> ivs = {{0, 3, a.active_features[a.active_features.size(0) / 4][2].item<int64_t>(), 2.0, false}};
  EXPECT_TRUE(flex_test::close(intervene(*m, c32, prompt(), ivs), intervene(*m, exact, prompt(), ivs), 1e-12, 1e-12));
}

TEST(AttributionClt, TypedErrorsForAMisShapedClt) {
  const Golden g{"gpt2"};
  flex_test::TempDir tmp;
  // W_dec_1 writing into two layers (layer 1 of 2 writes into one).
  write_clt(tmp.str("dec"), g, [](auto& t) { t["W_dec_1"] = at::zeros({16, 2, 64}); });
  flex_test::expect_error<ConfigError>([&] { load_cross_layer_transcoder(tmp.str("dec")); },
                                       {"W_dec_1.safetensors", "'W_dec_1'", "[16, 2, 64]", "[16, 1, 64]"});
  // A layer-1 encoder of another width.
  write_clt(tmp.str("enc"), g, [](auto& t) { t["W_enc_1"] = at::zeros({16, 65}); });
  flex_test::expect_error<ConfigError>([&] { load_cross_layer_transcoder(tmp.str("enc")); },
                                       {"W_enc_1.safetensors", "'W_enc_1'", "[16, 65]"});
  // A threshold on layer 0 only.
  write_clt(tmp.str("thr"), g, [](auto& t) { t.erase("threshold_1"); });
  flex_test::expect_error<ConfigError>([&] { load_cross_layer_transcoder(tmp.str("thr")); },
                                       {"W_enc_1.safetensors", "threshold_1"});
  // A decoder file missing.
  write_clt(tmp.str("nodec"), g, [](auto& t) { t.erase("W_dec_0"); });
  flex_test::expect_error<ConfigError>([&] { load_cross_layer_transcoder(tmp.str("nodec")); }, {"W_dec_0"});
  // Three layers for the two-layer model.
  write_clt(tmp.str("three"), g, [](auto& t) {
    t["W_enc_2"] = t["W_enc_1"].clone();
    t["b_enc_2"] = t["b_enc_1"].clone();
    t["b_dec_2"] = t["b_dec_1"].clone();
    t["threshold_2"] = t["threshold_1"].clone();
    t["W_dec_0"] = at::zeros({16, 3, 64});
    t["W_dec_1"] = at::zeros({16, 2, 64});
    t["W_dec_2"] = at::zeros({16, 1, 64});
  });
  flex_test::expect_error<ConfigError>([&] { load_attribution_transcoders(tmp.str("three"), 2); },
                                       {tmp.str("three"), "3 layers", "model has 2"});
  // A CLT of another width than the model's, given in memory.
  auto m = model("llama");
  auto clt = random_clt(*m, true);
  clt->W_enc = at::zeros({2, 16, 32}, at::kDouble);
  clt->b_dec = at::zeros({2, 32}, at::kDouble);
  flex_test::expect_error<ConfigError>([&] { attribute(*m, clt, prompt()); }, {"test/clt", "width 32", "64"});
  flex_test::expect_error<ConfigError>([&] { intervene(*m, clt, prompt(), {{0, 1, 0, 1.0, false}}); }, {"test/clt", "width 32"});
  // An intervention on a feature the CLT does not have.
  flex_test::expect_error<ConfigError>(
      [&] { intervene(*m, random_clt(*m, true), prompt(), {{1, 1, 16, 1.0, false}}); }, {"feature out of range", "16"});
  // Hooks the CLT cannot read or write at.
  auto at_resid_pre = random_clt(*m, true);
  at_resid_pre->input_hook = "hook_resid_pre";
  flex_test::expect_error<ConfigError>([&] { attribute(*m, at_resid_pre, prompt()); }, {"feature_input_hook 'hook_resid_pre'"});
  auto to_resid = random_clt(*m, true);
  to_resid->output_hook = "hook_resid_post";
  flex_test::expect_error<ConfigError>([&] { attribute(*m, to_resid, prompt()); }, {"feature_output_hook 'hook_resid_post'"});
}
