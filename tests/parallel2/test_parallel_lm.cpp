// Single-process checks of the parallel builds (a 1x1x1 mesh over the local
// communicator): the same code path as under mpirun must reproduce the
// golden logits and captures, and bad input is reported with typed errors.
// The multi-rank cases are mpi_models.cpp (CTest runs them under mpirun).
#include <flex/dispatch/safetensors.h>
#include <flex/flexcore/flex_model.h>
#include <flex/hooks/errors.h>
#include <flex/models/auto_model.h>
#include <flex/models/parallel_lm.h>
#include <flex/parallel/local_communicator.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "mesh_env.h"
#include "test_util.h"

namespace {

flex::DeviceMesh local_mesh() { return flex::DeviceMesh(std::make_shared<flex::LocalCommunicator>(), 1, 1, 1); }

at::Tensor inputs() { return parallel2_test::golden_input_ids(); }

class LocalParallel : public ::testing::TestWithParam<std::string> {};

TEST_P(LocalParallel, LoadedModelMatchesGoldenLogitsAndCaptures) {
  const std::string name = GetParam();
  auto g = flex::SafetensorsFile::open(flex_test::fixture("golden/" + name + ".safetensors"));
  auto mesh = local_mesh();
  auto lm = flex::load_parallel_pretrained(flex_test::fixture("models/" + name), mesh);
  flex::FlexModel fm(lm);
  fm.set_mesh(mesh, lm->layout());
  const std::string mlp = name == "gpt2" ? "transformer.h.1.mlp" : name == "llama" ? "model.layers.1.mlp"
                                                                                    : "gpt_neox.layers.1.mlp";
  fm.register_forward_hook(std::make_shared<flex::HookFunction>(mlp));
  at::Tensor logits = fm.forward(inputs());
  EXPECT_TRUE(flex_test::close(logits, g->get("logits"), /*rtol=*/0, 1e-5));
  ASSERT_EQ(fm.output().at(mlp).size(), 1u);
  EXPECT_TRUE(flex_test::close(fm.output().at(mlp)[0], g->get(mlp), /*rtol=*/0, 1e-5));
}

TEST_P(LocalParallel, ParallelizeSlicesAnUnshardedModel) {
  const std::string name = GetParam();
  auto whole = flex::load_pretrained(flex_test::fixture("models/" + name));
  auto lm = flex::parallelize(*whole, local_mesh());
  at::Tensor ids = inputs();
  EXPECT_TRUE(flex_test::close(lm->logits(ids), whole->logits(ids), /*rtol=*/0, 1e-6));
}

INSTANTIATE_TEST_SUITE_P(Zoo, LocalParallel, ::testing::Values("gpt2", "llama", "gpt-neox"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

TEST(LocalParallelErrors, WrongSliceShapeNamesTheParameter) {
  auto cfg = flex::load_config(flex_test::fixture("models/gpt2"));
  auto lm = flex::build_parallel_causal_lm(cfg, local_mesh());
  try {
    lm->load_slices([](const std::string&) { return at::zeros({3, 5}); });
    FAIL() << "wrong shapes were accepted";
  } catch (const flex::ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("transformer."), std::string::npos) << e.what();
  }
}

TEST(LocalParallelErrors, KVCacheAndBadInputsAreRejected) {
  auto lm = flex::load_parallel_pretrained(flex_test::fixture("models/gpt2"), local_mesh());
  EXPECT_THROW(lm->logits(at::zeros({8}, at::kLong)), flex::ShapeError);
  flex::Inputs in;
  in.set("input_ids", inputs());
  in.set("past_key_values", flex::Value(std::string("cache")));
  EXPECT_THROW((*lm)(in), flex::UnsupportedError);
}

TEST(LocalParallelErrors, UnknownArchitectureIsUnsupported) {
  auto cfg = flex::load_config(flex_test::fixture("models/gpt2"));
  cfg.model_type = "bert";
  EXPECT_THROW(flex::build_parallel_causal_lm(cfg, local_mesh()), flex::Error);
}

}  // namespace
