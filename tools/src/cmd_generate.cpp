// flexmodel generate: text generation with edits applied through FlexModel
// HookFunction editing functions: steering (add alpha * vector), ablation
// (zero a module's output or one attention head) and activation patching.
#include "cli.h"

#include <flex/datasets/batch_runner.h>
#include <flex/dispatch/safetensors.h>
#include <flex/flexcore/activation_edits.h>
#include <flex/flexcore/flex_model.h>
#include <flex/flexcore/routing_edits.h>
#include <flex/hooks/errors.h>
#include <flex/models/generate.h>
#include <flex/sae/feature_edits.h>
#include <flex/tokenizers/tokenizer.h>

#include <ATen/ATen.h>

#include <iostream>

namespace flex::cli {

namespace {

const std::vector<Flag>& generate_flags() {
  static const std::vector<Flag> flags = [] {
    std::vector<Flag> f = {
        {"--prompt", "TEXT", "the prompt (tokenized with the model folder's tokenizer)"},
        {"--input-ids", "FILE.safetensors", "the prompts as token ids: input_ids [T] or [B, T] (and attention_mask for left padding)"},
        {"--max-new-tokens", "N", "tokens to generate (default 20)"},
        {"--temperature", "T", "sample with this temperature (default: greedy)"},
        {"--top-k", "K", "sample from the K most likely tokens"},
        {"--top-p", "P", "sample from the smallest set with probability >= P"},
        {"--seed", "S", "seed for sampling (default 0)"},
        {"--steer", "NAME=VECTOR.safetensors:ALPHA", "add ALPHA * vector to NAME's output", true},
        {"--ablate", "NAME[:HEAD]", "zero NAME's output, or one head of attention module NAME", true},
        {"--patch", "NAME=FILE.safetensors", "replace NAME's output by the tensor in FILE (positions 0..T-1)", true},
        {"--force-experts", "BLOCK=E1,E2,...", "route every token of sparse MoE block BLOCK to experts E1.. (k of them)", true},
        {"--ban-expert", "BLOCK=E[,E...]", "remove experts from BLOCK's router softmax (their logits become -inf)", true},
        {"--scale-expert", "EXPERT=ALPHA", "multiply expert module EXPERT's output (e.g. BLOCK.experts.3) by ALPHA", true},
        {"--steer-feature", "[I:]F=ALPHA", "add ALPHA * decoder row F of the I-th --sae (from 0; I may be left out "
                                           "with one --sae) where that dictionary sits", true},
        {"--clamp-feature", "[I:]F=V", "set feature F of the I-th --sae to V at every position", true},
        {"--scale-feature", "[I:]F=S", "multiply feature F of the I-th --sae by S", true},
        {"--ablate-feature", "[I:]F", "zero feature F of the I-th --sae", true},
        {"--cuda-graph", "", "decode with a static KV cache, the step recorded once as a CUDA graph and replayed "
                             "per token (a model on one CUDA device; edits become graph nodes; with --patch: "
                             "eager decode, with a note)"},
        {"--log-level", "LEVEL", "error|warn|info|debug (default: $FLEXMODEL_LOG, else warn)"},
    };
    for (auto& l : sae_flags("replace-with-error")) f.push_back(l);
    for (auto& l : loading_flags()) f.push_back(l);
    for (auto& p : parallel_flags()) f.push_back(p);
    return f;
  }();
  return flags;
}

/// "NAME=REST" -> {NAME, REST}; UsageError naming the flag otherwise.
std::pair<std::string, std::string> split_eq(const std::string& flag, const std::string& v, const std::string& form) {
  const auto eq = v.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == v.size())
    throw UsageError("option " + flag + ": '" + v + "' is not " + form);
  return {v.substr(0, eq), v.substr(eq + 1)};
}

/// The tensor a steering / patch file holds: the one named `name`, else
/// "vector" / "activation", else its only tensor.
at::Tensor tensor_from(const std::string& path, const std::string& name) {
  auto f = SafetensorsFile::open(path);
  for (const std::string& n : {name, std::string("vector"), std::string("activation")})
    if (f->contains(n)) return f->get(n).to(at::kFloat).clone();
  if (f->names().size() == 1) return f->get(f->names()[0]).to(at::kFloat).clone();
  throw NotFoundError("'" + path + "' holds " + std::to_string(f->names().size()) + " tensors; name one '" + name +
                      "' (or 'vector')");
}

HookFunctionPtr edit_hook(const std::string& module, EditFn fn) {
  HookFunctionOptions o;
  o.save = false;
  o.editing_function = std::move(fn);
  return std::make_shared<HookFunction>(module, o);
}

HookFunctionPtr steer(const std::string& spec) {
  const auto name_rest = split_eq("--steer", spec, "NAME=VECTOR.safetensors:ALPHA");
  const std::string name = name_rest.first, rest = name_rest.second;
  const auto colon = rest.rfind(':');
  if (colon == std::string::npos) throw UsageError("option --steer: '" + spec + "' has no :ALPHA");
  char* end = nullptr;
  const std::string alpha_s = rest.substr(colon + 1);
  const double alpha = std::strtod(alpha_s.c_str(), &end);
  if (alpha_s.empty() || *end) throw UsageError("option --steer: ALPHA '" + alpha_s + "' is not a number");
  return edit_hook(name, add_vector(tensor_from(rest.substr(0, colon), name), alpha, "--steer " + name));
}

HookFunctionPtr ablate(const std::string& spec, Module& model) {
  std::string name = spec;
  std::optional<int64_t> head;
  if (auto colon = spec.rfind(':'); colon != std::string::npos) {
    name = spec.substr(0, colon);
    const std::string h = spec.substr(colon + 1);
    char* end = nullptr;
    const long v = std::strtol(h.c_str(), &end, 10);
    if (h.empty() || *end || v < 0) throw UsageError("option --ablate: head '" + h + "' is not a head index");
    head = v;
  }
  if (!head) return edit_hook(name, zero_activation());
  // One head: zeroed in the attention module's per-head outputs [B, T, H, D].
  std::string point;
  try {
    point = head_hook_point(model, name);
  } catch (const NotFoundError& e) {
    throw NotFoundError("--ablate " + spec + ": " + e.what());
  }
  return edit_hook(point, zero_head(*head, "--ablate " + spec));
}

HookFunctionPtr patch(const std::string& spec, bool cached) {
  const auto name_file = split_eq("--patch", spec, "NAME=FILE.safetensors");
  const std::string name = name_file.first;
  return edit_hook(name, patch_positions(tensor_from(name_file.second, name), cached, "--patch " + name));
}

/// The sparse block BLOCK names (NotFoundError with close names, or saying it is not one).
void require_moe_block(Module& model, const std::string& flag, const std::string& block) {
  model.get_submodule(block);
  try {
    model.get_submodule(block + ".hook_selected_experts");
  } catch (const NotFoundError&) {
    throw NotFoundError(flag + ": '" + block + "' is not a sparse mixture-of-experts block (e.g. " +
                        "model.layers.0.mlp in Mixtral and Qwen2-MoE)");
  }
}

HookFunctionPtr force(const std::string& spec, Module& model) {
  const auto [block, list] = split_eq("--force-experts", spec, "BLOCK=E1,E2,...");
  require_moe_block(model, "--force-experts", block);
  return edit_hook(block + ".hook_selected_experts", force_experts(parse_index_list("--force-experts", list, "an expert index")));
}

HookFunctionPtr ban(const std::string& spec, Module& model) {
  const auto [block, list] = split_eq("--ban-expert", spec, "BLOCK=E[,E...]");
  require_moe_block(model, "--ban-expert", block);
  return edit_hook(block + ".gate", ban_experts(parse_index_list("--ban-expert", list, "an expert index")));
}

HookFunctionPtr scale_expert(const std::string& spec) {
  const auto [name, alpha_s] = split_eq("--scale-expert", spec, "EXPERT=ALPHA");
  char* end = nullptr;
  const double alpha = std::strtod(alpha_s.c_str(), &end);
  if (*end) throw UsageError("option --scale-expert: ALPHA '" + alpha_s + "' is not a number");
  return edit_hook(name, scale_output(alpha));
}

/// A feature of one of the spliced dictionaries: "[I:]F[=VALUE]".
struct FeatureSpec {
  const Splice* splice = nullptr;
  int64_t feature = 0;
  double value = 0;
};

FeatureSpec feature_spec(const std::string& flag, const std::string& spec, const std::vector<Splice>& splices,
                         bool with_value) {
  const std::string form = with_value ? "[I:]F=VALUE" : "[I:]F";
  if (splices.empty()) throw UsageError(flag + " needs a dictionary: give --sae PATH");
  std::string rest = spec;
  size_t which = 0;
  auto integer = [&](const std::string& text, const std::string& what) {
    char* end = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end || v < 0) throw UsageError("option " + flag + ": " + what + " '" + text + "' in '" + spec + "' is not " + form);
    return static_cast<int64_t>(v);
  };
  if (const auto colon = rest.find(':'); colon != std::string::npos) {
    which = static_cast<size_t>(integer(rest.substr(0, colon), "dictionary"));
    rest = rest.substr(colon + 1);
    if (which >= splices.size())
      throw UsageError("option " + flag + ": dictionary " + std::to_string(which) + " in '" + spec + "', but " +
                       std::to_string(splices.size()) + " --sae given (counted from 0)");
  } else if (splices.size() > 1) {
    throw UsageError("option " + flag + ": '" + spec + "' does not say which of the " + std::to_string(splices.size()) +
                     " dictionaries (I:F...)");
  }
  FeatureSpec f;
  f.splice = &splices[which];
  std::string feature = rest;
  if (with_value) {
    const auto eq = rest.find('=');
    if (eq == std::string::npos) throw UsageError("option " + flag + ": '" + spec + "' is not " + form);
    feature = rest.substr(0, eq);
    const std::string v = rest.substr(eq + 1);
    char* end = nullptr;
    f.value = std::strtod(v.c_str(), &end);
    if (v.empty() || *end) throw UsageError("option " + flag + ": '" + v + "' in '" + spec + "' is not a number");
  }
  f.feature = integer(feature, "feature");
  const int64_t d_sae = f.splice->sae->config().d_sae;
  if (f.feature >= d_sae)
    throw UsageError("option " + flag + ": feature " + std::to_string(f.feature) + " outside the dictionary's " +
                     std::to_string(d_sae) + " features (" + f.splice->sae->config().source + ")");
  return f;
}

}  // namespace

int run_generate(const std::vector<std::string>& argv) {
  Args args("generate", generate_flags(), argv);
  if (args.help()) {
    std::cout << usage_text("generate", "MODEL_DIR (--prompt TEXT | --input-ids FILE.safetensors) [options]",
                            generate_flags(),
                            "Generates text, greedy or sampled, with edits applied by FlexModel HookFunction\n"
                            "editing functions on every forward (the prompt and each new token). Prints the prompt\n"
                            "followed by the generated text. With --input-ids, one line per row: its token ids\n"
                            "(prompt, then the new ones, space-separated) when the folder has no tokenizer, else\n"
                            "the decoded text.\n\n"
                            "--sae splices dictionaries (default mode replace-with-error: the model's output is\n"
                            "unchanged until a feature is edited); --clamp-feature / --scale-feature /\n"
                            "--ablate-feature edit its feature activations, --steer-feature adds a decoder row.");
    return 0;
  }
  set_log_level(args.get("--log-level"));
  const std::string dir = args.one_positional("MODEL_DIR");
  const Ranks ranks = parallel_setup(args);
  const auto prompt = args.get("--prompt");
  const auto ids_file = args.get("--input-ids");
  if (!prompt == !ids_file) throw UsageError("give exactly one of --prompt TEXT or --input-ids FILE.safetensors");
  GenerateOptions g;
  g.max_new_tokens = args.get_int("--max-new-tokens").value_or(20);
  if (g.max_new_tokens < 1) throw UsageError("option --max-new-tokens must be at least 1");
  if (args.has("--temperature") || args.has("--top-k") || args.has("--top-p")) g.do_sample = true;
  g.temperature = args.get_double("--temperature").value_or(1.0);
  g.top_k = args.get_int("--top-k").value_or(0);
  g.top_p = args.get_double("--top-p").value_or(1.0);
  g.seed = static_cast<uint64_t>(args.get_int("--seed").value_or(0));
  if (g.temperature <= 0) throw UsageError("option --temperature must be > 0");
  if (g.top_k < 0) throw UsageError("option --top-k must be >= 0");
  if (!(g.top_p > 0 && g.top_p <= 1)) throw UsageError("option --top-p must be in (0, 1]");
  require_model_dir(dir);

  // Token ids need no tokenizer; a prompt does.
  std::unique_ptr<Tokenizer> tok;
  try {
    tok = load_tokenizer(dir);
  } catch (const IOError&) {
    if (prompt)
      throw IOError("model directory '" + dir +
                    "' has no tokenizer (tokenizer.json, or vocab.json + merges.txt); pass token ids with --input-ids");
  }
  InputBatch batch;
  if (ids_file) {
    batch = read_input_ids(*ids_file);
  } else {
    std::vector<int64_t> ids = tok->encode(*prompt);
    if (ids.empty()) throw ConfigError("the prompt has no tokens");
    batch.input_ids = at::tensor(ids, at::kLong).unsqueeze(0);
  }
  // The parallel model keeps no KV cache: every step runs the whole sequence.
  g.use_cache = !ranks.mesh;
  g.cuda_graph = args.has("--cuda-graph");
  if (g.cuda_graph && ranks.mesh) throw UsageError("--cuda-graph decodes on one device; it does not combine with a mesh");
  if (g.cuda_graph && args.has("--patch")) {
    // A patch tracks the absolute position on the host, which a replay does not run.
    std::cerr << "note: --patch with --cuda-graph: decoding eagerly (a patch tracks positions on the host)\n";
    g.cuda_graph = false;
  }
  std::shared_ptr<CausalLM> model;
  std::shared_ptr<ParallelCausalLM> parallel;
  if (ranks.mesh) parallel = load_parallel_model(dir, args, *ranks.mesh);
  else model = load_model(dir, args);
  const std::shared_ptr<Module> root = parallel ? std::shared_ptr<Module>(parallel) : std::shared_ptr<Module>(model);
  FlexModel fm(root);
  if (parallel) fm.set_mesh(*ranks.mesh, parallel->layout());
  for (const auto& s : args.all("--steer")) fm.register_forward_hook(steer(s));
  for (const auto& s : args.all("--ablate")) fm.register_forward_hook(ablate(s, *root));
  for (const auto& s : args.all("--patch")) fm.register_forward_hook(patch(s, g.use_cache));
  for (const auto& s : args.all("--force-experts")) fm.register_forward_hook(force(s, *root));
  for (const auto& s : args.all("--ban-expert")) fm.register_forward_hook(ban(s, *root));
  for (const auto& s : args.all("--scale-expert")) fm.register_forward_hook(scale_expert(s));
  // Dictionaries, then their feature edits: acts_post edits act inside the
  // dictionary; steering adds the decoder row where the dictionary writes,
  // after it (hooks run in registration order).
  const std::vector<Splice> splices = splice_saes(fm, args, SpliceMode::ReplaceWithError);
  const bool observing = args.get("--sae-mode") && parse_splice_mode(*args.get("--sae-mode")) == SpliceMode::Observe;
  auto feature_edit = [&](const char* flag, bool with_value, auto make) {
    for (const auto& s : args.all(flag)) {
      if (observing) throw UsageError(std::string(flag) + " edits features, which --sae-mode observe discards");
      const FeatureSpec f = feature_spec(flag, s, splices, with_value);
      fm.register_forward_hook(edit_hook(f.splice->module + ".sae.hook_sae_acts_post", make(f)));
    }
  };
  feature_edit("--clamp-feature", true, [](const FeatureSpec& f) { return clamp_feature(f.feature, f.value); });
  feature_edit("--scale-feature", true, [](const FeatureSpec& f) { return scale_feature(f.feature, f.value); });
  feature_edit("--ablate-feature", false, [](const FeatureSpec& f) { return ablate_features({f.feature}); });
  for (const auto& s : args.all("--steer-feature")) {
    const FeatureSpec f = feature_spec("--steer-feature", s, splices, true);
    attach_at(fm, f.splice->place, steer_feature(*f.splice->sae, f.feature, f.value));
  }

  const at::Tensor& input = batch.input_ids;
  at::NoGradGuard no_grad;
  GenerateOutput out;
  if (parallel) {
    // Rank 0 holds the whole logits; it shares the last position's so every
    // rank picks the same token (sampling is seeded identically) and the
    // ranks keep feeding the same sequence.
    BatchRunner runner(fm);
    auto step = [&](const LMInputs& in) {
      LMInputs x;
      x.input_ids = in.input_ids;
      x.attention_mask = in.attention_mask;
      const at::Tensor logits = LMOutput::from_value(runner.forward(std::move(x))).logits;
      at::Tensor last;
      if (ranks.writer()) last = logits.select(1, logits.size(1) - 1).contiguous();
      ranks.world->broadcast(last, 0);
      return last.unsqueeze(1);
    };
    out = generate(step, parallel->config(), input, batch.attention_mask, g);
  } else {
    out = generate(*model, input, batch.attention_mask, g);
  }
  if (!ranks.writer()) return 0;
  if (prompt) {
    std::cout << *prompt << tok->decode(out.new_tokens(0)) << "\n";
    return 0;
  }
  for (int64_t b = 0; b < input.size(0); ++b) {
    // The row's prompt without its left padding, then what it generated.
    std::vector<int64_t> row;
    for (int64_t t = 0; t < input.size(1); ++t)
      if (!batch.attention_mask.defined() || batch.attention_mask[b][t].item<int64_t>() != 0)
        row.push_back(input[b][t].item<int64_t>());
    for (int64_t id : out.new_tokens(b)) row.push_back(id);
    if (tok) {
      std::cout << tok->decode(row) << "\n";
    } else {
      for (size_t i = 0; i < row.size(); ++i) std::cout << (i ? " " : "") << row[i];
      std::cout << "\n";
    }
  }
  return 0;
}

}  // namespace flex::cli
