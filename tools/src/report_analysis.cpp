// The numbers behind `flexmodel report`. Each capture tensor is read on its
// own through the file's mapping (a zero-copy view) and dropped before the
// next, so the resident memory is one tensor's worth, not the capture's.
// Tensors are recognised by shape, not by architecture: [B, H, T, T] are
// attention probabilities, [B, T, D] activations, NAME.<i> block outputs.
#include "cli.h"
#include "report.h"

#include <flex/dispatch/safetensors.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/shape_text.h>
#include <flex/models/from_pretrained.h>
#include <flex/tokenizers/tokenizer.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

namespace flex::cli::report {

namespace {

namespace fs = std::filesystem;

/// "a.10" after "a.9": digit runs compare as numbers.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) && std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t i2 = i, j2 = j;
      while (i2 < a.size() && std::isdigit(static_cast<unsigned char>(a[i2]))) ++i2;
      while (j2 < b.size() && std::isdigit(static_cast<unsigned char>(b[j2]))) ++j2;
      const std::string na = a.substr(i, i2 - i), nb = b.substr(j, j2 - j);
      if (na.size() != nb.size()) return na.size() < nb.size();
      if (na != nb) return na < nb;
      i = i2, j = j2;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i, ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

/// A dotted name's component made of digits only ("3" in "transformer.h.3").
bool is_number(const std::string& part) {
  return !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
}

/// "transformer.h.3.attn.attn_dropout" -> {"transformer.h.3", 3}; nullopt without a numeric component.
std::optional<std::pair<std::string, int64_t>> layer_of(const std::string& name) {
  size_t start = 0;
  while (start < name.size()) {
    size_t end = name.find('.', start);
    if (end == std::string::npos) end = name.size();
    const std::string part = name.substr(start, end - start);
    if (is_number(part))
      return std::make_pair(name.substr(0, end), static_cast<int64_t>(std::stoll(part)));
    start = end + 1;
  }
  return std::nullopt;
}

bool is_float(const TensorInfo& info) { return info.dtype != at::ScalarType::Undefined && at::isFloatingType(info.dtype); }

/// Captures that are a module's auxiliary outputs, not activations over tokens.
bool is_auxiliary(const std::string& name) { return name.find('#') != std::string::npos; }

/// For each (row, position i): the position right after the most recent
/// earlier occurrence j of token ids[i], when j + 1 < i; else -1.
at::Tensor induction_targets(const at::Tensor& ids) {
  const int64_t B = ids.size(0), T = ids.size(1);
  at::Tensor target = at::full({B, T}, -1, at::kLong);
  auto id = ids.accessor<int64_t, 2>();
  auto out = target.accessor<int64_t, 2>();
  for (int64_t b = 0; b < B; ++b) {
    std::map<int64_t, int64_t> last;  // token -> its latest position so far
    for (int64_t i = 0; i < T; ++i) {
      auto it = last.find(id[b][i]);
      if (it != last.end() && it->second + 1 < i) out[b][i] = it->second + 1;
      last[id[b][i]] = i;
    }
  }
  return target;
}

/// Scores of every head of one layer's probabilities [B, H, T, T], one row at a time.
std::vector<HeadScore> score_heads(const at::Tensor& probs, const at::Tensor& targets, const std::string& label) {
  const int64_t B = probs.size(0), H = probs.size(1), T = probs.size(2);
  at::Tensor prev = at::zeros({H}, at::kDouble), first = at::zeros({H}, at::kDouble), ind = at::zeros({H}, at::kDouble);
  int64_t ind_count = 0;
  for (int64_t b = 0; b < B; ++b) {
    at::Tensor p = probs[b].to(at::kDouble);  // [H, T, T]
    if (T > 1) {
      prev += p.diagonal(-1, 1, 2).sum(-1);
      first += p.narrow(1, 1, T - 1).select(2, 0).sum(-1);
    }
    at::Tensor t = targets.defined() && b < targets.size(0) ? targets[b] : at::Tensor();
    if (t.defined()) {
      at::Tensor valid = t.ge(0);
      const int64_t n = valid.sum().item<int64_t>();
      if (n > 0) {
        at::Tensor rows = valid.nonzero().squeeze(1);
        at::Tensor picked = p.index_select(1, rows).gather(2, t.index_select(0, rows).view({1, -1, 1}).expand({H, n, 1}));
        ind += picked.squeeze(2).sum(-1);
        ind_count += n;
      }
    }
  }
  std::vector<HeadScore> out;
  const double denom = static_cast<double>(B * std::max<int64_t>(T - 1, 1));
  for (int64_t h = 0; h < H; ++h) {
    HeadScore s;
    s.layer = label;
    s.head = h;
    s.previous_token = prev[h].item<double>() / denom;
    s.first_token = first[h].item<double>() / denom;
    if (ind_count > 0) s.induction = ind[h].item<double>() / static_cast<double>(ind_count);
    out.push_back(s);
  }
  return out;
}

/// Mean attention a uniform head would pay to the induction targets.
double uniform_induction(const at::Tensor& targets) {
  double sum = 0;
  int64_t n = 0;
  auto t = targets.accessor<int64_t, 2>();
  for (int64_t b = 0; b < targets.size(0); ++b)
    for (int64_t i = 0; i < targets.size(1); ++i)
      if (t[b][i] >= 0) sum += 1.0 / static_cast<double>(i + 1), ++n;
  return n ? sum / static_cast<double>(n) : 0;
}

/// The model's final norm: the base model's ln_f / final_layer_norm / norm.
std::shared_ptr<Module> final_norm(CausalLM& model) {
  const std::string base = model.base_model_prefix();
  for (const char* n : {"ln_f", "final_layer_norm", "norm"}) {
    try {
      return model.get_submodule(base + "." + n);
    } catch (const NotFoundError&) {
    }
  }
  throw NotFoundError("no final norm (ln_f, final_layer_norm or norm) under '" + base + "'");
}

std::string token_label(const Tokenizer* tok, int64_t id) {
  if (!tok) return "#" + std::to_string(id);
  try {
    return tok->decode({id});
  } catch (const std::exception&) {
    return "#" + std::to_string(id);
  }
}

void add_findings(Report& r, double uniform) {
  if (r.loss_repeated && r.loss_other)
    r.findings.push_back("In-context learning: the next-token loss is " + fixed(*r.loss_repeated) +
                         " nats where the two-token sequence already occurred earlier in the context, against " +
                         fixed(*r.loss_other) + " nats elsewhere.");
  auto list = [&](auto score, double threshold) {
    std::vector<const HeadScore*> hs;
    for (const auto& h : r.heads)
      if (score(h) >= threshold) hs.push_back(&h);
    std::sort(hs.begin(), hs.end(), [&](auto a, auto b) { return score(*a) > score(*b); });
    std::string s;
    for (size_t i = 0; i < hs.size() && i < 6; ++i)
      s += std::string(i ? ", " : "") + hs[i]->layer + " head " + std::to_string(hs[i]->head) + " (" + fixed(score(*hs[i])) + ")";
    if (hs.size() > 6) s += " and " + std::to_string(hs.size() - 6) + " more";
    return s;
  };
  auto induction = [](const HeadScore& h) { return h.induction.value_or(0.0); };
  auto previous = [](const HeadScore& h) { return h.previous_token; };
  auto first = [](const HeadScore& h) { return h.first_token; };
  const bool repeats = std::any_of(r.heads.begin(), r.heads.end(), [](const HeadScore& h) { return h.induction.has_value(); });
  // A head of the model's first layer sees keys that hold only their own token
  // and position: nothing has yet written "the token before me" into them. So
  // when it attends from a repeated token to the token after the earlier
  // occurrence, it has found that position by its offset, not by content, and
  // is not an induction head (which needs a previous-token head below it).
  auto content = [&](const HeadScore& h) { return h.layer_index > 0 ? induction(h) : 0.0; };
  auto by_offset = [&](const HeadScore& h) { return h.layer_index == 0 ? induction(h) : 0.0; };
  const double threshold = std::max(0.3, 4 * uniform);
  if (repeats) {
    const std::string ind = list(content, threshold), offset = list(by_offset, threshold);
    if (!ind.empty())
      r.findings.push_back("Induction heads: " + ind + " of the attention from a repeated token goes to the token right after its "
                           "earlier occurrence (uniform attention would give " + fixed(uniform) + ").");
    if (!offset.empty())
      r.findings.push_back("Copy found by position: " + offset + " of the attention from a repeated token goes to the token right "
                           "after its earlier occurrence, but a first-layer head cannot see which token precedes a key, so it "
                           "finds the copy by its distance, not by content (not an induction head).");
    if (ind.empty())
      r.findings.push_back("No induction head: no head after the first layer puts " + fixed(threshold) +
                           " of its attention on the token after a repeated token's earlier occurrence (uniform: " +
                           fixed(uniform) + ").");
    // The two-layer circuit (Olsson et al., 2022): a previous-token head writes
    // "the token before me" into each position, and an induction head in a
    // later layer finds, for the current token, the position whose previous
    // token it is. Named when both are there, in that order of layers.
    const HeadScore* ind_head = nullptr;
    for (const auto& h : r.heads)
      if (content(h) >= threshold && (!ind_head || content(h) > content(*ind_head))) ind_head = &h;
    const HeadScore* prev_head = nullptr;
    if (ind_head)
      for (const auto& h : r.heads)
        if (h.layer_index < ind_head->layer_index && previous(h) >= 0.5 && (!prev_head || previous(h) > previous(*prev_head)))
          prev_head = &h;
    if (ind_head && prev_head)
      r.findings.push_back("Induction circuit: " + prev_head->layer + " head " + std::to_string(prev_head->head) +
                           " attends to the previous token (" + fixed(previous(*prev_head)) + "), and " + ind_head->layer +
                           " head " + std::to_string(ind_head->head) + " attends from a repeated token to the token after its "
                           "earlier occurrence (" + fixed(induction(*ind_head)) + ").");
  }
  const std::string prev = list(previous, 0.5);
  if (!prev.empty()) r.findings.push_back("Previous-token heads: " + prev + " of the attention goes to the token just before.");
  const std::string sink = list(first, 0.5);
  if (!sink.empty()) r.findings.push_back("First-token (attention sink) heads: " + sink + " of the attention rests on position 0.");
  if (r.heads.empty()) r.findings.push_back("The capture holds no attention probabilities ([batch, heads, T, T]); capture them with "
                                            "--hook '*.hook_attn_probs'.");
}

/// Every block output of `stream` (and the captured logits) through the
/// final norm and unembedding of the model in r.model_dir, whose weights stay
/// in the checkpoint (a "disk" map) but for the two modules used.
void logit_lens(Report& r, const SafetensorsFile& f, const std::vector<std::pair<int64_t, std::string>>& stream,
                const Tokenizer* tok, int64_t shown_row, int64_t P) {
  PretrainedOptions po;
  po.device_map_strategy = "disk";
  auto model = from_pretrained(r.model_dir, po);
  r.architecture = model->class_name();
  auto norm = final_norm(*model);
  auto head = model->output_embeddings();
  at::NoGradGuard no_grad;
  auto add_row = [&](const std::string& label, const at::Tensor& logits) {  // [P, V]
    auto [p, top] = at::softmax(logits.to(at::kFloat), -1).max(-1);
    LensRow row;
    row.label = label;
    for (int64_t t = 0; t < p.size(0); ++t) {
      row.top_probs.push_back(p[t].item<double>());
      row.top_tokens.push_back(token_label(tok, top[t].item<int64_t>()));
    }
    r.lens.push_back(std::move(row));
  };
  auto blocks = stream;
  std::sort(blocks.begin(), blocks.end());
  for (const auto& [index, n] : blocks) {
    at::Tensor resid = f.get(n);
    const int64_t row = std::min(shown_row, resid.size(0) - 1);
    at::Tensor x = resid[row].narrow(0, 0, std::min(resid.size(1), P)).to(at::kFloat).unsqueeze(0).contiguous();
    add_row("layer " + std::to_string(index), (*head)((*norm)(x))[0]);
  }
  if (f.contains("logits") && f.info("logits").shape.size() == 3) {
    at::Tensor logits = f.get("logits");
    const int64_t row = std::min(shown_row, logits.size(0) - 1);
    add_row("output", logits[row].narrow(0, 0, std::min(logits.size(1), P)));
  }
  const std::string& first = blocks.front().second;
  r.lens_note = "each block's output (" + first.substr(0, first.rfind('.')) +
                ".N) through the model's final norm and unembedding; the last row is the model's own logits";
}

}  // namespace

std::string fixed(double v, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

Report analyze(const Options& o) {
  Report r;
  r.capture = o.capture;
  r.row = o.row;
  auto f = SafetensorsFile::open(o.capture);
  r.capture_bytes = f->file_size();
  std::vector<std::string> names = f->names();
  std::sort(names.begin(), names.end(), natural_less);
  for (const auto& n : names) {
    const auto& info = f->info(n);
    r.tensors.push_back({n, info.dtype_name, shape_text(info.shape), info.nbytes()});
  }

  // The tokens, and the model folder the capture came from.
  at::Tensor ids;
  if (f->contains("input_ids")) {
    ids = f->get("input_ids").to(at::kLong).contiguous();
    if (ids.dim() == 1) ids = ids.unsqueeze(0);
    if (ids.dim() != 2) throw ShapeError("'" + o.capture + "': input_ids must be [batch, tokens], got " + shape_text(ids.sizes().vec()));
    r.rows = ids.size(0);
    r.positions = ids.size(1);
    if (o.row < 0 || o.row >= r.rows)
      throw UsageError("option --row " + std::to_string(o.row) + " is outside the capture's " + std::to_string(r.rows) + " row(s)");
  }
  if (o.model) {
    require_model_dir(*o.model);
    r.model_dir = *o.model;
  } else if (f->metadata().count("flexmodel.model")) {
    const std::string dir = f->metadata().at("flexmodel.model");
    if (fs::exists(fs::path(dir) / "config.json")) r.model_dir = dir;
  }
  std::unique_ptr<Tokenizer> tok;
  const std::string tok_dir = o.tokenizer.value_or(r.model_dir);
  if (!tok_dir.empty()) {
    try {
      tok = load_tokenizer(tok_dir);
    } catch (const IOError&) {
      if (o.tokenizer) throw;  // asked for explicitly
    }
  }
  const int64_t T = r.positions;
  const int64_t P = T ? std::min(T, o.max_positions) : o.max_positions;
  if (ids.defined())
    for (int64_t t = 0; t < P; ++t) {
      r.ids.push_back(ids[o.row][t].item<int64_t>());
      r.tokens.push_back(token_label(tok.get(), r.ids.back()));
    }
  const at::Tensor targets = ids.defined() ? induction_targets(ids) : at::Tensor();

  // Attention: one tensor per layer, hook_attn_probs preferred over a module returning the same.
  std::map<std::string, std::string> attention;  // layer key -> tensor name
  std::map<std::string, int64_t> layer_index;
  for (const auto& n : names) {
    const auto& info = f->info(n);
    if (is_auxiliary(n) || !is_float(info) || info.shape.size() != 4 || info.shape[2] != info.shape[3]) continue;
    if (T && info.shape[2] != T) continue;
    const auto layer = layer_of(n);
    if (!layer) continue;
    auto& slot = attention[layer->first];
    layer_index[layer->first] = layer->second;
    const bool hook = n.size() >= 15 && n.compare(n.size() - 15, 15, "hook_attn_probs") == 0;
    if (slot.empty() || hook) slot = n;
  }
  std::vector<std::string> keys;
  for (const auto& kv : attention) keys.push_back(kv.first);
  std::sort(keys.begin(), keys.end(), natural_less);
  for (const auto& key : keys) {
    const std::string& n = attention[key];
    at::Tensor probs = f->get(n);
    AttentionLayer a;
    a.name = n;
    a.label = "layer " + std::to_string(layer_index[key]);
    a.heads = probs.size(1);
    const int64_t p = std::min(probs.size(2), o.max_positions);
    a.positions = p;
    const int64_t row = std::min(o.row, probs.size(0) - 1);
    at::Tensor shown = probs[row].narrow(1, 0, p).narrow(2, 0, p).to(at::kFloat).clamp(0, 1).mul(255).round().to(at::kByte).contiguous();
    a.probs.assign(shown.data_ptr<uint8_t>(), shown.data_ptr<uint8_t>() + shown.numel());
    for (auto& s : score_heads(probs, targets, a.label)) {
      s.layer_index = layer_index[key];
      r.heads.push_back(s);
    }
    r.attention.push_back(std::move(a));
  }

  // Activation norms of every [B, T, D] capture.
  for (const auto& n : names) {
    const auto& info = f->info(n);
    if (n == "logits" || is_auxiliary(n) || !is_float(info) || info.shape.size() != 3) continue;
    if (T && info.shape[1] != T) continue;
    const int64_t row = std::min(o.row, info.shape[0] - 1);
    at::Tensor norms = f->get(n)[row].to(at::kFloat).norm(2, -1);  // [T]
    NormRow nr;
    nr.name = n;
    nr.mean = norms.mean().item<double>();
    at::Tensor shown = norms.narrow(0, 0, std::min(norms.size(0), o.max_positions)).to(at::kDouble).contiguous();
    nr.per_position.assign(shown.data_ptr<double>(), shown.data_ptr<double>() + shown.numel());
    r.norms.push_back(std::move(nr));
  }

  // Next-token loss on repeated bigrams vs the rest, from the captured logits.
  if (ids.defined() && f->contains("logits")) {
    const auto& info = f->info("logits");
    if (info.shape.size() == 3 && info.shape[0] == r.rows && info.shape[1] == T && T > 1) {
      at::Tensor logits = f->get("logits");
      double rep = 0, other = 0;
      int64_t nrep = 0, nother = 0;
      for (int64_t b = 0; b < r.rows; ++b) {
        at::Tensor nll = -at::log_softmax(logits[b].narrow(0, 0, T - 1).to(at::kFloat), -1)
                              .gather(1, ids[b].narrow(0, 1, T - 1).unsqueeze(1))
                              .squeeze(1);
        std::set<std::pair<int64_t, int64_t>> seen;
        for (int64_t t = 0; t + 1 < T; ++t) {
          const auto bigram = std::make_pair(ids[b][t].item<int64_t>(), ids[b][t + 1].item<int64_t>());
          const double l = nll[t].item<double>();
          if (seen.count(bigram)) rep += l, ++nrep;
          else other += l, ++nother;
          seen.insert(bigram);
        }
      }
      if (nrep && nother) r.loss_repeated = rep / nrep, r.loss_other = other / nother;
    }
  }

  // Logit lens: every block output through the final norm and unembedding.
  std::map<std::string, std::vector<std::pair<int64_t, std::string>>> blocks;  // prefix -> (index, name)
  for (const auto& n : names) {
    const auto& info = f->info(n);
    const auto dot = n.rfind('.');
    if (dot == std::string::npos || !is_float(info) || info.shape.size() != 3 || (T && info.shape[1] != T)) continue;
    const std::string last = n.substr(dot + 1);
    if (!is_number(last)) continue;
    blocks[n.substr(0, dot)].emplace_back(std::stoll(last), n);
  }
  const std::vector<std::pair<int64_t, std::string>>* stream = nullptr;
  for (const auto& kv : blocks)
    if (!stream || kv.second.size() > stream->size()) stream = &kv.second;
  if (!stream) {
    r.lens_note = "no block outputs in the capture (capture NAME.<layer> modules, e.g. --hook all)";
  } else if (r.model_dir.empty()) {
    r.lens_note = "no model folder to take the final norm and unembedding from (pass --model DIR)";
  } else {
    try {
      logit_lens(r, *f, *stream, tok.get(), o.row, P);
    } catch (const std::exception& e) {  // the rest of the report stands without it
      r.lens.clear();
      r.lens_note = "the model folder '" + r.model_dir + "' could not be read for the final norm and unembedding (" + e.what() + ")";
      log(LogLevel::Warn, "report: no logit lens: " + r.lens_note);
    }
  }

  add_findings(r, targets.defined() ? uniform_induction(targets) : 0.0);
  return r;
}

}  // namespace flex::cli::report
