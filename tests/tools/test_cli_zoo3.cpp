// `flexmodel inspect CONFIG_DIR --json` on the published configs of the
// 2025-26 models (tests/data/configs, from scripts/golden/make_param_counts.py):
// num_parameters equals Transformers 5.23's count of the same config built on
// the meta device (tied weights once; FP8 / MXFP4 models dequantized; a
// multimodal Gemma 3 as its language model, Gemma3ForCausalLM of text_config).
#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include <fstream>
#include <map>

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
    if (map.size() > 1) EXPECT_FALSE(block_device.empty());
    int before = 0;
    for (const auto& [index, device] : block_device) {
      EXPECT_GE(device, before) << "block " << index;
      before = device;
    }
  }
}

}  // namespace
