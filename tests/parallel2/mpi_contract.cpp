// Run under mpirun with FLEX_MESH="tp,pp,dp": the hook contract
// (tests/models/contract_check.h) in the parallel layouts. Every case of
// tests/data/contract is built over the mesh, every module Transformers 5.23
// has is hooked on every rank, and on rank 0 each gathered capture of the
// left-padded batch has Transformers' shape and values, as in one process
// (tests/models/test_module_contract.cpp).
#include <flex/hooks/shape_text.h>
#include <flex/models/parallel_lm.h>

#include "../models/contract_check.h"
#include "mesh_env.h"

namespace {

using parallel2_test::mesh;

TEST(ParallelModuleContract, EveryNamedModuleHasTransformersShapeAndValues) {
  contract_test::Tally tally;
  const auto m = contract_test::manifest();
  const auto& cases = m["cases"];
  const auto s = parallel2_test::mesh_shape();
  const std::string layout = "tp=" + std::to_string(s.tp) + " pp=" + std::to_string(s.pp) + " dp=" + std::to_string(s.dp);
  for (auto& [name, info] : cases.items()) {
    auto lm = flex::load_parallel_pretrained(contract_test::contract(name), mesh());
    flex::FlexModel fm(lm);
    fm.set_mesh(mesh(), lm->layout());
    const auto hooked = contract_test::hook_every_module(fm, name, info, tally);
    auto golden = flex::SafetensorsFile::open(contract_test::contract(name + ".contract.safetensors"));
    flex::Inputs in;
    in.set("input_ids", golden->get("input_ids"));
    in.set("attention_mask", golden->get("attention_mask"));
    {
      at::NoGradGuard g;
      fm.forward(std::move(in));
    }
    if (mesh().rank() == 0) contract_test::compare(name, info, *golden, fm.output(), hooked, tally, 2e-5);
  }
  if (mesh().rank() != 0) return;
  contract_test::expect_only_open_differences(tally, layout);
  EXPECT_GT(tally.compared, 900);
}

// An expected_shape that does not hold names the whole activation's shape,
// Transformers' (not this rank's slice): Gemma 3's q_norm output split over
// tp by heads, a layer's output split over dp by rows. (pp=1 only: the
// error is raised by the ranks running the layer, which a pipeline would
// leave the other stage waiting for.)
TEST(ParallelModuleContract, ExpectedShapeErrorsNameTransformersShape) {
  if (parallel2_test::mesh_shape().pp != 1) GTEST_SKIP() << "pp=1 only";
  const std::string name = "gemma3_text";
  auto golden = flex::SafetensorsFile::open(contract_test::contract(name + ".contract.safetensors"));
  for (const std::string module : {"model.layers.0.self_attn.q_norm", "model.layers.1"}) {
    auto lm = flex::load_parallel_pretrained(contract_test::contract(name), mesh());
    flex::FlexModel fm(lm);
    fm.set_mesh(mesh(), lm->layout());
    const at::Tensor want = golden->get("out." + module);
    std::vector<int64_t> wrong = want.sizes().vec();
    wrong.back() += 1;
    fm.register_forward_hook(std::make_shared<flex::HookFunction>(module, wrong));
    flex::Inputs in;
    in.set("input_ids", golden->get("input_ids"));
    in.set("attention_mask", golden->get("attention_mask"));
    try {
      at::NoGradGuard g;
      fm.forward(std::move(in));
      ADD_FAILURE() << module << ": no ShapeError for expected_shape " << flex::shape_text(wrong);
    } catch (const flex::ShapeError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(module), std::string::npos) << what;
      EXPECT_NE(what.find("has shape " + flex::shape_text(want.sizes())), std::string::npos)
          << "the error should name Transformers' shape " << flex::shape_text(want.sizes()) << ": " << what;
    }
  }
}

}  // namespace
