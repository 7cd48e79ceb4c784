// Run under mpirun with FLEX_MESH="tp,pp,dp" (tp*pp*dp = world size): for
// GPT-2, Llama and GPT-NeoX built in parallel from the fixture checkpoints,
// rank 0's logits and captures equal the single-process golden results
// (made by Transformers), edits give the single-process edited logits, and
// get_module_parameter returns whole parameters (compared with the
// checkpoint). Hooks registered differently on one rank are reported.
#include <flex/dispatch/checkpoint.h>
#include <flex/dispatch/safetensors.h>
#include <flex/flexcore/flex_model.h>
#include <flex/flexcore/hook_names.h>
#include <flex/flexcore/routing_edits.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/shape_text.h>
#include <flex/models/auto_model.h>
#include <flex/models/from_pretrained.h>
#include <flex/models/model_checkpoint.h>
#include <flex/models/parallel_lm.h>
#include <flex/parallel/communicator.h>
#include <flex/parallel/device_mesh.h>
#include <flex/sae/tl_hook_names.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "../models/golden_util.h"
#include "mesh_env.h"
#include "test_util.h"

namespace {

using parallel2_test::mesh;
using parallel2_test::mesh_shape;

bool rank0() { return mesh().rank() == 0; }

std::shared_ptr<models_test::GoldenTensors> golden(const std::string& model) { return models_test::golden_tensors(model); }

at::Tensor inputs() { return parallel2_test::golden_input_ids(); }

// Modules in Transformers' execution order (golden json), minus the root and
// the base model, which the parallel forward does not call as a whole.
std::vector<std::string> hooked_modules(const std::string& model, const std::string& base) {
  const auto j = models_test::golden_json(model);
  std::vector<std::string> out;
  for (const auto& m : j["modules_in_execution_order"]) {
    const std::string name = m["name"];
    // (Modules whose outputs the golden does not hold, Mixtral's model.rotary_emb, left out.)
    if (!name.empty() && name != base && !m["saved"].empty()) out.push_back(name);
  }
  return out;
}

// 2e-5: tensor parallelism adds row-parallel partial sums across ranks, an
// order the single-process golden did not use; GPT-2's logits land at 1.01e-5
// from it on some runs (seen on an AVX-512 machine, all cases in one process).
::testing::AssertionResult close(const at::Tensor& a, const at::Tensor& e, const std::string& what,
                                 double atol = 2e-5) {
  // In float64 whatever the dtypes; empty tensors (an expert that saw no rows) are close.
  auto f64 = [](const at::Tensor& t) { return t.defined() ? t.to(at::kDouble) : t; };
  ::testing::AssertionResult r = flex_test::close(f64(a), f64(e), /*rtol=*/0, atol);
  if (r) return r;
  return ::testing::AssertionFailure() << what << ": " << r.message();
}

struct Arch {
  std::string fixture, base, attn, mlp, qkv, embed, head, act, row;
};

const std::vector<Arch>& archs() {
  static const std::vector<Arch> a{
      {"gpt2", "transformer", "transformer.h.1.attn", "transformer.h.0.mlp", "transformer.h.0.attn.c_attn",
       "transformer.wte", "lm_head", "transformer.h.1.mlp.act", "transformer.h.1.attn.c_proj"},
      {"llama", "model", "model.layers.1.self_attn", "model.layers.0.mlp", "model.layers.0.self_attn.k_proj",
       "model.embed_tokens", "lm_head", "model.layers.1.mlp.act_fn", "model.layers.1.mlp.down_proj"},
      {"gpt-neox", "gpt_neox", "gpt_neox.layers.1.attention", "gpt_neox.layers.0.mlp",
       "gpt_neox.layers.0.attention.query_key_value", "gpt_neox.embed_in", "lm_head", "gpt_neox.layers.1.mlp.act",
       "gpt_neox.layers.1.attention.dense"},
  };
  return a;
}

std::shared_ptr<flex::ParallelCausalLM> load(const Arch& a) {
  return flex::load_parallel_pretrained(flex_test::fixture("models/" + a.fixture), mesh());
}

class ParallelModels : public ::testing::TestWithParam<size_t> {};

TEST_P(ParallelModels, LogitsAndEveryCaptureMatchGolden) {
  const Arch& a = archs()[GetParam()];
  auto lm = load(a);
  flex::FlexModel fm(lm);
  fm.set_mesh(mesh(), lm->layout());
  const auto names = hooked_modules(a.fixture, a.base);
  for (const auto& n : names) fm.register_forward_hook(std::make_shared<flex::HookFunction>(n));
  at::Tensor logits = fm.forward(inputs());
  if (!rank0()) {
    EXPECT_TRUE(fm.output().empty()) << "only rank 0 keeps captures";
    return;
  }
  auto g = golden(a.fixture);
  EXPECT_TRUE(close(logits, g->get("logits"), a.fixture + " logits"));
  for (const auto& n : names) {
    auto it = fm.output().find(n);
    ASSERT_TRUE(it != fm.output().end()) << a.fixture << ": no capture of " << n;
    ASSERT_EQ(it->second.size(), 1u) << n;
    EXPECT_TRUE(close(it->second[0], g->get(n), a.fixture + " " + n));
  }
  EXPECT_EQ(fm.output().size(), names.size());
}

// Position-dependent edits, so a piece put back in the wrong place shows.
flex::EditFn ramp_edit(double scale) {
  return [scale](flex::Module&, const at::Tensor& x, flex::SaveContext&, flex::TrainableModules&) {
    at::Tensor ramp = at::arange(x.numel(), x.options()).view(x.sizes()) / static_cast<double>(x.numel());
    return x * (1.0 + scale * ramp) + scale * ramp;
  };
}

void add_edits(flex::FlexModel& fm, const Arch& a) {
  // Fused QKV, a column-split activation, a row-parallel partial sum, the
  // vocab-parallel embedding, whole attention/MLP outputs, and per-head hook
  // points split along dims 1 and 2.
  for (const auto& n : {a.qkv, a.act, a.row, a.embed, a.attn, a.mlp, a.attn + ".hook_attn_probs",
                        a.attn + ".hook_head_out"}) {
    flex::HookFunctionOptions o;
    o.editing_function = ramp_edit(0.25);
    fm.register_forward_hook(std::make_shared<flex::HookFunction>(n, o));
  }
}

TEST_P(ParallelModels, EditsGiveSingleProcessEditedLogits) {
  const Arch& a = archs()[GetParam()];
  at::Tensor expected;
  if (rank0()) {
    auto whole = flex::load_pretrained(flex_test::fixture("models/" + a.fixture));
    flex::FlexModel single(whole);
    add_edits(single, a);
    expected = single.forward(inputs());
    // The edits matter: the edited logits are far from the plain ones.
    ASSERT_GT((expected - golden(a.fixture)->get("logits")).abs().max().item<double>(), 1e-2);
  }
  auto lm = load(a);
  flex::FlexModel fm(lm);
  fm.set_mesh(mesh(), lm->layout());
  add_edits(fm, a);
  at::Tensor logits = fm.forward(inputs());
  if (rank0()) {
    EXPECT_TRUE(close(logits, expected, a.fixture + " edited logits"));
  }
}

// `names` captured by forward hooks over the mesh and, on rank 0, in one
// process on the unsharded fixture: {single process, mesh} (empty off rank 0).
std::pair<flex::OutputMap, flex::OutputMap> capture_single_and_mesh(const Arch& a,
                                                                    const std::vector<std::string>& names) {
  flex::OutputMap single_out;
  if (rank0()) {
    flex::FlexModel single(flex::load_pretrained(flex_test::fixture("models/" + a.fixture)));
    for (const auto& n : names) single.register_forward_hook(std::make_shared<flex::HookFunction>(n));
    single.forward(inputs());
    single_out = single.output();
  }
  auto lm = load(a);
  flex::FlexModel fm(lm);
  fm.set_mesh(mesh(), lm->layout());
  for (const auto& n : names) fm.register_forward_hook(std::make_shared<flex::HookFunction>(n));
  fm.forward(inputs());
  return {single_out, rank0() ? fm.output() : flex::OutputMap()};
}

// The largest difference and where, printed even when within tolerance (the
// margin the note reports).
void print_largest_difference(const std::string& what, const at::Tensor& g, const at::Tensor& e) {
  if (!g.defined() || g.sizes() != e.sizes()) return;
  const at::Tensor d = (g.to(at::kDouble) - e.to(at::kDouble)).abs().flatten();
  const int64_t i = d.argmax().item<int64_t>();
  std::printf("%s: largest |diff| %.3g at flat index %lld of %s\n", what.c_str(), d[i].item<double>(),
              static_cast<long long>(i), flex::shape_text(g.sizes()).c_str());
}

// Hook points are not in the golden files: compare with an unsharded model
// captured in this program on rank 0.
TEST_P(ParallelModels, HookPointsMatchSingleProcess) {
  const Arch& a = archs()[GetParam()];
  const std::string block = a.attn.substr(0, a.attn.rfind('.'));
  const std::vector<std::string> names{a.attn + ".hook_attn_probs", a.attn + ".hook_head_out",
                                       block + ".hook_resid_pre", block + ".hook_resid_post"};
  const auto [expected, got] = capture_single_and_mesh(a, names);
  if (!rank0()) return;
  for (const auto& n : names) {
    ASSERT_EQ(got.count(n), 1u) << n;
    EXPECT_TRUE(close(got.at(n).at(0), expected.at(n).at(0), a.fixture + " " + n));
  }
}

// TransformerLens names of a module's whole output or input (decision 38) over
// the mesh: each capture equals the single-process capture of the module (or
// module input) the name stands for, and, independently of the name mapping,
// block 1's resid_post / resid_pre equal that block's output / input.
// Block 1 is on the second stage with pp=2; resid_pre is routed as the
// block's input, though registered (and captured) as a forward hook.
TEST_P(ParallelModels, TransformerLensNamesMatchSingleProcess) {
  const Arch& a = archs()[GetParam()];
  flex::install_transformer_lens_names();
  const std::string block1 = a.attn.substr(0, a.attn.rfind('.'));
  std::vector<std::string> names{"blocks.1.hook_resid_post", "blocks.1.hook_resid_pre", "blocks.0.hook_mlp_out",
                                 "blocks.0.hook_attn_out", "hook_embed"};
  if (a.fixture != "gpt-neox") names.push_back("blocks.0.hook_resid_mid");  // (NeoX's parallel residual has none)
  std::map<std::string, at::Tensor> expected;
  at::Tensor block_out, block_in;
  if (rank0()) {
    auto single_lm = flex::load_pretrained(flex_test::fixture("models/" + a.fixture));
    flex::FlexModel single(single_lm);
    std::map<std::string, std::string> key_of;
    for (const auto& n : names) {
      const flex::HookPointRef at = flex::resolve_hook_name(*single_lm, n);
      ASSERT_FALSE(flex::has_view(at)) << n;
      auto h = std::make_shared<flex::HookFunction>(at.module);
      if (at.input) {
        single.register_forward_pre_hook(h);
      } else if (!single.output().count(at.module)) {
        single.register_forward_hook(h);
      }
      key_of[n] = at.module + (at.input ? "#input" : "");
    }
    single.forward(inputs());
    for (const auto& n : names) expected[n] = single.output().at(key_of.at(n)).at(0);
    flex::FlexModel plain(flex::load_pretrained(flex_test::fixture("models/" + a.fixture)));
    plain.register_forward_hook(std::make_shared<flex::HookFunction>(block1));
    plain.register_forward_pre_hook(std::make_shared<flex::HookFunction>(block1));
    plain.forward(inputs());
    block_out = plain.output().at(block1).at(0);
    block_in = plain.output().at(block1 + "#input").at(0);
  }
  auto lm = load(a);
  flex::FlexModel fm(lm);
  fm.set_mesh(mesh(), lm->layout());
  for (const auto& n : names) fm.register_forward_hook(std::make_shared<flex::HookFunction>(n));
  fm.forward(inputs());
  if (!rank0()) return;
  auto got = [&](const std::string& n) {
    EXPECT_EQ(fm.output().count(n), 1u) << n << " not captured under its name";
    return fm.output().count(n) ? fm.output().at(n).at(0) : at::Tensor();
  };
  for (const auto& n : names) {
    const at::Tensor g = got(n);
    EXPECT_TRUE(close(g, expected.at(n), a.fixture + " " + n));
    print_largest_difference(a.fixture + " " + n, g, expected.at(n));
  }
  EXPECT_TRUE(close(got("blocks.1.hook_resid_post"), block_out, a.fixture + " resid_post vs " + block1 + " output"));
  EXPECT_TRUE(close(got("blocks.1.hook_resid_pre"), block_in, a.fixture + " resid_pre vs " + block1 + " input"));
}

// The routing of an alias of a module's input, where the input and output are
// sharded differently (TransformerLens's input places, block and norm inputs,
// are sharded like their outputs): a name resolved to the row-parallel
// projection's input is gathered as that input (split by columns over tp),
// not as its output (a partial sum), and equals the single-process input.
TEST_P(ParallelModels, AliasOfAModuleInputIsGatheredAsThatInput) {
  const Arch& a = archs()[GetParam()];
  const std::string alias = "input_of." + a.row;
  flex::set_hook_name_resolver([alias, row = a.row](flex::Module&, const std::string& name) -> std::optional<flex::HookPlace> {
    if (name != alias) return std::nullopt;
    flex::HookPlace p;
    p.module = row;
    p.input = true;
    return p;
  });
  at::Tensor expected;
  if (rank0()) {
    flex::FlexModel single(flex::load_pretrained(flex_test::fixture("models/" + a.fixture)));
    single.register_forward_pre_hook(std::make_shared<flex::HookFunction>(a.row));
    single.forward(inputs());
    expected = single.output().at(a.row + "#input").at(0);
  }
  auto lm = load(a);
  flex::FlexModel fm(lm);
  fm.set_mesh(mesh(), lm->layout());
  fm.register_forward_hook(std::make_shared<flex::HookFunction>(alias));
  fm.forward(inputs());
  flex::set_hook_name_resolver(nullptr);
  if (!rank0()) return;
  ASSERT_EQ(fm.output().count(alias), 1u) << alias << " not captured under its name";
  EXPECT_TRUE(close(fm.output().at(alias).at(0), expected, a.fixture + " " + alias));
}

// A name standing for a view of a module's value (a norm's normalised input,
// q/k/v split by heads, GPT-2's taken from its fused [q | k | v]) under a mesh:
// the view is taken of the gathered whole value, so the capture equals the
// single-process capture of the same name (a view of one rank's shard would
// split the wrong heads and normalise over part of the width).
TEST_P(ParallelModels, TransformerLensViewNamesMatchSingleProcess) {
  const Arch& a = archs()[GetParam()];
  flex::install_transformer_lens_names();
  std::vector<std::string> names{"blocks.0.ln1.hook_normalized", "blocks.1.ln2.hook_normalized"};
  if (a.fixture != "gpt-neox")
    for (const char* n : {"blocks.0.attn.hook_q", "blocks.1.attn.hook_k", "blocks.1.attn.hook_v"}) names.push_back(n);
  const auto [expected, got] = capture_single_and_mesh(a, names);
  if (!rank0()) return;
  for (const auto& n : names) {
    ASSERT_EQ(got.count(n), 1u) << n << " not captured under its name";
    const at::Tensor g = got.at(n).at(0);
    const at::Tensor e = expected.at(n).at(0);
    EXPECT_TRUE(close(g, e, a.fixture + " " + n + " under " + mesh().describe()));
    print_largest_difference(a.fixture + " " + n, g, e);
  }
}

// An edit of a view under a mesh goes back into the whole value before the
// scatter: the logits and the edited capture equal one process's. (A read-only
// view's edit throws in the forward, as in one process; an editing function
// that returns its input unchanged, as a trace's does, is allowed.)
TEST_P(ParallelModels, TransformerLensViewEditMatchesSingleProcess) {
  const Arch& a = archs()[GetParam()];
  if (a.fixture == "gpt-neox") GTEST_SKIP() << "GPT-NeoX has no attn.hook_v";
  flex::install_transformer_lens_names();
  const std::string name = "blocks.0.attn.hook_v";
  flex::HookFunctionOptions edit;
  edit.editing_function = ramp_edit(0.5);
  edit.save_after_edit = true;
  at::Tensor expected_logits;
  flex::OutputMap expected;
  if (rank0()) {
    flex::FlexModel single(flex::load_pretrained(flex_test::fixture("models/" + a.fixture)));
    single.register_forward_hook(std::make_shared<flex::HookFunction>(name, edit));
    expected_logits = single.forward(inputs());
    expected = single.output();
  }
  auto lm = load(a);
  flex::FlexModel fm(lm);
  fm.set_mesh(mesh(), lm->layout());
  fm.register_forward_hook(std::make_shared<flex::HookFunction>(name, edit));
  at::Tensor logits = fm.forward(inputs());
  if (!rank0()) return;
  EXPECT_TRUE(close(logits, expected_logits, a.fixture + " logits with " + name + " edited"));
  EXPECT_TRUE(close(fm.output().at(name).at(0), expected.at(name).at(0), a.fixture + " edited " + name));
}

// What stays refused under a mesh is what one process refuses too: GPT-NeoX's
// q, k and v come from one fused per-head projection, so it has no hook_q.
TEST_P(ParallelModels, TransformerLensFusedQkvIsRefusedUnderAMesh) {
  const Arch& a = archs()[GetParam()];
  if (a.fixture != "gpt-neox") GTEST_SKIP() << a.fixture << " has separate or equal-part q/k/v";
  flex::install_transformer_lens_names();
  auto lm = load(a);
  flex::FlexModel fm(lm);
  fm.set_mesh(mesh(), lm->layout());
  try {
    fm.register_forward_hook(std::make_shared<flex::HookFunction>("blocks.0.attn.hook_q"));
    ADD_FAILURE() << "blocks.0.attn.hook_q was accepted under " << mesh().describe();
  } catch (const flex::UnsupportedError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("blocks.0.attn.hook_q"), std::string::npos) << msg;
    EXPECT_NE(msg.find("fused projection"), std::string::npos) << msg;
  }
}

// Three rows: with dp=2 the ranks get 2 and 1 (array_split), so gathers
// concatenate pieces of different sizes and an edit's rows go back unevenly.
TEST_P(ParallelModels, UnevenBatchMatchesSingleProcess) {
  const Arch& a = archs()[GetParam()];
  at::Tensor ids = at::cat({inputs(), inputs().narrow(0, 0, 1).flip(1)}, 0);
  flex::HookFunctionOptions edit;
  edit.editing_function = ramp_edit(0.5);
  at::Tensor expected_logits;
  flex::OutputMap expected;
  if (rank0()) {
    flex::FlexModel single(flex::load_pretrained(flex_test::fixture("models/" + a.fixture)));
    single.register_forward_hook(std::make_shared<flex::HookFunction>(a.qkv, edit));
    single.register_forward_hook(std::make_shared<flex::HookFunction>(a.mlp));
    expected_logits = single.forward(ids);
    expected = single.output();
  }
  auto lm = load(a);
  flex::FlexModel fm(lm);
  fm.set_mesh(mesh(), lm->layout());
  fm.register_forward_hook(std::make_shared<flex::HookFunction>(a.qkv, edit));
  fm.register_forward_hook(std::make_shared<flex::HookFunction>(a.mlp));
  at::Tensor logits = fm.forward(ids);
  if (!rank0()) return;
  EXPECT_TRUE(close(logits, expected_logits, a.fixture + " logits of 3 rows"));
  for (const auto& n : {a.qkv, a.mlp})
    EXPECT_TRUE(close(fm.output().at(n).at(0), expected.at(n).at(0), a.fixture + " " + n + " of 3 rows"));
}

TEST_P(ParallelModels, GetModuleParameterIsWhole) {
  const Arch& a = archs()[GetParam()];
  auto lm = load(a);
  flex::FlexModel fm(lm);
  fm.set_mesh(mesh(), lm->layout());
  const std::string dir = flex_test::fixture("models/" + a.fixture);
  auto ckpt = flex::open_model_checkpoint(dir, flex::load_config(dir));  // under the model's names
  // Fused/column, row and vocab-split weights, row biases (held by rank 0
  // only), replicated norms, and the output head.
  std::vector<std::string> params{a.qkv + ".weight", a.row + ".weight", a.embed + ".weight"};
  if (a.fixture == "gpt2") {
    params.push_back("transformer.h.0.attn.c_attn.bias");
    params.push_back("transformer.h.1.attn.c_proj.bias");
    params.push_back("transformer.h.1.ln_2.weight");
  } else if (a.fixture == "gpt-neox") {
    params.push_back("gpt_neox.layers.0.attention.query_key_value.bias");
    params.push_back("gpt_neox.layers.1.attention.dense.bias");
    params.push_back("lm_head.weight");
  } else {
    params.push_back("lm_head.weight");
    params.push_back("model.layers.1.mlp.up_proj.weight");
  }
  for (const auto& p : params) {
    at::Tensor w = fm.get_module_parameter(p);
    if (rank0()) {
      EXPECT_TRUE(close(w, ckpt.get(p), a.fixture + " parameter " + p, 0.0));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Zoo, ParallelModels, ::testing::Values(0, 1, 2),
                         [](const auto& info) {
                           std::string n = archs()[info.param].fixture;
                           for (auto& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

TEST(ParallelBuild, ConfigsThatCannotBeSplitAreRejected) {
  auto cfg = flex::load_config(flex_test::fixture("models/gpt2"));
  if (mesh().tp_size() > 1) {
    // Uneven heads split (checked against golden in tools_cli_parallel at tp=3);
    // fewer heads than ranks cannot.
    auto few = cfg;
    few.num_attention_heads = few.num_key_value_heads = 1;
    try {
      flex::build_parallel_causal_lm(few, mesh());
      ADD_FAILURE() << "1 head was split over tp=" << mesh().tp_size();
    } catch (const flex::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("1 attention heads"), std::string::npos) << e.what();
    }
  }
  if (mesh().pp_size() > 1) {
    auto shallow = cfg;
    shallow.num_hidden_layers = 1;
    EXPECT_THROW(flex::build_parallel_causal_lm(shallow, mesh()), flex::ConfigError);
  }
}

TEST(ParallelRouter, HooksThatDifferAcrossRanksAreReported) {
  const Arch& a = archs()[0];
  auto lm = load(a);
  flex::FlexModel fm(lm);
  fm.set_mesh(mesh(), lm->layout());
  fm.register_forward_hook(std::make_shared<flex::HookFunction>(a.mlp));
  const int odd = mesh().comm()->size() - 1;
  flex::HookHandle extra;
  if (mesh().rank() == odd) extra = fm.register_forward_hook(std::make_shared<flex::HookFunction>(a.attn));
  try {
    fm.forward(inputs());
    ADD_FAILURE() << "a forward with different hooks on rank " << odd << " ran";
  } catch (const flex::ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("rank " + std::to_string(odd) + " differs"), std::string::npos) << msg;
    EXPECT_NE(msg.find(a.attn), std::string::npos) << msg;
  }
  // Once the hooks agree again the model runs.
  if (mesh().rank() == odd) extra.remove();
  fm.clear();
  at::Tensor logits = fm.forward(inputs());
  if (rank0()) {
    EXPECT_TRUE(close(logits, golden(a.fixture)->get("logits"), "logits after the mismatch"));
    EXPECT_TRUE(close(fm.output().at(a.mlp).at(0), golden(a.fixture)->get(a.mlp), a.mlp));
  }
}

// Mixture of experts over the mesh: experts split over tp (the router
// replicated, so every rank routes alike), layers over pp, the batch over dp.
// Routing edits give the single-process edited logits; expert rows and their
// token indices arrive whole on rank 0 in single-process order (over dp the
// ranks' rows are merged by choice slot, then token).
void add_routing_edits(flex::FlexModel& fm, const std::string& block0, const std::string& block1) {
  auto edit = [&](const std::string& name, flex::EditFn fn) {
    flex::HookFunctionOptions o;
    o.editing_function = std::move(fn);
    fm.register_forward_hook(std::make_shared<flex::HookFunction>(name, o));
  };
  edit(block0 + ".gate", flex::ban_experts({1}));  // expert 1 of layer 0 then runs on no rows
  edit(block1 + ".hook_selected_experts", flex::force_experts({2, 0}, {0, 5, 9, 15}));
  edit(block1 + ".experts.3", flex::scale_output(2.5));
}

std::shared_ptr<flex::ParallelCausalLM> load_moe(const std::string& model, bool expert_parallel) {
  flex::ParallelLMOptions o;
  o.expert_parallel = expert_parallel;
  return flex::load_parallel_pretrained(flex_test::fixture("models/" + model), mesh(), o);
}

// Tensor parallel (every expert split) and expert parallel (whole experts
// per tp rank): router logits, every expert's rows and its projections, the
// block outputs and the logits equal Transformers' golden captures.
TEST(ParallelMoe, EveryCaptureMatchesGoldenWithExpertsSplitOrWhole) {
  for (const std::string model : {"mixtral", "qwen2_moe"}) {
    for (const bool ep : {false, true}) {
      const std::string what = model + (ep ? " (expert parallel)" : " (experts split)");
      auto lm = load_moe(model, ep);
      flex::FlexModel fm(lm);
      fm.set_mesh(mesh(), lm->layout());
      const auto names = hooked_modules(model, "model");
      for (const auto& n : names) fm.register_forward_hook(std::make_shared<flex::HookFunction>(n));
      at::Tensor logits = fm.forward(inputs());
      // Gathered parameters are whole: an expert's projections, the router.
      const std::string sparse = "mlp";
      const std::string down = model == "mixtral" ? ".w2" : ".down_proj";
      // Expert parallel: expert 3 of 4 lives on the last tp rank only.
      const std::string e3 = "model.layers.1." + sparse + ".experts.3" + down + ".weight";
      if (ep && mesh().tp_size() > 1 && mesh().tp_rank() == 0 && lm->owns_parameter(e3)) {
        EXPECT_EQ(flex::get_module_tensor(*lm, e3).numel(), 0) << what << ": expert 3 held on tp rank 0";
      }
      if (!ep && mesh().tp_size() > 1 && lm->owns_parameter(e3)) {
        EXPECT_GT(flex::get_module_tensor(*lm, e3).numel(), 0) << what << ": every rank holds a slice of expert 3";
      }
      const std::string dir = flex_test::fixture("models/" + model);
      auto ckpt = flex::open_model_checkpoint(dir, flex::load_config(dir));  // under the model's names
      for (const std::string& p : {"model.layers.1." + sparse + ".experts.3" + down + ".weight",
                                  "model.layers.0." + sparse + ".experts.0" + down + ".weight",
                                  "model.layers.0." + sparse + ".gate.weight"}) {
        at::Tensor w = fm.get_module_parameter(p);
        if (rank0()) {
          EXPECT_TRUE(close(w, ckpt.get(p), what + " parameter " + p, 0.0));
        }
      }
      if (!rank0()) continue;
      auto g = golden(model);
      EXPECT_TRUE(close(logits, g->get("logits"), what + " logits"));
      for (const auto& n : names) {
        auto it = fm.output().find(n);
        ASSERT_TRUE(it != fm.output().end()) << what << ": no capture of " << n;
        EXPECT_TRUE(close(it->second.at(0), g->get(n), what + " " + n));
      }
    }
  }
}

TEST(ParallelMoe, RoutingEditsAndExpertRowsMatchSingleProcess) {
  for (const std::string model : {"mixtral", "qwen2_moe"}) {
    const std::string sparse = "mlp";
    const std::string b0 = "model.layers.0." + sparse, b1 = "model.layers.1." + sparse;
    const std::vector<std::string> captured{b0 + ".experts.1", b0 + ".experts.2", b1 + ".experts.0", b1 + ".experts.3",
                                            b1};
    flex::OutputMap expected_out;
    at::Tensor expected;
    if (rank0()) {
      auto whole = flex::load_pretrained(flex_test::fixture("models/" + model));
      flex::FlexModel single(whole);
      add_routing_edits(single, b0, b1);
      for (const auto& n : captured) single.register_forward_hook(std::make_shared<flex::HookFunction>(n));
      expected = single.forward(inputs());
      ASSERT_GT((expected - golden(model)->get("logits")).abs().max().item<double>(), 1e-2) << model;
      expected_out = single.output();
      ASSERT_EQ(expected_out.at(b0 + ".experts.1").at(0).size(0), 0) << "the banned expert saw rows";
    }
    for (const bool ep : {false, true}) {
      const std::string what = model + (ep ? " (expert parallel)" : " (experts split)");
      auto lm = load_moe(model, ep);
      flex::FlexModel fm(lm);
      fm.set_mesh(mesh(), lm->layout());
      add_routing_edits(fm, b0, b1);
      for (const auto& n : captured) fm.register_forward_hook(std::make_shared<flex::HookFunction>(n));
      at::Tensor logits = fm.forward(inputs());
      if (!rank0()) continue;
      EXPECT_TRUE(close(logits, expected, what + " edited logits"));
      for (const auto& n : captured) {
        EXPECT_TRUE(close(fm.output().at(n).at(0), expected_out.at(n).at(0), what + " " + n));
        if (n == b1) continue;
        EXPECT_TRUE(
            flex_test::equal(fm.output().at(n + "#token_index").at(0), expected_out.at(n + "#token_index").at(0)))
            << what << " " << n;
      }
    }
  }
}

TEST(ParallelMoe, ExpertParallelismNeedsExperts) {
  flex::ParallelLMOptions o;
  o.expert_parallel = true;
  EXPECT_THROW(flex::load_parallel_pretrained(flex_test::fixture("models/llama"), mesh(), o), flex::ConfigError);
}


// Quantized shards: each rank quantizes its slices after loading. A
// column-parallel projection holds whole rows, so its row-wise (int8) and
// 64-wide-block (nf4, 64-wide fixture rows) quantization is the
// single-process one: the gathered dequantized weight is equal. Row-parallel
// slices are quantized per rank, so the logits are held to the quantization
// bound of the single-process test (tests/quant) instead.
TEST(ParallelQuant, QuantizedShardsMatchSingleProcessQuantization) {
  for (const std::string method : {"int8", "nf4"}) {
    flex::ParallelLMOptions o;
    o.quantization = flex::quantization_from_string(method);
    auto lm = flex::load_parallel_pretrained(flex_test::fixture("models/llama"), mesh(), o);
    flex::FlexModel fm(lm);
    fm.set_mesh(mesh(), lm->layout());
    const std::string q = "model.layers.1.self_attn.q_proj.weight";
    at::Tensor w = fm.get_module_parameter(q);
    at::Tensor logits = fm.forward(inputs());
    if (!rank0()) continue;
    flex::PretrainedOptions po;
    po.quantization = o.quantization;
    auto single = flex::from_pretrained(flex_test::fixture("models/llama"), po);
    flex::FlexModel fs(single);
    EXPECT_TRUE(close(w, fs.get_module_parameter(q), method + " " + q, 0.0));
    const at::Tensor gold = golden("llama")->get("logits");
    const double bound = (method == "int8" ? 0.04 : 0.6) * gold.abs().max().item<double>();
    EXPECT_TRUE(close(logits, gold, method + " logits from quantized shards", bound));
  }
}

}  // namespace
