// The page of `flexmodel features`: static HTML with inline CSS and SVG (it
// reads the same with scripts off), plus the numbers as JSON for programs.
#include "cli.h"
#include "features.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace flex::cli::features {

namespace {

const char* kStyle = R"(
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1180px;color:#1d1d1f;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:0}
.meta{color:#555;margin-bottom:16px}.meta b{color:#1d1d1f}
table{border-collapse:collapse;margin:6px 0}td,th{padding:2px 10px;text-align:left;border-bottom:1px solid #eee}
th{font-weight:600;color:#333}td.num{text-align:right;font-variant-numeric:tabular-nums}
section.feature{border:1px solid #ddd;border-radius:8px;padding:12px 16px;margin:18px 0;background:#fcfcfd}
.cols{display:flex;gap:28px;flex-wrap:wrap;align-items:flex-start;margin-top:8px}
.stats{color:#444}.stats b{color:#1d1d1f}
svg.histogram{background:#fff;border:1px solid #e4e4e4}
table.logits td.tok,.example .tok{font-family:ui-monospace,Menlo,monospace;white-space:pre}
table.promoted td.num{color:#0a7a2f}table.suppressed td.num{color:#b3261e}
.examples{margin-top:10px}.example{margin:3px 0;font-family:ui-monospace,Menlo,monospace;font-size:13px}
.example .val{display:inline-block;width:70px;color:#666;text-align:right;margin-right:8px}
.example .tok{padding:1px 1px;margin-right:2px;border-radius:3px}.example .focus{outline:2px solid #c2410c}
.note{color:#777;font-style:italic}
a{color:#0b57d0;text-decoration:none}
)";

std::string num(double v, const char* fmt = "%.4g") {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

std::string percent(double v) { return num(100 * v, "%.3g") + "%"; }

std::string histogram_svg(const Feature& f) {
  const int W = 360, H = 120, pad = 22;
  const int64_t top = std::max<int64_t>(1, *std::max_element(f.histogram.begin(), f.histogram.end()));
  const double bw = double(W - 2 * pad) / std::max<size_t>(1, f.histogram.size());
  std::ostringstream s;
  s << "<svg class=\"histogram\" width=\"" << W << "\" height=\"" << H << "\" viewBox=\"0 0 " << W << " " << H
    << "\" role=\"img\"><title>activation histogram of feature " << f.index << "</title>";
  for (size_t i = 0; i < f.histogram.size(); ++i) {
    const double h = (H - 2 * pad) * double(f.histogram[i]) / double(top);
    s << "<rect x=\"" << num(pad + i * bw, "%.1f") << "\" y=\"" << num(H - pad - h, "%.1f") << "\" width=\""
      << num(std::max(1.0, bw - 1), "%.1f") << "\" height=\"" << num(h, "%.1f") << "\" fill=\"#e8590c\"><title>["
      << num(i * f.bin_width) << ", " << num((i + 1) * f.bin_width) << "): " << f.histogram[i] << "</title></rect>";
  }
  s << "<line x1=\"" << pad << "\" y1=\"" << H - pad << "\" x2=\"" << W - pad << "\" y2=\"" << H - pad
    << "\" stroke=\"#888\"/>";
  s << "<text x=\"" << pad << "\" y=\"" << H - 6 << "\" font-size=\"10\" fill=\"#555\">0</text>";
  s << "<text x=\"" << W - pad << "\" y=\"" << H - 6 << "\" font-size=\"10\" fill=\"#555\" text-anchor=\"end\">"
    << num(f.max) << "</text>";
  s << "<text x=\"" << pad << "\" y=\"" << pad - 8 << "\" font-size=\"10\" fill=\"#555\">" << top
    << " tokens</text></svg>";
  return s.str();
}

std::string logit_table(const std::vector<TokenEffect>& effects, const char* cls, const char* title) {
  std::ostringstream s;
  s << "<table class=\"logits " << cls << "\"><tr><th>" << title << "</th><th>logit</th></tr>";
  for (const auto& t : effects)
    s << "<tr><td class=\"tok\">" << html_escape(visible_token(t.token)) << "</td><td class=\"num\">"
      << num(t.logit, "%+.3f") << "</td></tr>";
  s << "</table>";
  return s.str();
}

std::string example_html(const Example& ex, double max) {
  std::ostringstream s;
  s << "<div class=\"example\" data-context=\"" << ex.context << "\" data-position=\"" << ex.position
    << "\"><span class=\"val\">" << num(ex.value, "%.3f") << "</span>";
  for (size_t i = 0; i < ex.tokens.size(); ++i) {
    const double a = max > 0 ? std::clamp(ex.acts[i] / max, 0.0, 1.0) : 0.0;
    const bool focus = ex.first + static_cast<int64_t>(i) == ex.position;
    s << "<span class=\"tok" << (focus ? " focus" : "") << "\" style=\"background:rgba(232,89,12," << num(a, "%.3f")
      << ")\" title=\"" << num(ex.acts[i], "%.4f") << "\">" << html_escape(visible_token(ex.tokens[i])) << "</span>";
  }
  s << "</div>";
  return s.str();
}

nlohmann::json as_json(const Page& p) {
  nlohmann::json j = {{"sae", p.sae},         {"model", p.model},       {"dataset", p.dataset},
                      {"hook", p.hook},       {"place", p.place},       {"architecture", p.architecture},
                      {"d_in", p.d_in},       {"d_sae", p.d_sae},       {"tokens", p.tokens},
                      {"contexts", p.contexts}, {"context_len", p.context_len}, {"mean_l0", p.mean_l0},
                      {"dead", p.dead},       {"selection", p.selection}};
  j["features"] = nlohmann::json::array();
  for (const auto& f : p.features) {
    nlohmann::json jf = {{"index", f.index}, {"count", f.count}, {"density", f.density}, {"max", f.max},
                         {"mean", f.mean},   {"bin_width", f.bin_width}, {"histogram", f.histogram}};
    jf["examples"] = nlohmann::json::array();
    for (const auto& ex : f.examples)
      jf["examples"].push_back({{"context", ex.context}, {"position", ex.position}, {"value", ex.value},
                                {"first", ex.first}, {"acts", ex.acts}});
    for (const char* side : {"promoted", "suppressed"}) {
      jf[side] = nlohmann::json::array();
      for (const auto& t : std::string(side) == "promoted" ? f.promoted : f.suppressed)
        jf[side].push_back({{"id", t.id}, {"logit", t.logit}});
    }
    j["features"].push_back(jf);
  }
  return j;
}

}  // namespace

std::string render_html(const Page& p) {
  std::ostringstream h;
  h << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>flexmodel features: "
    << html_escape(p.sae) << "</title>\n<style>" << kStyle << "</style></head><body>\n";
  h << "<h1>flexmodel features</h1>\n<div class=\"meta\" id=\"summary\"><b>" << html_escape(p.architecture) << "</b> "
    << html_escape(p.sae) << " &middot; d_in " << p.d_in << " &times; " << p.d_sae << " features &middot; hook <b>"
    << html_escape(p.hook) << "</b> at <code>" << html_escape(p.place) << "</code><br>model " << html_escape(p.model)
    << " &middot; corpus " << html_escape(p.dataset) << " &middot; " << p.tokens << " tokens in " << p.contexts
    << " contexts of " << p.context_len << " &middot; mean L0 <b>" << num(p.mean_l0, "%.2f") << "</b> &middot; "
    << p.dead << " features never active (" << percent(double(p.dead) / std::max<int64_t>(1, p.d_sae)) << ")</div>\n";

  h << "<h2>" << p.features.size() << " features (" << html_escape(p.selection) << ")</h2>\n"
    << "<table id=\"summary-table\"><tr><th>feature</th><th>density</th><th>max</th><th>mean</th><th>top promoted "
       "token</th></tr>";
  for (const auto& f : p.features)
    h << "<tr><td><a href=\"#feature-" << f.index << "\">" << f.index << "</a></td><td class=\"num\">"
      << percent(f.density) << "</td><td class=\"num\">" << num(f.max) << "</td><td class=\"num\">" << num(f.mean)
      << "</td><td class=\"tok\">" << (f.promoted.empty() ? "&ndash;" : html_escape(visible_token(f.promoted[0].token)))
      << "</td></tr>";
  h << "</table>\n";

  for (const auto& f : p.features) {
    h << "<section class=\"feature\" id=\"feature-" << f.index << "\"><h2>Feature " << f.index << "</h2>\n";
    h << "<div class=\"stats\">density <b>" << percent(f.density) << "</b> (" << f.count << " of " << p.tokens
      << " tokens) &middot; max <b>" << num(f.max) << "</b> &middot; mean when active <b>" << num(f.mean)
      << "</b></div>\n<div class=\"cols\"><div>" << histogram_svg(f) << "</div>";
    if (f.has_logits) {
      h << "<div>" << logit_table(f.promoted, "promoted", "promotes") << "</div><div>"
        << logit_table(f.suppressed, "suppressed", "suppresses") << "</div>";
    } else {
      h << "<div class=\"note logits-na\">no logit effect: the decoder does not write the residual stream</div>";
    }
    h << "</div>\n<div class=\"examples\">";
    if (f.examples.empty()) h << "<div class=\"note\">never active on this corpus</div>";
    for (const auto& ex : f.examples) h << example_html(ex, f.max);
    h << "</div></section>\n";
  }
  // "</" inside JSON text would end the script element early.
  std::string data = as_json(p).dump();
  for (size_t at = data.find("</"); at != std::string::npos; at = data.find("</", at + 3)) data.replace(at, 2, "<\\/");
  h << "<script type=\"application/json\" id=\"feature-data\">" << data << "</script>\n</body></html>\n";
  return h.str();
}

}  // namespace flex::cli::features
