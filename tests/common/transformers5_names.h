#pragma once
// The first-wave fixtures (tests/data/fixtures) were recorded with
// Transformers 4.47; flexmodel's module names are Transformers 5.23's. Where
// 5.23 renamed a module without changing it, a fixture name is read under its
// 5.23 name here, in one place:
//   Mixtral's sparse block  model.layers.N.block_sparse_moe  -> model.layers.N.mlp
//   GPT-NeoX's head         embed_out                        -> lm_head
// (Modules 5.23 moved or rebuilt, such as the per-layer rotary_emb that 5.23
// computes once in model.rotary_emb, are not renames: the fixtures keep them.)
#include <nlohmann/json.hpp>

#include <string>

namespace flex_test {

inline std::string transformers5_name(std::string name) {
  const std::string moe = ".block_sparse_moe";
  for (size_t at = name.find(moe); at != std::string::npos; at = name.find(moe, at))
    name.replace(at, moe.size(), ".mlp");
  const std::string head = "embed_out";
  if (name.rfind(head, 0) == 0 && (name.size() == head.size() || name[head.size()] == '.' || name[head.size()] == '#'))
    name.replace(0, head.size(), "lm_head");
  return name;
}

/// A fixture json with every string (values and keys) read under its 5.23 name.
inline nlohmann::json transformers5_names(const nlohmann::json& j) {
  if (j.is_string()) return transformers5_name(j.get<std::string>());
  if (j.is_array()) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& e : j) out.push_back(transformers5_names(e));
    return out;
  }
  if (j.is_object()) {
    nlohmann::json out = nlohmann::json::object();
    for (auto it = j.begin(); it != j.end(); ++it) out[transformers5_name(it.key())] = transformers5_names(it.value());
    return out;
  }
  return j;
}

}  // namespace flex_test
