// flexmodel capture --dataset: a corpus packed into contexts, run batch by
// batch, the hooks' per-token activations written as an activation dataset
// (flex/datasets/activation_shards.h) by a background thread.
#include "cli.h"

#include <flex/datasets/capture_dataset.h>
#include <flex/datasets/batch_runner.h>
#include <flex/flexcore/flex_model.h>
#include <flex/hooks/errors.h>
#include <flex/tokenizers/tokenizer.h>

#include <ATen/ATen.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <set>
#include <sys/resource.h>

namespace fs = std::filesystem;

namespace flex::cli {

namespace {

/// "all" -> 0, "random:K" -> K.
int64_t parse_positions(const std::string& text) {
  if (text == "all") return 0;
  if (text.rfind("random:", 0) == 0) {
    try {
      size_t used = 0;
      const long long k = std::stoll(text.substr(7), &used);
      if (used == text.size() - 7 && k >= 1) return k;
    } catch (const std::exception&) {
    }
  }
  throw UsageError("option --positions: '" + text + "' is not 'all' or 'random:K' with K >= 1");
}

double peak_rss_mb() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;  // Linux: kilobytes
}

}  // namespace

int run_capture_dataset(const Args& args, const std::string& dir, const Ranks& ranks) {
  for (const char* f : {"--prompt", "--prompts-file", "--input-ids", "--out"})
    if (args.has(f)) throw UsageError(std::string("--dataset captures to --stream-dir; it does not take ") + f);
  const auto out_dir = args.get("--stream-dir");
  if (!out_dir) throw UsageError("--dataset needs --stream-dir DIR (where the activation shards go)");
  const auto context_len = args.get_int("--context-len");
  if (!context_len) throw UsageError("--dataset needs --context-len N (tokens per context)");
  if (*context_len < 1) throw UsageError("option --context-len must be at least 1");
  const auto hooks_given = args.all("--hook");
  if (hooks_given.empty() && !args.has("--sae")) throw UsageError("give at least one --hook NAME, or --sae PATH");
  if (args.has("--sae-features") && !args.has("--sae")) throw UsageError("--sae-features goes with --sae");
  const int64_t feature_width = parse_feature_width(args.get("--sae-features").value_or("active"));
  const bool auto_batch = args.get("--batch-size") == std::optional<std::string>("auto");
  int64_t batch_size = auto_batch ? 0 : args.get_int("--batch-size").value_or(8);
  if (!auto_batch && batch_size < 1) throw UsageError("option --batch-size must be at least 1 (or auto)");
  if (auto_batch && ranks.mesh)
    throw UsageError("--batch-size auto runs in one process only (an out-of-memory failure on one rank would leave the others waiting)");
  const auto max_tokens = args.get_int("--max-tokens");
  if (max_tokens && *max_tokens < 1) throw UsageError("option --max-tokens must be at least 1");
  const auto shard_size = args.get("--shard-size") ? parse_size("--shard-size", *args.get("--shard-size")) : (256ll << 20);
  if (shard_size < 1) throw UsageError("option --shard-size must be positive");
  const auto dataset = *args.get("--dataset");
  if (!fs::exists(dataset)) throw IOError("dataset '" + dataset + "' does not exist");
  require_model_dir(dir);
  if (ranks.writer()) require_writable_dir(*out_dir);

  DatasetCaptureOptions o;
  o.corpus.path = dataset;
  if (auto f = args.get("--text-field")) {
    o.corpus.text_field = *f;
    o.corpus.format = DatasetFormat::JsonLines;
  }
  o.corpus.context_len = *context_len;
  if (max_tokens) o.corpus.max_contexts = (*max_tokens + *context_len - 1) / *context_len;
  o.out_dir = *out_dir;
  // Storage: --store-dtype, else the model's --dtype (bf16 halves the disk either way).
  o.dtype = args.get("--store-dtype") ? parse_dtype(*args.get("--store-dtype"))
            : args.get("--dtype")     ? parse_dtype(*args.get("--dtype"))
                                      : at::kFloat;
  o.random_positions = parse_positions(args.get("--positions").value_or("all"));
  o.exclude_bos = args.has("--exclude-bos");
  o.seed = static_cast<uint64_t>(args.get_int("--seed").value_or(0));
  o.max_shard_bytes = static_cast<uint64_t>(shard_size);
  o.describe = {{"model", fs::absolute(dir).lexically_normal().string()}};
  for (const auto& spec : args.all("--sae")) o.describe["sae"].push_back(spec);
  if (args.has("--sae")) o.describe["sae_features"] = args.get("--sae-features").value_or("active");

  std::shared_ptr<const Tokenizer> tok;
  try {
    tok = load_tokenizer(dir);
  } catch (const IOError&) {
    // Token-id corpora need none; text ones fail in TokenContexts, naming the dataset.
  }
  std::shared_ptr<Module> model;
  std::shared_ptr<ParallelCausalLM> parallel;
  const ModelConfig* cfg;
  std::shared_ptr<CausalLM> single;
  if (ranks.mesh) {
    model = parallel = load_parallel_model(dir, args, *ranks.mesh);
    cfg = &parallel->config();
  } else {
    model = single = load_model(dir, args);
    cfg = &single->config();
  }
  o.vocab_size = cfg->vocab_size;
  o.bos_id = tok && tok->bos_id() ? tok->bos_id() : cfg->bos_token_id;
  FlexModel fm(model);
  if (parallel) fm.set_mesh(*ranks.mesh, parallel->layout());
  // Each dictionary's features: fixed-width columns, so every shard row has the same shape.
  const std::vector<Splice> splices = splice_saes(fm, args, SpliceMode::Observe);
  std::vector<std::shared_ptr<FeatureRecorder>> recorders;
  for (const auto& sp : splices) {
    const SaeConfig& c = sp.sae->config();
    int64_t width = feature_width;
    if (width == 0) {
      if (!c.top_k())
        throw UsageError("--sae-features active: a " + c.class_name() + " ('" + c.source + "') has no fixed number of " +
                         "active features per token, so shards cannot hold them all in fixed rows; give "
                         "--sae-features top:K (l0 records how many were active)");
      width = c.k;
    }
    auto rec = std::make_shared<FeatureRecorder>(sp, width, ranks.mesh);
    recorders.push_back(rec);
    // Three columns per dictionary; the first take() of a forward fetches all
    // three (on every rank: the gather is collective; rank 0 gets them).
    auto pending = std::make_shared<std::optional<StrongestFeatures>>();
    const bool writer = ranks.writer();
    auto column = [rec, pending, writer](int which) {
      return [rec, pending, writer, which](int64_t, int64_t) {
        if (which == 0) {
          auto got = rec->take_gathered();
          pending->reset();
          if (!writer) return at::Tensor();
          if (got.size() != 1)
            throw ConfigError("dictionary at '" + rec->key("") + "' ran " + std::to_string(got.size()) +
                              " times in one forward (a dataset capture needs one call per forward)");
          *pending = std::move(got[0]);
        }
        if (!pending->has_value()) return at::Tensor();
        const StrongestFeatures& f = **pending;
        return which == 0 ? f.indices : which == 1 ? f.values : f.l0;
      };
    };
    o.columns.push_back({rec->key("feature_indices"), column(0)});
    o.columns.push_back({rec->key("feature_values"), column(1)});
    o.columns.push_back({rec->key("l0"), column(2)});
  }
  std::set<std::string> seen;
  for (const auto& h : hooks_given)
    for (const auto& n : h == "all" ? all_hook_names(*model) : matching_hook_names(*model, h))
      if (seen.insert(n).second) o.hooks.push_back(n);

  if (auto_batch) {
    // The largest batch of contexts that runs, from 64 down (Accelerate's
    // find_executable_batch_size), probed with the hooks attached.
    std::vector<HookHandle> probe;
    for (const auto& h : o.hooks) probe.push_back(fm.register_forward_hook(std::make_shared<HookFunction>(h)));
    const int64_t start = o.corpus.max_contexts > 0 ? std::min<int64_t>(64, o.corpus.max_contexts) : 64;
    BatchRunner probe_runner(fm, BatchRunnerOptions().auto_batch_size(true));
    batch_size = probe_runner.batch_size({at::zeros({start, *context_len}, at::kLong), {}});
    for (auto& h : probe) h.remove();
    fm.clear();
    log(LogLevel::Info, "--batch-size auto: " + std::to_string(batch_size) + " context(s) per forward");
  }
  o.corpus.batch_size = batch_size;

  Progress progress("capturing", max_tokens ? o.corpus.max_contexts * *context_len : 0, "tokens");
  o.on_progress = [&](const DatasetCaptureProgress& p) {
    const double f = p.contexts_total > 0 ? double(p.contexts) / double(p.contexts_total) : p.corpus_fraction;
    progress.set(p.contexts * *context_len, f);
  };
  const DatasetCaptureResult r = capture_dataset(fm, tok, o, ranks.world.get());
  if (!ranks.writer()) return 0;
  if (r.resumed_at > 0) log(LogLevel::Warn, "resumed the capture in " + *out_dir + " at context " + std::to_string(r.resumed_at));
  if (r.tokens_dropped > 0)
    log(LogLevel::Info, "the corpus's last " + std::to_string(r.tokens_dropped) + " token(s) do not fill a context: left out");
  if (log_level() >= LogLevel::Warn) {
    char line[512];
    const double s = std::max(r.seconds, 1e-9);
    std::snprintf(line, sizeof(line),
                  "flexmodel: captured %lld tokens (%lld stored) from %zu hook(s) in %.1f s: %.0f tokens/s, "
                  "%.1f MB/s to disk, peak memory %.0f MB; %lld contexts in %s\n",
                  static_cast<long long>(r.tokens_run), static_cast<long long>(r.tokens_stored), o.hooks.size(), r.seconds,
                  r.tokens_run / s, r.bytes_written / s / 1e6, peak_rss_mb(), static_cast<long long>(r.contexts),
                  out_dir->c_str());
    std::fwrite(line, 1, std::strlen(line), stderr);
  }
  return 0;
}

}  // namespace flex::cli
