// flexmodel capture: run a batch through a model with FlexModel hooks and
// write every hooked module's output to one safetensors file (or, with
// --stream-dir, to StreamingSink shards for captures larger than memory).
#include "cli.h"

#include <flex/datasets/batch_runner.h>
#include <flex/dispatch/safetensors.h>
#include <flex/flexcore/flex_model.h>
#include <flex/flexcore/streaming_sink.h>
#include <flex/hooks/errors.h>
#include <flex/models/generate.h>
#include <flex/tokenizers/tokenizer.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <iostream>
#include <set>

namespace flex::cli {

namespace {

const std::vector<Flag>& capture_flags() {
  static const std::vector<Flag> flags = [] {
    std::vector<Flag> f = {
        {"--prompt", "TEXT", "a prompt, tokenized with the model folder's tokenizer", true},
        {"--prompts-file", "FILE", "one prompt per line"},
        {"--input-ids", "FILE.safetensors", "tensor input_ids [B, T] (and attention_mask if present) as the batch"},
        {"--hook", "NAME", "module to capture ('all': every named module except the root and hook_* points; a pattern "
                            "with * or ? selects every matching name, hook points included: '*.hook_attn_probs'; a "
                            "TransformerLens hook name, blocks.3.hook_resid_post, is captured under that name)", true},
        {"--out", "FILE.safetensors", "output: one tensor per hook, plus input_ids and logits"},
        {"--batch-size", "N|auto", "rows per forward (default: the whole batch; auto: the largest that fits in memory, "
                                   "halving from the whole batch); outputs are concatenated on dim 0"},
        {"--stream-dir", "DIR", "stream captures to StreamingSink shards in DIR (resumes an interrupted run); "
                                "with --dataset: the activation dataset's directory"},
        {"--dataset", "FILE", "capture a corpus: text (one document per line), JSON Lines (.jsonl, or --text-field), "
                              "or token ids (.safetensors input_ids [tokens] or [documents, tokens]); needs "
                              "--context-len and --stream-dir"},
        {"--text-field", "NAME", "--dataset is JSON Lines with the document in this field (default for .jsonl: text)"},
        {"--context-len", "N", "--dataset: tokens per context (documents are concatenated, then cut)"},
        {"--max-tokens", "M", "--dataset: stop after M tokens (rounded up to whole contexts)"},
        {"--positions", "all|random:K", "--dataset: store every position (default) or K random ones per context"},
        {"--exclude-bos", "", "--dataset: leave out the BOS tokens"},
        {"--seed", "N", "--dataset: seed of --positions random:K (default 0)"},
        {"--shard-size", "SIZE", "--dataset: bytes per shard (default 256MB)"},
        {"--store-dtype", "f32|bf16|f16", "--dataset: storage dtype of the activations (default: --dtype's); the model "
                                         "still computes in --dtype"},
        {"--sae-features", "active|top:K", "with --sae: per token, every active feature (default; with --dataset, "
                                          "TopK dictionaries only) or the K strongest; stored as <module>.sae."
                                          "feature_indices (int32, -1 = none), feature_values and l0 (active count)"},
        {"--log-level", "LEVEL", "error|warn|info|debug (default: $FLEXMODEL_LOG, else warn)"},
    };
    for (auto& l : sae_flags("observe")) f.push_back(l);
    for (auto& l : loading_flags()) f.push_back(l);
    for (auto& p : parallel_flags()) f.push_back(p);
    return f;
  }();
  return flags;
}

InputBatch tokenize(const std::string& dir, const std::vector<std::string>& prompts) {
  if (prompts.empty()) throw UsageError("no prompts given (the prompts file is empty?)");
  std::unique_ptr<Tokenizer> tok;
  try {
    tok = load_tokenizer(dir);
  } catch (const IOError&) {
    throw IOError("model directory '" + dir +
                  "' has no tokenizer (tokenizer.json, or vocab.json + merges.txt); pass token ids with --input-ids");
  }
  std::vector<std::vector<int64_t>> ids;
  for (const auto& p : prompts) {
    ids.push_back(tok->encode(p));
    if (ids.back().empty()) throw ConfigError("prompt '" + p + "' has no tokens");
  }
  const int64_t pad = tok->pad_id().value_or(tok->eos_id().value_or(0));
  auto [input_ids, mask] = pad_left(ids, pad);
  InputBatch b{input_ids, mask};
  if (mask.min().item<int64_t>() == 1) b.attention_mask = at::Tensor();  // no padding at all
  return b;
}

std::vector<std::string> read_prompts(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw IOError("cannot read prompts file '" + path + "'");
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(line);
  return out;
}

at::Tensor to_out(const at::Tensor& t, at::ScalarType dtype) { return to_cpu_capture(t, dtype); }

/// Casts captures to the output dtype, adds the per-forward input_ids and
/// logits the root hook stashed, and hands everything to the StreamingSink.
class StreamWriter : public ActivationSink {
 public:
  StreamWriter(std::shared_ptr<StreamingSink> sink, at::ScalarType dtype) : sink_(std::move(sink)), dtype_(dtype) {}
  void write(const std::string& key, int64_t fwd, const at::Tensor& t) override { sink_->write(key, fwd, to_out(t, dtype_)); }
  void end_forward(int64_t fwd) override {
    for (auto& [k, t] : pending_) sink_->write(k, fwd, t);
    pending_.clear();
    sink_->end_forward(fwd);
  }
  void stash(const std::string& key, const at::Tensor& t) { pending_.emplace_back(key, to_out(t, dtype_)); }
  StreamingSink& sink() { return *sink_; }

 private:
  std::shared_ptr<StreamingSink> sink_;
  at::ScalarType dtype_;
  std::vector<std::pair<std::string, at::Tensor>> pending_;
};

/// One dictionary's recorded forwards as [rows, T, K] indices / values and
/// [rows, T] l0, every forward padded to the widest (index -1, value 0).
std::vector<std::pair<std::string, at::Tensor>> features_tensors(const std::vector<StrongestFeatures>& got, int64_t T,
                                                                 at::ScalarType dtype) {
  int64_t K = 0;
  for (const auto& f : got) K = std::max(K, f.indices.size(1));
  std::vector<at::Tensor> idx, val, l0;
  for (const auto& f : got) {
    const int64_t pad = K - f.indices.size(1);
    idx.push_back(at::constant_pad_nd(f.indices, {0, pad}, -1));
    val.push_back(at::constant_pad_nd(to_out(f.values, dtype), {0, pad}, 0));
    l0.push_back(f.l0);
  }
  if (got.empty()) return {};
  return {{"feature_indices", at::cat(idx).view({-1, T, K})},
          {"feature_values", at::cat(val).view({-1, T, K})},
          {"l0", at::cat(l0).view({-1, T})}};
}

}  // namespace

int run_capture(const std::vector<std::string>& argv) {
  Args args("capture", capture_flags(), argv);
  if (args.help()) {
    std::cout << usage_text("capture",
                            "MODEL_DIR (--prompt TEXT ... | --prompts-file FILE | --input-ids FILE.safetensors)\n"
                            "                          --hook NAME [--hook NAME ...] --out FILE.safetensors [options]\n"
                            "       flexmodel capture MODEL_DIR --dataset FILE --context-len N --hook NAME ... --stream-dir DIR\n"
                            "                          [--max-tokens M] [--batch-size B|auto] [--positions all|random:K]\n"
                            "                          [--exclude-bos] [--store-dtype f32|bf16|f16] [options]",
                            capture_flags(),
                            "Runs the batch through the model with a FlexModel forward hook on every --hook and\n"
                            "writes one tensor per hooked module, named as the module (tuple outputs: element 0;\n"
                            "a module called k times per forward also gives NAME@1 .. NAME@k-1), plus input_ids\n"
                            "and logits (and attention_mask when prompts were padded). Floating tensors are\n"
                            "float32 unless --dtype says otherwise. Batches are concatenated along dim 0.\n\n"
                            "With --dataset, the corpus is tokenized (BOS per document when the tokenizer has one),\n"
                            "packed into contexts of --context-len tokens and run in batches (default 8 contexts);\n"
                            "each hook's per-token activations go to shards in --stream-dir with the token ids and\n"
                            "(document, position) of every token (layout: README, 'Activation datasets'). Run it\n"
                            "again on the same directory to resume after an interruption.\n\n"
                            "With --sae, each dictionary is spliced at its hook point (observe mode: the model is\n"
                            "unchanged) and its feature activations are stored sparsely: per token the active\n"
                            "features (or the K strongest) as <module>.sae.feature_indices [B, T, K] int32 (-1 pads),\n"
                            "<module>.sae.feature_values [B, T, K] and <module>.sae.l0 [B, T] (the active count;\n"
                            "l0 > K shows a token was cut). With --dataset the same go to the shards as [n, K] / [n].\n"
                            "The dictionary's own hook points (<module>.sae.hook_sae_acts_post, ...) take --hook.");
    return 0;
  }
  set_log_level(args.get("--log-level"));
  const std::string dir = args.one_positional("MODEL_DIR");
  const Ranks ranks = parallel_setup(args);
  if (args.has("--dataset")) return run_capture_dataset(args, dir, ranks);
  for (const char* f : {"--text-field", "--context-len", "--max-tokens", "--positions", "--exclude-bos", "--seed", "--shard-size",
                        "--store-dtype"})
    if (args.has(f)) throw UsageError(std::string(f) + " goes with --dataset");
  const int sources = args.has("--prompt") + args.has("--prompts-file") + args.has("--input-ids");
  if (sources != 1) throw UsageError("give exactly one of --prompt, --prompts-file or --input-ids");
  const auto hooks_given = args.all("--hook");
  if (hooks_given.empty() && !args.has("--sae")) throw UsageError("give at least one --hook NAME (or --hook all), or --sae PATH");
  if (args.has("--sae-features") && !args.has("--sae")) throw UsageError("--sae-features goes with --sae");
  if (args.has("--sae") && args.has("--stream-dir"))
    throw UsageError("--sae writes its features to --out (or, with --dataset, to the activation dataset); not to --stream-dir");
  const int64_t feature_width = parse_feature_width(args.get("--sae-features").value_or("active"));
  const auto out = args.get("--out");
  if (!out) throw UsageError("missing --out FILE.safetensors");
  const bool auto_batch = args.get("--batch-size") == std::optional<std::string>("auto");
  const int64_t batch_size = auto_batch ? 0 : args.get_int("--batch-size").value_or(0);
  if (args.has("--batch-size") && !auto_batch && batch_size < 1) throw UsageError("option --batch-size must be at least 1 (or auto)");
  if (auto_batch && ranks.mesh)
    throw UsageError("--batch-size auto runs in one process only (an out-of-memory failure on one rank would leave the others waiting)");
  const at::ScalarType out_dtype = args.get("--dtype") ? parse_dtype(*args.get("--dtype")) : at::kFloat;
  if (ranks.writer()) require_writable_file(*out);  // fail before any work
  require_model_dir(dir);

  InputBatch all;
  if (auto f = args.get("--input-ids")) all = read_input_ids(*f);
  else if (args.has("--prompt")) all = tokenize(dir, args.all("--prompt"));
  else all = tokenize(dir, read_prompts(*args.get("--prompts-file")));

  // Every rank holds the whole batch; the parallel model splits it.
  std::shared_ptr<Module> model;
  std::shared_ptr<ParallelCausalLM> parallel;
  if (ranks.mesh) model = parallel = load_parallel_model(dir, args, *ranks.mesh);
  else model = load_model(dir, args);
  FlexModel fm(model);
  if (parallel) fm.set_mesh(*ranks.mesh, parallel->layout());  // whole activations on rank 0
  // Dictionaries first: their hook points (<module>.sae.hook_sae_*) are then --hook-able.
  const std::vector<Splice> splices = splice_saes(fm, args, SpliceMode::Observe);
  std::vector<std::unique_ptr<FeatureRecorder>> recorders;
  for (const auto& sp : splices) recorders.push_back(std::make_unique<FeatureRecorder>(sp, feature_width, ranks.mesh));

  std::vector<std::string> names;
  std::set<std::string> seen;
  for (const auto& h : hooks_given) {
    const auto add = h == "all" ? all_hook_names(*model) : matching_hook_names(*model, h);
    for (const auto& n : add)
      if (seen.insert(n).second) names.push_back(n);
  }
  for (const auto& n : names) fm.register_forward_hook(std::make_shared<HookFunction>(n));  // unknown: NotFoundError with close names

  const int64_t rows = all.input_ids.size(0);
  // Placement, batching and collection: the batch runner's (inputs go to the
  // device of the module that consumes them, captures come back on the CPU).
  BatchRunner runner(fm, BatchRunnerOptions().batch_size(batch_size).auto_batch_size(auto_batch).capture_dtype(out_dtype));
  const TokenBatch whole{all.input_ids, all.attention_mask};
  const int64_t bs = runner.batch_size(whole);
  for (auto& r : recorders) r->take();  // what auto's trial forwards recorded
  if (auto_batch) log(LogLevel::Info, "--batch-size auto: " + std::to_string(bs) + " row(s) per forward");

  std::shared_ptr<StreamWriter> stream;
  HookHandle root_hook;
  if (auto sd = args.get("--stream-dir"); sd && ranks.writer()) {
    require_writable_dir(*sd);
    stream = std::make_shared<StreamWriter>(std::make_shared<StreamingSink>(*sd), out_dtype);
    fm.set_sink(stream);
    root_hook = model->register_forward_hook([&](Module&, const Inputs& in, Value& v) {
      stream->stash("input_ids", in.tensor_or("input_ids"));
      stream->stash("logits", LMOutput::from_value(v).logits);
    });
  }

  const int64_t nbatches = runner.num_forwards(rows);
  // Rank 0 decides where a resumed stream continues; the others follow.
  int64_t skip = stream ? std::min(stream->sink().forwards_done(), nbatches) : 0;
  if (ranks.mesh && args.has("--stream-dir")) {
    at::Tensor s = at::full({1}, skip, at::kLong);
    ranks.world->broadcast(s, 0);
    skip = s.item<int64_t>();
  }
  if (skip > 0) log(LogLevel::Warn, "resuming the capture in " + *args.get("--stream-dir") + " at batch " + std::to_string(skip));
  // The sink numbers forwards itself: a resumed stream simply continues at `skip`.

  std::map<std::string, std::vector<at::Tensor>> captured;
  std::vector<std::vector<StrongestFeatures>> features(recorders.size());
  std::vector<at::Tensor> logits;
  {
    Progress progress("capturing", nbatches - skip);
    runner.run(whole, skip, [&](const ForwardSlice& slice, Value& v) {
      if (!stream) {
        if (ranks.writer()) {
          logits.push_back(to_out(LMOutput::from_value(v).logits, out_dtype));
          for (auto& [key, t] : runner.take_captures(slice)) captured[key].push_back(std::move(t));
        }
        fm.clear();
      }
      for (size_t i = 0; i < recorders.size(); ++i)
        for (auto& f : recorders[i]->take_gathered()) features[i].push_back(std::move(f));  // empty but on rank 0
      progress.step();
    });
  }
  root_hook.remove();
  if (!ranks.writer()) return 0;  // rank 0 holds the whole captures and writes them

  std::vector<std::pair<std::string, at::Tensor>> tensors;
  if (stream) {
    stream->sink().flush();
    CaptureReader reader(stream->sink().dir());
    for (const char* k : {"input_ids", "logits"}) tensors.emplace_back(k, at::cat(reader.all(k), 0));
  } else {
    tensors.emplace_back("input_ids", all.input_ids);
    tensors.emplace_back("logits", at::cat(logits, 0));
    for (auto& [key, list] : captured) {
      try {
        tensors.emplace_back(key, list.size() == 1 ? list[0] : at::cat(list, 0));
      } catch (const std::exception&) {
        throw ShapeError("cannot concatenate the captures of '" + key + "' across batches (shapes differ); use one batch");
      }
    }
  }
  if (all.attention_mask.defined()) tensors.emplace_back("attention_mask", all.attention_mask);
  for (size_t i = 0; i < recorders.size(); ++i) {
    for (auto& [k, t] : features_tensors(features[i], all.input_ids.size(1), out_dtype))
      tensors.emplace_back(recorders[i]->key(k), t);
  }
  for (const auto& n : names)
    if (!stream && !captured.count(n)) log(LogLevel::Info, "module '" + n + "' was not called; nothing captured for it");

  save_safetensors(*out, tensors, {{"format", "pt"}, {"flexmodel.model", dir}});
  if (log_level() >= LogLevel::Info) {
    std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& [k, t] : tensors) {
      std::ostringstream os;
      os << "  " << k << "  " << t.sizes() << "  " << t.scalar_type();
      log(LogLevel::Info, os.str());
    }
  }
  if (log_level() >= LogLevel::Warn) {
    if (!recorders.empty()) std::cerr << "flexmodel: " << recorders.size() << " dictionar" << (recorders.size() == 1 ? "y's" : "ies'") << " features captured\n";
    std::cerr << "flexmodel: captured " << (stream ? names.size() : captured.size()) << " module outputs over " << nbatches
              << " batch(es) -> " << (stream ? *args.get("--stream-dir") + " (shards), " : "") << *out << "\n";
  }
  return 0;
}

}  // namespace flex::cli
