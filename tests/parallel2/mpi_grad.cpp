// Run under mpirun with FLEX_MESH="tp,1,1": for GPT-2, Llama and GPT-NeoX
// built tensor-parallel from the fixture checkpoints, a loss computed on the
// whole logits (identical on every rank) backpropagates to every rank's
// parameter shards with the single-process gradient slices: for every
// parameter, the whole gradient assembled from the ranks' shards (per the
// layout's parameter spec) equals the gradient of the unsharded model, on
// every rank. Replicated parameters (layer norms, learned positions) and
// row-parallel biases (PartialSum: rank 0 holds the bias, the others zeros,
// and each rank's gradient is the whole bias's gradient) must carry the whole
// gradient on every rank, as an optimizer step on each rank needs.
#include <flex/flexcore/flex_model.h>
#include <flex/hooks/errors.h>
#include <flex/models/auto_model.h>
#include <flex/models/parallel_lm.h>
#include <flex/parallel/communicator.h>
#include <flex/parallel/device_mesh.h>
#include <flex/parallel/shard_spec.h>
#include <flex/dispatch/safetensors.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

#include "mesh_env.h"
#include "test_util.h"

namespace {

using parallel2_test::mesh;
using parallel2_test::mesh_shape;

at::Tensor inputs() { return parallel2_test::golden_input_ids(); }

// A fixed, non-trivial function of the logits: next-token cross entropy plus
// a weighted sum, so every logit gets a distinct gradient.
at::Tensor loss_of(const at::Tensor& logits, const at::Tensor& ids) {
  const int64_t t = ids.size(1);
  at::Tensor lp = at::log_softmax(logits.narrow(1, 0, t - 1), -1);
  at::Tensor nll = -lp.gather(-1, ids.narrow(1, 1, t - 1).unsqueeze(-1)).mean();
  at::Tensor w = at::sin(at::arange(logits.numel(), logits.options()) * 0.37).view_as(logits);
  return nll + (logits * w).mean();
}

std::map<std::string, at::Tensor> single_process_gradients(const std::string& fixture, const at::Tensor& ids) {
  auto lm = flex::load_pretrained(flex_test::fixture("models/" + fixture));
  for (auto& p : lm->parameters()) p.set_requires_grad(true);
  loss_of(lm->logits(ids), ids).backward();
  std::map<std::string, at::Tensor> g;
  for (const auto& kv : lm->named_parameters()) g[kv.key()] = kv.value().grad();
  return g;
}

// The whole gradient of every parameter of the parallel model, assembled
// from the ranks' shards per the layout (collective). Replicated and
// PartialSum parameters must have the same (whole) gradient on every rank.
std::map<std::string, at::Tensor> parallel_whole_gradients(flex::ParallelCausalLM& lm, const std::string& what) {
  auto& tp = *mesh().tp_group();
  std::map<std::string, at::Tensor> whole;
  std::map<const void*, std::string> seen;
  for (const auto& kv : lm.named_parameters()) {
    const std::string& name = kv.key();
    const at::Tensor& p = kv.value();
    EXPECT_TRUE(p.grad().defined()) << what << ": no gradient for " << name;
    if (!p.grad().defined() || seen.count(p.unsafeGetTensorImpl())) continue;  // a parallel tie: counted once
    seen[p.unsafeGetTensorImpl()] = name;
    const size_t dot = name.rfind('.');
    auto owner = lm.get_submodule(name.substr(0, dot));
    const flex::ShardSpec spec = lm.layout()->param_spec(*owner, name.substr(dot + 1));
    const at::Tensor g = p.grad().detach().contiguous();
    if (spec.kind == flex::ShardSpec::Kind::Split) {
      whole[name] = flex::all_gather_whole(spec, g, tp);
    } else {
      // Replicated and PartialSum: every rank's gradient is the whole one.
      auto all = tp.all_gather(g);
      for (size_t r = 1; r < all.size(); ++r)
        EXPECT_TRUE(flex_test::close(all[r], all[0], /*rtol=*/0, 1e-6))
            << what << " " << name << " (" << spec.describe() << "): rank " << r << "'s gradient differs from rank 0's";
      whole[name] = g;
    }
  }
  // GPT-2's lm_head and wte are one tensor in the unsharded model, two here.
  for (const auto& group : lm.tied_parameters()) {
    at::Tensor sum;
    for (const auto& n : group)
      if (whole.count(n)) sum = sum.defined() ? sum + whole.at(n) : whole.at(n);
    for (const auto& n : group)
      if (whole.count(n)) whole[n] = sum;
  }
  return whole;
}

void expect_same_gradients(const std::map<std::string, at::Tensor>& expected,
                           const std::map<std::string, at::Tensor>& whole, const std::string& what) {
  size_t compared = 0;
  for (const auto& [name, g] : expected) {
    ASSERT_TRUE(g.defined()) << what << ": the single-process model has no gradient for " << name;
    ASSERT_TRUE(whole.count(name)) << what << ": no parallel gradient for " << name;
    ASSERT_EQ(whole.at(name).sizes(), g.sizes()) << what << " " << name;
    const double scale = g.abs().max().item<double>();
    EXPECT_TRUE(flex_test::close(whole.at(name), g, /*rtol=*/0, 1e-5 * (1.0 + scale)))
        << what << " " << name << ": gradient differs from the single-process one (max |g| " << scale << ")";
    ++compared;
  }
  EXPECT_EQ(compared, expected.size()) << what << ": not every single-process parameter was compared";
  EXPECT_GT(compared, 10u) << what;
}

struct Names {
  std::string mlp, column, row, head, norm;
};

Names names_of(const std::string& fixture) {
  if (fixture == "gpt2")
    return {"transformer.h.0.mlp", "transformer.h.0.mlp.c_fc", "transformer.h.1.mlp.c_proj", "lm_head",
            "transformer.ln_f"};
  if (fixture == "llama")
    return {"model.layers.0.mlp", "model.layers.0.mlp.gate_proj", "model.layers.1.mlp.down_proj", "lm_head",
            "model.norm"};
  return {"gpt_neox.layers.0.mlp", "gpt_neox.layers.0.mlp.dense_h_to_4h", "gpt_neox.layers.1.mlp.dense_4h_to_h",
          "lm_head", "gpt_neox.final_layer_norm"};
}

using HookList = std::vector<std::pair<flex::HookType, flex::HookFunctionPtr>>;

// The same gradient hooks (optionally editing) for the single-process and the parallel model.
HookList gradient_hooks(const std::string& fixture, bool edit, bool has_row_bias) {
  const Names n = names_of(fixture);
  auto hook = [&](const std::string& module, double scale) {
    flex::HookFunctionOptions o;
    if (edit && scale != 1.0)
      o.editing_function = [scale](flex::Module&, const at::Tensor& g, flex::SaveContext&,
                                   flex::TrainableModules&) { return g * scale; };
    return std::make_shared<flex::HookFunction>(module, o);
  };
  HookList h{
      {flex::HookType::FullBackward, hook(n.mlp, 1.0)},
      {flex::HookType::FullBackwardPre, hook(n.mlp, 1.0)},
      {flex::HookType::FullBackward, hook(n.column, 3.0)},     // PartialSum input gradient
      {flex::HookType::FullBackwardPre, hook(n.column, 2.0)},  // split output gradient
      {flex::HookType::FullBackward, hook(n.row, 0.5)},        // split input gradient
      {flex::HookType::FullBackwardPre, hook(n.row, 1.5)},     // gradient of a partial sum
      {flex::HookType::FullBackward, hook(n.head, 1.0)},
      {flex::HookType::FullBackwardPre, hook(n.head, 1.0)},
      {flex::HookType::Tensor, hook(n.column + ".weight", 1.0)},
      {flex::HookType::Tensor, hook(n.row + ".weight", 1.0)},
      {flex::HookType::Tensor, hook(n.norm + ".weight", 1.0)},
  };
  if (has_row_bias) h.push_back({flex::HookType::Tensor, hook(n.row + ".bias", 1.0)});
  return h;
}

void register_all(flex::FlexModel& fm, const HookList& hooks) {
  for (const auto& [type, h] : hooks) {
    switch (type) {
      case flex::HookType::FullBackward: fm.register_full_backward_hook(h); break;
      case flex::HookType::FullBackwardPre: fm.register_full_backward_pre_hook(h); break;
      default: fm.register_hook(h); break;
    }
  }
}

class ParallelGrad : public ::testing::TestWithParam<std::string> {};

TEST_P(ParallelGrad, LossOnLogitsGivesSingleProcessGradientSlices) {
  const auto s = mesh_shape();
  if (s.pp != 1 || s.dp != 1) GTEST_SKIP() << "tensor parallel only";
  const std::string fixture = GetParam();
  const at::Tensor ids = inputs();
  const auto expected = single_process_gradients(fixture, ids);

  auto lm = flex::load_parallel_pretrained(flex_test::fixture("models/" + fixture), mesh());
  flex::FlexModel fm(lm);
  fm.set_mesh(mesh(), lm->layout());
  fm.wrapped_module_requires_grad(true);
  const at::Tensor logits = fm.forward(ids);
  ASSERT_TRUE(logits.requires_grad()) << fixture << ": the parallel logits carry no graph";
  loss_of(logits, ids).backward();
  expect_same_gradients(expected, parallel_whole_gradients(*lm, fixture), fixture);
}

// Backward, backward-pre and tensor hooks under tp see the whole
// single-process gradients (rank 0 keeps them); editing hooks change the
// parameter gradients exactly as in the single process.
TEST_P(ParallelGrad, GradientHooksMatchSingleProcess) {
  const auto s = mesh_shape();
  if (s.pp != 1 || s.dp != 1) GTEST_SKIP() << "tensor parallel only";
  const std::string fixture = GetParam();
  const at::Tensor ids = inputs();
  for (bool edit : {false, true}) {
    const std::string what = fixture + (edit ? " (editing hooks)" : "");
    auto whole_lm = flex::load_pretrained(flex_test::fixture("models/" + fixture));
    const bool row_bias = whole_lm->named_parameters().contains(names_of(fixture).row + ".bias");
    flex::FlexModel single(whole_lm);
    single.wrapped_module_requires_grad(true);
    register_all(single, gradient_hooks(fixture, edit, row_bias));
    loss_of(single.forward(ids), ids).backward();
    std::map<std::string, at::Tensor> expected;
    for (const auto& kv : whole_lm->named_parameters()) expected[kv.key()] = kv.value().grad();

    auto lm = flex::load_parallel_pretrained(flex_test::fixture("models/" + fixture), mesh());
    flex::FlexModel fm(lm);
    fm.set_mesh(mesh(), lm->layout());
    fm.wrapped_module_requires_grad(true);
    register_all(fm, gradient_hooks(fixture, edit, row_bias));
    loss_of(fm.forward(ids), ids).backward();

    if (mesh().rank() == 0) {
      EXPECT_EQ(fm.output().size(), single.output().size()) << what;
      for (const auto& [key, list] : single.output()) {
        auto it = fm.output().find(key);
        ASSERT_TRUE(it != fm.output().end()) << what << ": no capture " << key;
        ASSERT_EQ(it->second.size(), list.size()) << what << " " << key;
        ASSERT_EQ(it->second[0].sizes(), list[0].sizes()) << what << " " << key;
        const double scale = list[0].abs().max().item<double>();
        EXPECT_TRUE(flex_test::close(it->second[0], list[0], /*rtol=*/0, 1e-5 * (1.0 + scale)))
            << what << " capture " << key;
      }
    } else {
      EXPECT_TRUE(fm.output().empty()) << what << ": rank " << mesh().rank() << " kept captures";
    }
    expect_same_gradients(expected, parallel_whole_gradients(*lm, what), what);
  }
}

INSTANTIATE_TEST_SUITE_P(Zoo, ParallelGrad, ::testing::Values("gpt2", "llama", "gpt-neox"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string n = info.param;
                           for (auto& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

}  // namespace
