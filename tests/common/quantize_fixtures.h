#pragma once
// What the --quantize-head and --quantize-embeddings tests share: the
// fixtures' input ids, a pair of identical random 256-wide llamas (Q6_K
// needs 256-value rows; the fixtures are 64 wide) and the name of a (model,
// format) test case.
#include <flex/dispatch/safetensors.h>
#include <flex/models/auto_model.h>
#include <flex/models/config.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cctype>
#include <fstream>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "data_util.h"

namespace flex_test {

/// The fixture models' input ids (fixtures/golden/inputs.safetensors).
inline at::Tensor fixture_input_ids() {
  return flex::SafetensorsFile::open(fixture("golden/inputs.safetensors"))->get("input_ids");
}

/// The llama fixture's config at hidden and intermediate size 256, one
/// layer: two models with the same weights N(0, 0.05) drawn after
/// at::manual_seed(52), one to quantize and one to compare against.
inline std::pair<std::shared_ptr<flex::CausalLM>, std::shared_ptr<flex::CausalLM>> twin_llama256() {
  nlohmann::json c;
  std::ifstream(fixture("models/llama/config.json")) >> c;
  c["hidden_size"] = 256;
  c["intermediate_size"] = 256;
  c["num_hidden_layers"] = 1;
  at::manual_seed(52);
  auto ref = flex::build_causal_lm(flex::parse_config(c, "llama256"), at::TensorOptions());
  auto lm = flex::build_causal_lm(flex::parse_config(c, "llama256"), at::TensorOptions());
  at::NoGradGuard g;
  auto sa = flex::state_dict(*ref), sb = flex::state_dict(*lm);
  EXPECT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size() && i < sb.size(); ++i) {
    EXPECT_EQ(sa[i].first, sb[i].first);
    if (!at::isFloatingType(sa[i].second.scalar_type())) continue;
    sa[i].second.normal_(0, 0.05);
    sb[i].second.copy_(sa[i].second);
  }
  return {ref, lm};
}

/// "llama3_rope_tied_q8_0" for the case (model, format).
inline std::string model_format_name(const std::tuple<std::string, std::string>& param) {
  std::string s = std::get<0>(param) + "_" + std::get<1>(param);
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

}  // namespace flex_test
