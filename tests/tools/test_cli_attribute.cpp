// `flexmodel attribute` against circuit-tracer 0.5.0's own graph file for the
// same model, transcoders and prompt (tests/data/attribution, written by
// scripts/golden/make_attribution.py with circuit-tracer's create_nodes /
// create_used_nodes_and_edges / build_model): the same nodes in the same
// order with the same fields, influences and activations within 1e-4, the
// same links with weights within 1e-4 (relative, or of the largest weight);
// and the typed errors: a transcoder whose width does not fit, a prompt
// longer than the context, thresholds out of range, missing flags.
#include "cli_util.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "test_util.h"

using cli_test::run;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string data(const std::string& rel) { return flex_test::data_path("attribution/" + rel); }
std::string gpt2() { return flex_test::fixture("models/gpt2"); }

// input_ids [T] as a safetensors file (the ids circuit-tracer was given).
std::string ids_file(flex_test::TempDir& dir, const std::vector<int64_t>& ids) {
  const std::string path = dir.str("ids.safetensors");
  const std::string header = "{\"input_ids\":{\"dtype\":\"I64\",\"shape\":[" + std::to_string(ids.size()) +
                             "],\"data_offsets\":[0," + std::to_string(8 * ids.size()) + "]}}";
  std::string padded = header + std::string((8 - header.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = padded.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << padded;
  out.write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(8 * ids.size()));
  return path;
}

const std::vector<int64_t> kPrompt = {255, 17, 42, 7, 99, 5, 11, 64, 2, 8};

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

void expect_near(const json& ours, const json& theirs, double tol, const std::string& what) {
  if (theirs.is_null()) {
    EXPECT_TRUE(ours.is_null()) << what << ": ours " << ours.dump() << ", circuit-tracer's null";
    return;
  }
  ASSERT_TRUE(ours.is_number()) << what << ": " << ours.dump();
  const double a = ours.get<double>(), b = theirs.get<double>();
  EXPECT_LE(std::abs(a - b), tol * std::max(1.0, std::abs(b))) << what << ": ours " << a << ", circuit-tracer's " << b;
}

}  // namespace

static void compare_graph_files(const std::string& family, std::vector<int64_t> prompt, const std::string& n_active) {
  SCOPED_TRACE(family);
  flex_test::TempDir dir;
  const std::string out = dir.str("graph.json");
  const auto r = run({"attribute", flex_test::fixture("models/" + family), "--transcoders", data(family + "-transcoders"),
                      "--input-ids", ids_file(dir, prompt), "--out", out, "--batch-size", "16", "--slug",
                      family + "-circuit-tracer-graph"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find(n_active + " active features"), std::string::npos) << r.out;
  const json ours = read_json(out), theirs = read_json(data(family + "-circuit-tracer-graph.json"));
  for (const char* key : {"slug", "prompt_tokens", "prompt", "node_threshold", "schema_version", "transcoder_list"})
    EXPECT_EQ(ours["metadata"][key], theirs["metadata"][key]) << "metadata." << key;
  EXPECT_EQ(ours["metadata"]["scan"], family + "-transcoders");
  EXPECT_EQ(ours["qParams"], theirs["qParams"]);

  const json& on = ours["nodes"];
  const json& tn = theirs["nodes"];
  ASSERT_EQ(on.size(), tn.size());
  for (size_t i = 0; i < tn.size(); ++i) {
    const std::string id = tn[i]["node_id"];
    for (const char* key : {"node_id", "feature", "layer", "ctx_idx", "feature_type", "is_target_logit", "run_idx",
                            "reverse_ctx_idx", "jsNodeId", "clerp"})
      EXPECT_EQ(on[i][key], tn[i][key]) << "node " << i << " (" << id << ")." << key;
    for (const char* key : {"influence", "activation", "token_prob"})
      expect_near(on[i][key], tn[i][key], 1e-4, "node " + id + "." + key);
  }
  const json& ol = ours["links"];
  const json& tl = theirs["links"];
  ASSERT_EQ(ol.size(), tl.size());
  double largest = 0, worst = 0;
  std::string worst_at;
  for (const auto& l : tl) largest = std::max(largest, std::abs(l["weight"].get<double>()));
  for (size_t i = 0; i < tl.size(); ++i) {
    EXPECT_EQ(ol[i]["source"], tl[i]["source"]) << "link " << i;
    EXPECT_EQ(ol[i]["target"], tl[i]["target"]) << "link " << i;
    const double a = ol[i]["weight"], b = tl[i]["weight"];
    if (std::abs(a - b) > worst) {
      worst = std::abs(a - b);
      worst_at = tl[i]["source"].get<std::string>() + " -> " + tl[i]["target"].get<std::string>();
    }
    EXPECT_LE(std::abs(a - b), 1e-4 * std::max(std::abs(b), largest)) << "link " << i;
  }
  std::cout << family << ": largest |link weight - circuit-tracer's| " << worst << " at " << worst_at << " (largest weight "
            << largest << ")\n";
}

TEST(CliAttribute, Gpt2GraphFileIsCircuitTracers) { compare_graph_files("gpt2", kPrompt, "152"); }
TEST(CliAttribute, LlamaGraphFileIsCircuitTracers) {
  compare_graph_files("llama", {1, 17, 42, 7, 99, 5, 11, 64, 2, 8}, "165");
}

TEST(CliAttribute, TypedErrors) {
  flex_test::TempDir dir;
  const std::string ids = ids_file(dir, kPrompt);
  const std::string tc = data("gpt2-transcoders");
  // A transcoder whose output width (48) is not the model's (64).
  const fs::path mixed = dir.path() / "mixed";
  fs::create_directories(mixed);
  fs::copy(tc + "/layer_0", mixed / "layer_0", fs::copy_options::recursive);
  fs::copy(flex_test::data_path("sae/skip_transcoder"), mixed / "layer_1", fs::copy_options::recursive);
  auto r = run({"attribute", gpt2(), "--transcoders", mixed.string(), "--input-ids", ids, "--out", dir.str("g.json")});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("layer_1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("W_dec [128, 48]"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir.str("g.json")));
  // A prompt longer than the context (64 positions).
  r = run({"attribute", gpt2(), "--transcoders", tc, "--input-ids", ids_file(dir, std::vector<int64_t>(65, 3)), "--out",
           dir.str("g.json")});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("65 tokens are longer than the model's context of 64"), std::string::npos) << r.err;
  // Thresholds and options out of range, before any work.
  r = run({"attribute", gpt2(), "--transcoders", tc, "--input-ids", ids, "--out", dir.str("g.json"), "--node-threshold", "1.5"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("node_threshold must be in [0, 1], not 1.5"), std::string::npos) << r.err;
  r = run({"attribute", gpt2(), "--transcoders", tc, "--input-ids", ids, "--out", dir.str("g.json"), "--edge-threshold", "-1"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("edge_threshold"), std::string::npos) << r.err;
  r = run({"attribute", gpt2(), "--transcoders", tc, "--input-ids", ids, "--out", dir.str("g.json"), "--desired-logit-prob", "0"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("desired_logit_prob"), std::string::npos) << r.err;
  // Usage: no --transcoders, both or neither of --prompt / --input-ids.
  r = run({"attribute", gpt2(), "--input-ids", ids, "--out", dir.str("g.json")});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--transcoders"), std::string::npos) << r.err;
  r = run({"attribute", gpt2(), "--transcoders", tc, "--out", dir.str("g.json")});
  EXPECT_EQ(r.code, 2);
  // --prompt needs the model folder's tokenizer (the fixture has none): says to pass ids.
  r = run({"attribute", gpt2(), "--transcoders", tc, "--prompt", "hello", "--out", dir.str("g.json")});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--input-ids"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir.str("g.json")));
}
