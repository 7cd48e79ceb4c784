// Mixtral and Qwen2-MoE beyond the golden captures: each expert's rows and
// their token indices against an independent routing of the golden router
// logits, expert outputs put back in place, and the routing edits (force, ban,
// scale) against a sparse block computed here from the weights alone.
#include "golden_util.h"

#include <flex/flexcore/flex_model.h>
#include <flex/flexcore/routing_edits.h>
#include <flex/hooks/errors.h>
#include <flex/models/moe.h>

#include <map>
#include <set>

#include "test_util.h"

using namespace flex;
using models_test::close;

namespace {

struct MoeModel {
  std::string name, block;  // fixture, and the sparse block's name in a layer
  bool renormalise, shared;
};

void PrintTo(const MoeModel& m, std::ostream* os) { *os << m.name; }

const MoeModel kMixtral{"mixtral", "mlp", true, false};
const MoeModel kQwen2Moe{"qwen2_moe", "mlp", false, true};

std::string block_of(const MoeModel& m, int layer) { return "model.layers." + std::to_string(layer) + "." + m.block; }

// The top-2 experts of each token by sorting the softmax (not topk), in double.
std::pair<at::Tensor, at::Tensor> route(const at::Tensor& logits, bool renormalise, const std::set<int64_t>& banned = {}) {
  at::Tensor l = logits.to(at::kDouble).clone();
  for (int64_t e : banned) l.select(1, e).fill_(-std::numeric_limits<double>::infinity());
  at::Tensor p = at::softmax(l, 1);
  at::Tensor order = std::get<1>(p.sort(1, /*descending=*/true)).narrow(1, 0, 2);
  at::Tensor w = p.gather(1, order);
  if (renormalise) w = w / w.sum(1, true);
  return {order, w};
}

// down(silu(gate(x)) * up(x)) with the expert's weights read by name.
at::Tensor gated_mlp(Module& model, const std::string& prefix, const std::string& gate, const std::string& up,
                     const std::string& down, const at::Tensor& x) {
  auto w = [&](const std::string& n) { return get_module_tensor(model, prefix + "." + n + ".weight").to(at::kDouble); };
  at::Tensor h = at::silu(x.matmul(w(gate).t())) * x.matmul(w(up).t());
  return h.matmul(w(down).t());
}

// The sparse block from its weights: routing, every expert on every token,
// weighted sum (expert `scaled` times `factor`), plus the gated shared expert.
at::Tensor reference_block(Module& model, const MoeModel& m, int layer, const at::Tensor& x3,
                           const std::set<int64_t>& banned = {}, int64_t scaled = -1, double factor = 1.0) {
  const std::string b = block_of(m, layer);
  at::Tensor x = x3.reshape({-1, x3.size(-1)}).to(at::kDouble);
  at::Tensor logits = x.matmul(get_module_tensor(model, b + ".gate.weight").to(at::kDouble).t());
  auto [experts, weights] = route(logits, m.renormalise, banned);
  at::Tensor out = at::zeros_like(x);
  const bool mixtral = m.name == "mixtral";
  for (int64_t e = 0; e < logits.size(1); ++e) {
    const std::string p = b + ".experts." + std::to_string(e);
    at::Tensor y = mixtral ? gated_mlp(model, p, "w1", "w3", "w2", x) : gated_mlp(model, p, "gate_proj", "up_proj", "down_proj", x);
    if (e == scaled) y = y * factor;
    at::Tensor w = (weights * experts.eq(e).to(at::kDouble)).sum(1, true);  // 0 where e was not chosen
    out = out + w * y;
  }
  if (m.shared) {
    at::Tensor s = gated_mlp(model, b + ".shared_expert", "gate_proj", "up_proj", "down_proj", x);
    at::Tensor g = at::sigmoid(x.matmul(get_module_tensor(model, b + ".shared_expert_gate.weight").to(at::kDouble).t()));
    out = out + g * s;
  }
  return out.view(x3.sizes());
}

struct MoeRun {
  std::shared_ptr<CausalLM> model;
  std::shared_ptr<FlexModel> fm;
  at::Tensor logits;
};

// Loads the fixture, attaches `hooks` (name -> edit, may be null) and runs the golden input.
MoeRun run(const MoeModel& m, const std::vector<std::pair<std::string, EditFn>>& hooks) {
  MoeRun r;
  r.model = load_pretrained(models_test::model_dir(m.name), at::kFloat);
  r.fm = std::make_shared<FlexModel>(r.model);
  for (const auto& [name, edit] : hooks) {
    HookFunctionOptions o;
    o.editing_function = edit;
    r.fm->register_forward_hook(std::make_shared<HookFunction>(name, o));
  }
  at::NoGradGuard g;
  LMInputs in;
  in.input_ids = models_test::golden_inputs();
  r.logits = LMOutput::from_value(r.fm->forward(in.to_inputs())).logits;
  return r;
}

class Moe : public ::testing::TestWithParam<MoeModel> {};

TEST_P(Moe, ExpertRowsComeWithTheirTokenIndices) {
  const MoeModel m = GetParam();
  auto gt = models_test::golden_tensors(m.name);
  for (int layer = 0; layer < 2; ++layer) {
    const std::string b = block_of(m, layer);
    std::vector<std::pair<std::string, EditFn>> hooks{{b, nullptr}};
    for (int e = 0; e < 4; ++e) hooks.push_back({b + ".experts." + std::to_string(e), nullptr});
    MoeRun r = run(m, hooks);
    const auto& out = r.fm->output();

    // Transformers' order from the golden router logits: tokens choosing e
    // first, in token order, then those choosing it second.
    auto [experts, weights] = route(gt->get(b + ".gate"), m.renormalise);
    at::Tensor rebuilt = at::zeros({16, 64}, at::kDouble);
    for (int64_t e = 0; e < 4; ++e) {
      const std::string name = b + ".experts." + std::to_string(e);
      std::vector<int64_t> expected;
      for (int64_t slot = 0; slot < 2; ++slot)
        for (int64_t t = 0; t < 16; ++t)
          if (experts[t][slot].item<int64_t>() == e) expected.push_back(t);
      ASSERT_TRUE(out.count(name + "#token_index")) << name;
      const at::Tensor idx = out.at(name + "#token_index").at(0);
      EXPECT_EQ(idx.scalar_type(), at::kLong);
      EXPECT_EQ(std::vector<int64_t>(idx.data_ptr<int64_t>(), idx.data_ptr<int64_t>() + idx.numel()), expected) << name;
      const at::Tensor rows = out.at(name).at(0);
      EXPECT_TRUE(close(rows, gt->get(name), name));
      // Put the rows back: token t gets weight(t, e) * its row.
      at::Tensor w = (weights * experts.eq(e).to(at::kDouble)).sum(1);
      rebuilt.index_add_(0, idx, rows.to(at::kDouble) * w.index_select(0, idx).unsqueeze(1));
    }
    if (m.shared) {
      const at::Tensor s = gt->get(b + ".shared_expert"), g = gt->get(b + ".shared_expert_gate");
      rebuilt = rebuilt + at::sigmoid(g.to(at::kDouble)) * s.to(at::kDouble);
    }
    EXPECT_TRUE(close(rebuilt.view({2, 8, 64}), gt->get(b), b + " rebuilt from its experts' rows"));
    EXPECT_TRUE(close(out.at(b).at(0), gt->get(b), b));
  }
}

TEST_P(Moe, ForcingTheChosenExpertsGivesBitwiseTheUneditedLogits) {
  const MoeModel m = GetParam();
  MoeRun plain = run(m, {{block_of(m, 0) + ".hook_selected_experts", nullptr},
                      {block_of(m, 1) + ".hook_selected_experts", nullptr}});
  EXPECT_TRUE(close(plain.logits, models_test::golden_tensors(m.name)->get("logits"), m.name + " logits"));
  // One force_experts per (layer, chosen pair), each on the tokens that chose it.
  std::vector<std::pair<std::string, EditFn>> hooks;
  for (int layer = 0; layer < 2; ++layer) {
    const std::string hp = block_of(m, layer) + ".hook_selected_experts";
    const at::Tensor sel = plain.fm->output().at(hp).at(0);
    ASSERT_EQ(sel.sizes(), (at::IntArrayRef{16, 2}));
    std::map<std::vector<int64_t>, std::vector<int64_t>> tokens_of;
    for (int64_t t = 0; t < 16; ++t) tokens_of[{sel[t][0].item<int64_t>(), sel[t][1].item<int64_t>()}].push_back(t);
    EXPECT_GE(tokens_of.size(), 2u);
    for (const auto& [pair, tokens] : tokens_of) hooks.push_back({hp, force_experts(pair, tokens)});
  }
  MoeRun forced = run(m, hooks);
  EXPECT_TRUE(flex_test::equal(forced.logits, plain.logits));

  // Forcing other experts does change them.
  MoeRun other = run(m, {{block_of(m, 0) + ".hook_selected_experts", force_experts({3, 1})}});
  EXPECT_GT((other.logits - plain.logits).abs().max().item<double>(), 1e-3);
}

TEST_P(Moe, RoutingEditsEqualTheBlockComputedFromItsWeights) {
  const MoeModel m = GetParam();
  const std::string b = block_of(m, 0), in = "model.layers.0.post_attention_layernorm";
  struct Edit {
    std::string what, module;
    EditFn fn;
    std::set<int64_t> banned;
    int64_t scaled;
    double factor;
  };
  const std::vector<Edit> edits = {
      {"no edit", b + ".gate", nullptr, {}, -1, 1.0},
      {"ban 1", b + ".gate", ban_experts({1}), {1}, -1, 1.0},
      {"ban 0 and 2", b + ".gate", ban_experts({0, 2}), {0, 2}, -1, 1.0},
      {"scale 2 by 3", b + ".experts.2", scale_output(3.0), {}, 2, 3.0},
      {"scale 1 by 0", b + ".experts.1", scale_output(0.0), {}, 1, 0.0},
  };
  for (const auto& e : edits) {
    MoeRun r = run(m, {{in, nullptr}, {e.module, e.fn}, {b, nullptr}});
    at::Tensor expected = reference_block(*r.model, m, 0, r.fm->output().at(in).at(0), e.banned, e.scaled, e.factor);
    EXPECT_TRUE(close(r.fm->output().at(b).at(0), expected, m.name + " " + e.what));
    if (!e.banned.empty()) {
      // A banned expert still runs, on no rows.
      MoeRun rows = run(m, {{e.module, e.fn}, {b + ".experts." + std::to_string(*e.banned.begin()), nullptr}});
      EXPECT_EQ(rows.fm->output().at(b + ".experts." + std::to_string(*e.banned.begin())).at(0).size(0), 0);
    }
  }
}

TEST_P(Moe, BadRoutingEditsAreTypedErrors) {
  const MoeModel m = GetParam();
  const std::string b = block_of(m, 0);
  EXPECT_THROW(run(m, {{b + ".hook_selected_experts", force_experts({1, 2, 3})}}), ShapeError);
  EXPECT_THROW(run(m, {{b + ".hook_selected_experts", force_experts({1, 2}, {99})}}), ShapeError);
  EXPECT_THROW(run(m, {{b + ".gate", ban_experts({0, 1, 2, 3})}}), ShapeError);
  EXPECT_THROW(run(m, {{b + ".gate", ban_experts({7})}}), ShapeError);
  EXPECT_THROW(force_experts({2, 2}), ConfigError);
  EditFn out_of_range = [](Module&, const at::Tensor& s, SaveContext&, TrainableModules&) { return s + 10; };
  EXPECT_THROW(run(m, {{b + ".hook_selected_experts", out_of_range}}), ShapeError);
}

INSTANTIATE_TEST_SUITE_P(Models, Moe, ::testing::Values(kMixtral, kQwen2Moe),
                         [](const ::testing::TestParamInfo<MoeModel>& i) { return i.param.name; });

TEST(MoeConfig, SparseLayersAndErrors) {
  auto base = models_test::read_json(models_test::model_dir("qwen2_moe") + "/config.json");
  auto cfg = parse_config(base, "qwen2_moe");
  EXPECT_EQ(cfg.num_experts, 4);
  EXPECT_FALSE(cfg.norm_topk_prob);
  EXPECT_TRUE(cfg.layer_is_sparse(0) && cfg.layer_is_sparse(1));
  auto c2 = base;
  c2["mlp_only_layers"] = {0};
  c2["decoder_sparse_step"] = 1;
  auto dense0 = parse_config(c2, "qwen2_moe");
  EXPECT_FALSE(dense0.layer_is_sparse(0));
  EXPECT_TRUE(dense0.layer_is_sparse(1));
  // A dense layer is a Qwen2MoeMLP of intermediate_size under "mlp".
  auto model = build_causal_lm(dense0, at::TensorOptions());
  EXPECT_EQ(model->get_submodule("model.layers.0.mlp")->class_name(), "Qwen2MoeMLP");
  EXPECT_EQ(model->get_submodule("model.layers.1.mlp")->class_name(), "Qwen2MoeSparseMoeBlock");
  EXPECT_EQ(get_module_tensor(*model, "model.layers.0.mlp.up_proj.weight").size(0), 128);

  auto mix = models_test::read_json(models_test::model_dir("mixtral") + "/config.json");
  for (auto [field, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"num_experts_per_tok", 5}, {"num_local_experts", 0}, {"num_experts_per_tok", 0}}) {
    auto c = mix;
    c[field] = value;
    try {
      parse_config(c, "cfg.json");
      ADD_FAILURE() << field << " accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  }
  auto q = base;
  q["mlp_only_layers"] = "all";
  EXPECT_THROW(parse_config(q, "cfg.json"), ConfigError);
}

}  // namespace
