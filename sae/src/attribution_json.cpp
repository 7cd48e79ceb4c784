// The graph file circuit-tracer 0.5.0's create_graph_files writes (its
// frontend/graph_models.py: Metadata, QParams, Node, links), field for field,
// so Neuronpedia's viewer and circuit-tracer's local server open ours.
#include <flex/dispatch/atomic_file.h>
#include <flex/hooks/errors.h>
#include <flex/sae/attribution_graph.h>

#include <ATen/ATen.h>

#include <cstdio>
#include <map>
#include <set>

namespace flex {

namespace {

using json = nlohmann::json;

int64_t json_cantor(int64_t x, int64_t y) { return (x + y) * (x + y + 1) / 2 + y; }

json json_node(const std::string& id, int64_t feature, const std::string& layer, int64_t ctx, const std::string& type,
          const std::string& js_id, json influence, json activation) {
  return {{"node_id", id},         {"feature", feature}, {"layer", layer},
          {"ctx_idx", ctx},        {"feature_type", type}, {"token_prob", 0.0},
          {"is_target_logit", false}, {"run_idx", 0},    {"reverse_ctx_idx", 0},
          {"jsNodeId", js_id},     {"clerp", ""},        {"influence", influence},
          {"activation", activation}};
}

std::string json_fixed3(double p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", p);
  return buf;
}

}  // namespace

json graph_json(const AttributionGraph& g, const PrunedGraph& pruned, const GraphJsonInfo& info, double node_threshold) {
  const int64_t S = g.n_features(), L = g.n_layers, T = g.n_pos, N = g.n_nodes();
  const at::Tensor scores = pruned.cumulative_scores.to(at::kDouble).contiguous();
  const at::Tensor mask = pruned.node_mask.contiguous();
  const auto feats = g.active_features.contiguous();
  std::map<int64_t, json> nodes;  // by node index, for the kept nodes
  for (int64_t i = 0; i < N; ++i) {
    if (!mask[i].item<bool>()) continue;
    const double influence = scores[i].item<double>();
    if (i < S) {
      const int64_t a = g.selected_features[i].item<int64_t>();
      const int64_t layer = feats[a][0].item<int64_t>(), pos = feats[a][1].item<int64_t>(), f = feats[a][2].item<int64_t>();
      const std::string ls = std::to_string(layer);
      nodes[i] = json_node(ls + "_" + std::to_string(f) + "_" + std::to_string(pos), json_cantor(layer, f), ls, pos,
                      "cross layer transcoder", ls + "_" + std::to_string(f) + "-0", influence,
                      g.activations[a].item<double>());
    } else if (i < S + L * T) {
      const int64_t layer = (i - S) / T, pos = (i - S) % T;
      nodes[i] = json_node("0_" + std::to_string(layer) + "_" + std::to_string(pos), -1, std::to_string(layer), pos,
                      "mlp reconstruction error", std::to_string(layer) + "_" + std::to_string(pos) + "-0", influence,
                      nullptr);
    } else if (i < S + L * T + T) {
      const int64_t pos = i - S - L * T;
      const std::string tok = std::to_string(g.input_ids[pos].item<int64_t>());
      nodes[i] = json_node("E_" + tok + "_" + std::to_string(pos), pos, "E", pos, "embedding", "E_" + tok + "-" + std::to_string(pos),
                      influence, nullptr);
    } else {
      const int64_t k = i - S - L * T - T;
      const std::string vocab = std::to_string(g.logit_tokens[k].item<int64_t>());
      const std::string layer = std::to_string(L + 1);
      const double p = g.logit_probabilities[k].item<double>();
      json n = json_node(layer + "_" + vocab + "_" + std::to_string(T - 1), g.logit_tokens[k].item<int64_t>(), layer, T - 1,
                    "logit", "L_" + vocab + "-" + std::to_string(T - 1), nullptr, nullptr);
      n["token_prob"] = p;
      n["is_target_logit"] = k == 0;
      const std::string text = k < static_cast<int64_t>(info.logit_tokens.size()) ? info.logit_tokens[k] : vocab;
      n["clerp"] = "Output \"" + text + "\" (p=" + json_fixed3(p) + ")";
      nodes[i] = n;
    }
  }
  // Links of the kept edges between kept nodes, target-major as circuit-tracer lists them.
  json links = json::array();
  std::set<std::string> connected;
  // (the pruning's edge list: a streamed graph's adjacency is not in memory).
  const at::Tensor kept = pruned.edges.contiguous();  // [E, 2] (target, source)
  const int64_t* kp = kept.data_ptr<int64_t>();
  const at::Tensor kept_weights = pruned.edge_weights.to(at::kDouble).contiguous();
  const double* ap = kept_weights.data_ptr<double>();
  for (int64_t e = 0; e < kept.size(0); ++e) {
    const int64_t dst = kp[2 * e], src = kp[2 * e + 1];
    auto s = nodes.find(src), d = nodes.find(dst);
    if (s == nodes.end() || d == nodes.end()) continue;
    const std::string sid = s->second["node_id"], did = d->second["node_id"];
    links.push_back({{"source", sid}, {"target", did}, {"weight", ap[e]}});
    connected.insert(sid);
    connected.insert(did);
  }
  json used = json::array();
  for (auto& [i, n] : nodes) {
    const std::string type = n["feature_type"];
    if (connected.count(n["node_id"].get<std::string>()) || type == "embedding" || type == "logit") used.push_back(n);
  }
  json metadata = {{"slug", info.slug},
                   {"scan", info.scan},
                   {"transcoder_list", info.transcoder_list},
                   {"prompt_tokens", info.prompt_tokens},
                   {"prompt", info.prompt},
                   {"node_threshold", node_threshold},
                   {"schema_version", 1}};
  json qparams = {{"pinnedIds", json::array()}, {"supernodes", json::array()}, {"linkType", "both"},
                  {"clickedId", ""}, {"sg_pos", ""}};
  return {{"metadata", metadata}, {"qParams", qparams}, {"nodes", used}, {"links", links}};
}

void write_json_file(const std::string& path, const json& content) { write_file_atomic(path, content.dump(2) + "\n"); }

}  // namespace flex
