#pragma once
// The hook contract's comparison, shared by the single-process layouts
// (tests/models/test_module_contract.cpp: in memory, half on disk) and the
// mpirun ones (tests/parallel2/mpi_contract.cpp: tp, pp, dp): for one case of
// tests/data/contract (scripts/golden/make_contract.py: new random weights, a
// 3-row batch with two left-padded rows), every named module Transformers 5.23
// has gets a FlexModel capture hook, and each capture is compared with what
// Transformers' own forward hook recorded: the same shape (always, padded rows
// included) and the same values (the unpadded row where the output is per
// row, since padded positions are free to differ). A module Transformers has
// and flexmodel does not is a difference unless it is one of the deliberate
// differences the README lists; the differences still open must go on
// differing until fixed (both listed in tests/data/contract/known_differences.json,
// which the Python contract test reads too).
#include <flex/dispatch/safetensors.h>
#include <flex/flexcore/flex_model.h>
#include <flex/flexcore/hook_function.h>
#include <flex/hooks/errors.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "test_util.h"

namespace contract_test {

inline std::string contract(const std::string& rel) { return flex_test::data_path("contract/" + rel); }

inline nlohmann::json manifest() {
  std::ifstream in(contract("manifest.json"));
  return nlohmann::json::parse(in);
}

/// tests/data/contract/known_differences.json: the deliberate differences
/// (by rule, as the README lists them) and those still open.
inline const nlohmann::json& known_differences() {
  static const nlohmann::json k = [] {
    std::ifstream in(contract("known_differences.json"));
    return nlohmann::json::parse(in);
  }();
  return k;
}

/// Why flexmodel deliberately differs at `name` (a rule of known_differences.json), or null.
inline const char* deliberate_rule(const std::string& name, const nlohmann::json& entry) {
  static const auto rules = [] {
    std::vector<std::tuple<std::string, std::regex, std::string>> r;  // dtype, name pattern, rule
    for (const auto& d : known_differences()["deliberate"])
      r.emplace_back(d.value("dtype", ""), std::regex(d.value("match", ".*")), d["rule"].get<std::string>());
    return r;
  }();
  for (const auto& [dtype, match, rule] : rules)
    if ((dtype.empty() || entry.value("dtype", "") == dtype) && std::regex_match(name, match)) return rule.c_str();
  return nullptr;
}

/// Differences still open (issue 49), as "case module": the same in every layout.
inline const std::set<std::string>& open_differences() {
  static const std::set<std::string> open = [] {
    std::set<std::string> o;
    for (const auto& d : known_differences()["open"])
      for (const auto& c : d["cases"]) o.insert(c.get<std::string>() + " " + d["module"].get<std::string>());
    return o;
  }();
  return open;
}

/// Counts and differences over the cases of one layout.
struct Tally {
  int64_t modules = 0, compared = 0, deliberate = 0;
  std::set<std::string> differing;
  std::map<std::string, std::string> why;
  double worst = 0, worst_relative = 0;  // largest difference, and relative to the golden's scale
  std::string worst_where;
  void differs(const std::string& c, const std::string& module, const std::string& what) {
    differing.insert(c + " " + module);
    why[c + " " + module] = what;
  }
};

/// What hook_every_module registered: forward hooks (outputs) and forward
/// pre-hooks (inputs, "NAME#input").
struct Hooked {
  std::vector<std::string> outputs, inputs;
};

/// Registers a capture hook on every module of case `name` that Transformers
/// records a tensor output for, and a capturing pre-hook on every module it
/// records an input for.
inline Hooked hook_every_module(flex::FlexModel& fm, const std::string& name, const nlohmann::json& info, Tally& tally) {
  Hooked hooked;
  for (auto& [module, entry] : info["modules"].items()) {
    const char* rule = deliberate_rule(module, entry);
    if (rule && entry.value("dtype", "") == "complex64") {
      ++tally.deliberate;
      continue;
    }
    if (entry.contains("input_shape")) {
      ++tally.modules;
      try {
        fm.register_forward_pre_hook(std::make_shared<flex::HookFunction>(module));
        hooked.inputs.push_back(module);
      } catch (const flex::NotFoundError&) {
        if (rule) ++tally.deliberate;
        else tally.differs(name, module + "#input", "Transformers has it (" + entry["class"].get<std::string>() + "), flexmodel does not");
      }
    }
    if (!entry.contains("shape")) continue;  // no tensor output (a base model's ModelOutput), or never called
    ++tally.modules;
    try {
      fm.register_forward_hook(std::make_shared<flex::HookFunction>(module));
      hooked.outputs.push_back(module);
    } catch (const flex::NotFoundError&) {
      if (rule) ++tally.deliberate;  // a name flexmodel deliberately does not have
      else tally.differs(name, module, "Transformers has it (" + entry["class"].get<std::string>() + "), flexmodel does not");
    }
  }
  return hooked;
}

/// Largest |a - e| and max |e| over the compared part: the unpadded row 0 of
/// per-row outputs ([B, T, ...] or [B, heads, T, ...]); tables and flattened rows whole.
inline std::pair<double, double> difference(const at::Tensor& got, const at::Tensor& want, int64_t B, int64_t T) {
  const bool per_row = want.dim() >= 2 && want.size(0) == B && (want.size(1) == T || want.dim() >= 3);
  const at::Tensor a = (per_row ? got[0] : got).to(at::kDouble), e = (per_row ? want[0] : want).to(at::kDouble);
  return {a.numel() ? (a - e).abs().max().item<double>() : 0.0, e.numel() ? e.abs().max().item<double>() : 0.0};
}

/// Compares the captures of one kind (outputs: "out.", key NAME; inputs:
/// "in.", key NAME#input) with the golden ones, within atol + 1e-4 of the
/// golden's largest magnitude (tensor parallelism sums row-parallel partial
/// products in another order: 2e-5 there).
inline void compare_kind(const std::string& name, const nlohmann::json& info, const flex::SafetensorsFile& golden,
                         const flex::OutputMap& output, const std::vector<std::string>& modules, bool inputs,
                         Tally& tally, double atol, double rtol) {
  const at::Tensor ids = golden.get("input_ids");
  const int64_t B = ids.size(0), T = ids.size(1);
  const std::string prefix = inputs ? "in." : "out.", suffix = inputs ? "#input" : "";
  for (const auto& module : modules) {
    const auto& entry = info["modules"][module];
    const int64_t calls = entry["calls"].get<int64_t>();
    const std::string key = module + suffix;
    auto it = output.find(key);
    if (it == output.end()) {
      // A container flexmodel keeps but never calls (the per-expert ModuleList standing for 5.23's fused experts).
      if (deliberate_rule(module, entry)) ++tally.deliberate;
      else tally.differs(name, key, "not called by flexmodel, " + std::to_string(calls) + "x by Transformers");
      continue;
    }
    if (static_cast<int64_t>(it->second.size()) != calls) {
      tally.differs(name, key, "called " + std::to_string(it->second.size()) + "x, by Transformers " + std::to_string(calls) + "x");
      continue;
    }
    // A module called k times is matched call for call in any order: Transformers
    // iterates set(layer_types) for the per-type rotary tables, an order Python's
    // string hashing decides per process.
    std::vector<bool> used(calls, false);
    for (int64_t k = 0; k < calls; ++k) {
      const at::Tensor& got = it->second[k];
      ++tally.compared;
      double best = std::numeric_limits<double>::infinity(), best_scale = 0;
      int64_t best_j = -1;
      std::string shapes;
      for (int64_t j = 0; j < calls; ++j) {
        if (used[j]) continue;
        const at::Tensor want = golden.get(prefix + (j == 0 ? module : module + "@" + std::to_string(j)));
        if (got.sizes() != want.sizes()) {
          std::ostringstream o;
          o << got.sizes() << " where Transformers has " << want.sizes();
          shapes = o.str();
          continue;
        }
        const auto [d, scale] = difference(got, want, B, T);
        if (d < best) best = d, best_scale = scale, best_j = j;
      }
      if (best_j < 0) {
        tally.differs(name, key, "shape " + shapes);
        continue;
      }
      used[best_j] = true;
      if (!(best <= atol + rtol * best_scale)) {
        std::ostringstream o;
        o << "differs by " << best << " (values up to " << best_scale << ")";
        tally.differs(name, key, o.str());
      } else if (best > tally.worst) {
        tally.worst = best, tally.worst_where = name + " " + key;
      }
      if (best_scale > 0 && best / best_scale > tally.worst_relative) tally.worst_relative = best / best_scale;
    }
  }
}

/// Compares every capture of `hooked` (in `output`) with the golden ones
/// (shapes exactly; values within atol + rtol of the golden's largest magnitude).
inline void compare(const std::string& name, const nlohmann::json& info, const flex::SafetensorsFile& golden,
                    const flex::OutputMap& output, const Hooked& hooked, Tally& tally, double atol = 1e-5,
                    double rtol = 1e-4) {
  compare_kind(name, info, golden, output, hooked.outputs, false, tally, atol, rtol);
  compare_kind(name, info, golden, output, hooked.inputs, true, tally, atol, rtol);
}

/// Fails on a difference not listed as open, and on a listed one that now matches.
inline void expect_only_open_differences(const Tally& tally, const std::string& layout) {
  for (const auto& d : tally.differing)
    if (!open_differences().count(d)) ADD_FAILURE() << layout << ": " << d << ": " << tally.why.at(d);
  for (const auto& d : open_differences())
    if (!tally.differing.count(d))
      ADD_FAILURE() << layout << ": " << d << ": listed as an open difference but it now matches Transformers: take it off the list";
  std::cout << "contract (" << layout << "): " << tally.modules << " module outputs and inputs of Transformers, " << tally.compared
            << " compared, " << tally.differing.size() << " differing (" << open_differences().size()
            << " listed as open), " << tally.deliberate
            << " deliberate differences (fused experts, complex rotary); largest difference where they agree "
            << tally.worst << " (" << tally.worst_where << "), " << tally.worst_relative
            << " of the golden's largest magnitude at most\n";
}

}  // namespace contract_test
