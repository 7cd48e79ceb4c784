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

/// allclose with the fixture tolerances; the message names `what` and the worst element.
inline ::testing::AssertionResult close(const at::Tensor& actual, const at::Tensor& expected, const std::string& what,
                                        double atol = 1e-5, double rtol = 1e-4) {
  if (!actual.defined()) return ::testing::AssertionFailure() << what << ": no tensor";
  if (actual.sizes() != expected.sizes()) {
    std::ostringstream o;
    o << what << ": shape " << actual.sizes() << " vs expected " << expected.sizes();
    return ::testing::AssertionFailure() << o.str();
  }
  at::Tensor a = actual.detach().to(at::kCPU, at::kDouble), e = expected.to(at::kCPU, at::kDouble);
  at::Tensor excess = (a - e).abs() - (atol + rtol * e.abs());
  if (excess.max().item<double>() <= 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": max |diff| " << (a - e).abs().max().item<double>()
                                       << " exceeds atol " << atol << " + rtol " << rtol << " * |expected|";
}

}  // namespace models_test
