// Run under mpirun with FLEX_MESH="tp,pp,dp": the model zoo III checkpoints
// of tests/data/golden5 (Gemma 3 text and multimodal, Qwen3-MoE, gpt-oss plain
// and MXFP4, OLMo 3, DeepSeek-V3 with and without q-LoRA and FP8 blocks,
// DeepSeek-V2 greedy and grouped) built in parallel: on rank 0 the logits of a
// left-padded batch and every golden capture (blocks, attention, MLP, router
// logits, the MLA latent) equal Transformers 5.23's, and parameters split over
// tp (gpt-oss's sinks and experts, MLA's per-head projections) gather whole.
#include <flex/dispatch/checkpoint.h>
#include <flex/flexcore/flex_model.h>
#include <flex/models/model_checkpoint.h>
#include <flex/models/parallel_lm.h>

#include <gtest/gtest.h>

#include "../models/golden_util.h"
#include "mesh_env.h"

namespace {

using models_test::golden5;
using models_test::kept;
using parallel2_test::mesh;

class ParallelZoo3 : public ::testing::TestWithParam<std::string> {};

TEST_P(ParallelZoo3, LogitsAndCapturesMatchTransformers5) {
  const std::string name = GetParam();
  const auto info = models_test::read_json(golden5("manifest_zoo3.json"))["cases"][name];
  const bool renamed = info.contains("causal_lm_names");
  auto ours = [&](const std::string& n) { return renamed ? info["causal_lm_names"][n].get<std::string>() : n; };
  auto lm = flex::load_parallel_pretrained(golden5(name), mesh());
  flex::FlexModel fm(lm);
  fm.set_mesh(mesh(), lm->layout());
  std::vector<std::string> names;
  for (const char* group : {"captured", "captured_submodules", "routers"})
    if (info.contains(group))
      for (const auto& n : info[group]) names.push_back(n);
  for (const auto& n : names) fm.register_forward_hook(std::make_shared<flex::HookFunction>(ours(n)));

  auto gt = flex::SafetensorsFile::open(golden5(name + ".golden.safetensors"));
  const at::Tensor mask = gt->get("attention_mask");
  flex::Inputs in;
  in.set("input_ids", gt->get("input_ids"));
  in.set("attention_mask", mask);
  const at::Tensor logits = fm.forward(std::move(in)).toTupleRef().elements()[0].toTensor();

  // Split parameters gather whole (collective: every rank asks).
  const auto ckpt = flex::open_model_checkpoint(golden5(name), lm->config());
  std::vector<std::string> params;
  if (name.rfind("gpt_oss", 0) == 0)
    params = {"model.layers.0.self_attn.sinks", "model.layers.1.mlp.experts.gate_up_proj",
              "model.layers.1.mlp.experts.down_proj_bias"};
  if (name == "deepseek_v3" || name == "deepseek_v2_group")
    params = {"model.layers.1.self_attn.q_b_proj.weight", "model.layers.1.self_attn.kv_b_proj.weight",
              "model.layers.2.mlp.experts.3.down_proj.weight", "model.layers.2.mlp.gate.e_score_correction_bias"};
  if (name == "deepseek_v2_group") params.pop_back();  // V2's router has no correction bias
  for (const auto& p : params) {
    const at::Tensor w = fm.get_module_parameter(p);
    if (mesh().rank() == 0) {
      EXPECT_TRUE(models_test::close(w, ckpt.get(p), name + " parameter " + p, 0.0, 0.0));
    }
  }
  if (mesh().rank() != 0) return;

  EXPECT_TRUE(models_test::close(kept(logits, mask), kept(gt->get("logits"), mask), name + " logits", 2e-5));
  const int64_t b = mask.size(0), t = mask.size(1);
  for (const auto& n : names) {
    auto it = fm.output().find(ours(n));
    ASSERT_TRUE(it != fm.output().end()) << name << ": no capture of " << n;
    at::Tensor got = it->second.at(0);
    if (got.dim() == 2) got = got.reshape({b, t, -1});  // router logits [B*T, E]
    EXPECT_TRUE(models_test::close(kept(got, mask), kept(gt->get("out." + n), mask), name + " " + n, 2e-5));
  }
}

INSTANTIATE_TEST_SUITE_P(Transformers5, ParallelZoo3,
                         ::testing::ValuesIn(models_test::golden5_cases("manifest_zoo3.json")),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
