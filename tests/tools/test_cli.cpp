// The flexmodel command line, run as a separate process: captures on every
// fixture model reproduce the golden activations (in memory, and with
// blocks offloaded to disk), `inspect --json` reproduces Accelerate's device
// maps for the fixture budgets, and each error path gives one line on stderr
// and the documented exit code.
#include "cli_util.h"
#include "golden_capture.h"

#include <flex/dispatch/device_map.h>
#include <flex/dispatch/safetensors.h>
#include <flex/flexcore/streaming_sink.h>
#include <flex/parallel/mpi_communicator.h>

#include <gtest/gtest.h>
#include <torch/version.h>
#include <nlohmann/json.hpp>

#include <map>
#include <set>

#include "test_util.h"

using cli_test::expect_matches_golden;
using cli_test::run;
using nlohmann::json;

namespace {

const std::string kInputs = flex_test::fixture("golden/inputs.safetensors");

std::string name_of(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (auto& c : s)
    if (c == '-') c = '_';
  return s;
}

class CliCapture : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(CliCapture, HookAllReproducesGolden) {
  flex_test::TempDir tmp;
  auto r = run({"capture", flex_test::fixture("models/" + GetParam()), "--input-ids", kInputs, "--hook", "all", "--out",
                tmp.str("cap.safetensors")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(r.out.empty()) << "stdout is for results only: " << r.out;
  expect_matches_golden(tmp.str("cap.safetensors"), GetParam());
}

TEST_P(CliCapture, BlocksOnDiskWithOffloadFolderReproduceGolden) {
  flex_test::TempDir tmp;
  // Budget: about half the model on CPU, the rest to disk (auto map).
  const json dm = flex_test::transformers5_names(models_test::read_json(flex_test::fixture("device_maps/" + GetParam() + ".json")));
  const double total = dm["compute_module_sizes"]["sizes"][0][1].get<double>();
  auto r = run({"capture", flex_test::fixture("models/" + GetParam()), "--input-ids", kInputs, "--hook", "all", "--out",
                tmp.str("cap.safetensors"), "--device-map", "auto", "--max-memory",
                "cpu=" + std::to_string(static_cast<int64_t>(0.5 * total)), "--offload-folder", tmp.str("offload")});
  ASSERT_EQ(r.code, 0) << r.err;
  expect_matches_golden(tmp.str("cap.safetensors"), GetParam());
}

// --batch-size auto: the whole batch fits here, so the capture is the
// golden one (and it says which size it took).
TEST(CliCaptureAuto, AutoBatchSizeReproducesGolden) {
  flex_test::TempDir tmp;
  auto r = run({"capture", flex_test::fixture("models/gpt2"), "--input-ids", kInputs, "--hook", "all", "--out",
                tmp.str("cap.safetensors"), "--batch-size", "auto", "--log-level", "info"});
  ASSERT_EQ(r.code, 0) << r.err;
  expect_matches_golden(tmp.str("cap.safetensors"), "gpt2");
  EXPECT_NE(r.err.find("--batch-size auto: "), std::string::npos) << r.err;
}

TEST_P(CliCapture, BatchesOfOneAreConcatenated) {
  flex_test::TempDir tmp;
  const std::string hook = GetParam() == "gpt2"       ? "transformer.h.1.mlp"
                           : GetParam() == "gpt-neox" ? "gpt_neox.layers.1.mlp"
                           : GetParam() == "mixtral"  ? "model.layers.1.mlp"
                                                      : "model.layers.1.mlp";
  auto r = run({"capture", flex_test::fixture("models/" + GetParam()), "--input-ids", kInputs, "--hook", hook, "--out",
                tmp.str("cap.safetensors"), "--batch-size", "1"});
  ASSERT_EQ(r.code, 0) << r.err;
  auto out = flex::SafetensorsFile::open(tmp.str("cap.safetensors"));
  auto ref = models_test::golden_tensors(GetParam());
  EXPECT_EQ(out->names().size(), 3u);
  EXPECT_TRUE(models_test::close(out->get(hook), ref->get(hook), hook));
  EXPECT_TRUE(models_test::close(out->get("logits"), ref->get("logits"), "logits"));
  EXPECT_TRUE(flex_test::equal(out->get("input_ids"), ref->get("input_ids")));
}

// An expert's rows come with their token indices over the whole input: put
// back densely (row i at token_index[i]), batches of one give what one
// batch of two gives, and every expert row is where the golden run put it.
TEST(CliCaptureMoe, ExpertTokenIndicesSpanTheWholeInput) {
  for (const std::string model : {"mixtral", "qwen2_moe"}) {
    const std::string block = "model.layers.0.mlp";
    std::map<std::string, at::Tensor> dense[2];
    for (int pass = 0; pass < 2; ++pass) {
      flex_test::TempDir tmp;
      std::vector<std::string> argv{"capture", flex_test::fixture("models/" + model), "--input-ids", kInputs,
                                    "--hook", block + ".experts.1", "--hook", block + ".experts.2",
                                    "--out", tmp.str("cap.safetensors")};
      if (pass == 1) argv.insert(argv.end(), {"--batch-size", "1"});
      auto r = run(argv);
      ASSERT_EQ(r.code, 0) << r.err;
      auto out = flex::SafetensorsFile::open(tmp.str("cap.safetensors"));
      for (const std::string e : {".experts.1", ".experts.2"}) {
        const at::Tensor rows = out->get(block + e), idx = out->get(block + e + "#token_index");
        ASSERT_EQ(idx.scalar_type(), at::kLong);
        ASSERT_EQ(idx.size(0), rows.size(0));
        at::Tensor d = at::zeros({16, rows.size(1)});
        d.index_copy_(0, idx, rows);
        dense[pass][e] = d;
        if (pass == 0) {
          EXPECT_TRUE(models_test::close(rows, models_test::golden_tensors(model)->get(block + e), block + e));
        }
      }
    }
    for (const auto& [e, d] : dense[0]) EXPECT_TRUE(models_test::close(dense[1][e], d, model + e + " batches of one"));
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CliCapture,
                         ::testing::Values("gpt2", "llama", "gpt-neox", "llama3-rope-tied", "mistral", "qwen2", "gemma2",
                                           "phi3", "olmo2", "mixtral", "qwen2_moe"),
                         name_of);

TEST(CliCapture, ExplicitDiskMapFileAndStreamDir) {
  // Transformers' own CPU + disk map for GPT-2 (fixture), given as a file, and
  // the streaming sink: the shards hold the same activations.
  flex_test::TempDir tmp;
  const json e2e = models_test::read_json(flex_test::fixture("device_maps/gpt2.json"))["transformers_from_pretrained_end_to_end"];
  { std::ofstream(tmp.str("map.json")) << e2e["hf_device_map"].dump(); }
  auto r = run({"capture", flex_test::fixture("models/gpt2"), "--input-ids", kInputs, "--hook", "transformer.h.0",
                "--hook", "transformer.h.1.attn.attn_dropout", "--out", tmp.str("cap.safetensors"), "--device-map",
                tmp.str("map.json"), "--offload-folder", tmp.str("off"), "--stream-dir", tmp.str("stream"), "--batch-size",
                "1"});
  ASSERT_EQ(r.code, 0) << r.err;
  auto ref = models_test::golden_tensors("gpt2");
  flex::CaptureReader reader(tmp.str("stream"));
  EXPECT_EQ(reader.num_forwards(), 2);
  for (const std::string k : {"transformer.h.0", "transformer.h.1.attn.attn_dropout", "logits"})
    EXPECT_TRUE(models_test::close(at::cat(reader.all(k), 0), ref->get(k), k));
  auto out = flex::SafetensorsFile::open(tmp.str("cap.safetensors"));
  EXPECT_TRUE(models_test::close(out->get("logits"), ref->get("logits"), "logits"));
  EXPECT_TRUE(flex_test::equal(out->get("input_ids"), ref->get("input_ids")));
}

TEST(CliCapture, DtypeBf16StoresBf16) {
  flex_test::TempDir tmp;
  auto r = run({"capture", flex_test::fixture("models/llama"), "--input-ids", kInputs, "--hook", "model.norm", "--out",
                tmp.str("cap.safetensors"), "--dtype", "bf16"});
  ASSERT_EQ(r.code, 0) << r.err;
  auto out = flex::SafetensorsFile::open(tmp.str("cap.safetensors"));
  EXPECT_EQ(out->info("model.norm").dtype_name, "BF16");
  EXPECT_EQ(out->info("logits").dtype_name, "BF16");
  // bf16 compute: loose agreement with the f32 golden.
  auto ref = models_test::golden_tensors("llama");
  EXPECT_TRUE(models_test::close(out->get("model.norm").to(at::kFloat), ref->get("model.norm"), "norm", 0.1, 0.05));
}

// --- inspect -------------------------------------------------------------------------

namespace {
class CliInspect : public ::testing::TestWithParam<std::string> {};

std::string budget_arg(const json& mm) {
  std::string s;
  for (auto it = mm.begin(); it != mm.end(); ++it) {
    s += (s.empty() ? "" : ",") + it.key() + "=";
    s += it.value().is_string() ? it.value().get<std::string>() : std::to_string(it.value().get<int64_t>());
  }
  return s;
}

flex::DeviceMap map_from_pairs(const json& pairs) {
  flex::DeviceMap m;
  for (const auto& p : pairs)
    m.set(p[0].get<std::string>(), p[1].is_number_integer() ? flex::MapDevice(p[1].get<int>()) : flex::MapDevice(p[1].get<std::string>()));
  return m;
}
}  // namespace

TEST_P(CliInspect, JsonReproducesFixtureDeviceMapsAndSizes) {
  // dispatch_fixture_device_maps checks the planner on every scenario in
  // process; here the command line is checked end to end on a few: of each
  // kind of call (plain, --dtype, --no-split none) the scenario whose map uses
  // the most devices. (Every scenario costs a process, ~1 s of libtorch start-up.)
  const json fx = flex_test::transformers5_names(models_test::read_json(flex_test::fixture("device_maps/" + GetParam() + ".json")));
  const std::vector<std::string> block = fx["model._no_split_modules"];
  const auto no_split_of = [](const json& kw) {
    return !kw.contains("no_split_module_classes") || kw["no_split_module_classes"].is_null();
  };
  std::map<std::string, std::pair<size_t, json>> chosen;  // kind -> (devices, scenario)
  for (const auto& sc : fx["scenarios"]) {
    const json kw = sc["kwargs"];
    if (sc["device_map"].is_string()) continue;  // upstream raised
    bool simple = true, integral = true;
    for (auto it = kw.begin(); it != kw.end(); ++it)
      simple = simple && (it.key() == "no_split_module_classes" || it.key() == "dtype");
    for (auto it = sc["max_memory"].begin(); it != sc["max_memory"].end(); ++it)
      integral = integral && (it.value().is_string() || it.value().is_number_integer());
    if (!simple || !integral) continue;
    const bool no_split = no_split_of(kw);
    if (!no_split && kw["no_split_module_classes"].get<std::vector<std::string>>() != block) continue;
    const std::string kind = kw.contains("dtype") ? "dtype" : no_split ? "no-split" : "plain";
    std::set<std::string> devices;
    for (const auto& p : sc["device_map"]) devices.insert(p[1].dump());
    if (!chosen.count(kind) || devices.size() > chosen[kind].first) chosen[kind] = {devices.size(), sc};
  }
  ASSERT_TRUE(chosen.count("plain")) << "no plain scenario in the fixture";
  for (const auto& [kind, entry] : chosen) {
    const json& sc = entry.second;
    const json kw = sc["kwargs"];
    std::vector<std::string> args = {"inspect", flex_test::fixture("models/" + GetParam()), "--json", "--max-memory",
                                     budget_arg(sc["max_memory"])};
    if (no_split_of(kw)) args.insert(args.end(), {"--no-split", "none"});
    if (kw.contains("dtype")) args.insert(args.end(), {"--dtype", kw["dtype"].get<std::string>()});
    auto r = run(args);
    ASSERT_EQ(r.code, 0) << sc["tag"] << ": " << r.err;
    ASSERT_EQ(cli_test::count_lines(r.out), 1) << "one JSON object: " << r.out;
    const json j = json::parse(r.out);
    EXPECT_EQ(flex::DeviceMap::from_json(j["device_map"].dump()), map_from_pairs(sc["device_map"])) << sc["tag"];
    if (kind != "plain") continue;
    const json cfg = models_test::read_json(flex_test::fixture("models/" + GetParam() + "/config.json"));
    EXPECT_EQ(j["architecture"], cfg["architectures"][0]);
    // Independent count: every tensor of the checkpoint (tied ones are stored once; no buffers stored).
    auto ck = flex::SafetensorsFile::open(flex_test::fixture("models/" + GetParam() + "/model.safetensors"));
    int64_t numel = 0;
    for (const auto& n : ck->names()) {
      int64_t k = 1;
      for (auto d : ck->info(n).shape) k *= d;
      numel += k;
    }
    EXPECT_EQ(j["num_parameters"].get<int64_t>(), numel);
    EXPECT_EQ(j["tied_parameters"], fx["tied_parameters"]);
    std::map<std::string, double> golden;
    for (const auto& p : fx["compute_module_sizes"]["sizes"]) golden[p[0]] = p[1].get<double>();
    for (auto it = j["module_sizes"].begin(); it != j["module_sizes"].end(); ++it)
      EXPECT_EQ(it.value().get<double>(), golden.count(it.key()) ? golden[it.key()] : 0.0) << it.key();
    for (const auto& [k, v] : golden)
      if (v != 0) {
        EXPECT_TRUE(j["module_sizes"].contains(k)) << k;
      }
  }
}

// The models whose module tree is the one the 4.47 fixtures recorded. Mistral,
// Gemma 2, Phi-3, OLMo 2 and Mixtral have 5.23's model.rotary_emb besides
// (its inv_freq changes the sizes): dispatch_fixture_device_maps checks the
// planner on their 4.47 trees in process.
INSTANTIATE_TEST_SUITE_P(Fixtures, CliInspect,
                         ::testing::Values("gpt2", "llama", "gpt-neox", "llama3-rope-tied", "qwen2", "qwen2_moe"),
                         name_of);

TEST(CliInspect, HumanReadableAndArchitecture) {
  auto r = run({"inspect", flex_test::fixture("models/gpt2"), "--max-memory", "cpu=1GiB", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["architecture"], "GPT2LMHeadModel");
  // 2 blocks of 4*64*64+4*64 (attn) + 2*64*256+256+64 (mlp) + 4*64 (2 LN), wte 256*64, wpe 64*64, ln_f 2*64.
  const int64_t block = (64 * 192 + 192) + (64 * 64 + 64) + (64 * 256 + 256) + (256 * 64 + 64) + 4 * 64;
  EXPECT_EQ(j["num_parameters"].get<int64_t>(), 2 * block + 256 * 64 + 64 * 64 + 2 * 64);
  EXPECT_EQ(j["device_map"], json::parse(R"({"":"cpu"})"));
  auto h = run({"inspect", flex_test::fixture("models/gpt2"), "--max-memory", "0=200KB,cpu=1GiB"});
  ASSERT_EQ(h.code, 0) << h.err;
  EXPECT_NE(h.out.find("GPT2LMHeadModel"), std::string::npos);
  EXPECT_NE(h.out.find("lm_head.weight transformer.wte.weight"), std::string::npos) << h.out;
  EXPECT_NE(h.out.find("device map:"), std::string::npos) << h.out;
  EXPECT_NE(h.out.find("GPT2Block"), std::string::npos) << h.out;
}

// --- errors --------------------------------------------------------------------------

namespace {
void expect_error(const cli_test::Result& r, int code, const std::vector<std::string>& fragments) {
  EXPECT_EQ(r.code, code) << r.err;
  EXPECT_EQ(cli_test::count_lines(r.err), 1) << "one line: " << r.err;
  EXPECT_EQ(r.err.rfind("flexmodel: error: ", 0), 0u) << r.err;
  for (const auto& f : fragments) EXPECT_NE(r.err.find(f), std::string::npos) << "'" << f << "' not in: " << r.err;
}
}  // namespace

TEST(CliErrors, MissingModelDir) {
  flex_test::TempDir tmp;
  expect_error(run({"capture", tmp.str("nope"), "--input-ids", kInputs, "--hook", "all", "--out", tmp.str("o.safetensors")}),
               1, {tmp.str("nope"), "does not exist"});
  expect_error(run({"inspect", tmp.str()}), 1, {"no config.json"});
}

TEST(CliErrors, UnknownHookNameSuggestsCloseNames) {
  flex_test::TempDir tmp;
  auto r = run({"capture", flex_test::fixture("models/gpt2"), "--input-ids", kInputs, "--hook", "transformer.h.0.mlpp",
                "--out", tmp.str("o.safetensors")});
  expect_error(r, 1, {"transformer.h.0.mlpp", "transformer.h.0.mlp"});
  EXPECT_FALSE(std::filesystem::exists(tmp.str("o.safetensors")));
}

TEST(CliErrors, BadDeviceMapFile) {
  flex_test::TempDir tmp;
  { std::ofstream(tmp.str("bad.json")) << "{\"transformer\": \"gpu7\""; }
  expect_error(run({"capture", flex_test::fixture("models/gpt2"), "--input-ids", kInputs, "--hook", "all", "--out",
                    tmp.str("o.safetensors"), "--device-map", tmp.str("bad.json")}),
               1, {"bad.json"});
  { std::ofstream(tmp.str("dev.json")) << R"({"transformer": "gpu7", "lm_head": "cpu"})"; }
  expect_error(run({"capture", flex_test::fixture("models/gpt2"), "--input-ids", kInputs, "--hook", "all", "--out",
                    tmp.str("o.safetensors"), "--device-map", tmp.str("dev.json")}),
               1, {"dev.json", "gpu7"});
  // A map that leaves parameters without a device.
  { std::ofstream(tmp.str("partial.json")) << R"({"lm_head": "cpu"})"; }
  expect_error(run({"capture", flex_test::fixture("models/gpt2"), "--input-ids", kInputs, "--hook", "all", "--out",
                    tmp.str("o.safetensors"), "--device-map", tmp.str("partial.json")}),
               1, {"transformer"});
  expect_error(run({"capture", flex_test::fixture("models/gpt2"), "--input-ids", kInputs, "--hook", "all", "--out",
                    tmp.str("o.safetensors"), "--device-map", tmp.str("missing.json")}),
               1, {"missing.json"});
}

TEST(CliErrors, UnwritableOutput) {
  flex_test::TempDir tmp;
  expect_error(run({"capture", flex_test::fixture("models/gpt2"), "--input-ids", kInputs, "--hook", "all", "--out",
                    tmp.str("no/such/dir/o.safetensors")}),
               1, {"no/such/dir", "does not exist"});
  expect_error(run({"capture", flex_test::fixture("models/gpt2"), "--input-ids", kInputs, "--hook", "all", "--out", tmp.str()}),
               1, {"is a directory"});
}

TEST(CliErrors, BadSizeString) {
  expect_error(run({"inspect", flex_test::fixture("models/gpt2"), "--max-memory", "cpu=12XB"}), 2, {"12XB", "--max-memory"});
  expect_error(run({"inspect", flex_test::fixture("models/gpt2"), "--max-memory", "cpu"}), 2, {"DEVICE=SIZE"});
  expect_error(run({"inspect", flex_test::fixture("models/gpt2"), "--max-memory", "mps=1GB"}), 2, {"mps"});
  flex_test::TempDir tmp;
  expect_error(run({"convert", flex_test::fixture("models/gpt2"), "--out", tmp.str("c"), "--max-shard-size", "-5MB"}), 2,
               {"-5MB"});
}

TEST(CliErrors, BadFlags) {
  expect_error(run({"inspect", flex_test::fixture("models/gpt2"), "--bogus"}), 2, {"--bogus"});
  expect_error(run({"frobnicate"}), 2, {"frobnicate"});
  expect_error(run({"capture", flex_test::fixture("models/gpt2"), "--hook", "all", "--out", "x.safetensors"}), 2,
               {"--input-ids"});
  expect_error(run({"capture", flex_test::fixture("models/gpt2"), "--input-ids", kInputs, "--out", "x.safetensors"}), 2,
               {"--hook"});
  expect_error(run({"capture", flex_test::fixture("models/gpt2"), "--input-ids", kInputs, "--hook", "all"}), 2, {"--out"});
  expect_error(run({"inspect", flex_test::fixture("models/gpt2"), "--dtype", "f8"}), 2, {"f8"});
  expect_error(run({"inspect", flex_test::fixture("models/gpt2"), "--log-level", "loud"}), 2, {"loud"});
  expect_error(run({"inspect", flex_test::fixture("models/gpt2")}, "FLEXMODEL_LOG=chatty"), 2, {"FLEXMODEL_LOG", "chatty"});
  expect_error(run({"inspect", flex_test::fixture("models/gpt2"), "--tp", "0"}), 2, {"--tp"});
  expect_error(run({"capture", flex_test::fixture("models/gpt2"), "--input-ids", kInputs, "--hook", "all", "--out",
                    "x.safetensors", "--batch-size", "two"}),
               2, {"--batch-size", "two"});
  expect_error(run({"capture", flex_test::fixture("models/gpt2"), "--input-ids", kInputs, "--hook", "all", "--out",
                    "x.safetensors", "--device-map", "everywhere"}),
               2, {"everywhere"});
}

TEST(CliErrors, RanksThatDoNotMatchTheJobAreRejected) {
  // Outside mpirun the job has one rank: --tp 2 cannot be laid out.
  expect_error(run({"inspect", flex_test::fixture("models/gpt2"), "--tp", "2"}), 2,
               {"--tp 2 x --pp 1 x --dp 1 = 2 rank(s)", "this job has 1", "mpirun -np 2"});
  expect_error(run({"capture", flex_test::fixture("models/gpt2"), "--dp", "0"}), 2, {"--dp must be at least 1"});
}

TEST(CliErrors, PromptWithoutTokenizer) {
  flex_test::TempDir tmp;
  expect_error(run({"capture", flex_test::fixture("models/gpt2"), "--prompt", "hello", "--hook", "all", "--out",
                    tmp.str("o.safetensors")}),
               1, {"has no tokenizer", "--input-ids"});
}

TEST(CliErrors, InputFileWithoutInputIds) {
  flex_test::TempDir tmp;
  expect_error(run({"capture", flex_test::fixture("models/gpt2"), "--input-ids",
                    flex_test::fixture("models/gpt2/model.safetensors"), "--hook", "all", "--out", tmp.str("o.safetensors")}),
               1, {"input_ids", "model.safetensors"});
}

TEST(CliHelp, EveryCommandHasHelp) {
  for (const std::string c : {"inspect", "capture", "generate", "convert"}) {
    auto r = run({c, "--help"});
    EXPECT_EQ(r.code, 0) << c;
    EXPECT_NE(r.out.find("usage: flexmodel " + c), std::string::npos) << r.out;
  }
  auto r = run({"--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("capture"), std::string::npos);
}

// The versions come from the headers this test compiled against and from the
// dynamic loader's view of the test process, not from the tool.
TEST(CliVersion, NamesFlexmodelLibtorchItsBuildAndTheBackends) {
  const auto r = run({"--version"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("flexmodel 0."), std::string::npos) << r.out;
#ifdef FLEX_TORCH_CUDA
  const std::string build = ", CUDA build (";
#else
  const std::string build = ", CPU build (";
#endif
  EXPECT_NE(r.out.find(std::string("libtorch ") + TORCH_VERSION + build), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("libtorch_cpu.so"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(flex::mpi_available() ? "MPI: compiled in (" : "MPI: not compiled in"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("NCCL: "), std::string::npos) << r.out;
  EXPECT_NE(run({"--help"}).out.find("flexmodel --version"), std::string::npos);
}
