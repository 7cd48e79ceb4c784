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
