// The flexmodel command line under mpirun with --tp/--pp/--dp: every rank
// runs the command, rank 0 writes the output. Checked against independent
// results: captures of every fixture model (--hook all, so fused QKV,
// embeddings, row-parallel projections, the base model and lm_head are all
// included) equal the golden Transformers forward for each mesh, greedy
// and steered generation equal the single-process run, and so do a spliced
// sparse dictionary's features and a generation steered along one feature.
#include "cli_util.h"
#include "tiny_gpt2_folder.h"
#include "golden_capture.h"
#include "hf_folder.h"
#include "test_util.h"

#include <flex/datasets/activation_shards.h>
#include <flex/dispatch/safetensors.h>
#include <flex/flexcore/streaming_sink.h>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <tuple>

#ifdef FLEX_MPIEXEC
using cli_test::expect_matches_golden;

namespace {

const std::string kInputs = flex_test::fixture("golden/inputs.safetensors");

/// `mpirun -np N flexmodel ARGS...` (one thread per rank: the ranks share 2 cores).
cli_test::Result mpirun(int np, const std::vector<std::string>& args) {
  return cli_test::run(args, "OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE FLEX_COMM_TIMEOUT=120 " +
                                 cli_test::quote(FLEX_MPIEXEC) + " --allow-run-as-root --oversubscribe -np " +
                                 std::to_string(np));
}

struct Mesh {
  int tp, pp, dp;
  bool expert_parallel = false;
  int np() const { return tp * pp * dp; }
  std::vector<std::string> flags() const {
    std::vector<std::string> f{"--tp", std::to_string(tp), "--pp", std::to_string(pp), "--dp", std::to_string(dp)};
    if (expert_parallel) f.push_back("--expert-parallel");
    return f;
  }
  std::string name() const {
    return "tp" + std::to_string(tp) + "_pp" + std::to_string(pp) + "_dp" + std::to_string(dp) +
           (expert_parallel ? "_ep" : "");
  }
};

const std::vector<Mesh> kMeshes = {{2, 1, 1}, {1, 2, 1}, {1, 1, 2}, {2, 2, 1}, {2, 1, 2}, {1, 2, 2}};

/// The golden forward a fixture model folder must reproduce.
std::string golden_for(const std::string& model) {
  if (model == "llama-sharded") return "llama";               // same weights, sharded checkpoint
  if (model == "llama-bf16") return "llama-bf16-as-f32";      // bf16 weights, run in float32
  return model;
}

class CliParallelCapture : public ::testing::TestWithParam<std::tuple<std::string, Mesh>> {};

/// The tiny GPT-2 folder (4 heads: splits over tp=2).
const std::string& tiny_model() { return cli_test::tiny_gpt2_folder(); }

}  // namespace

TEST_P(CliParallelCapture, HookAllReproducesGolden) {
  const auto& [model, mesh] = GetParam();
  flex_test::TempDir tmp;
  std::vector<std::string> args = {"capture", flex_test::fixture("models/" + model), "--input-ids", kInputs,
                                   "--hook", "all", "--out", tmp.str("cap.safetensors")};
  for (const auto& f : mesh.flags()) args.push_back(f);
  auto r = mpirun(mesh.np(), args);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  // Only rank 0 reports.
  EXPECT_EQ(cli_test::count_lines(r.err), 1) << r.err;
  expect_matches_golden(tmp.str("cap.safetensors"), golden_for(model));
}

static std::string case_name(const ::testing::TestParamInfo<std::tuple<std::string, Mesh>>& info) {
  std::string s = std::get<0>(info.param) + "_" + std::get<1>(info.param).name();
  for (auto& c : s)
    if (c == '-') c = '_';
  return s;
}

// The three architectures on every mesh; the other fixtures (tied Llama-3 rope,
// sharded checkpoint, bf16 weights) at tp=2 and at pp=2 x dp=2.
INSTANTIATE_TEST_SUITE_P(Models, CliParallelCapture,
                         ::testing::Combine(::testing::Values("gpt2", "llama", "gpt-neox"), ::testing::ValuesIn(kMeshes)),
                         case_name);
// The second-wave Llama family at tp=2 (fused qkv/gate_up, q/k norms over the
// split projection, soft-caps), pp=2 and dp=2.
INSTANTIATE_TEST_SUITE_P(ZooII, CliParallelCapture,
                         ::testing::Combine(::testing::Values("mistral", "qwen2", "gemma2", "phi3", "olmo2"),
                                            ::testing::Values(Mesh{2, 1, 1}, Mesh{1, 2, 1}, Mesh{1, 1, 2})),
                         case_name);
// Mixture of experts: every expert split over tp=2 (router replicated), whole
// experts per rank with --expert-parallel, whole layers per stage at pp=2,
// and at dp=2 each rank's expert rows merged back into single-process order.
INSTANTIATE_TEST_SUITE_P(MoE, CliParallelCapture,
                         ::testing::Combine(::testing::Values("mixtral", "qwen2_moe"),
                                            ::testing::Values(Mesh{2, 1, 1}, Mesh{2, 1, 1, true}, Mesh{1, 2, 1},
                                                              Mesh{1, 1, 2})),
                         case_name);
// Heads that do not divide by tp: 4 query heads over tp=3 split [2, 1, 1] and
// the 2 key/value heads follow them (rank 0 holds kv head 0, ranks 1 and 2
// both hold kv head 1); over tp=4 each key/value head is on two ranks. The
// vocabulary and the MLP split unevenly too (256 and 128 over 3).
INSTANTIATE_TEST_SUITE_P(UnevenHeads, CliParallelCapture,
                         ::testing::Combine(::testing::Values("gpt2", "llama", "gpt-neox", "phi3", "olmo2", "gemma2"),
                                            ::testing::Values(Mesh{3, 1, 1})),
                         case_name);
INSTANTIATE_TEST_SUITE_P(ReplicatedKvHeads, CliParallelCapture,
                         ::testing::Combine(::testing::Values("mistral", "qwen2"), ::testing::Values(Mesh{4, 1, 1})),
                         case_name);
INSTANTIATE_TEST_SUITE_P(MoreFixtures, CliParallelCapture,
                         ::testing::Combine(::testing::Values("llama3-rope-tied", "llama-sharded", "llama-bf16"),
                                            ::testing::Values(Mesh{2, 1, 1}, Mesh{1, 2, 2})),
                         case_name);

TEST(CliParallel, StreamDirUnderTensorAndPipelineParallel) {
  flex_test::TempDir tmp;
  auto r = mpirun(4, {"capture", flex_test::fixture("models/gpt2"), "--input-ids", kInputs, "--hook", "all", "--out",
                      tmp.str("cap.safetensors"), "--stream-dir", tmp.str("stream"), "--batch-size", "1", "--tp", "2",
                      "--pp", "2"});
  ASSERT_EQ(r.code, 0) << r.err;
  auto out = flex::SafetensorsFile::open(tmp.str("cap.safetensors"));
  auto ref = models_test::golden_tensors("gpt2");
  EXPECT_TRUE(models_test::close(out->get("logits"), ref->get("logits"), "streamed logits"));
  flex::CaptureReader reader(tmp.str("stream"));
  for (const char* n : {"transformer.h.1.attn.c_attn", "transformer.h.0.mlp.c_proj", "lm_head", "transformer"})
    EXPECT_TRUE(models_test::close(at::cat(reader.all(n), 0), ref->get(n), std::string("streamed ") + n));
}

TEST(CliParallel, DatasetCaptureEqualsTheSingleProcessRun) {
  // A token-id corpus through the data- and tensor-parallel model: rank 0
  // writes the same dataset as one process (indices exactly, activations to
  // the parallel forward's rounding).
  flex_test::TempDir tmp;
  flex::save_safetensors(tmp.str("ids.safetensors"), {{"input_ids", at::randint(0, 255, {8, 40}, at::kLong)}});
  auto args = [&](const std::string& out) {
    return std::vector<std::string>{"capture", flex_test::fixture("models/gpt2"), "--dataset", tmp.str("ids.safetensors"),
                                    "--context-len", "16", "--batch-size", "4", "--hook", "transformer.h.1",
                                    "--hook", "transformer.h.0.mlp", "--stream-dir", out, "--shard-size", "8KB"};
  };
  auto r = cli_test::run(args(tmp.str("single")));
  ASSERT_EQ(r.code, 0) << r.err;
  flex::ActivationDataset want(tmp.str("single"));
  for (const auto& mesh : {std::vector<std::string>{"--dp", "2"}, std::vector<std::string>{"--tp", "2"}}) {
    auto a = args(tmp.str("par" + mesh[0]));
    a.insert(a.end(), mesh.begin(), mesh.end());
    r = mpirun(2, a);
    ASSERT_EQ(r.code, 0) << mesh[0] << ": " << r.err;
    flex::ActivationDataset got(tmp.str("par" + mesh[0]));
    ASSERT_EQ(got.num_tokens(), want.num_tokens()) << mesh[0];
    ASSERT_EQ(got.num_shards(), want.num_shards()) << mesh[0];
    for (size_t s = 0; s < want.num_shards(); ++s) {
      auto g = got.shard(s), w = want.shard(s);
      EXPECT_TRUE(flex_test::equal(g.token_ids, w.token_ids)) << mesh[0] << " shard " << s;
      EXPECT_TRUE(flex_test::equal(g.document, w.document)) << mesh[0] << " shard " << s;
      EXPECT_TRUE(flex_test::equal(g.position, w.position)) << mesh[0] << " shard " << s;
      EXPECT_TRUE(flex_test::equal(g.context, w.context)) << mesh[0] << " shard " << s;
      for (const auto& [hook, t] : w.activations)
        EXPECT_TRUE(models_test::close(g.activations.at(hook), t, mesh[0] + " " + hook));
    }
  }
}

TEST(CliParallel, GreedyAndSteeredGenerationEqualTheSingleProcessRun) {
  flex_test::TempDir tmp;
  // A steering vector on block 0's MLP output (hidden size 64).
  flex::save_safetensors(tmp.str("v.safetensors"), {{"vector", at::linspace(-2, 2, 64)}});
  const std::vector<std::string> base = {"generate", tiny_model(), "--prompt", "hello world", "--max-new-tokens", "6"};
  const std::vector<std::string> edits = {"--steer", "transformer.h.0.mlp=" + tmp.str("v.safetensors") + ":3",
                                          "--ablate", "transformer.h.1.attn:1"};
  for (const bool edited : {false, true}) {
    auto args = base;
    if (edited) args.insert(args.end(), edits.begin(), edits.end());
    auto single = cli_test::run(args);
    ASSERT_EQ(single.code, 0) << single.err;
    for (const Mesh& m : {Mesh{2, 1, 1}, Mesh{1, 2, 1}, Mesh{2, 2, 1}}) {
      auto a = args;
      for (const auto& f : m.flags()) a.push_back(f);
      auto par = mpirun(m.np(), a);
      ASSERT_EQ(par.code, 0) << m.name() << ": " << par.err;
      EXPECT_EQ(par.out, single.out) << m.name() << (edited ? " (steered, ablated)" : " (greedy)");
    }
  }
}

TEST(CliParallel, SaeFeaturesAndSteeringEqualTheSingleProcessRun) {
  // A dictionary spliced under tp/pp/dp sees the whole activation: the
  // features rank 0 writes, and a generation steered along a feature, are
  // the single process's (features to the parallel forward's rounding).
  flex_test::TempDir tmp;
  at::manual_seed(3);
  flex::save_safetensors(tmp.str("ids.safetensors"), {{"input_ids", at::randint(0, 200, {4, 9}, at::kLong)}});
  const std::vector<std::string> capture = {
      "capture", tiny_model(), "--input-ids", tmp.str("ids.safetensors"), "--sae", flex_test::data_path("sae/topk"),
      "--sae", flex_test::data_path("sae/jumprelu") + "@blocks.0.hook_resid_post", "--batch-size", "4"};
  auto with = [](std::vector<std::string> a, const std::vector<std::string>& more) {
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  auto single = cli_test::run(with(capture, {"--out", tmp.str("single.safetensors")}));
  ASSERT_EQ(single.code, 0) << single.err;
  auto want = flex::SafetensorsFile::open(tmp.str("single.safetensors"));
  const std::vector<std::string> names = {"transformer.h.1.hook_resid_post.sae.", "transformer.h.0.hook_resid_post.sae."};
  ASSERT_TRUE(want->contains(names[0] + "feature_values")) << "no topk features in the single-process capture";
  ASSERT_GT(want->get(names[1] + "l0").sum().item<int64_t>(), 0) << "the jumprelu dictionary never fired";
  for (const Mesh& m : {Mesh{2, 1, 1}, Mesh{1, 2, 1}, Mesh{1, 1, 2}}) {
    const std::string out = tmp.str(m.name() + ".safetensors");
    auto par = mpirun(m.np(), with(with(capture, {"--out", out}), m.flags()));
    ASSERT_EQ(par.code, 0) << m.name() << ": " << par.err;
    auto got = flex::SafetensorsFile::open(out);
    for (const auto& n : names) {
      // Rows hold each token's features by decreasing value, so equal indices
      // and l0 mean the same active sets in the same order.
      EXPECT_TRUE(flex_test::equal(got->get(n + "feature_indices"), want->get(n + "feature_indices"))) << m.name() << " " << n;
      EXPECT_TRUE(flex_test::equal(got->get(n + "l0"), want->get(n + "l0"))) << m.name() << " " << n;
      EXPECT_TRUE(flex_test::close(got->get(n + "feature_values"), want->get(n + "feature_values"), 1e-4, 1e-5))
          << m.name() << " " << n;
    }
    EXPECT_TRUE(flex_test::close(got->get("logits"), want->get("logits"), 1e-4, 1e-5)) << m.name();
  }
  const std::vector<std::string> steer = {"generate", tiny_model(), "--prompt", "hello world", "--max-new-tokens", "6",
                                          "--sae", flex_test::data_path("sae/topk"), "--steer-feature", "3=200"};
  auto one = cli_test::run(steer);
  ASSERT_EQ(one.code, 0) << one.err;
  auto plain = cli_test::run({"generate", tiny_model(), "--prompt", "hello world", "--max-new-tokens", "6"});
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_NE(one.out, plain.out) << "steering by 200 changed nothing: the comparison would prove nothing";
  for (const Mesh& m : {Mesh{2, 1, 1}, Mesh{1, 2, 1}}) {
    auto par = mpirun(m.np(), with(steer, m.flags()));
    ASSERT_EQ(par.code, 0) << m.name() << ": " << par.err;
    EXPECT_EQ(par.out, one.out) << m.name() << " (steered feature)";
  }
}

TEST(CliParallel, SaeFeatureShardsEqualTheSingleProcessRun) {
  // capture --dataset --sae: rank 0's shards hold the features of every
  // context, whichever stage or data-parallel rank ran the dictionary.
  flex_test::TempDir tmp;
  at::manual_seed(4);
  flex::save_safetensors(tmp.str("corpus.safetensors"), {{"input_ids", at::randint(0, 200, {6, 40}, at::kLong)}});
  auto args = [&](const std::string& out) {
    return std::vector<std::string>{"capture", tiny_model(), "--dataset", tmp.str("corpus.safetensors"), "--context-len",
                                    "16", "--batch-size", "4", "--sae", flex_test::data_path("sae/topk"), "--stream-dir",
                                    out};
  };
  auto single = cli_test::run(args(tmp.str("single")));
  ASSERT_EQ(single.code, 0) << single.err;
  flex::ActivationDataset want(tmp.str("single"));
  const std::string f = "transformer.h.1.hook_resid_post.sae.";
  for (const Mesh& m : {Mesh{1, 2, 1}, Mesh{1, 1, 2}}) {
    auto a = args(tmp.str(m.name()));
    for (const auto& flag : m.flags()) a.push_back(flag);
    auto par = mpirun(m.np(), a);
    ASSERT_EQ(par.code, 0) << m.name() << ": " << par.err;
    flex::ActivationDataset got(tmp.str(m.name()));
    ASSERT_EQ(got.num_tokens(), want.num_tokens()) << m.name();
    ASSERT_EQ(got.num_shards(), want.num_shards()) << m.name();
    for (size_t s = 0; s < want.num_shards(); ++s) {
      auto g = got.shard(s), w = want.shard(s);
      EXPECT_TRUE(flex_test::equal(g.token_ids, w.token_ids)) << m.name() << " shard " << s;
      EXPECT_TRUE(flex_test::equal(g.activations.at(f + "feature_indices"), w.activations.at(f + "feature_indices")))
          << m.name() << " shard " << s;
      EXPECT_TRUE(flex_test::close(g.activations.at(f + "feature_values"), w.activations.at(f + "feature_values"), 1e-4,
                                   1e-5))
          << m.name() << " shard " << s;
    }
  }
}

TEST(CliParallel, InspectPrintsThePlanOnce) {
  auto r = mpirun(2, {"inspect", flex_test::fixture("models/gpt2"), "--pp", "2"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("stage 0: blocks 0..0, embeddings"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("stage 1: blocks 1..1, final norm and head"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("architecture:"), r.out.rfind("architecture:")) << "printed by more than one rank";
}

// flexmodel attribute (design decision 48) under tp=2 and pp=2: rank 0's
// graph file has the single-process run's nodes and links, the link weights
// within 1e-5 of the largest (float32; the test data's transcoders);
// streamed too (--max-memory). The largest difference is printed.
TEST(CliParallel, AttributionGraphEqualsTheSingleProcessRun) {
  flex_test::TempDir tmp;
  flex::save_safetensors(tmp.str("ids.safetensors"),
                         {{"input_ids", at::tensor({255, 17, 42, 7, 99, 5, 11, 64, 2, 8}, at::kLong)}});
  const std::vector<std::string> base = {"attribute", flex_test::fixture("models/gpt2"), "--transcoders",
                                         flex_test::data_path("attribution/gpt2-transcoders"), "--input-ids",
                                         tmp.str("ids.safetensors"), "--batch-size", "16"};
  auto with = [](std::vector<std::string> a, const std::vector<std::string>& more) {
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  auto single = cli_test::run(with(base, {"--out", tmp.str("single.json")}));
  ASSERT_EQ(single.code, 0) << single.err;
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    return nlohmann::json::parse(in);
  };
  const nlohmann::json want = read(tmp.str("single.json"));
  int n = 0;
  for (const Mesh& m : {Mesh{2, 1, 1}, Mesh{1, 2, 1}}) {
    for (const bool streamed : {false, true}) {
      const std::string what = m.name() + (streamed ? " streamed" : "");
      const std::string out = tmp.str("graph" + std::to_string(n++) + ".json");
      auto a = with(with(base, {"--out", out}), m.flags());
      if (streamed) a = with(a, {"--max-memory", "200MB"});
      auto par = mpirun(m.np(), a);
      ASSERT_EQ(par.code, 0) << what << ": " << par.err;
      EXPECT_NE(par.out.find("attribution graph:"), std::string::npos) << what << ": " << par.out;
      const nlohmann::json got = read(out);
      ASSERT_EQ(got["nodes"].size(), want["nodes"].size()) << what;
      for (size_t i = 0; i < want["nodes"].size(); ++i)
        EXPECT_EQ(got["nodes"][i]["node_id"], want["nodes"][i]["node_id"]) << what << ": node " << i;
      ASSERT_EQ(got["links"].size(), want["links"].size()) << what;
      double largest = 0, worst = 0;
      for (const auto& l : want["links"]) largest = std::max(largest, std::abs(l["weight"].get<double>()));
      for (size_t i = 0; i < want["links"].size(); ++i) {
        EXPECT_EQ(got["links"][i]["source"], want["links"][i]["source"]) << what << ": link " << i;
        EXPECT_EQ(got["links"][i]["target"], want["links"][i]["target"]) << what << ": link " << i;
        worst = std::max(worst, std::abs(got["links"][i]["weight"].get<double>() - want["links"][i]["weight"].get<double>()));
      }
      EXPECT_LE(worst, 1e-5 * largest) << what;
      std::cout << "attribute " << what << ": " << want["nodes"].size() << " nodes, " << want["links"].size()
                << " links, largest |weight difference| " << worst << " (largest weight " << largest << ")\n";
    }
  }
}

TEST(CliParallel, BadCombinationsFailEveryRank) {
  flex_test::TempDir tmp;
  // Offloading flags belong to the single-process model.
  auto r = mpirun(2, {"capture", flex_test::fixture("models/gpt2"), "--input-ids", kInputs, "--hook", "all", "--out",
                      tmp.str("x.safetensors"), "--tp", "2", "--device-map", "auto"});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--device-map cannot be combined with --tp/--pp/--dp"), std::string::npos) << r.err;
  // The product must match the job.
  r = mpirun(2, {"inspect", flex_test::fixture("models/gpt2"), "--tp", "2", "--pp", "2"});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("= 4 rank(s), but this job has 2"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(tmp.str("x.safetensors")));
  // Every rank reports, each on a line of its own with one prefix (a line
  // written in pieces interleaved with the other rank's).
  std::istringstream lines(r.err);
  int reports = 0;
  for (std::string line; std::getline(lines, line);) {
    const auto first = line.find("flexmodel: error: ");
    if (first == std::string::npos) continue;
    ++reports;
    EXPECT_EQ(first, 0u) << line;
    EXPECT_EQ(line.find("flexmodel: error: ", first + 1), std::string::npos) << "doubled prefix: " << line;
  }
  EXPECT_GE(reports, 1) << r.err;
}
#else
TEST(CliParallel, NeedsMpirun) { GTEST_SKIP() << "built without MPI: no mpirun to run the parallel CLI"; }
#endif
