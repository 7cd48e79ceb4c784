// Run under mpirun with FLEX_MESH="2,1,1" (tensor parallel), "1,2,1"
// (pipeline parallel) or "2,2,1" (both, np 4): attribution graphs (flex/sae/attribution_parallel.h)
// of the GPT-2 and Llama fixtures built over the mesh, through random per-layer transcoders (plain ReLU,
// skip, JumpReLU skip; replicated on every rank), against the one-process
// graph of the unsharded model computed in the same run (float64 both):
//   - rank 0's nodes (active features, activations, selection, logits) are
//     the one-process ones and its edges equal them within 1e-5 of the
//     largest edge (the largest difference is printed);
//   - in memory with every feature, with a feature budget (the ranking is
//     rank 0's, broadcast), and streamed (--max-memory, rows in rank 0's
//     file only);
//   - the same with the test data's cross-layer transcoders (features
//     writing into both layers: both pipeline stages);
//   - the other ranks return the same nodes and hold no rows;
//   - a data-parallel mesh ("1,1,2") is refused with an error naming it.
#include <flex/hooks/errors.h>
#include <flex/models/auto_model.h>
#include <flex/models/parallel_lm.h>
#include <flex/sae/attribution_parallel.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "mesh_env.h"
#include "tensor_compare.h"
#include "test_util.h"

namespace {

using parallel2_test::mesh;
using parallel2_test::mesh_shape;

// Layer 0 plain ReLU, later layers skip (GPT-2) or JumpReLU skip (Llama),
// drawn from one seed (the same on every rank); hooks as circuit-tracer names them.
std::vector<std::shared_ptr<flex::SparseDictionary>> random_transcoders(int64_t d, int64_t L, bool gpt2) {
  std::vector<std::shared_ptr<flex::SparseDictionary>> out;
  at::manual_seed(5);
  for (int64_t l = 0; l < L; ++l) {
    flex::SaeConfig c;
    c.architecture = l == 0 ? flex::SaeArchitecture::Transcoder
                            : (gpt2 ? flex::SaeArchitecture::SkipTranscoder : flex::SaeArchitecture::JumpReLUSkipTranscoder);
    c.d_in = c.d_out = d;
    c.d_sae = 24;
    c.dtype = at::kDouble;
    c.apply_b_dec_to_input = false;
    c.hook_name = "blocks." + std::to_string(l) + ".mlp.hook_in";
    c.hook_name_out = "blocks." + std::to_string(l) + ".hook_mlp_out";
    c.source = "test/layer_" + std::to_string(l);
    auto t = std::make_shared<flex::SparseDictionary>(c);
    at::NoGradGuard ng;
    const double in_scale = gpt2 ? 0.25 : 2.0;  // pre-activations of a few units
    t->set_tensor("W_enc", (at::randn({d, 24}) * in_scale / std::sqrt(double(d))).to(at::kDouble));
    t->set_tensor("b_enc", (at::randn({24}) * 0.3).to(at::kDouble));
    t->set_tensor("W_dec", (at::randn({24, d}) * 0.2).to(at::kDouble));
    t->set_tensor("b_dec", (at::randn({d}) * 0.1).to(at::kDouble));
    if (c.has_skip()) t->set_tensor("W_skip", (at::randn({d, d}) * 0.05).to(at::kDouble));
    if (c.jump()) t->set_tensor("threshold", (at::rand({24}) * 0.3).to(at::kDouble));
    out.push_back(t);
  }
  return out;
}

at::Tensor adjacency_of(const flex::AttributionGraph& g) { return g.is_streamed() ? g.streamed->dense() : g.adjacency; }

void expect_same_nodes(const flex::AttributionGraph& got, const flex::AttributionGraph& want, const std::string& what) {
  EXPECT_TRUE(flex_test::equal(got.active_features, want.active_features)) << what << ": active features";
  EXPECT_TRUE(flex_test::close(got.activations, want.activations, 0, 1e-9)) << what << ": activations";
  EXPECT_TRUE(flex_test::equal(got.selected_features, want.selected_features)) << what << ": selected features";
  EXPECT_TRUE(flex_test::equal(got.logit_tokens, want.logit_tokens)) << what << ": logit tokens";
  EXPECT_TRUE(flex_test::close(got.logit_probabilities, want.logit_probabilities, 0, 1e-9)) << what << ": logit probabilities";
}

class ParallelAttribution : public ::testing::TestWithParam<std::string> {};

TEST_P(ParallelAttribution, RankZerosGraphIsTheOneProcessGraph) {
  const auto s = mesh_shape();
  if (s.dp != 1) GTEST_SKIP() << "tensor or pipeline parallel";
  const std::string fixture = GetParam();
  const std::string dir = flex_test::fixture("models/" + fixture);
  auto whole = flex::load_pretrained(dir, at::kDouble);
  flex::ParallelLMOptions po;
  po.dtype = at::kDouble;
  auto lm = flex::load_parallel_pretrained(dir, mesh(), po);
  const int64_t d = whole->config().hidden_size, L = whole->config().num_hidden_layers;
  // The random per-layer transcoders, then the test data's cross-layer
  // transcoder (make_attribution_clt.py): its features write into both
  // layers, so under pp into both stages.
  for (const bool clt : {false, true}) {
    const std::string clt_dir = flex_test::data_path("attribution/" + fixture + "-clt");
    const flex::Transcoders tc = clt ? flex::load_attribution_transcoders(clt_dir, L)
                                     : flex::Transcoders(random_transcoders(d, L, fixture == "gpt2"));
    const at::Tensor ids = at::tensor({1, 17, 42, 7, 99, 5, 11}, at::kLong);

    struct Case {
      std::string name;
      flex::AttributionOptions o;
    };
    std::vector<Case> cases(3);
    cases[0].name = "all features, batch 4";
    cases[0].o.batch_size = 4;
    cases[1].name = "8 features by influence, batch 2";
    cases[1].o.batch_size = 2, cases[1].o.max_feature_nodes = 8, cases[1].o.update_interval = 1;
    cases[2].name = "streamed (max_memory 200 MB)";
    cases[2].o.batch_size = 4, cases[2].o.max_memory_bytes = 200'000'000;
    for (const Case& c : cases) {
      const std::string what = fixture + (clt ? " CLT, " : ", ") + c.name;
      const flex::AttributionGraph want = flex::attribute(*whole, tc, ids, c.o);
      const flex::AttributionGraph got = flex::attribute(*lm, tc, ids, c.o);
      ASSERT_GT(want.n_features(), 4) << what << ": too few active features for a check";
      expect_same_nodes(got, want, what + " (rank " + std::to_string(mesh().rank()) + ")");
      if (mesh().rank() != 0) {
        EXPECT_FALSE(got.adjacency.defined()) << what << ": rank " << mesh().rank() << " holds the adjacency";
        EXPECT_FALSE(got.is_streamed()) << what << ": rank " << mesh().rank() << " holds streamed rows";
        continue;
      }
      EXPECT_EQ(got.is_streamed(), c.o.max_memory_bytes > 0) << what;
      const at::Tensor a = adjacency_of(got), e = adjacency_of(want);
      ASSERT_EQ(a.sizes(), e.sizes()) << what;
      const double scale = e.abs().max().item<double>();
      const double diff = (a - e).abs().max().item<double>();
      std::printf("[attribution %s] %s: %lld nodes, largest edge %.3g, largest difference %.3g (%.2g relative)\n",
                  mesh().describe().c_str(), what.c_str(), static_cast<long long>(e.size(0)), scale, diff, diff / scale);
      EXPECT_GT(scale, 0.0) << what;
      EXPECT_TRUE(flex_test::close(a, e, 0, 1e-5 * scale)) << what << ": edges differ from the one-process graph";
    }
  }
}

// A bound too small for one batch of rows: a ConfigError on every rank
// (rank 0's naming the size needed), none left waiting in a collective.
TEST(ParallelAttributionErrors, TooSmallMemoryBoundFailsEveryRank) {
  const auto s = mesh_shape();
  if (s.dp != 1) GTEST_SKIP() << "tensor or pipeline parallel";
  auto lm = flex::load_parallel_pretrained(flex_test::fixture("models/gpt2"), mesh());
  const int64_t d = lm->config().hidden_size, L = lm->config().num_hidden_layers;
  flex::AttributionOptions o;
  o.max_memory_bytes = 4000;
  try {
    flex::attribute(*lm, random_transcoders(d, L, true), at::tensor({1, 17, 42, 7, 99}, at::kLong), o);
    FAIL() << "rank " << mesh().rank() << ": no error";
  } catch (const flex::ConfigError& e) {
    if (mesh().rank() == 0) {
      EXPECT_NE(std::string(e.what()).find("needs"), std::string::npos) << e.what();
    }
  }
}

TEST(ParallelAttributionErrors, DataParallelMeshIsRefusedByName) {
  const auto s = mesh_shape();
  if (s.dp == 1) GTEST_SKIP() << "needs a data-parallel mesh";
  auto lm = flex::load_parallel_pretrained(flex_test::fixture("models/gpt2"), mesh());
  const int64_t d = lm->config().hidden_size, L = lm->config().num_hidden_layers;
  try {
    flex::attribute(*lm, random_transcoders(d, L, true), at::tensor({1, 17, 42}, at::kLong));
    FAIL() << "no error";
  } catch (const flex::UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find(mesh().describe()), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Zoo, ParallelAttribution, ::testing::Values("gpt2", "llama"));

}  // namespace
