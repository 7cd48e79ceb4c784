#pragma once
// Checks a `flexmodel capture --hook all` output file against a fixture's
// golden forward (written by Transformers).
#include "../models/golden_util.h"

#include <flex/dispatch/safetensors.h>

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace cli_test {

/// Every golden module output (HF names; "" and the extra "#out" elements
/// excepted) is in `out_path` within the fixture tolerances, and the file
/// holds no module the golden forward did not call.
inline void expect_matches_golden(const std::string& out_path, const std::string& golden) {
  auto out = flex::SafetensorsFile::open(out_path);
  auto ref = models_test::golden_tensors(golden);
  std::set<std::string> called;
  const auto gj = models_test::golden_json(golden);
  for (const auto& m : gj["modules_in_execution_order"]) called.insert(m["name"].get<std::string>());
  size_t compared = 0;
  for (const auto& n : ref->names()) {
    if (n.empty() || n.find('#') != std::string::npos) continue;
    ASSERT_TRUE(out->contains(n)) << golden << ": capture lacks " << n;
    EXPECT_EQ(out->info(n).dtype, n == "input_ids" ? at::kLong : at::kFloat) << n;
    EXPECT_TRUE(models_test::close(out->get(n), ref->get(n), golden + " " + n));
    ++compared;
  }
  const std::string rows = "#token_index";
  for (const auto& n : out->names()) {
    // Beside a mixture-of-experts expert's rows (and its submodules'): each row's token index.
    if (n.size() > rows.size() && n.compare(n.size() - rows.size(), rows.size(), rows) == 0) {
      const std::string base = n.substr(0, n.size() - rows.size());
      ASSERT_TRUE(ref->contains(base)) << golden << ": " << n << " beside no captured rows";
      EXPECT_EQ(out->info(n).dtype, at::kLong) << n;
      EXPECT_EQ(out->get(n).size(0), ref->get(base).size(0)) << n;
      continue;
    }
    // A module the golden forward called whose values it did not record
    // (Mixtral's model.rotary_emb: 4.47 computed tables per layer instead).
    EXPECT_TRUE(ref->contains(n) || called.count(n)) << golden << ": unexpected capture " << n;
  }
  EXPECT_GT(compared, 15u);
}

}  // namespace cli_test
