// The page of `flexmodel attribute --html`: one self-contained HTML file
// (inline CSS and JS, the graph JSON embedded, no network) that draws a
// graph file as circuit-tracer's viewer lays it out.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace flex::cli {

/// The page for a graph in Neuronpedia's format (flex::graph_json's output):
/// x = token position, y = layer (embeddings bottom, logits top), nodes
/// coloured by type, edges by sign with width by |weight|, details of a node
/// on hover/click, and a minimum |weight| slider.
std::string render_attribution_html(const nlohmann::json& graph);

}  // namespace flex::cli
