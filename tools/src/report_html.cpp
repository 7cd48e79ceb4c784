// The page of `flexmodel report`: one HTML file with its CSS and script
// inline (no network). Tables are static HTML; the attention maps are drawn
// by the inline script on canvases from the probabilities embedded as
// base64 bytes (one byte per probability keeps a 12-layer x 12-head capture
// at 128 positions near 3 MB).
#include "cli.h"
#include "report.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace flex::cli::report {

namespace {

std::string escape(const std::string& s) { return html_escape(s); }
std::string visible(const std::string& s) { return visible_token(s); }

std::string base64(const std::vector<uint8_t>& bytes) {
  static const char* abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const uint32_t n = (uint32_t(bytes[i]) << 16) | (i + 1 < bytes.size() ? uint32_t(bytes[i + 1]) << 8 : 0) |
                       (i + 2 < bytes.size() ? uint32_t(bytes[i + 2]) : 0);
    out += abc[(n >> 18) & 63];
    out += abc[(n >> 12) & 63];
    out += i + 1 < bytes.size() ? abc[(n >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? abc[n & 63] : '=';
  }
  return out;
}

std::string human_bytes(uint64_t b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1000 && u < 4) v /= 1000, ++u;
  return (u ? fixed(v, 1) : std::to_string(b)) + " " + units[u];
}

/// White -> blue, for a value in [0, 1].
std::string cell_colour(double p) {
  p = std::clamp(p, 0.0, 1.0);
  char buf[40];
  std::snprintf(buf, sizeof buf, "rgb(%d,%d,%d)", int(255 - 215 * p), int(255 - 160 * p), int(255 - 40 * p));
  return buf;
}

/// JSON safe inside a <script> element.
std::string script_json(const nlohmann::json& j) {
  std::string s = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<' && i + 1 < s.size() && s[i + 1] == '/') out += "<\\/", ++i;
    else out += s[i];
  }
  return out;
}

const char* kStyle = R"(
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#1b1f24;max-width:1400px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #d0d7de}
.meta{color:#57606a} .tok{font-family:ui-monospace,monospace;background:#f6f8fa;border-radius:3px;padding:0 3px;margin:1px;display:inline-block}
ul.findings li{margin:4px 0} table{border-collapse:collapse} td,th{padding:2px 6px;border:1px solid #e1e4e8;font-size:12px}
th{background:#f6f8fa;text-align:left} td.num{text-align:right;font-variant-numeric:tabular-nums}
.lens td{font-family:ui-monospace,monospace;text-align:center;min-width:28px}
.grid{display:grid;gap:6px;align-items:center;justify-content:start} .grid canvas{border:1px solid #d0d7de;cursor:pointer;image-rendering:pixelated}
.grid canvas.sel{outline:3px solid #cf222e} .bar{background:#4078c0;height:10px;display:inline-block}
.scroll{overflow-x:auto;max-width:100%} #attn-detail{border:1px solid #d0d7de;margin-top:10px}
)";

// Draws the thumbnails and the selected head with token labels on both axes.
const char* kScript = R"(
(function(){
const data=JSON.parse(document.getElementById('attn-data').textContent);
if(!data.layers.length)return;
function bytes(b64){const s=atob(b64),a=new Uint8Array(s.length);for(let i=0;i<s.length;i++)a[i]=s.charCodeAt(i);return a;}
const layers=data.layers.map(l=>Object.assign({},l,{p:bytes(l.b64)}));
function colour(v){const p=v/255;return [255-215*p,255-160*p,255-40*p];}
function paint(ctx,l,h,x0,y0,cell){const n=l.positions,img=ctx.createImageData(n*cell,n*cell);
 for(let q=0;q<n;q++)for(let k=0;k<n;k++){const c=colour(l.p[(h*n+q)*n+k]);
  for(let dy=0;dy<cell;dy++)for(let dx=0;dx<cell;dx++){const o=((q*cell+dy)*n*cell+k*cell+dx)*4;img.data[o]=c[0];img.data[o+1]=c[1];img.data[o+2]=c[2];img.data[o+3]=255;}}
 ctx.putImageData(img,x0,y0);}
const grid=document.getElementById('attn-grid'),maxH=Math.max(...layers.map(l=>l.heads));
grid.style.gridTemplateColumns='90px repeat('+maxH+',66px)';
grid.appendChild(document.createElement('div'));
for(let h=0;h<maxH;h++){const d=document.createElement('div');d.textContent='head '+h;d.style.fontSize='12px';grid.appendChild(d);}
const detail=document.getElementById('attn-detail'),title=document.getElementById('attn-title');let selected=null;
function show(li,h,cv){const l=layers[li],n=l.positions,cell=Math.max(4,Math.min(22,Math.floor(720/n))),margin=90;
 detail.width=margin+n*cell+10;detail.height=margin+n*cell+10;const ctx=detail.getContext('2d');
 ctx.fillStyle='#fff';ctx.fillRect(0,0,detail.width,detail.height);paint(ctx,l,h,margin,margin,cell);
 ctx.fillStyle='#1b1f24';ctx.font=Math.min(12,cell)+'px monospace';ctx.textBaseline='middle';
 for(let i=0;i<n;i++){const t=(data.tokens[i]||String(i)).slice(0,10);
  ctx.textAlign='right';ctx.fillText(t,margin-4,margin+i*cell+cell/2);
  ctx.save();ctx.translate(margin+i*cell+cell/2,margin-4);ctx.rotate(-Math.PI/2);ctx.textAlign='left';ctx.fillText(t,0,0);ctx.restore();}
 title.textContent=l.label+' head '+h+' ('+l.name+'): rows are queries, columns keys';
 if(selected)selected.classList.remove('sel');selected=cv;cv.classList.add('sel');}
let best=null;
layers.forEach((l,li)=>{const lab=document.createElement('div');lab.textContent=l.label;lab.style.fontSize='12px';grid.appendChild(lab);
 for(let h=0;h<maxH;h++){if(h>=l.heads){grid.appendChild(document.createElement('div'));continue;}
  const cv=document.createElement('canvas'),cell=Math.max(1,Math.floor(64/l.positions));cv.width=cv.height=l.positions*cell;
  cv.style.width=cv.style.height='64px';cv.title=l.label+' head '+h;cv.className='thumb';
  paint(cv.getContext('2d'),l,h,0,0,cell);cv.addEventListener('click',()=>show(li,h,cv));grid.appendChild(cv);
  if(data.focus&&data.focus[0]===li&&data.focus[1]===h)best=[li,h,cv];}});
if(!best){const cv=grid.querySelector('canvas');best=[0,0,cv];}
show(best[0],best[1],best[2]);
})();
)";

}  // namespace

std::string render_html(const Report& r) {
  std::ostringstream h;
  h << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>flexmodel report: " << escape(r.capture)
    << "</title>\n<style>" << kStyle << "</style></head><body>\n";
  h << "<h1>flexmodel report</h1>\n<div class=\"meta\" id=\"summary\">" << escape(r.capture) << " &middot; "
    << r.tensors.size() << " tensors, " << human_bytes(r.capture_bytes);
  if (!r.model_dir.empty()) h << " &middot; model " << escape(r.model_dir);
  if (!r.architecture.empty()) h << " (" << escape(r.architecture) << ")";
  if (r.rows) h << " &middot; " << r.rows << " row(s) x " << r.positions << " tokens";
  h << "</div>\n";
  if (!r.tokens.empty()) {
    h << "<p id=\"tokens\">";
    for (const auto& t : r.tokens) h << "<span class=\"tok\">" << escape(visible(t)) << "</span>";
    if (r.positions > static_cast<int64_t>(r.tokens.size())) h << " &hellip; (first " << r.tokens.size() << " shown)";
    h << "</p>\n";
  }

  h << "<h2>Findings</h2>\n<ul class=\"findings\" id=\"findings\">\n";
  for (const auto& f : r.findings) h << "<li>" << escape(f) << "</li>\n";
  h << "</ul>\n";

  // Attention: thumbnails of every head, the selected one large, the scores.
  h << "<h2>Attention patterns</h2>\n<section id=\"attention\">\n";
  nlohmann::json data = {{"tokens", nlohmann::json::array()}, {"layers", nlohmann::json::array()}};
  for (const auto& t : r.tokens) data["tokens"].push_back(visible(t));
  for (const auto& a : r.attention)
    data["layers"].push_back({{"name", a.name}, {"label", a.label}, {"heads", a.heads}, {"positions", a.positions}, {"b64", base64(a.probs)}});
  if (r.attention.empty()) {
    h << "<p>No attention probabilities in this capture (capture them with <code>--hook '*.hook_attn_probs'</code>).</p>\n";
  } else {
    // Open on the head with the highest induction (else previous-token) score.
    const HeadScore* focus = nullptr;
    for (const auto& s : r.heads)
      if (!focus || s.induction.value_or(s.previous_token) > focus->induction.value_or(focus->previous_token)) focus = &s;
    if (focus)
      for (size_t li = 0; li < r.attention.size(); ++li)
        if (r.attention[li].label == focus->layer) data["focus"] = {li, focus->head};
    h << "<p class=\"meta\">Every head of every layer on row " << r.row << " (click one to enlarge; darker is more attention).</p>\n"
      << "<div class=\"grid\" id=\"attn-grid\"></div>\n<p id=\"attn-title\"></p>\n<div class=\"scroll\"><canvas id=\"attn-detail\" width=\"10\" height=\"10\"></canvas></div>\n";
    h << "<h3>What each head does</h3>\n<p class=\"meta\">Share of each head's attention (mean over all rows and positions) "
         "that goes to the previous token, to the first token, and from a repeated token to the token after its earlier "
         "occurrence (induction).</p>\n<table id=\"head-scores\"><tr><th>layer</th><th>head</th><th>previous token</th>"
         "<th>first token</th><th>induction</th></tr>\n";
    for (const auto& s : r.heads) {
      h << "<tr><td>" << escape(s.layer) << "</td><td class=\"num\">" << s.head << "</td>";
      for (double v : {s.previous_token, s.first_token})
        h << "<td class=\"num\" style=\"background:" << cell_colour(v) << "\">" << fixed(v) << "</td>";
      if (s.induction) h << "<td class=\"num\" style=\"background:" << cell_colour(*s.induction) << "\">" << fixed(*s.induction) << "</td>";
      else h << "<td>n/a</td>";
      h << "</tr>\n";
    }
    h << "</table>\n";
  }
  h << "<script type=\"application/json\" id=\"attn-data\">" << script_json(data) << "</script>\n</section>\n";

  // Logit lens.
  h << "<h2>Logit lens</h2>\n<section id=\"logit-lens\">\n";
  if (r.lens.empty()) {
    h << "<p>Not available: " << escape(r.lens_note) << ".</p>\n";
  } else {
    h << "<p class=\"meta\">Top next-token prediction of " << escape(r.lens_note)
      << ". Colour: its probability.</p>\n<div class=\"scroll\"><table class=\"lens\"><tr><th></th>";
    for (const auto& t : r.tokens) h << "<th>" << escape(visible(t)) << "</th>";
    h << "</tr>\n";
    for (auto it = r.lens.rbegin(); it != r.lens.rend(); ++it) {  // output on top
      h << "<tr><th>" << escape(it->label) << "</th>";
      for (size_t t = 0; t < it->top_tokens.size(); ++t)
        h << "<td style=\"background:" << cell_colour(it->top_probs[t]) << "\" title=\"" << fixed(it->top_probs[t], 3) << "\">"
          << escape(visible(it->top_tokens[t])) << "</td>";
      h << "</tr>\n";
    }
    h << "</table></div>\n";
  }
  h << "</section>\n";

  // Activation norms.
  h << "<h2>Activation norms</h2>\n<section id=\"norms\">\n";
  if (r.norms.empty()) {
    h << "<p>No [batch, tokens, hidden] activations in this capture.</p>\n";
  } else {
    double top = 0;
    for (const auto& n : r.norms) top = std::max(top, n.mean);
    h << "<p class=\"meta\">Mean L2 norm over positions of each captured module's output (shown row).</p>\n"
         "<table id=\"norm-table\"><tr><th>module</th><th>mean norm</th><th></th></tr>\n";
    for (const auto& n : r.norms)
      h << "<tr><td>" << escape(n.name) << "</td><td class=\"num\">" << fixed(n.mean, 3) << "</td><td><span class=\"bar\" style=\"width:"
        << (top > 0 ? int(300 * n.mean / top) : 0) << "px\"></span></td></tr>\n";
    h << "</table>\n";
  }
  h << "</section>\n";

  // Every tensor.
  h << "<h2>Tensors</h2>\n<table id=\"tensors\"><tr><th>name</th><th>dtype</th><th>shape</th><th>size</th></tr>\n";
  for (const auto& t : r.tensors)
    h << "<tr><td>" << escape(t.name) << "</td><td>" << escape(t.dtype) << "</td><td>" << escape(t.shape)
      << "</td><td class=\"num\">" << human_bytes(t.bytes) << "</td></tr>\n";
  h << "</table>\n<script>" << kScript << "</script>\n</body></html>\n";
  return h.str();
}

}  // namespace flex::cli::report
