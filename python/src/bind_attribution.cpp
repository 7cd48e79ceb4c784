// Attribution graphs from Python: flexmodel._C.attribution.attribute runs
// flex::attribute and flex::prune_graph (flex/sae/attribution*.h) and
// returns the graph's tensors, the pruning masks and the graph file's JSON.
#include "bindings.h"

#include <flex/dispatch/memory.h>
#include <flex/hooks/errors.h>
#include <flex/sae/attribution.h>
#include <flex/sae/attribution_graph.h>
#include <flex/sae/attribution_intervention.h>
#include <flex/sae/attribution_parallel.h>

#include <ATen/ATen.h>

namespace flex::python {

namespace {

// A path (per-layer folder or cross-layer transcoder, found as
// --transcoders finds it) or a list of per-layer transcoders.
Transcoders transcoder_list(int64_t n_layers, py::object transcoders) {
  if (py::isinstance<py::str>(transcoders))
    return load_attribution_transcoders(transcoders.cast<std::string>(), n_layers);
  return transcoders.cast<std::vector<std::shared_ptr<SparseDictionary>>>();
}

// The graph's nodes as attribute() returns them on every rank (the
// adjacency, pruning and graph file are added where there are rows).
py::dict graph_nodes(const AttributionGraph& g) {
  py::dict d;
  d["n_layers"] = g.n_layers;
  d["n_pos"] = g.n_pos;
  d["input_ids"] = g.input_ids;
  d["active_features"] = g.active_features;
  d["activations"] = g.activations;
  d["pre_activations"] = g.pre_activations;
  d["selected_features"] = g.selected_features;
  d["logit_tokens"] = g.logit_tokens;
  d["logit_probabilities"] = g.logit_probabilities;
  return d;
}

// Each: "L:P:F=V" / "L:P:F*X", or (layer, pos, feature, value[, scale]).
std::vector<FeatureIntervention> intervention_list(py::list interventions) {
  std::vector<FeatureIntervention> ivs;
  for (const auto& item : interventions) {
    if (py::isinstance<py::str>(item)) {
      ivs.push_back(parse_feature_intervention(item.cast<std::string>()));
      continue;
    }
    const auto t = item.cast<py::sequence>();
    if (t.size() != 4 && t.size() != 5)
      throw ConfigError("intervene: an intervention is (layer, position, feature, value[, scale]), not " +
                        py::repr(item).cast<std::string>());
    FeatureIntervention iv;
    iv.layer = t[0].cast<int64_t>();
    iv.pos = t[1].cast<int64_t>();
    iv.feature = t[2].cast<int64_t>();
    iv.value = t[3].cast<double>();
    iv.scale = t.size() == 5 && t[4].cast<bool>();
    ivs.push_back(iv);
  }
  return ivs;
}

std::shared_ptr<CausalLM> causal_lm(std::shared_ptr<Module> model, const char* what) {
  auto lm = std::dynamic_pointer_cast<CausalLM>(model);
  if (!lm) throw ConfigError(std::string(what) + ": the model is not a causal language model of flexmodel's");
  return lm;
}

}  // namespace

void bind_attribution(py::module_& m) {
  auto a = m.def_submodule("attribution", "Attribution graphs through transcoders (flex/sae/attribution.h)");
  a.def(
      "attribute",
      [](std::shared_ptr<Module> model, py::object transcoders, const at::Tensor& input_ids, int64_t max_n_logits,
         double desired_logit_prob, int64_t batch_size, int64_t max_feature_nodes, bool zero_first_position,
         double node_threshold, double edge_threshold, py::object decode,
         const std::string& prompt, const std::string& slug, const std::string& scan, py::object max_memory) {
        auto lm = std::dynamic_pointer_cast<CausalLM>(model);
        auto parallel = std::dynamic_pointer_cast<ParallelCausalLM>(model);
        if (!lm && !parallel) throw ConfigError("attribute: the model is not a causal language model of flexmodel's");
        const Transcoders tcs = transcoder_list(parallel ? parallel->config().num_hidden_layers : lm->config().num_hidden_layers,
                                                transcoders);
        check_prune_thresholds(node_threshold, edge_threshold);
        AttributionOptions o;
        o.max_n_logits = max_n_logits;
        o.desired_logit_prob = desired_logit_prob;
        o.batch_size = batch_size;
        o.max_feature_nodes = max_feature_nodes;
        o.zero_first_position = zero_first_position;
        // max_memory: None (dense in memory), bytes, or a size such as "2GB" (decision 45).
        if (py::isinstance<py::str>(max_memory)) {
          o.max_memory_bytes = convert_file_size_to_int(max_memory.cast<std::string>());
        } else if (!max_memory.is_none()) {
          o.max_memory_bytes = max_memory.cast<int64_t>();
        }
        if (!max_memory.is_none() && o.max_memory_bytes <= 0)
          throw ConfigError("attribute: max_memory must be a positive size, not " + py::repr(max_memory).cast<std::string>());
        AttributionGraph g;
        PrunedGraph p;
        {
          py::gil_scoped_release release;
          g = parallel ? attribute(*parallel, tcs, input_ids, o) : attribute(*lm, tcs, input_ids, o);
          // Under a mesh only rank 0 holds rows (decision 48): the others have nothing to prune.
          if (g.adjacency.defined() || g.streamed) p = prune_graph(g, node_threshold, edge_threshold);
        }
        if (!g.adjacency.defined() && !g.streamed) {
          py::dict d = graph_nodes(g);
          for (const char* k : {"adjacency", "node_mask", "edge_mask", "edges", "edge_weights", "peak_working_memory",
                                "cumulative_scores", "json"})
            d[k] = py::none();
          return d;
        }
        GraphJsonInfo info;
        info.slug = slug;
        info.scan = scan;
        info.prompt = prompt;
        // Token strings: decode(id) when given (a tokenizer's), else the id.
        auto text = [&](int64_t id) {
          return decode.is_none() ? std::to_string(id) : decode(id).cast<std::string>();
        };
        for (int64_t i = 0; i < g.n_pos; ++i) info.prompt_tokens.push_back(text(g.input_ids[i].item<int64_t>()));
        for (int64_t k = 0; k < g.logit_tokens.size(0); ++k) info.logit_tokens.push_back(text(g.logit_tokens[k].item<int64_t>()));
        if (info.prompt.empty())
          for (const auto& t : info.prompt_tokens) info.prompt += (info.prompt.empty() ? "" : " ") + t;
        py::dict d = graph_nodes(g);
        // A streamed graph's adjacency stays on disk (and goes with it): None.
        d["adjacency"] = g.streamed ? py::object(py::none()) : py::cast(g.adjacency);
        d["node_mask"] = p.node_mask;
        d["edge_mask"] = p.edge_mask.defined() ? py::cast(p.edge_mask) : py::object(py::none());
        d["edges"] = p.edges;
        d["edge_weights"] = p.edge_weights;
        d["peak_working_memory"] = g.streamed ? py::cast(g.streamed->peak_working_bytes()) : py::object(py::none());
        d["cumulative_scores"] = p.cumulative_scores;
        d["json"] = py::module_::import("json").attr("loads")(graph_json(g, p, info, node_threshold).dump());
        return d;
      },
      py::arg("model"), py::arg("transcoders"), py::arg("input_ids"), py::arg("max_n_logits"),
      py::arg("desired_logit_prob"), py::arg("batch_size"), py::arg("max_feature_nodes"), py::arg("zero_first_position"),
      py::arg("node_threshold"), py::arg("edge_threshold"), py::arg("decode"), py::arg("prompt"), py::arg("slug"),
      py::arg("scan"), py::arg("max_memory") = py::none());
  a.def(
      "intervene",
      [](std::shared_ptr<Module> model, py::object transcoders, const at::Tensor& input_ids, py::list interventions,
         bool frozen_attention) {
        auto lm = causal_lm(model, "intervene");
        const auto tcs = transcoder_list(lm->config().num_hidden_layers, transcoders);
        const auto ivs = intervention_list(interventions);
        py::gil_scoped_release release;
        return intervene(*lm, tcs, input_ids, ivs, frozen_attention);
      },
      py::arg("model"), py::arg("transcoders"), py::arg("input_ids"), py::arg("interventions"),
      py::arg("frozen_attention"));
  a.def(
      "intervene_generate",
      [](std::shared_ptr<Module> model, py::object transcoders, const at::Tensor& input_ids, py::list interventions,
         int64_t max_new_tokens, bool frozen_attention) {
        auto lm = causal_lm(model, "intervene_generate");
        const auto tcs = transcoder_list(lm->config().num_hidden_layers, transcoders);
        const auto ivs = intervention_list(interventions);
        at::Tensor ids, steps;
        {
          py::gil_scoped_release release;
          ids = intervene_generate(*lm, tcs, input_ids, ivs, max_new_tokens, frozen_attention, &steps);
        }
        return py::make_tuple(ids, steps);
      },
      py::arg("model"), py::arg("transcoders"), py::arg("input_ids"), py::arg("interventions"),
      py::arg("max_new_tokens"), py::arg("frozen_attention"));
}

}  // namespace flex::python
