// The training curves of a run as one self-contained SVG: MSE, L0,
// explained variance and the dead fraction against tokens, one panel each.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace flex {

namespace {

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}

}  // namespace

std::string training_curves_svg(const std::vector<nlohmann::json>& metrics) {
  struct Panel {
    const char* key;
    const char* title;
    const char* colour;
  };
  const Panel panels[] = {{"mse", "MSE (scaled inputs)", "#1f77b4"},
                          {"l0", "L0 (active latents per token)", "#ff7f0e"},
                          {"explained_variance", "explained variance", "#2ca02c"},
                          {"dead_fraction", "dead fraction", "#d62728"}};
  const int W = 420, H = 240, pad = 48;
  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(2 * W) + "\" height=\"" +
                    std::to_string(2 * H) + "\" font-family=\"sans-serif\" font-size=\"11\">\n"
                    "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  double max_tokens = 1;
  for (const auto& m : metrics) max_tokens = std::max(max_tokens, m.value("tokens", 0.0));
  for (int i = 0; i < 4; ++i) {
    const Panel& p = panels[i];
    const int ox = (i % 2) * W, oy = (i / 2) * H;
    double lo = INFINITY, hi = -INFINITY;
    std::vector<std::pair<double, double>> pts;
    for (const auto& m : metrics) {
      if (!m.contains(p.key) || !m.at(p.key).is_number()) continue;
      const double v = m.at(p.key).get<double>();
      if (!std::isfinite(v)) continue;
      pts.push_back({m.value("tokens", 0.0), v});
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    if (pts.empty()) lo = 0, hi = 1;
    if (hi <= lo) hi = lo + 1e-9 + std::abs(lo) * 1e-3;
    const double pw = W - 2 * pad, ph = H - 2 * pad;
    svg += "<g transform=\"translate(" + std::to_string(ox) + "," + std::to_string(oy) + ")\">\n";
    svg += "<text x=\"" + std::to_string(pad) + "\" y=\"20\" font-size=\"13\">" + std::string(p.title) + "</text>\n";
    svg += "<rect x=\"" + std::to_string(pad) + "\" y=\"" + std::to_string(pad) + "\" width=\"" + num(pw) +
           "\" height=\"" + num(ph) + "\" fill=\"none\" stroke=\"#999\"/>\n";
    svg += "<text x=\"4\" y=\"" + std::to_string(pad + 4) + "\">" + num(hi) + "</text>\n";
    svg += "<text x=\"4\" y=\"" + std::to_string(H - pad) + "\">" + num(lo) + "</text>\n";
    svg += "<text x=\"" + std::to_string(W - pad - 60) + "\" y=\"" + std::to_string(H - pad + 16) + "\">" +
           num(max_tokens) + " tokens</text>\n";
    std::string line;
    for (const auto& [x, y] : pts)
      line += num(pad + pw * x / max_tokens) + "," + num(pad + ph * (1 - (y - lo) / (hi - lo))) + " ";
    svg += "<polyline fill=\"none\" stroke=\"" + std::string(p.colour) + "\" stroke-width=\"1.5\" points=\"" + line +
           "\"/>\n</g>\n";
  }
  return svg + "</svg>\n";
}

}  // namespace flex
