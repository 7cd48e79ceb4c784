// `flexmodel inspect CONFIG_DIR --json` on the published configs of the
// 2025-26 models (tests/data/configs, from scripts/golden/make_param_counts.py):
// num_parameters equals Transformers 5.23's count of the same config built on
// the meta device (tied weights once; FP8 / MXFP4 models dequantized; a
// multimodal Gemma 3 as its language model, Gemma3ForCausalLM of text_config).
#include <flex/dispatch/safetensors.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>

#include "../models/golden_util.h"
#include "cli_util.h"

using cli_test::run;
using nlohmann::json;

namespace {

TEST(CliZoo3, InspectCountsParametersAsTransformers5) {
  std::ifstream in(flex_test::data_path("configs/param_counts.json"));
  const json counts = json::parse(in);
  ASSERT_EQ(counts["transformers"], "5.23.0");
  int checked = 0;
  for (const auto& [name, info] : counts["models"].items()) {
    SCOPED_TRACE(name);
    const std::string type = info["model_type"];
    const auto r = run({"inspect", flex_test::data_path("configs/" + name), "--json"});
    ASSERT_EQ(r.code, 0) << r.err;
    const json j = json::parse(r.out);
    const json& expected = info.contains("text_only") ? info["text_only"] : info;
    EXPECT_EQ(j["num_parameters"].get<int64_t>(), expected["num_parameters"].get<int64_t>());
    EXPECT_EQ(j["architecture"], expected["class"]);
    ++checked;
  }
  EXPECT_EQ(checked, 6);
}

// The planning a user with one 24 GB GPU does: nf4, --max-memory 0=24GB.
// Checked against the module sizes inspect reports, independently of the
// planner: every block lands whole on one device, in order (GPU, then CPU,
// then disk), and no device gets more than its budget.
TEST(CliZoo3, Nf4DeviceMapFor24GBGpu) {
  std::ifstream in(flex_test::data_path("configs/param_counts.json"));
  const json counts = json::parse(in);
  const std::map<std::string, double> budget{{"0", 24e9}, {"cpu", 64e9}, {"disk", 4e12}};
  for (const auto& [name, info] : counts["models"].items()) {
    SCOPED_TRACE(name);
    const auto r = run({"inspect", flex_test::data_path("configs/" + name), "--json", "--quantize", "nf4",
                        "--max-memory", "0=24GB,cpu=64GB,disk=4000GB"});
    ASSERT_EQ(r.code, 0) << r.err;
    const json j = json::parse(r.out);
    const json& map = j["device_map"];
    const json& sizes = j["module_sizes"];
    std::map<std::string, double> used;
    for (const auto& [module, device] : map.items()) {
      const std::string d = device.is_string() ? device.get<std::string>() : std::to_string(device.get<int>());
      ASSERT_TRUE(budget.count(d)) << module << " on " << d;
      used[d] += sizes[module].get<double>();
    }
    for (const auto& [d, bytes] : used) EXPECT_LE(bytes, budget.at(d)) << "device " << d;
    EXPECT_GT(used["0"], 1e9) << "the GPU holds at least a gigabyte";
    // Each block is a key of the map (never split); by block index the
    // devices come in order: GPU, then CPU, then disk.
    const std::map<std::string, int> order{{"0", 0}, {"cpu", 1}, {"disk", 2}};
    std::map<int64_t, int> block_device;
    for (const auto& [module, device] : map.items()) {
      const size_t at = module.find(".layers.");
      if (at == std::string::npos) continue;
      const std::string index = module.substr(at + 8);
      ASSERT_EQ(index.find('.'), std::string::npos) << module << " is split across devices";
      block_device[std::stoll(index)] = order.at(device.is_string() ? device.get<std::string>()
                                                                    : std::to_string(device.get<int>()));
    }
    if (map.size() > 1) {
      EXPECT_FALSE(block_device.empty());
    }
    int before = 0;
    for (const auto& [index, device] : block_device) {
      EXPECT_GE(device, before) << "block " << index;
      before = device;
    }
  }
}

// The subcommands on the model zoo III goldens (tests/data/golden5, from
// Transformers 5.23): capture gives the golden logits and block outputs (and
// DeepSeek's MLA latent); --quantize nf4 at load equals capturing the folder
// convert --quantize nf4 wrote (bitwise); convert --dtype bf16 stays near the
// float32 logits; greedy generate's first token is the golden logits' argmax.
TEST(CliZoo3, SubcommandsRunTheNewArchitectures) {
  std::ifstream in(flex_test::data_path("golden5/manifest_zoo3.json"));
  const json manifest = json::parse(in);
  flex_test::TempDir tmp;
  for (const auto& [name, info] : manifest["cases"].items()) {
    SCOPED_TRACE(name);
    const std::string dir = flex_test::data_path("golden5/" + name);
    const std::string golden = flex_test::data_path("golden5/" + name + ".golden.safetensors");
    const auto gt = flex::SafetensorsFile::open(golden);
    const at::Tensor mask = gt->get("attention_mask");
    auto kept = [&](const at::Tensor& t) { return models_test::kept(t, mask); };
    const bool renamed = info.contains("causal_lm_names");
    std::vector<std::string> hooks{info["captured"][0]};
    if (name.rfind("deepseek", 0) == 0) hooks.push_back("model.layers.1.self_attn.kv_a_proj_with_mqa");
    auto capture = [&](const std::string& model, const std::string& out, std::vector<std::string> extra) {
      std::vector<std::string> a{"capture", model, "--input-ids", golden, "--out", out};
      for (const auto& h : hooks) a.insert(a.end(), {"--hook", renamed ? info["causal_lm_names"][h].get<std::string>() : h});
      a.insert(a.end(), extra.begin(), extra.end());
      const auto r = run(a);
      EXPECT_EQ(r.code, 0) << r.err;
      return flex::SafetensorsFile::open(out);
    };
    const auto plain = capture(dir, tmp.str() + "/" + name + ".f32.safetensors", {});
    EXPECT_TRUE(flex_test::close(kept(plain->get("logits")), kept(gt->get("logits")), 1e-4, 1e-5)) << "logits";
    for (const auto& h : hooks) {
      const std::string ours = renamed ? info["causal_lm_names"][h].get<std::string>() : h;
      EXPECT_TRUE(flex_test::close(kept(plain->get(ours)), kept(gt->get("out." + h)), 1e-4, 1e-5)) << h;
    }

    const auto nf4 = capture(dir, tmp.str() + "/" + name + ".nf4.safetensors", {"--quantize", "nf4"});
    const std::string conv = tmp.str() + "/" + name + ".nf4";
    auto r = run({"convert", dir, "--quantize", "nf4", "--out", conv});
    ASSERT_EQ(r.code, 0) << r.err;
    const auto converted = capture(conv, conv + ".safetensors", {});
    EXPECT_TRUE(flex_test::equal(converted->get("logits"), nf4->get("logits"))) << "nf4 at load vs converted";
    EXPECT_GT((nf4->get("logits") - plain->get("logits")).abs().max().item<double>(), 0.0) << "nf4 changed nothing";

    const std::string bf = tmp.str() + "/" + name + ".bf16";
    r = run({"convert", dir, "--dtype", "bf16", "--out", bf});
    ASSERT_EQ(r.code, 0) << r.err;
    const auto half = capture(bf, bf + ".safetensors", {});
    const double scale = gt->get("logits").abs().max().item<double>();
    EXPECT_LT((kept(half->get("logits")) - kept(gt->get("logits"))).abs().max().item<double>(), 0.1 * scale);  // bf16 through every layer of a random model

    r = run({"generate", dir, "--input-ids", golden, "--max-new-tokens", "2"});
    ASSERT_EQ(r.code, 0) << r.err;
    std::istringstream lines(r.out);
    const at::Tensor next = gt->get("logits").select(1, -1).argmax(-1);
    for (int64_t row = 0; row < mask.size(0); ++row) {
      std::string line;
      ASSERT_TRUE(std::getline(lines, line)) << "no output for row " << row;
      std::istringstream ids(line);
      std::vector<int64_t> tokens;
      for (int64_t id; ids >> id;) tokens.push_back(id);
      const int64_t prompt = mask[row].sum().item<int64_t>();
      ASSERT_EQ(static_cast<int64_t>(tokens.size()), prompt + 2) << line;
      EXPECT_EQ(tokens[prompt], next[row].item<int64_t>()) << "row " << row << ": " << line;
    }
  }
}

}  // namespace
