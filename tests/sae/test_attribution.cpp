// Attribution graphs (flex/sae/attribution.h) against an independent
// computation: tests/common/attribution_reference.h writes GPT-2 and Llama
// out by hand in float64 with the attention patterns and norm denominators
// frozen and per-layer transcoders applied by hand. On the float64 fixture
// models with random transcoders (plain ReLU, skip, JumpReLU):
//   - the active features and their activations are the reference's;
//   - every edge equals the reference's finite difference frozen(S) -
//     frozen(S with that source zeroed) (exact for the affine replacement);
//   - completeness: each feature's incoming edges plus its bias term (the
//     frozen replacement with every source zeroed) sum to its pre-activation,
//     and each logit node's to its logit minus the mean logit;
//   - the batch size and max_feature_nodes change nothing in the rows;
//   - typed errors for transcoders that do not fit, long prompts, options.
#include <flex/hooks/errors.h>
#include <flex/hooks/frozen_replacement.h>
#include <flex/models/auto_model.h>
#include <flex/sae/attribution.h>
#include <flex/sae/attribution_graph.h>

#include <flex/dispatch/safetensors.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>

#include "attribution_reference.h"
#include "attribution_reference_edges.h"
#include "expect_error.h"
#include "random_transcoders.h"
#include "tensor_compare.h"
#include "test_util.h"

using namespace flex;

namespace {

std::shared_ptr<CausalLM> model(const std::string& name, at::ScalarType dt = at::kDouble) {
  return load_pretrained(flex_test::fixture("models/" + name), dt);
}

// Layer l's transcoder: layer 0 plain ReLU, layer 1 skip (GPT-2) or JumpReLU
// skip (Llama); hooks named as circuit-tracer names them, or as modules.
std::vector<std::shared_ptr<SparseDictionary>> transcoders(const CausalLM& m, at::ScalarType dt, int64_t d_sae = 24,
                                                           int64_t seed = 5) {
  const bool gpt2 = m.base_model_prefix() == "transformer";
  const bool gemma = m.class_name() == "Gemma2ForCausalLM" || m.class_name() == "Gemma3ForCausalLM";
  flex_test::RandomTranscoders spec;
  spec.d_sae = d_sae;
  spec.seed = seed;
  spec.dtype = dt;
  // Inputs have unit scale per coordinate after the norm (weight ~1): pre-activations of a few units.
  spec.enc_scale = gpt2 ? 0.25 : 2.0;
  spec.architecture = [gpt2](int64_t l) {
    return l == 0 ? SaeArchitecture::Transcoder
                  : (gpt2 ? SaeArchitecture::SkipTranscoder : SaeArchitecture::JumpReLUSkipTranscoder);
  };
  spec.hooks = [gpt2, gemma](int64_t l) -> std::pair<std::string, std::string> {
    const std::string ls = std::to_string(l);
    if (l == 0) return {"blocks.0.mlp.hook_in", "blocks.0.mlp.hook_out"};
    if (gemma) return {"model.layers." + ls + ".pre_feedforward_layernorm", "blocks." + ls + ".mlp.hook_out"};
    return {(gpt2 ? "transformer.h." : "model.layers.") + ls + (gpt2 ? ".ln_2" : ".post_attention_layernorm"),
            "blocks." + ls + ".hook_mlp_out"};
  };
  return flex_test::random_transcoders(m, spec);
}

at::Tensor prompt() { return at::tensor({1, 17, 42, 7, 99, 5, 11}, at::kLong); }

using flex_test::reference_edges;
using flex_test::ReferenceEdges;
using flex_test::target_rows;

void check_against_reference(const std::string& name, std::shared_ptr<CausalLM> m = nullptr,
                             const at::Tensor& ids = prompt(), const flex_test::Gemma3Attention* gemma3 = nullptr,
                             int64_t d_sae = 24) {
  if (!m) m = model(name);
  auto tc = transcoders(*m, at::kDouble, d_sae);
  AttributionOptions o;
  o.batch_size = 7;  // several passes, targets of both layers and logits mixed in one
  o.max_n_logits = 4;
  o.desired_logit_prob = 0.99;
  const AttributionGraph g = attribute(*m, tc, ids, o);
  flex_test::AttributionReference ref(*m, tc, ids, true, gemma3);
  if (gemma3) {
    // The patterns the reference uses are its own: they must be the model's.
    std::cout << name << ": largest |pattern - model's pattern| " << ref.largest_pattern_difference() << "\n";
    ASSERT_LT(ref.largest_pattern_difference(), 1e-6) << name << ": the written-out attention pattern is not the model's";
  }

  // The active features are the reference's, with its activations.
  const int64_t L = g.n_layers, T = g.n_pos;
  ASSERT_TRUE(flex_test::equal(g.active_features, flex_test::reference_active_features(ref, L))) << name;
  ASSERT_GT(g.active_features.size(0), 20) << name << ": too few active features to test anything";
  ASSERT_LT(g.active_features.size(0), L * (T - 1) * 24) << name << ": every feature active";
  const at::Tensor f = g.active_features;
  std::vector<at::Tensor> acts, pres;
  for (int64_t i = 0; i < f.size(0); ++i) {
    acts.push_back(ref.sources.acts[f[i][0].item<int64_t>()][f[i][1].item<int64_t>()][f[i][2].item<int64_t>()]);
    pres.push_back(ref.pre[f[i][0].item<int64_t>()][f[i][1].item<int64_t>()][f[i][2].item<int64_t>()]);
  }
  EXPECT_TRUE(flex_test::close(g.activations, at::stack(acts), 1e-9, 1e-11)) << name;
  EXPECT_TRUE(flex_test::close(g.pre_activations, at::stack(pres), 1e-9, 1e-11)) << name;
  // Logit targets: the most probable tokens.
  const at::Tensor p = at::softmax(ref.last_logits, -1);
  EXPECT_TRUE(flex_test::equal(g.logit_tokens, std::get<1>(at::topk(p, g.logit_tokens.size(0))))) << name;
  EXPECT_TRUE(flex_test::close(g.logit_probabilities, std::get<0>(at::topk(p, g.logit_tokens.size(0))), 1e-9)) << name;

  // Every edge: the reference's finite difference.
  const ReferenceEdges r = reference_edges(ref, g);
  const at::Tensor rows = target_rows(g);
  const double scale = r.edges.abs().max().item<double>();
  EXPECT_TRUE(flex_test::close(rows, r.edges, 1e-8, 1e-10 * scale)) << name << ": edges vs frozen-replacement differences";
  const at::Tensor diff = (rows - r.edges).abs();
  const int64_t worst = diff.argmax().item<int64_t>(), C = rows.size(1);
  std::cout << name << ": " << g.n_features() << " features, " << g.n_nodes() << " nodes; largest |edge - reference| "
            << diff.max().item<double>() << " at [target row " << worst / C << ", source node " << worst % C
            << "] (largest edge " << scale << ")\n";
  // Error and token nodes have no incoming edges.
  EXPECT_EQ(g.adjacency.narrow(0, g.error_offset(), L * T + T).abs().sum().item<double>(), 0.0);
  // Upstream only: no edge from a feature of the same or a later layer, or a later position.
  for (int64_t t = 0; t < g.n_features(); ++t)
    for (int64_t s = 0; s < g.n_features(); ++s) {
      const auto ft = f[g.selected_features[t].item<int64_t>()], fs = f[g.selected_features[s].item<int64_t>()];
      if (fs[0].item<int64_t>() >= ft[0].item<int64_t>() || fs[1].item<int64_t>() > ft[1].item<int64_t>())
        ASSERT_EQ(g.adjacency[t][s].item<double>(), 0.0) << name << ": edge " << s << " -> " << t;
    }

  // Completeness: incoming edges + bias term = the target's value.
  const at::Tensor sums = rows.sum(1) + r.bias;
  const at::Tensor values = at::cat({g.pre_activations.index_select(0, g.selected_features), r.value.narrow(0, g.n_features(), g.logit_tokens.size(0))});
  EXPECT_TRUE(flex_test::close(sums, values, 1e-9, 1e-10)) << name << ": completeness";
  EXPECT_TRUE(flex_test::close(r.value.narrow(0, 0, g.n_features()), g.pre_activations.index_select(0, g.selected_features), 1e-9, 1e-10))
      << name << ": the frozen reference at the recorded sources gives the pre-activations";
  std::cout << name << ": completeness, largest |sum of edges + bias - value| " << (sums - values).abs().max().item<double>()
            << "\n";
}

}  // namespace

TEST(Attribution, Gpt2EdgesEqualTheFrozenReplacementsDifferences) { check_against_reference("gpt2"); }
TEST(Attribution, LlamaEdgesEqualTheFrozenReplacementsDifferences) { check_against_reference("llama"); }

// Gemma 2: norms after the attention and the MLP (the transcoder stands in
// for the MLP and its post norm, as circuit-tracer's hook_mlp_out sits after
// it), scaled embeddings, soft caps on the scores (inside the frozen pattern)
// and on the final logits (the probabilities; a logit target is the logit
// before the cap, as circuit-tracer seeds it), sliding-window layers.
TEST(Attribution, Gemma2EdgesEqualTheFrozenReplacementsDifferences) { check_against_reference("gemma2"); }

// Qwen3 (q_norm / k_norm inside the attention): a small float64 model
// written here. Its q/k norms feed only the attention pattern, which the
// frozen replacement holds constant, so they need no freezing of their own;
// the reference takes the model's patterns, q/k norms included, and is
// otherwise Llama's.
TEST(Attribution, Qwen3EdgesEqualTheFrozenReplacementsDifferences) {
  flex_test::TempDir dir;
  const int64_t vocab = 128, hidden = 32, layers = 2, heads = 4, kv = 2, head_dim = 16, inter = 48;
  at::manual_seed(37);
  auto lin = [](int64_t out, int64_t in) { return (at::randn({out, in}) / std::sqrt(double(in))).to(at::kDouble); };
  auto scale = [](int64_t n) { return (1 + 0.2 * at::randn({n})).to(at::kDouble); };
  std::vector<std::pair<std::string, at::Tensor>> w = {{"model.embed_tokens.weight", (at::randn({vocab, hidden}) * 0.5).to(at::kDouble)},
                                                       {"lm_head.weight", lin(vocab, hidden)},
                                                       {"model.norm.weight", scale(hidden)}};
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    w.push_back({p + "self_attn.q_proj.weight", lin(heads * head_dim, hidden)});
    w.push_back({p + "self_attn.k_proj.weight", lin(kv * head_dim, hidden)});
    w.push_back({p + "self_attn.v_proj.weight", lin(kv * head_dim, hidden)});
    w.push_back({p + "self_attn.o_proj.weight", lin(hidden, heads * head_dim)});
    w.push_back({p + "self_attn.q_norm.weight", scale(head_dim)});
    w.push_back({p + "self_attn.k_norm.weight", scale(head_dim)});
    w.push_back({p + "mlp.gate_proj.weight", lin(inter, hidden)});
    w.push_back({p + "mlp.up_proj.weight", lin(inter, hidden)});
    w.push_back({p + "mlp.down_proj.weight", lin(hidden, inter)});
    w.push_back({p + "input_layernorm.weight", scale(hidden)});
    w.push_back({p + "post_attention_layernorm.weight", scale(hidden)});
  }
  save_safetensors(dir.str() + "/model.safetensors", w, {{"format", "pt"}});
  const nlohmann::json cfg = {{"architectures", {"Qwen3ForCausalLM"}}, {"model_type", "qwen3"}, {"vocab_size", vocab},
                              {"hidden_size", hidden}, {"num_hidden_layers", layers}, {"num_attention_heads", heads},
                              {"num_key_value_heads", kv}, {"head_dim", head_dim}, {"intermediate_size", inter},
                              {"rms_norm_eps", 1e-6}, {"rope_theta", 1e6}, {"attention_bias", false},
                              {"tie_word_embeddings", false}, {"use_sliding_window", false},
                              {"max_position_embeddings", 64}, {"torch_dtype", "float64"}};
  std::ofstream(dir.str() + "/config.json") << cfg.dump(2);
  auto m = load_pretrained(dir.str(), at::kDouble);
  ASSERT_EQ(m->class_name(), "Qwen3ForCausalLM");
  check_against_reference("qwen3", m);
}

// Gemma 3 (tests/data/golden5/gemma3_text, 7 layers: 6 sliding with a window
// of 6 and base 1e4, one full with base 1e6 and linear RoPE x8; per-head q/k
// norms; no soft caps): Gemma 2's residual stream. Here the reference also
// writes the attention pattern out from the config (q/k norms, RoPE per layer
// type, sliding window, query_pre_attn_scalar) instead of taking the model's,
// so the frozen pattern flexmodel holds is checked too. A 9-token prompt: the
// sliding window hides the first keys of the last queries.
TEST(Attribution, Gemma3EdgesEqualTheFrozenReplacementsDifferences) {
  const std::string dir = flex_test::data_path("golden5/gemma3_text");
  const auto g3 = flex_test::Gemma3Attention::from_config(dir + "/config.json");
  ASSERT_EQ(std::count(g3.sliding.begin(), g3.sliding.end(), false), 1);
  auto m = load_pretrained(dir, at::kDouble);
  ASSERT_EQ(m->class_name(), "Gemma3ForCausalLM");
  // 8 features a layer: 7 layers keep the reference's one frozen pass per source short.
  check_against_reference("gemma3", m, at::tensor({2, 17, 42, 7, 91, 5, 11, 60, 33}, at::kLong), &g3, 8);
}

// The guard alone: values unchanged; with batch_replicas the pattern is
// computed once ([1, H, T, S] at hook_attn_probs) and every row's output is
// the plain forward's.
TEST(Attribution, FrozenForwardKeepsValuesAndReplicasShareOnePattern) {
  for (const std::string name : {"gpt2", "llama"}) {
    auto m = model(name);
    const at::Tensor ids = prompt().unsqueeze(0).expand({3, prompt().size(0)}).contiguous();
    const at::Tensor plain = m->logits(ids);
    const std::string probs = name == "gpt2" ? "transformer.h.1.attn.hook_attn_probs" : "model.layers.1.self_attn.hook_attn_probs";
    std::vector<int64_t> seen;
    auto h = m->get_submodule(probs)->register_forward_hook(
        [&](Module&, const Inputs&, Value& out) { seen = find_first_tensor(out).sizes().vec(); });
    at::Tensor frozen, replicas;
    {
      FreezeNonlinearities guard;
      frozen = m->logits(ids);
      EXPECT_EQ(seen[0], 3) << name;
    }
    {
      FreezeNonlinearities guard(/*batch_replicas=*/true);
      replicas = m->logits(ids);
      EXPECT_EQ(seen[0], 1) << name << ": the pattern once, not per row";
    }
    h.remove();
    // (Llama's plain RMSNorm computes in float32, its frozen one in float64.)
    const double tol = name == "llama" ? 1e-5 : 1e-10;
    EXPECT_TRUE(flex_test::close(frozen, plain, tol, tol)) << name;
    EXPECT_TRUE(flex_test::close(replicas, frozen, 1e-10, 1e-10)) << name;
  }
}

TEST(Attribution, NoActiveFeatureLeavesErrorsTokensAndLogits) {
  auto m = model("llama");
  auto tc = transcoders(*m, at::kDouble);
  {
    at::NoGradGuard ng;
    for (auto& t : tc) t->set_tensor("b_enc", at::full({24}, -1e3, at::kDouble));  // nothing fires
  }
  const AttributionGraph g = attribute(*m, tc, prompt());
  ASSERT_EQ(g.active_features.size(0), 0);
  ASSERT_EQ(g.n_features(), 0);
  EXPECT_EQ(g.n_nodes(), g.n_layers * g.n_pos + g.n_pos + g.logit_tokens.size(0));
  // The logit rows are still the reference's differences (the errors now hold the whole MLP outputs).
  flex_test::AttributionReference ref(*m, tc, prompt());
  const ReferenceEdges r = reference_edges(ref, g);
  const at::Tensor rows = target_rows(g);
  EXPECT_TRUE(flex_test::close(rows, r.edges, 1e-8, 1e-10 * r.edges.abs().max().item<double>()));
  EXPECT_TRUE(flex_test::close(rows.sum(1) + r.bias, r.value, 1e-9, 1e-10));
  const PrunedGraph p = prune_graph(g);
  EXPECT_TRUE(p.node_mask.narrow(0, g.token_offset(), g.n_pos + g.logit_tokens.size(0)).all().item<bool>());
}

TEST(Attribution, BatchSizeAndFeatureBudgetLeaveRowsAlone) {
  auto m = model("gpt2");
  auto tc = transcoders(*m, at::kDouble);
  AttributionOptions a;
  a.batch_size = 1000;
  const AttributionGraph all = attribute(*m, tc, prompt(), a);
  AttributionOptions b;
  b.batch_size = 3;
  b.max_feature_nodes = 10;
  b.update_interval = 1;
  const AttributionGraph some = attribute(*m, tc, prompt(), b);
  ASSERT_EQ(some.n_features(), 10);
  EXPECT_TRUE(flex_test::equal(some.active_features, all.active_features));
  // The visited features' rows are the full graph's rows at the kept columns.
  const at::Tensor sel = some.selected_features;
  const int64_t C = all.logit_offset(), S = all.n_features();
  const at::Tensor cols = at::cat({sel, at::arange(S, C + all.logit_tokens.size(0), at::kLong)});
  const at::Tensor expect_rows = all.adjacency.index_select(0, sel).index_select(1, cols);
  EXPECT_TRUE(flex_test::close(some.adjacency.narrow(0, 0, 10), expect_rows, 1e-10, 1e-12));
  const int64_t K = all.logit_tokens.size(0);
  EXPECT_TRUE(flex_test::close(some.adjacency.narrow(0, some.n_nodes() - K, K),
                               all.adjacency.narrow(0, all.n_nodes() - K, K).index_select(1, cols), 1e-10, 1e-12));
}

TEST(Attribution, Float32GraphIsTheFloat64OneWithinFloat32Rounding) {
  auto m64 = model("llama");
  auto m32 = model("llama", at::kFloat);
  const AttributionGraph g64 = attribute(*m64, transcoders(*m64, at::kDouble), prompt());
  const AttributionGraph g32 = attribute(*m32, transcoders(*m32, at::kFloat), prompt());
  ASSERT_TRUE(flex_test::equal(g32.active_features, g64.active_features));
  EXPECT_EQ(g32.adjacency.scalar_type(), at::kFloat);
  const double scale = g64.adjacency.abs().max().item<double>();
  EXPECT_TRUE(flex_test::close(g32.adjacency.to(at::kDouble), g64.adjacency, 1e-4, 1e-5 * scale));
}

TEST(Attribution, PruningKeepsTokensLogitsAndTheStrongestPaths) {
  auto m = model("gpt2");
  const AttributionGraph g = attribute(*m, transcoders(*m, at::kDouble), prompt());
  const PrunedGraph all = prune_graph(g, 1.0, 1.0);
  const PrunedGraph p = prune_graph(g, 0.5, 0.9);
  const int64_t N = g.n_nodes(), K = g.logit_tokens.size(0), T = g.n_pos;
  EXPECT_TRUE(p.node_mask.narrow(0, N - K - T, K + T).all().item<bool>());
  EXPECT_LT(p.node_mask.sum().item<int64_t>(), all.node_mask.sum().item<int64_t>());
  EXPECT_LT(p.edge_mask.sum().item<int64_t>(), all.edge_mask.sum().item<int64_t>());
  // Kept edges join kept nodes; every kept feature has an edge in and out.
  const at::Tensor e = p.edge_mask.nonzero();
  for (int64_t i = 0; i < e.size(0); ++i) {
    EXPECT_TRUE(p.node_mask[e[i][0]].item<bool>());
    EXPECT_TRUE(p.node_mask[e[i][1]].item<bool>());
  }
  for (int64_t i = 0; i < g.n_features(); ++i)
    if (p.node_mask[i].item<bool>()) {
      EXPECT_TRUE(p.edge_mask[i].any().item<bool>()) << "feature " << i << " kept without incoming edge";
      EXPECT_TRUE(p.edge_mask.select(1, i).any().item<bool>()) << "feature " << i << " kept without outgoing edge";
    }
  // Cumulative scores: in [0, 1], the most influential node first.
  EXPECT_LE(p.cumulative_scores.max().item<double>(), 1.0 + 1e-9);
  flex_test::expect_error<ConfigError>([&] { prune_graph(g, 1.5, 0.9); }, {"node_threshold", "1.5"});
  flex_test::expect_error<ConfigError>([&] { prune_graph(g, 0.5, -0.1); }, {"edge_threshold"});
}

TEST(Attribution, TypedErrors) {
  auto m = model("gpt2");
  auto tc = transcoders(*m, at::kDouble);
  // A transcoder of another width.
  {
    SaeConfig c = tc[1]->config();
    c.d_in = c.d_out = 32;
    c.source = "tc/narrow";
    auto narrow = std::make_shared<SparseDictionary>(c);
    auto bad = tc;
    bad[1] = narrow;
    flex_test::expect_error<ShapeError>([&] { attribute(*m, bad, prompt()); }, {"tc/narrow", "[32, 24]", "64"});
  }
  // A transcoder reading another layer, or writing somewhere else.
  {
    SaeConfig c = tc[0]->config();
    c.hook_name = "blocks.1.hook_mlp_in";
    c.source = "tc/wrong_layer";
    auto bad = tc;
    bad[0] = std::make_shared<SparseDictionary>(c);
    flex_test::expect_error<ConfigError>([&] { attribute(*m, bad, prompt()); }, {"tc/wrong_layer", "blocks.1.hook_mlp_in", "layer 0"});
    c.hook_name = "blocks.0.mlp.hook_in";
    c.hook_name_out = "blocks.0.hook_resid_post";
    bad[0] = std::make_shared<SparseDictionary>(c);
    flex_test::expect_error<ConfigError>([&] { attribute(*m, bad, prompt()); }, {"tc/wrong_layer", "hook_resid_post"});
  }
  flex_test::expect_error<ConfigError>([&] { attribute(*m, {tc[0]}, prompt()); }, {"1 transcoders", "2 layers"});
  // A prompt longer than the context (64 positions).
  flex_test::expect_error<ShapeError>([&] { attribute(*m, tc, at::ones({65}, at::kLong)); }, {"65 tokens", "context of 64"});
  AttributionOptions o;
  o.desired_logit_prob = 1.5;
  flex_test::expect_error<ConfigError>([&] { attribute(*m, tc, prompt(), o); }, {"desired_logit_prob"});
  o = {};
  o.max_n_logits = 0;
  flex_test::expect_error<ConfigError>([&] { attribute(*m, tc, prompt(), o); }, {"max_n_logits"});
  o = {};
  o.batch_size = 0;
  flex_test::expect_error<ConfigError>([&] { attribute(*m, tc, prompt(), o); }, {"batch_size"});
}

TEST(Attribution, LeavesTheModelsParametersAsTheyWere) {
  auto m = model("gpt2");
  auto params = m->parameters();
  params[0].set_requires_grad(true);
  params[1].set_requires_grad(false);
  attribute(*m, transcoders(*m, at::kDouble), prompt());
  EXPECT_TRUE(params[0].requires_grad());
  EXPECT_FALSE(params[1].requires_grad());
}
