#pragma once
// Shared by the model tests: fixture paths, golden json/safetensors access,
// tolerance checks with readable failure messages.
#include <flex/dispatch/big_modeling.h>
#include <flex/dispatch/module_sizes.h>
#include <flex/dispatch/safetensors.h>
#include <flex/models/auto_model.h>
#include <flex/models/from_pretrained.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "transformers5_names.h"

namespace models_test {

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

inline std::string model_dir(const std::string& name) { return flex_test::fixture("models/" + name); }
/// A first-wave golden json read as Transformers 5.23 names and runs the model (transformers5_names.h).
inline nlohmann::json golden_json(const std::string& golden) {
  return flex_test::transformers5_golden(read_json(flex_test::fixture("golden/" + golden + ".json")));
}
/// A first-wave golden safetensors file whose tensors are named as Transformers 5.23 names the modules.
class GoldenTensors {
 public:
  GoldenTensors(const std::string& path, bool gemma2) : file_(flex::SafetensorsFile::open(path)) {
    const auto rank = [&](const std::string& k) { return file_->info(k).shape.size(); };
    for (const auto& [stored, name] : flex_test::transformers5_tensor_names(file_->names(), rank, gemma2)) {
      names_.push_back(name);
      stored_[name] = stored;
    }
  }
  const std::vector<std::string>& names() const { return names_; }
  bool contains(const std::string& name) const { return stored_.count(name) > 0; }
  at::Tensor get(const std::string& name) const { return file_->get(stored(name)); }
  flex::TensorInfo info(const std::string& name) const { return file_->info(stored(name)); }

 private:
  std::string stored(const std::string& name) const {
    auto it = stored_.find(name);
    return it == stored_.end() ? name : it->second;  // an unknown name: the file's own not-found error
  }
  std::shared_ptr<flex::SafetensorsFile> file_;
  std::vector<std::string> names_;
  std::map<std::string, std::string> stored_;
};
inline std::shared_ptr<GoldenTensors> golden_tensors(const std::string& golden) {
  return std::make_shared<GoldenTensors>(flex_test::fixture("golden/" + golden + ".safetensors"), golden == "gemma2");
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

/// A zoo3 manifest case's captured modules ("captured", "captured_submodules",
/// "routers"), each mapped to the name it has in flexmodel (a multimodal
/// checkpoint loads as its language model: "causal_lm_names" maps them).
inline std::map<std::string, std::string> zoo3_hooked(const nlohmann::json& info) {
  const bool renamed = info.contains("causal_lm_names");
  std::map<std::string, std::string> hooked;
  for (const char* group : {"captured", "captured_submodules", "routers"})
    if (info.contains(group))
      for (const auto& n : info[group])
        hooked[n.get<std::string>()] = renamed ? info["causal_lm_names"][n.get<std::string>()].get<std::string>()
                                               : n.get<std::string>();
  return hooked;
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

/// Logits of a (left-padded) batch through the model's call, so hooks run.
inline at::Tensor masked_logits(flex::CausalLM& model, const at::Tensor& ids, const at::Tensor& mask) {
  at::NoGradGuard g;
  flex::LMInputs in;
  in.input_ids = ids;
  in.attention_mask = mask;
  return model.run(in).logits;
}

/// Records the output (element 0 of a tuple) of each module: `names` maps the
/// key in `outputs` to the module's name in `model`. Keep the handles alive.
inline std::vector<flex::HookHandle> record_outputs(flex::Module& model, const std::map<std::string, std::string>& names,
                                                    std::map<std::string, at::Tensor>& outputs) {
  std::vector<flex::HookHandle> handles;
  for (const auto& [key, module] : names)
    handles.push_back(model.get_submodule(module)->register_forward_hook(
        [&outputs, key = key](flex::Module&, const flex::Inputs&, flex::Value& out) {
          outputs[key] = out.isTensor() ? out.toTensor() : out.toTupleRef().elements()[0].toTensor();
        }));
  return handles;
}

/// `dir` loaded with an automatic device map whose CPU budget is half of
/// `plain`'s bytes, the rest offloaded to `folder`.
inline std::shared_ptr<flex::CausalLM> from_pretrained_half_on_disk(const std::string& dir, flex::CausalLM& plain,
                                                                     const std::string& folder) {
  flex::PretrainedOptions o;
  o.device_map_strategy = "auto";
  flex::MaxMemory mm;
  mm.set(flex::MapDevice::cpu(), 0.5 * flex::compute_module_sizes(plain).total());
  o.max_memory = mm;
  o.offload_folder = folder;
  return flex::from_pretrained(dir, o);
}

}  // namespace models_test
