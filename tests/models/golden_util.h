#pragma once
// Shared by the model tests: fixture paths, golden json/safetensors access,
// tolerance checks with readable failure messages.
#include <flex/dispatch/safetensors.h>
#include <flex/models/auto_model.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace models_test {

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

inline std::string model_dir(const std::string& name) { return flex_test::fixture("models/" + name); }
inline nlohmann::json golden_json(const std::string& golden) {
  return read_json(flex_test::fixture("golden/" + golden + ".json"));
}
inline std::shared_ptr<flex::SafetensorsFile> golden_tensors(const std::string& golden) {
  return flex::SafetensorsFile::open(flex_test::fixture("golden/" + golden + ".safetensors"));
}
/// tests/data/golden5/<rel>: the Transformers 5.23 goldens.
inline std::string golden5(const std::string& rel) { return flex_test::data_path("golden5/" + rel); }
/// The case names of a golden5 manifest ("manifest.json", "manifest_zoo3.json").
inline std::vector<std::string> golden5_cases(const std::string& manifest) {
  std::vector<std::string> out;
  const auto m = read_json(golden5(manifest));
  for (auto& [name, info] : m["cases"].items()) out.push_back(name);
  return out;
}
/// Rows [B * T, ...] of `t` [B, T, ...] where `mask` [B, T] is 1 (what the
/// goldens compare: left padding is left out).
inline at::Tensor kept(const at::Tensor& t, const at::Tensor& mask) {
  const at::Tensor rows = mask.flatten().nonzero().squeeze(1);
  return t.reshape({t.size(0) * t.size(1), -1}).index_select(0, rows);
}

inline at::Tensor golden_inputs() {
  return flex::SafetensorsFile::open(flex_test::fixture("golden/inputs.safetensors"))->get("input_ids").clone();
}

/// flex_test::close with the fixture tolerances (atol before rtol here),
/// compared in float64 whatever the two dtypes; the message starts with `what`.
inline ::testing::AssertionResult close(const at::Tensor& actual, const at::Tensor& expected, const std::string& what,
                                        double atol = 1e-5, double rtol = 1e-4) {
  auto f64 = [](const at::Tensor& t) { return t.defined() ? t.to(at::kDouble) : t; };
  ::testing::AssertionResult r = flex_test::close(f64(actual), f64(expected), rtol, atol);
  if (r) return r;
  return ::testing::AssertionFailure() << what << ": " << r.message();
}

}  // namespace models_test
