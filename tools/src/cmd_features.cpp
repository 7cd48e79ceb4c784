// flexmodel features: a corpus through the model with a dictionary spliced in
// observe mode; per feature its density, activation histogram, strongest
// contexts and the direct logit effect of its decoder row, as one HTML page.
#include "cli.h"
#include "features.h"

#include <flex/datasets/batch_runner.h>
#include <flex/datasets/token_contexts.h>
#include <flex/dispatch/atomic_file.h>
#include <flex/flexcore/flex_model.h>
#include <flex/hooks/errors.h>
#include <flex/tokenizers/tokenizer.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <unordered_map>

namespace fs = std::filesystem;

namespace flex::cli {

namespace {

const std::vector<Flag>& features_flags() {
  static const std::vector<Flag> flags = [] {
    std::vector<Flag> f = {
        {"--dataset", "FILE", "the corpus: text (one document per line), JSON Lines (.jsonl) or token ids "
                              "(.safetensors input_ids)"},
        {"--text-field", "NAME", "--dataset is JSON Lines with the document in this field (default: text)"},
        {"--out", "FILE.html", "the page"},
        {"--features", "F,F,...", "the features to show (default: the --top-features most frequent)"},
        {"--top-features", "N", "without --features: how many of the most frequently active to show (default 12)"},
        {"--context-len", "N", "tokens per context (default 64)"},
        {"--max-tokens", "M", "read at most M tokens of the corpus (default 16384)"},
        {"--batch-size", "N", "contexts per forward (default 8)"},
        {"--examples", "E", "strongest contexts shown per feature (default 8)"},
        {"--window", "W", "tokens shown before each example's token (default 12; 4 after)"},
        {"--log-level", "LEVEL", "error|warn|info|debug (default: $FLEXMODEL_LOG, else warn)"},
    };
    for (auto& l : loading_flags()) f.push_back(l);
    return f;
  }();
  return flags;
}

std::vector<int64_t> feature_list(const std::string& text, int64_t d_sae) {
  std::vector<int64_t> out;
  for (int64_t v : parse_index_list("--features", text, "a feature index")) {
    if (v >= d_sae)
      throw UsageError("option --features: feature " + std::to_string(v) + " outside the dictionary's " +
                       std::to_string(d_sae) + " features");
    if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
  }
  return out;
}

/// Every active (token, feature, value) of the corpus, tokens numbered in corpus order.
struct Entries {
  std::vector<int32_t> token, feature;
  std::vector<float> value;
};

}  // namespace

int run_features(const std::vector<std::string>& argv) {
  Args args("features", features_flags(), argv);
  if (args.help()) {
    std::cout << usage_text("features", "SAE_PATH[@HOOK] MODEL_DIR --dataset FILE --out FILE.html [options]",
                            features_flags(),
                            "Runs the corpus through the model with the dictionary spliced at its hook point\n"
                            "(observe mode) and writes one HTML page: for each requested feature (or the most\n"
                            "frequently active), its density, activation histogram, the contexts where it fires\n"
                            "most with every token coloured by its activation, and the direct logit effect of its\n"
                            "decoder row (W_dec[f] . W_U: the tokens it promotes and suppresses; dictionaries on\n"
                            "the residual stream or on a sublayer's output). The numbers are also embedded as JSON\n"
                            "(<script id=\"feature-data\">).");
    return 0;
  }
  set_log_level(args.get("--log-level"));
  const auto& pos = args.positionals();
  if (pos.size() != 2) throw UsageError("give SAE_PATH and MODEL_DIR (got " + std::to_string(pos.size()) + " positionals)");
  const std::string sae_spec = pos[0], dir = pos[1];
  const auto dataset = args.get("--dataset");
  if (!dataset) throw UsageError("missing --dataset FILE");
  const auto out = args.get("--out");
  if (!out) throw UsageError("missing --out FILE.html");
  if (!fs::exists(*dataset)) throw IOError("dataset '" + *dataset + "' does not exist");
  const int64_t context_len = int_at_least(args, "--context-len", 64, 1);
  const int64_t max_tokens = int_at_least(args, "--max-tokens", 16384, 1);
  const int64_t batch_size = int_at_least(args, "--batch-size", 8, 1);
  const int64_t n_examples = int_at_least(args, "--examples", 8, 1);
  const int64_t top_features = int_at_least(args, "--top-features", 12, 1);
  const int64_t window = int_at_least(args, "--window", 12, 0);
  require_model_dir(dir);
  require_writable_file(*out);

  std::shared_ptr<const Tokenizer> tok;
  try {
    tok = load_tokenizer(dir);
  } catch (const IOError&) {
    // Token-id corpora need none; tokens are then shown as their ids.
  }
  auto model = load_model(dir, args);
  FlexModel fm(model);
  const Splice splice = splice_sae_spec(fm, sae_spec, SpliceMode::Observe);
  const SaeConfig& cfg = splice.sae->config();
  const int64_t d_sae = cfg.d_sae;
  std::vector<int64_t> requested;
  if (auto f = args.get("--features")) requested = feature_list(*f, d_sae);

  FeatureRecorder recorder(splice);

  TokenContextsOptions co;
  co.path = *dataset;
  if (auto f = args.get("--text-field")) {
    co.text_field = *f;
    co.format = DatasetFormat::JsonLines;
  }
  co.context_len = context_len;
  co.batch_size = batch_size;
  co.max_contexts = (max_tokens + context_len - 1) / context_len;
  TokenContexts contexts(co, tok);

  // One pass: every active entry kept (tokens x L0 of them), per-feature counts.
  Entries e;
  std::vector<at::Tensor> ids;
  std::vector<int64_t> count(d_sae, 0);
  std::vector<double> max_act(d_sae, 0), sum_act(d_sae, 0);
  int64_t tokens = 0;
  {
    at::NoGradGuard no_grad;
    BatchRunner runner(fm);  // places each batch where the model takes it
    Progress progress("features", co.max_contexts * context_len, "tokens");
    while (auto batch = contexts.next()) {
      const int64_t vocab = model->config().vocab_size;
      if (batch->input_ids.max().item<int64_t>() >= vocab)
        throw ConfigError(*dataset + ": a token id is outside the model's vocabulary of " + std::to_string(vocab));
      LMInputs in;
      in.input_ids = batch->input_ids;
      runner.forward(std::move(in));
      const int64_t n = batch->input_ids.numel();
      auto codes = recorder.take_codes();
      if (codes.size() != 1 || codes[0].rows != n)
        throw ShapeError("the dictionary at '" + splice.module + "' gave " +
                         (codes.size() == 1 ? std::to_string(codes[0].rows) + " rows of features"
                                            : "features " + std::to_string(codes.size()) + " times") +
                         " for " + std::to_string(n) + " tokens (it needs one row per token, once per forward)");
      const SparseCode* code = &codes[0];
      const int64_t* ptr = code->indptr.const_data_ptr<int64_t>();
      const int64_t* idx = code->indices.const_data_ptr<int64_t>();
      const at::Tensor vals = code->values.to(at::kFloat).contiguous();
      const float* val = vals.const_data_ptr<float>();
      for (int64_t r = 0; r < n; ++r)
        for (int64_t j = ptr[r]; j < ptr[r + 1]; ++j) {
          if (val[j] <= 0) continue;  // "active" is a positive activation (AbsTopK may keep negatives)
          const int64_t f = idx[j];
          e.token.push_back(static_cast<int32_t>(tokens + r));
          e.feature.push_back(static_cast<int32_t>(f));
          e.value.push_back(val[j]);
          ++count[f];
          sum_act[f] += val[j];
          max_act[f] = std::max<double>(max_act[f], val[j]);
        }
      tokens += n;
      ids.push_back(batch->input_ids);
      progress.step(n);
    }
  }
  if (tokens == 0)
    throw ConfigError(*dataset + ": no whole context of " + std::to_string(context_len) + " tokens (lower --context-len)");
  const at::Tensor all_ids = at::cat(ids).reshape({-1});
  const int64_t* tok_ids = all_ids.const_data_ptr<int64_t>();

  features::Page page;
  page.sae = sae_spec;
  page.model = dir;
  page.dataset = *dataset;
  page.hook = cfg.hook_name;
  page.place = splice.module;
  page.architecture = cfg.class_name();
  page.d_in = cfg.d_in;
  page.d_sae = d_sae;
  page.tokens = tokens;
  page.contexts = tokens / context_len;
  page.context_len = context_len;
  page.mean_l0 = double(e.value.size()) / double(tokens);
  page.dead = std::count(count.begin(), count.end(), 0);
  std::vector<int64_t> chosen = requested;
  page.selection = requested.empty() ? "most frequent" : "requested";
  if (chosen.empty()) {
    for (int64_t f = 0; f < d_sae; ++f)
      if (count[f] > 0) chosen.push_back(f);
    std::stable_sort(chosen.begin(), chosen.end(), [&](int64_t a, int64_t b) { return count[a] > count[b]; });
    if (static_cast<int64_t>(chosen.size()) > top_features) chosen.resize(top_features);
  }

  // The chosen features' entries, each as token -> activation.
  std::map<int64_t, size_t> slot;
  for (size_t i = 0; i < chosen.size(); ++i) slot[chosen[i]] = i;
  std::vector<std::vector<std::pair<int32_t, float>>> per(chosen.size());
  for (size_t j = 0; j < e.value.size(); ++j)
    if (auto it = slot.find(e.feature[j]); it != slot.end()) per[it->second].emplace_back(e.token[j], e.value[j]);

  auto label = [&](int64_t id) {
    if (!tok) return "#" + std::to_string(id);
    return tok->decode_text({id});
  };
  // Direct logit effect: only for a decoder that writes the residual stream's width.
  const at::Tensor W_U = model->output_embeddings()->weight.detach().to(at::kFloat);
  const bool logits_apply = !cfg.hook_z && cfg.d_out == W_U.size(1);
  for (size_t i = 0; i < chosen.size(); ++i) {
    const int64_t f = chosen[i];
    features::Feature ft;
    ft.index = f;
    ft.count = count[f];
    ft.density = double(count[f]) / double(tokens);
    ft.max = max_act[f];
    ft.mean = count[f] > 0 ? sum_act[f] / count[f] : 0;
    const int bins = 24;
    ft.histogram.assign(bins, 0);
    ft.bin_width = ft.max > 0 ? ft.max / bins : 1;
    for (const auto& [t, v] : per[i]) ++ft.histogram[std::min<int64_t>(bins - 1, static_cast<int64_t>(v / ft.bin_width))];
    std::unordered_map<int32_t, float> act(per[i].begin(), per[i].end());
    std::vector<std::pair<int32_t, float>> order = per[i];
    std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    for (size_t k = 0; k < order.size() && static_cast<int64_t>(k) < n_examples; ++k) {
      features::Example ex;
      const int64_t t = order[k].first;
      ex.context = t / context_len;
      ex.position = t % context_len;
      ex.value = order[k].second;
      ex.first = std::max<int64_t>(0, ex.position - window);
      const int64_t last = std::min<int64_t>(context_len - 1, ex.position + 4);
      for (int64_t p = ex.first; p <= last; ++p) {
        const int64_t g = ex.context * context_len + p;
        ex.tokens.push_back(label(tok_ids[g]));
        auto it = act.find(static_cast<int32_t>(g));
        ex.acts.push_back(it == act.end() ? 0.0 : it->second);
      }
      ft.examples.push_back(std::move(ex));
    }
    if (logits_apply) {
      ft.has_logits = true;
      const at::Tensor effect = at::matmul(W_U, splice.sae->W_dec[f].detach().to(at::kFloat));
      const int64_t k = std::min<int64_t>(10, effect.size(0));
      for (bool largest : {true, false}) {
        auto [v, ix] = effect.topk(k, 0, largest, /*sorted=*/true);
        for (int64_t j = 0; j < k; ++j) {
          const int64_t id = ix[j].item<int64_t>();
          (largest ? ft.promoted : ft.suppressed).push_back({label(id), id, v[j].item<double>()});
        }
      }
    }
    page.features.push_back(std::move(ft));
  }

  write_file_atomic(*out, features::render_html(page));  // whole or nothing
  std::cout << "flexmodel: " << tokens << " tokens, mean L0 " << page.mean_l0 << ", " << page.dead << " of " << d_sae
            << " features never active; wrote " << *out << " (" << page.features.size() << " features)\n";
  return 0;
}

}  // namespace flex::cli
