// flexmodel attribute: one prompt's attribution graph through per-layer
// transcoders (flex/sae/attribution.h), pruned and written as the JSON
// circuit-tracer writes for Neuronpedia's graph viewer.
#include "attribution_html.h"
#include "cli.h"

#include <flex/dispatch/atomic_file.h>
#include <flex/hooks/errors.h>
#include <flex/sae/attribution.h>
#include <flex/sae/attribution_graph.h>
#include <flex/sae/attribution_intervention.h>
#include <flex/sae/attribution_parallel.h>
#include <flex/tokenizers/tokenizer.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <iostream>

namespace fs = std::filesystem;

namespace flex::cli {

namespace {

const std::vector<Flag>& attribute_flags() {
  static const std::vector<Flag> flags = [] {
    std::vector<Flag> f = {
        {"--transcoders", "DIR", "one SAELens transcoder folder per layer (cfg.json + sae_weights.safetensors), each "
                                 "reading its layer's MLP input and writing the MLP output; or a cross-layer transcoder "
                                 "in circuit-tracer's layout (a folder of W_enc_i / W_dec_i.safetensors, or one "
                                 ".safetensors file holding those tensors), found by its W_enc_0"},
        {"--prompt", "TEXT", "the prompt (tokenized with the model folder's tokenizer)"},
        {"--input-ids", "FILE.safetensors", "the prompt as token ids: input_ids [T] or [1, T]"},
        {"--out", "GRAPH.json", "the graph file (Neuronpedia's graph viewer format)"},
        {"--html", "FILE.html", "also write the graph as one self-contained page (no network): x = position, y = "
                                "layer, details of a node on hover/click, a minimum |weight| slider"},
        {"--node-threshold", "X", "keep the nodes holding this fraction of the influence on the logits (default 0.8)"},
        {"--edge-threshold", "X", "keep the edges holding this fraction of the influence (default 0.98)"},
        {"--max-n-logits", "N", "at most N logit nodes (default 10)"},
        {"--desired-logit-prob", "P", "logit nodes until their cumulative probability reaches P (default 0.95)"},
        {"--max-feature-nodes", "N", "compute rows for at most N features, the most influential first (default: all)"},
        {"--batch-size", "N", "targets per backward pass (default 256)"},
        {"--intervene", "LAYER:POS:FEATURE=VALUE", "instead of a graph: set (or with *FACTOR scale) a transcoder feature at "
                                                   "a position (negative: from the end) and print the next-token logits "
                                                   "before and after (circuit-tracer's feature_intervention)", true},
        {"--frozen-attention", "", "with --intervene: attention patterns fixed at the clean run's (the default)"},
        {"--unfrozen-attention", "", "with --intervene: attention patterns recomputed (the normal forward)"},
        {"--max-new-tokens", "N", "with --intervene: also generate N tokens greedily with the interventions"},
        {"--top", "N", "with --intervene: how many top tokens to print (default 5)"},
        {"--slug", "NAME", "the graph's name in the viewer (default: the --out file's stem)"},
        {"--log-level", "LEVEL", "error|warn|info|debug (default: $FLEXMODEL_LOG, else warn)"},
    };
    for (auto& l : loading_flags()) {
      // A plain SIZE bounds the attribution's working memory (decision 45);
      // DEV=SIZE,... keeps its meaning for the device map.
      if (l.name == "--max-memory")
        l = {"--max-memory", "SIZE|DEV=SIZE,...",
             "SIZE (e.g. 2GB): bound the graph computation's working memory: the adjacency is streamed by row "
             "blocks through a temporary file ($TMPDIR), the backward batch sized to fit (error naming the size needed "
             "when it cannot); DEV=SIZE,...: budgets for --device-map as for the other commands"};
      f.push_back(l);
    }
    // Under mpirun: the model sharded over the ranks, the graph gathered on
    // rank 0, which writes it (design decision 48).
    for (auto& p : parallel_flags()) f.push_back(p);
    return f;
  }();
  return flags;
}

// argv without one flag and its value (--flag VALUE or --flag=VALUE).
std::vector<std::string> without_flag(const std::vector<std::string>& argv, const std::string& flag) {
  std::vector<std::string> out;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == flag) {
      ++i;
      continue;
    }
    if (argv[i].rfind(flag + "=", 0) == 0) continue;
    out.push_back(argv[i]);
  }
  return out;
}

// --intervene: the top next-token logits clean and intervened, and the
// greedy continuation with --max-new-tokens.
int print_interventions(const Args& args, CausalLM& model, const Transcoders& transcoders,
                        const at::Tensor& ids, const Tokenizer* tok) {
  std::vector<FeatureIntervention> ivs;
  for (const auto& text : args.all("--intervene")) ivs.push_back(parse_feature_intervention(text));
  const bool frozen = !args.has("--unfrozen-attention");
  const int64_t top = args.get_int("--top").value_or(5);
  if (top < 1) throw ConfigError("option --top must be at least 1, not " + std::to_string(top));
  auto text = [&](int64_t id) { return tok ? tok->decode({id}) : std::to_string(id); };
  const at::Tensor clean = intervene(model, transcoders, ids, {}, frozen)[-1];
  const at::Tensor edited = intervene(model, transcoders, ids, ivs, frozen)[-1];
  std::cout << "interventions (" << (frozen ? "frozen" : "unfrozen") << " attention):";
  for (const auto& t : args.all("--intervene")) std::cout << " " << t;
  std::cout << "\n";
  for (const auto& [name, logits] : {std::pair<const char*, at::Tensor>{"clean", clean}, {"intervened", edited}}) {
    const at::Tensor p = at::softmax(logits.to(at::kDouble), -1);
    auto [vals, idx] = at::topk(p, std::min<int64_t>(top, p.size(0)));
    std::cout << name << " top tokens:";
    for (int64_t k = 0; k < idx.size(0); ++k)
      std::cout << " " << nlohmann::json(text(idx[k].item<int64_t>())).dump() << " (p " << vals[k].item<double>()
                << ", logit " << logits[idx[k].item<int64_t>()].item<double>() << ")";
    std::cout << "\n";
  }
  if (const auto n = args.get_int("--max-new-tokens")) {
    const at::Tensor out = intervene_generate(model, transcoders, ids, ivs, *n, frozen);
    std::string cont;
    for (int64_t i = ids.size(0); i < out.size(0); ++i)
      cont += (tok || cont.empty() ? "" : " ") + text(out[i].item<int64_t>());
    std::cout << "continuation: " << nlohmann::json(cont).dump() << "\n";
  }
  return 0;
}

}  // namespace

int run_attribute(const std::vector<std::string>& argv) {
  Args args("attribute", attribute_flags(), argv);
  if (args.help()) {
    std::cout << usage_text("attribute", "MODEL --transcoders DIR --prompt TEXT|--input-ids FILE --out GRAPH.json [--html GRAPH.html]|--intervene L:P:F=V... [options]",
                            attribute_flags(),
                            "The attribution graph of one prompt (circuit-tracer's): the direct effects between the\n"
                            "active transcoder features, the error nodes, the token embeddings and the most likely\n"
                            "next-token logits in the frozen replacement model (attention patterns and norm\n"
                            "denominators fixed), pruned by influence on the logits, written as the JSON that\n"
                            "Neuronpedia's graph viewer (and circuit-tracer's local server) opens.\n"
                            "With --intervene (repeated): no graph; the features are set (=VALUE) or scaled\n"
                            "(*FACTOR) at their positions as circuit-tracer's feature_intervention does, and the\n"
                            "next-token logits before and after are printed (--max-new-tokens: a greedy continuation).\n"
                            "Under mpirun (mpirun -np 2 flexmodel attribute MODEL --tp 2 ..., or --pp 2): the model is\n"
                            "sharded over the ranks, the edge rows are gathered on rank 0, which writes the graph.");
    return 0;
  }
  set_log_level(args.get("--log-level"));
  const std::string dir = args.one_positional("MODEL");
  const auto tc_dir = args.get("--transcoders");
  const auto out = args.get("--out");
  const auto prompt = args.get("--prompt");
  const auto ids_file = args.get("--input-ids");
  if (!tc_dir) throw UsageError("attribute needs --transcoders DIR");
  const bool intervening = args.has("--intervene");
  if (!intervening && !out) throw UsageError("attribute needs --out GRAPH.json");
  if (intervening && args.has("--html")) throw UsageError("--html needs a graph (--out), not --intervene");
  if (!intervening)
    for (const char* f : {"--frozen-attention", "--unfrozen-attention", "--max-new-tokens", "--top"})
      if (args.has(f)) throw UsageError(std::string(f) + " needs --intervene");
  if (args.has("--frozen-attention") && args.has("--unfrozen-attention"))
    throw UsageError("give one of --frozen-attention and --unfrozen-attention");
  if (prompt.has_value() == ids_file.has_value()) throw UsageError("attribute needs one of --prompt TEXT or --input-ids FILE");
  const double node_threshold = args.get_double("--node-threshold").value_or(0.8);
  const double edge_threshold = args.get_double("--edge-threshold").value_or(0.98);
  check_prune_thresholds(node_threshold, edge_threshold);
  AttributionOptions o;
  o.max_n_logits = args.get_int("--max-n-logits").value_or(o.max_n_logits);
  o.desired_logit_prob = args.get_double("--desired-logit-prob").value_or(o.desired_logit_prob);
  o.max_feature_nodes = args.get_int("--max-feature-nodes").value_or(-1);
  if (args.has("--max-feature-nodes") && o.max_feature_nodes < 1)
    throw ConfigError("option --max-feature-nodes must be at least 1, not " + std::to_string(o.max_feature_nodes));
  o.batch_size = args.get_int("--batch-size").value_or(o.batch_size);
  std::vector<std::string> load_argv = argv;
  if (const auto mm = args.get("--max-memory"); mm && mm->find('=') == std::string::npos) {
    if (intervening) throw UsageError("--max-memory SIZE bounds a graph's computation (--out), not --intervene");
    o.max_memory_bytes = parse_size("--max-memory", *mm);
    if (o.max_memory_bytes <= 0) throw UsageError("option --max-memory: the bound must be positive, not '" + *mm + "'");
    load_argv = without_flag(argv, "--max-memory");
  }
  require_model_dir(dir);
  if (out) require_writable_file(*out);
  const auto html = args.get("--html");
  if (html) require_writable_file(*html);

  std::unique_ptr<Tokenizer> tok;
  try {
    tok = load_tokenizer(dir);
  } catch (const IOError&) {
    if (prompt)
      throw IOError("model directory '" + dir +
                    "' has no tokenizer (tokenizer.json, or vocab.json + merges.txt); pass token ids with --input-ids");
  }
  at::Tensor ids;
  if (ids_file) {
    ids = read_input_ids(*ids_file).input_ids;
    if (!(ids.dim() == 1 || (ids.dim() == 2 && ids.size(0) == 1)))
      throw ShapeError("--input-ids '" + *ids_file + "': input_ids of shape " + c10::str(ids.sizes()) +
                       " is not one prompt ([T] or [1, T])");
    ids = ids.reshape({-1});
  } else {
    const std::vector<int64_t> v = tok->encode(*prompt);
    if (v.empty()) throw ConfigError("the prompt has no tokens");
    ids = at::tensor(v, at::kLong);
  }
  const Ranks ranks = parallel_setup(args);
  if (ranks.mesh && intervening)
    throw UsageError("--intervene runs in one process: it cannot be combined with --tp/--pp/--dp");
  AttributionGraph graph;
  if (ranks.mesh) {
    auto model = load_parallel_model(dir, Args("attribute", attribute_flags(), load_argv), *ranks.mesh);
    graph = attribute(*model, load_attribution_transcoders(*tc_dir, model->config().num_hidden_layers), ids, o);
    if (!ranks.writer()) return 0;  // rank 0 holds the rows and writes the graph
  } else {
    auto model = load_model(dir, Args("attribute", attribute_flags(), load_argv));
    const Transcoders transcoders = load_attribution_transcoders(*tc_dir, model->config().num_hidden_layers);
    if (intervening) return print_interventions(args, *model, transcoders, ids, tok.get());
    graph = attribute(*model, transcoders, ids, o);
  }
  const PrunedGraph pruned = prune_graph(graph, node_threshold, edge_threshold);

  GraphJsonInfo info;
  info.slug = args.get("--slug").value_or(fs::path(*out).stem().string());
  info.scan = fs::path(*tc_dir).lexically_normal().filename().string();
  if (info.scan.empty()) info.scan = fs::path(*tc_dir).lexically_normal().parent_path().filename().string();
  auto text = [&](int64_t id) { return tok ? tok->decode({id}) : std::to_string(id); };
  for (int64_t i = 0; i < graph.n_pos; ++i) info.prompt_tokens.push_back(text(graph.input_ids[i].item<int64_t>()));
  for (int64_t k = 0; k < graph.logit_tokens.size(0); ++k) info.logit_tokens.push_back(text(graph.logit_tokens[k].item<int64_t>()));
  if (prompt) {
    info.prompt = *prompt;
  } else {
    for (const auto& t : info.prompt_tokens) info.prompt += (tok || info.prompt.empty() ? "" : " ") + t;
  }
  const nlohmann::json content = graph_json(graph, pruned, info, node_threshold);
  write_json_file(*out, content);
  if (html) write_file_atomic(*html, render_attribution_html(content));
  std::cout << "attribution graph: " << graph.active_features.size(0) << " active features (" << graph.n_features()
            << " computed), " << graph.logit_tokens.size(0) << " logits, " << graph.n_nodes() << " nodes; kept "
            << content["nodes"].size() << " nodes and " << content["links"].size() << " links -> " << *out
            << (html ? " and " + *html : std::string()) << "\n";
  if (graph.streamed)
    std::cout << "working memory: peak " << format_bytes(graph.streamed->peak_working_bytes()) << " of the "
              << format_bytes(o.max_memory_bytes) << " bound (edge rows streamed through a temporary file)\n";
  return 0;
}

}  // namespace flex::cli
