#pragma once
// The first-wave fixtures (tests/data/fixtures) were recorded with
// Transformers 4.47; flexmodel's module names are Transformers 5.23's. Where
// 5.23 renamed a module without changing it, a fixture name is read under its
// 5.23 name here, in one place:
//   Mixtral's sparse block  model.layers.N.block_sparse_moe  -> model.layers.N.mlp
//   GPT-NeoX's head         embed_out                        -> lm_head
// One module moved: where 4.47 called a self_attn.rotary_emb in each layer
// and had no model.rotary_emb (Mistral, Gemma 2, Phi-3, OLMo 2, Mixtral),
// 5.23 (and flexmodel) calls model.rotary_emb once, after the embedding, and
// the per-layer modules stay idle. transformers5_golden() and
// transformers5_tensor_names() read a golden that way.
#include <nlohmann/json.hpp>

#include <map>
#include <regex>
#include <string>
#include <vector>

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

inline bool per_layer_rotary(const std::string& name) {
  static const std::regex r(R"(model\.layers\.\d+\.self_attn\.rotary_emb)");
  return std::regex_match(name, r);
}

/// A first-wave golden json (renamed) read as 5.23 runs the model: Gemma 2's
/// embed_tokens scales inside (5.23's Gemma2TextScaledWordEmbedding), so its
/// 4.47 output (unscaled) is not 5.23's: the call stays, with nothing saved;
/// the
/// per-layer rotary calls replaced by one model.rotary_emb call after
/// model.embed_tokens, which saves layer 0's outputs where they have 5.23's
/// [1, T, D] shape (Mixtral's 4.47 [T, D] tables are not 5.23's output: it
/// saves none); the per-layer modules listed as never called; model.rotary_emb
/// and its inv_freq in the module tree after model.norm.
inline nlohmann::json transformers5_golden(const nlohmann::json& golden) {
  nlohmann::json g = transformers5_names(golden);
  if (!g.contains("modules_in_execution_order")) return g;
  auto& order = g["modules_in_execution_order"];
  if (g.value("class", "") == "Gemma2ForCausalLM") {
    for (auto& e : order)
      if (e["name"] == "model.embed_tokens") {
        e["class"] = "Gemma2TextScaledWordEmbedding";
        e["saved"] = nlohmann::json::array();
      }
    if (g.contains("named_modules"))
      for (auto& e : g["named_modules"])
        if (e.is_array() && e[0] == "model.embed_tokens") e[1] = "Gemma2TextScaledWordEmbedding";
    if (g.contains("buffers"))
      g["buffers"].push_back({{"name", "model.embed_tokens.embed_scale"}, {"shape", nlohmann::json::array()}, {"dtype", "float32"}});
  }
  for (const auto& e : order)
    if (e["name"] == "model.rotary_emb") return g;
  nlohmann::json kept = nlohmann::json::array(), moved, idle = nlohmann::json::array();
  for (const auto& e : order) {
    if (!per_layer_rotary(e["name"].get<std::string>())) {
      kept.push_back(e);
      continue;
    }
    idle.push_back(e["name"]);
    if (!moved.is_null()) continue;
    moved = e;
    moved["name"] = "model.rotary_emb";
    if (moved["class"] == "Phi3LongRoPEScaledRotaryEmbedding") moved["class"] = "Phi3RotaryEmbedding";
    nlohmann::json saved = nlohmann::json::array();
    for (auto s : e["saved"])
      if (s["shape"].size() == 3) {
        s["key"] = s["element"].get<int>() == 0 ? "model.rotary_emb" : "model.rotary_emb#out" + std::to_string(s["element"].get<int>());
        saved.push_back(s);
      }
    moved["saved"] = saved;
  }
  if (moved.is_null()) return g;
  nlohmann::json out = nlohmann::json::array();
  for (const auto& e : kept) {
    out.push_back(e);
    if (e["name"] == "model.embed_tokens") out.push_back(moved);
  }
  order = out;
  for (const auto& n : idle) g["modules_never_called"].push_back(n);
  if (g.contains("named_modules")) {
    nlohmann::json names = nlohmann::json::array();
    for (const auto& e : g["named_modules"]) {
      names.push_back(e);
      const std::string n = e.is_string() ? e.get<std::string>() : e[0].get<std::string>();
      if (n == "model.norm") {
        if (e.is_string()) names.push_back("model.rotary_emb");
        else names.push_back(nlohmann::json::array({"model.rotary_emb", moved["class"]}));
      }
    }
    g["named_modules"] = names;
  }
  if (g.contains("buffers"))
    for (auto b : g["buffers"])
      if (b["name"] == "model.layers.0.self_attn.rotary_emb.inv_freq") {
        b["name"] = "model.rotary_emb.inv_freq";
        g["buffers"].push_back(b);
        break;
      }
  return g;
}

/// A first-wave golden file's tensor names as 5.23 names them: renamed, and
/// (where the rotary module moved, as transformers5_golden) layer 0's
/// [1, T, D] rotary outputs read as model.rotary_emb's, the other layers'
/// left out; `gemma2`: its unscaled embed_tokens output left out. `rank`
/// gives a stored tensor's number of dims. Stored name -> 5.23 name, for the
/// tensors that have one.
template <typename RankOf>
std::vector<std::pair<std::string, std::string>> transformers5_tensor_names(const std::vector<std::string>& stored,
                                                                            RankOf rank, bool gemma2 = false) {
  bool moved = false, model_level = false;
  for (const auto& k : stored) {
    const std::string n = transformers5_name(k);
    moved = moved || per_layer_rotary(n.substr(0, n.find('#')));
    model_level = model_level || n == "model.rotary_emb";
  }
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& k : stored) {
    std::string n = transformers5_name(k);
    if (gemma2 && n == "model.embed_tokens") continue;
    const size_t hash = n.find('#');
    const std::string module = n.substr(0, hash);
    if (moved && !model_level && per_layer_rotary(module)) {
      if (module != "model.layers.0.self_attn.rotary_emb" || rank(k) != 3) continue;
      n = "model.rotary_emb" + (hash == std::string::npos ? std::string() : n.substr(hash));
    }
    out.emplace_back(k, n);
  }
  return out;
}

}  // namespace flex_test
