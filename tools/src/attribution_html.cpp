// The attribution graph page: the drawing is done by the inline script from the
// embedded graph, so the page is the graph file plus a fixed viewer. After
// drawing, the script writes the drawn counts into #status (data-nodes,
// data-edges, data-shown: edges at or above the minimum |weight|) and any script error into #errors, which the test reads.
#include "attribution_html.h"

#include "cli.h"

#include <sstream>

namespace flex::cli {

namespace {

const char* kStyle = R"(
body{font:13px/1.4 system-ui,sans-serif;margin:16px;color:#1d1d1f}
h1{font-size:19px;margin:0 0 4px}.meta{color:#555;margin-bottom:8px}
#controls{margin:6px 0}#controls input{vertical-align:middle;width:260px}
#wrap{display:flex;gap:16px;align-items:flex-start}
#canvas{flex:1 1 auto;min-width:0;overflow:auto;border:1px solid #ddd}svg#graph{background:#fff;display:block}
#details{min-width:300px;max-width:380px;font-size:12px}
#details table{border-collapse:collapse}#details td{padding:1px 6px;border-bottom:1px solid #eee}
#details td.num{text-align:right;font-variant-numeric:tabular-nums}
#tip{position:fixed;pointer-events:none;background:#fffbe6;border:1px solid #aaa;padding:4px 6px;font-size:12px;display:none;white-space:pre}
.legend span{display:inline-block;width:10px;height:10px;border-radius:5px;margin:0 3px 0 10px}
#errors{color:#b3261e;white-space:pre}
)";

// Layout: one column per token position, one row per layer; nodes of a cell
// sit side by side. A position with nothing above its embedding gets a narrow
// column (as circuit-tracer's viewer collapses them), so the positions that
// carry the circuit keep their width on a long prompt; the drawing scrolls in
// its box rather than being scaled down to it. Edge width by |weight|
// relative to the largest, colour by sign (blue positive, red negative), as
// circuit-tracer's viewer shows them.
const char* kScript = R"JS(
(function(){
const errs = document.getElementById('errors');
window.addEventListener('error', e => { errs.textContent += (e.message || 'error') + '\n'; });
try {
const g = JSON.parse(document.getElementById('graph-data').textContent);
const NS = 'http://www.w3.org/2000/svg';
const tokens = g.metadata.prompt_tokens || [];
const colour = {'cross layer transcoder':'#e8590c','mlp reconstruction error':'#868e96','embedding':'#2f9e44','logit':'#7048e8'};
const kind = {'cross layer transcoder':'feature','mlp reconstruction error':'error','embedding':'embedding','logit':'logit'};
// Rows: embeddings 0, layer l at l + 1, logits (layer L + 1 in the file) at L + 1.
const row = n => n.layer === 'E' ? 0 : n.feature_type === 'logit' ? Number(n.layer) : Number(n.layer) + 1;
let nPos = tokens.length, nRows = 1;
for (const n of g.nodes) { nPos = Math.max(nPos, n.ctx_idx + 1); nRows = Math.max(nRows, row(n) + 1); }
const cells = {};
for (const n of g.nodes) { const k = row(n) + ':' + n.ctx_idx; (cells[k] = cells[k] || []).push(n); }
// Width of column c: its fullest cell's nodes, 8 to a line; narrow when only
// the embedding row holds a node there.
const colW = new Array(nPos).fill(22), colX = new Array(nPos + 1).fill(0);
for (const k in cells) {
  const list = cells[k], r = row(list[0]), c = list[0].ctx_idx;
  if (r > 0 || list.length > 1) colW[c] = Math.max(colW[c], 48, Math.min(list.length, 8) * 13 + 12);
}
const rowH = 84, left = 70, bottom = 84, top = 16;
colX[0] = left;
for (let c = 0; c < nPos; ++c) colX[c + 1] = colX[c] + colW[c];
const W = colX[nPos] + 10, H = top + nRows * rowH + bottom;
const svg = document.getElementById('graph');
svg.setAttribute('width', W); svg.setAttribute('height', H); svg.setAttribute('viewBox', '0 0 ' + W + ' ' + H);
const el = (tag, attrs, parent) => { const e = document.createElementNS(NS, tag); for (const a in attrs) e.setAttribute(a, attrs[a]); (parent || svg).appendChild(e); return e; };
const text = (x, y, s, attrs) => { const t = el('text', Object.assign({x: x, y: y, 'font-size': 11, fill: '#444'}, attrs || {})); t.textContent = s; return t; };
const byId = {}, pos = {};
for (const k in cells) {
  const list = cells[k], r = row(list[0]), c = list[0].ctx_idx;
  const perLine = Math.min(list.length, 8), step = (colW[c] - 12) / Math.max(perLine, 1);
  list.forEach((n, i) => {
    const line = Math.floor(i / 8), j = i % 8;
    pos[n.node_id] = {x: colX[c] + 6 + step * (j + 0.5), y: top + (nRows - 1 - r) * rowH + rowH / 2 + line * 9 - 6};
  });
}
for (let r = 0; r < nRows; ++r) {
  const y = top + (nRows - 1 - r) * rowH + rowH / 2;
  el('line', {x1: left, x2: W - 10, y1: y, y2: y, stroke: '#f1f1f1'});
  text(6, y + 4, r === 0 ? 'embed' : r === nRows - 1 && g.nodes.some(n => n.feature_type === 'logit' && row(n) === r) ? 'logits' : 'layer ' + (r - 1));
}
// Token labels slanted, so a narrow column's label does not run into the next.
tokens.forEach((t, c) => {
  const x = colX[c] + colW[c] / 2, y = top + nRows * rowH + 6;
  text(x, y + 8, String(c), {'text-anchor': 'middle', fill: '#999', 'font-size': 9});
  text(x + 3, y + 18, JSON.stringify(t).slice(1, -1).slice(0, 12),
       {'text-anchor': 'end', 'font-family': 'ui-monospace,monospace', transform: 'rotate(-45 ' + (x + 3) + ' ' + (y + 18) + ')'});
});
let maxW = 0;
for (const l of g.links) maxW = Math.max(maxW, Math.abs(l.weight));
const incoming = {}, outgoing = {};
const edges = el('g', {id: 'edges'});
const drawn = [];
for (const l of g.links) {
  const s = pos[l.source], t = pos[l.target];
  if (!s || !t) continue;
  const w = Math.abs(l.weight) / (maxW || 1);
  const e = el('line', {x1: s.x, y1: s.y, x2: t.x, y2: t.y, class: 'edge', stroke: l.weight >= 0 ? '#1c7ed6' : '#e03131',
                        'stroke-width': (0.4 + 4 * w).toFixed(2), 'stroke-opacity': (0.25 + 0.6 * w).toFixed(2)}, edges);
  e.dataset.weight = l.weight; drawn.push(e);
  (incoming[l.target] = incoming[l.target] || []).push(l);
  (outgoing[l.source] = outgoing[l.source] || []).push(l);
}
const fmt = v => v === null || v === undefined ? '-' : Number(v).toPrecision(4);
const posLabel = n => 'position ' + n.ctx_idx + (tokens[n.ctx_idx] !== undefined ? ' ' + JSON.stringify(tokens[n.ctx_idx]) : '');
const layerLabel = n => n.layer === 'E' ? 'embeddings' : n.feature_type === 'logit' ? 'logits' : 'layer ' + n.layer;
const summary = n => n.node_id + ' (' + kind[n.feature_type] + ')\n' + layerLabel(n) + ', ' + posLabel(n) +
  '\nactivation ' + fmt(n.activation) + ', influence ' + fmt(n.influence) + (n.clerp ? '\n' + n.clerp : '');
const strongest = list => (list || []).slice().sort((a, b) => Math.abs(b.weight) - Math.abs(a.weight)).slice(0, 6);
const details = document.getElementById('details');
function show(n) {
  details.textContent = '';
  const h = document.createElement('h3'); h.textContent = n.node_id; details.appendChild(h);
  const p = document.createElement('div'); p.className = 'node-summary'; p.textContent = summary(n); p.style.whiteSpace = 'pre'; details.appendChild(p);
  for (const [title, list, other] of [['strongest incoming', incoming[n.node_id], 'source'], ['strongest outgoing', outgoing[n.node_id], 'target']]) {
    const h4 = document.createElement('h4'); h4.textContent = title + ' (' + (list || []).length + ')'; details.appendChild(h4);
    const t = document.createElement('table');
    for (const l of strongest(list)) {
      const tr = t.insertRow(); tr.insertCell().textContent = l[other];
      const c = tr.insertCell(); c.className = 'num'; c.textContent = fmt(l.weight); c.style.color = l.weight >= 0 ? '#1c7ed6' : '#e03131';
    }
    details.appendChild(t);
  }
  for (const c of svg.querySelectorAll('circle.node')) c.setAttribute('stroke', c.dataset.id === n.node_id ? '#000' : '#fff');
}
const tip = document.getElementById('tip');
const nodes = el('g', {id: 'nodes'});
let drawnNodes = 0;
for (const n of g.nodes) {
  const p = pos[n.node_id];
  const c = el('circle', {cx: p.x, cy: p.y, r: n.feature_type === 'cross layer transcoder' ? 4.5 : 5.5, class: 'node ' + kind[n.feature_type],
                          fill: colour[n.feature_type] || '#000', stroke: '#fff', 'stroke-width': 1}, nodes);
  c.dataset.id = n.node_id; byId[n.node_id] = n; ++drawnNodes;
  el('title', {}, c).textContent = summary(n);
  c.addEventListener('mouseenter', ev => { tip.textContent = summary(n); tip.style.display = 'block'; tip.style.left = (ev.clientX + 12) + 'px'; tip.style.top = (ev.clientY + 12) + 'px'; });
  c.addEventListener('mouseleave', () => { tip.style.display = 'none'; });
  c.addEventListener('click', () => show(n));
}
const slider = document.getElementById('min-weight'), label = document.getElementById('min-weight-value');
const status = document.getElementById('status');
slider.max = maxW; slider.step = 'any';
// #min-weight=X in the address presets the slider (a link to a filtered view).
const preset = /min-weight=([0-9.eE+-]+)/.exec(location.hash);
// The number is kept apart from the slider's value, which Chromium rounds.
let minWeight = preset ? Number(preset[1]) : 0;
slider.value = minWeight;
function filter() {
  const m = minWeight; let shown = 0;
  for (const e of drawn) { const on = Math.abs(Number(e.dataset.weight)) >= m; e.style.display = on ? '' : 'none'; shown += on; }
  label.textContent = fmt(m) + ' (' + shown + ' of ' + drawn.length + ' edges shown)';
  status.dataset.shown = shown;
}
slider.addEventListener('input', () => { minWeight = Number(slider.value); filter(); });
filter();
const first = g.nodes.find(n => n.feature_type === 'logit' && n.is_target_logit) || g.nodes[0];
if (first) show(first);
status.dataset.nodes = drawnNodes; status.dataset.edges = drawn.length;
status.textContent = drawnNodes + ' nodes, ' + drawn.length + ' edges drawn';
} catch (e) { errs.textContent += String(e && e.stack || e) + '\n'; }
})();
)JS";

}  // namespace

std::string render_attribution_html(const nlohmann::json& graph) {
  const auto& meta = graph.at("metadata");
  std::ostringstream h;
  h << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>flexmodel attribution graph: "
    << html_escape(meta.value("slug", "")) << "</title>\n<style>" << kStyle << "</style></head><body>\n"
    << "<h1>attribution graph: " << html_escape(meta.value("slug", "")) << "</h1>\n<div class=\"meta\">prompt <code>"
    << html_escape(meta.value("prompt", "")) << "</code> &middot; transcoders " << html_escape(meta.value("scan", ""))
    << " &middot; node threshold " << meta.value("node_threshold", 0.0) << " &middot; " << graph.at("nodes").size()
    << " nodes, " << graph.at("links").size() << " links"
    << "<span class=\"legend\"><span style=\"background:#e8590c\"></span>feature<span style=\"background:#868e96\"></span>"
       "error<span style=\"background:#2f9e44\"></span>embedding<span style=\"background:#7048e8\"></span>logit"
       "<span style=\"background:#1c7ed6;border-radius:0;height:3px\"></span>positive"
       "<span style=\"background:#e03131;border-radius:0;height:3px\"></span>negative</span></div>\n"
    << "<div id=\"controls\"><label>hide edges with |weight| below <input type=\"range\" id=\"min-weight\" min=\"0\" "
       "value=\"0\"></label> <span id=\"min-weight-value\"></span> &middot; <span id=\"status\">not drawn (scripts "
       "off?)</span></div>\n<div id=\"errors\"></div>\n"
    << "<div id=\"wrap\"><div id=\"canvas\"><svg id=\"graph\" xmlns=\"http://www.w3.org/2000/svg\"></svg></div>"
       "<div id=\"details\"></div></div>\n"
    << "<div id=\"tip\"></div>\n";
  // "</" inside the JSON text would end the script element early.
  std::string data = graph.dump();
  for (size_t at = data.find("</"); at != std::string::npos; at = data.find("</", at + 3)) data.replace(at, 2, "<\\/");
  h << "<script type=\"application/json\" id=\"graph-data\">" << data << "</script>\n<script>" << kScript
    << "</script>\n</body></html>\n";
  return h.str();
}

}  // namespace flex::cli
