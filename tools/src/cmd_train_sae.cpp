// flexmodel train-sae: a sparse autoencoder or transcoder trained on the
// shards of `flexmodel capture --dataset` (flex/sae/trainer.h does the work;
// this file maps flags to options and shows progress).
#include "cli.h"

#include <flex/datasets/activation_shards.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/empty_init.h>
#include <flex/models/auto_model.h>
#include <flex/models/config.h>
#include <flex/sae/model_source.h>
#include <flex/sae/tl_hook_names.h>
#include <flex/sae/trainer.h>

#include <flex/dispatch/atomic_file.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

namespace flex::cli {

namespace {

namespace fs = std::filesystem;

const std::vector<Flag>& train_sae_flags() {
  static const std::vector<Flag> flags = [] {
    std::vector<Flag> f = {
      {"--activations", "DIR", "the activation dataset (flexmodel capture --dataset ... --stream-dir DIR)"},
      {"--model", "MODEL_DIR", "instead of --activations: train on the model's forward over --dataset (no disk)"},
      {"--dataset", "FILE", "with --model: the corpus (text, JSON Lines, or safetensors input_ids)"},
      {"--text-field", "NAME", "with --model: --dataset is JSON Lines with the document in this field"},
      {"--context-len", "N", "with --model: tokens per context"},
      {"--batch-size", "N", "with --model: contexts per forward (default 8)"},
      {"--buffer-tokens", "N", "with --model: activations shuffled together per block (default 65536)"},
      {"--hook", "NAME", "the stored hook to train on (the transcoder's input)"},
      {"--transcoder-out", "HOOK", "train a transcoder predicting this stored hook from --hook"},
      {"--skip", "", "transcoders: add a linear skip connection x W_skip^T"},
      {"--architecture", "A", "topk | batchtopk | jumprelu | standard"},
      {"--d-sae", "N", "number of latents"},
      {"--k", "K", "topk: latents per token; batchtopk: per token on average (default 64)"},
      {"--l1", "C", "standard: L1 coefficient (default 5)"},
      {"--l0-coefficient", "C", "jumprelu: L0 coefficient (default 1)"},
      {"--lr", "LR", "Adam learning rate (default 3e-4)"},
      {"--lr-warm-up-steps", "N", "linear warm-up (default 0)"},
      {"--lr-decay-steps", "N", "linear decay to 0 over the last N steps (default 0)"},
      {"--coefficient-warm-up-steps", "N", "sparsity coefficient ramp from 0 (default 0)"},
      {"--batch-tokens", "B", "tokens per step (default 4096)"},
      {"--total-tokens", "T", "training tokens"},
      {"--out", "DIR", "output folder (a rerun with the same options continues its last checkpoint)"},
      {"--seed", "S", "initialisation and data order (default 0)"},
      {"--from-pretrained", "DIR", "start from this dictionary (SAELens folder) instead of a random one"},
      {"--dtype", "f32|bf16", "encoder product precision (weights stay float32; default f32)"},
      {"--dead-feature-window", "N", "steps without firing before a latent counts as dead (default 1000)"},
      {"--b-dec-init", "mean|geometric-median|zeros", "decoder bias from the data (default mean)"},
      {"--no-normalize", "", "train on the raw activations (default: scaled to norm sqrt(d_in) on average)"},
      {"--checkpoint-every", "T", "tokens between checkpoints (default: a tenth of the run)"},
      {"--eval-tokens", "N", "held-out tokens (the dataset's last) for the final evaluation (default 8192)"},
      {"--log-level", "LEVEL", "error|warn|info|debug (default: $FLEXMODEL_LOG, else warn)"},
    };
    for (auto& l : loading_flags()) f.push_back(l);
    return f;
  }();
  return flags;
}

std::string required(const Args& args, const std::string& flag, const std::string& metavar) {
  auto v = args.get(flag);
  if (!v) throw UsageError("missing " + flag + " " + metavar);
  return *v;
}

// cfg.json's metadata is what SAELens 6.54.12 and Neuronpedia look an SAE up by: SAEMetadata (sae_lens/saes/sae.py)
// keeps every metadata key, and HookedSAETransformer.add_sae / Neuronpedia's uploads hook metadata.hook_name in a
// TransformerLens model, so it must be TransformerLens's name (blocks.3.hook_resid_post), and model_name the
// model's name (as in the published releases: "gpt2-small", "gemma-2-2b"), not a path on this machine.

/// The model's name: config.json's _name_or_path (its last part: "google/gemma-2-2b" -> "gemma-2-2b"), else the
/// folder's name.
std::string model_name_of(const std::string& model_dir) {
  fs::path dir(model_dir);
  if (!dir.has_filename()) dir = dir.parent_path();  // "models/gpt2/"
  try {
    std::ifstream in(dir / "config.json");
    if (in) {
      const nlohmann::json cfg = nlohmann::json::parse(in);
      if (auto n = cfg.find("_name_or_path"); n != cfg.end() && n->is_string() && !n->get<std::string>().empty()) {
        std::string name = n->get<std::string>();
        while (!name.empty() && name.back() == '/') name.pop_back();
        const size_t slash = name.rfind('/');
        if (!name.empty()) return slash == std::string::npos ? name : name.substr(slash + 1);
      }
    }
  } catch (const nlohmann::json::exception&) {
    // An unreadable config.json names nothing: the folder's name does.
  }
  return dir.filename().string();
}

/// The model's module tree, on meta (nothing loaded), to name hooks by; null when `model_dir` has no readable config.
std::shared_ptr<CausalLM> module_tree(const std::string& model_dir) {
  try {
    const ModelConfig cfg = load_config(model_dir);
    EmptyInit scope;
    return build_causal_lm(cfg);
  } catch (const Error&) {
    return nullptr;
  }
}

/// `hook` as TransformerLens names it (kept as it is, with a warning, when it has no such name).
std::string transformer_lens_hook(const std::string& hook, CausalLM* model) {
  if (hook.empty() || is_transformer_lens_name(hook)) return hook;
  const std::string tl = model ? transformer_lens_name_of(*model, hook) : "";
  if (tl.empty())
    log(LogLevel::Warn, "'" + hook + "' has no TransformerLens name" +
                            (model ? std::string() : std::string(" known here (the model's config.json was not found)")) +
                            "; cfg.json's metadata.hook_name keeps it, which SAELens and Neuronpedia will not find");
  return tl.empty() ? hook : tl;
}

}  // namespace

int run_train_sae(const std::vector<std::string>& argv) {
  Args args("train-sae", train_sae_flags(), argv);
  if (args.help()) {
    std::cout << usage_text("train-sae", "--activations DIR --hook NAME --architecture A --d-sae N --total-tokens T --out DIR",
                            train_sae_flags(),
                            "Trains a sparse autoencoder (or, with --transcoder-out, a transcoder) on stored\n"
                            "activations as sae-lens 6.54 does, and writes it in SAELens's format with\n"
                            "metrics.jsonl, curves.svg and eval.json beside it.");
    return 0;
  }
  set_log_level(args.get("--log-level"));
  if (!args.positionals().empty()) throw UsageError("train-sae takes no positional argument (the model is --model)");
  SaeTrainRunOptions o;
  SaeTrainingOptions& s = o.sae;
  const auto model_dir = args.get("--model");
  if (model_dir && args.has("--activations")) throw UsageError("give --activations DIR or --model MODEL_DIR, not both");
  const std::string dir = model_dir ? "" : required(args, "--activations", "DIR (or --model MODEL_DIR --dataset FILE)");
  const std::string hook = required(args, "--hook", "NAME");
  const std::string out = required(args, "--out", "DIR");
  try {
    s.architecture = parse_train_architecture(required(args, "--architecture", "topk|batchtopk|jumprelu|standard"));
  } catch (const ConfigError& e) {
    throw UsageError(std::string("option --architecture: ") + e.what());
  }
  s.d_sae = int_at_least(args, "--d-sae", 0, 1);
  if (!args.has("--d-sae")) throw UsageError("missing --d-sae N");
  if (auto k = args.get_double("--k")) s.k = *k;
  if (args.has("--l1") && s.architecture != TrainArchitecture::Standard)
    throw UsageError("option --l1 is for --architecture standard");
  if (args.has("--l0-coefficient") && s.architecture != TrainArchitecture::JumpReLU)
    throw UsageError("option --l0-coefficient is for --architecture jumprelu");
  if (args.has("--k") && s.architecture != TrainArchitecture::TopK && s.architecture != TrainArchitecture::BatchTopK)
    throw UsageError("option --k is for --architecture topk or batchtopk");
  if (auto v = args.get_double("--l1")) s.l1_coefficient = *v;
  if (auto v = args.get_double("--l0-coefficient")) s.l0_coefficient = *v;
  if (auto v = args.get_double("--lr")) s.lr = *v;
  if (!(s.lr > 0)) throw UsageError("option --lr must be positive");
  s.lr_warm_up_steps = int_at_least(args, "--lr-warm-up-steps", 0, 0);
  s.lr_decay_steps = int_at_least(args, "--lr-decay-steps", 0, 0);
  s.coefficient_warm_up_steps = int_at_least(args, "--coefficient-warm-up-steps", 0, 0);
  s.dead_feature_window = int_at_least(args, "--dead-feature-window", 1000, 0);
  s.seed = static_cast<uint64_t>(int_at_least(args, "--seed", 0, 0));
  s.normalize_activations = !args.has("--no-normalize");
  if (auto d = args.get("--dtype")) {
    if (*d == "bf16" || *d == "bfloat16") s.bf16_encoder = true;
    else if (*d != "f32" && *d != "float32") throw UsageError("option --dtype: '" + *d + "' is not f32 or bf16");
  }
  if (auto b = args.get("--b-dec-init")) {
    if (*b == "mean") s.b_dec_init = BDecInit::Mean;
    else if (*b == "geometric-median") s.b_dec_init = BDecInit::GeometricMedian;
    else if (*b == "zeros") s.b_dec_init = BDecInit::Zeros;
    else throw UsageError("option --b-dec-init: '" + *b + "' is not mean, geometric-median or zeros");
  }
  const std::string hook_out = args.get("--transcoder-out").value_or("");
  s.transcoder = !hook_out.empty();
  s.skip_connection = args.has("--skip");
  if (s.skip_connection && !s.transcoder) throw UsageError("option --skip needs --transcoder-out");
  s.hook_name = hook;
  s.hook_name_out = hook_out;
  o.out_dir = out;
  o.batch_tokens = int_at_least(args, "--batch-tokens", 4096, 1);
  if (!args.has("--total-tokens")) throw UsageError("missing --total-tokens T");
  o.total_tokens = int_at_least(args, "--total-tokens", 0, 1);
  o.checkpoint_every_tokens = int_at_least(args, "--checkpoint-every", 0, 0);
  o.eval_tokens = int_at_least(args, "--eval-tokens", 8192, 0);
  o.init_tokens = std::max<int64_t>(o.batch_tokens, 16384);
  o.from_pretrained = args.get("--from-pretrained").value_or("");

  std::unique_ptr<ActivationSource> source;
  std::shared_ptr<CausalLM> model;
  at::Tensor held_ids;
  if (model_dir) {
    require_model_dir(*model_dir);
    ModelSourceOptions mo;
    mo.model_dir = *model_dir;
    mo.dataset = required(args, "--dataset", "FILE");
    mo.text_field = args.get("--text-field").value_or("");
    if (!args.has("--context-len")) throw UsageError("missing --context-len N (with --model)");
    mo.context_len = int_at_least(args, "--context-len", 128, 1);
    mo.batch_size = int_at_least(args, "--batch-size", 8, 1);
    mo.buffer_tokens = int_at_least(args, "--buffer-tokens", 65536, 1);
    mo.held_out_tokens = o.eval_tokens;
    mo.hook = hook;
    mo.hook_out = hook_out;
    mo.seed = s.seed;
    std::shared_ptr<const Tokenizer> tok;
    try {
      tok = load_tokenizer(*model_dir);
    } catch (const IOError&) {
      // Token-id corpora need none.
    }
    model = load_model(*model_dir, args);
    source = model_source(model, tok, mo, &held_ids);
    s.model_name = model_name_of(*model_dir);
    s.context_size = mo.context_len;
    s.hook_name = transformer_lens_hook(hook, model.get());
    s.hook_name_out = transformer_lens_hook(hook_out, model.get());
  } else {
    source = shard_source(dir, hook, hook_out, o.eval_tokens, s.seed);
    // The dataset's record of where its activations came from goes into cfg.json.
    const nlohmann::json made = ActivationDataset(dir).settings();  // a copy: the dataset is a temporary
    std::shared_ptr<CausalLM> tree;
    if (made.contains("model") && made.at("model").is_string()) {
      const std::string from = made.at("model").get<std::string>();
      s.model_name = model_name_of(from);
      tree = module_tree(from);
    }
    s.hook_name = transformer_lens_hook(hook, tree.get());
    s.hook_name_out = transformer_lens_hook(hook_out, tree.get());
    if (made.contains("context_len") && made.at("context_len").is_number_integer())
      s.context_size = made.at("context_len").get<int64_t>();
  }
  Progress bar("train-sae", o.total_tokens / o.batch_tokens * o.batch_tokens, "tokens");
  int64_t last_line_step = 0;
  auto on_progress = [&](const SaeTrainProgress& p) {
    bar.set(p.tokens, static_cast<double>(p.tokens) / std::max<int64_t>(1, p.total_tokens));
    if (log_level() >= LogLevel::Info || p.step.step - last_line_step >= 50 || p.tokens == p.total_tokens) {
      char line[256];
      std::snprintf(line, sizeof line,
                    "step %lld  tokens %lld/%lld  loss %.5g  mse %.5g  L0 %.1f  explained variance %.4f  dead %.3f  "
                    "%.0f tokens/s  ETA %.0f s",
                    static_cast<long long>(p.step.step), static_cast<long long>(p.tokens),
                    static_cast<long long>(p.total_tokens), p.step.loss, p.step.mse, p.step.l0,
                    p.step.explained_variance, static_cast<double>(p.step.dead) / s.d_sae, p.tokens_per_second,
                    p.eta_seconds);
      log(LogLevel::Info, line);
      last_line_step = p.step.step;
    }
  };
  const SaeTrainResult r = train_sae(*source, o, on_progress);
  char summary[512];
  std::snprintf(summary, sizeof summary,
                "flexmodel: trained %s %lld latents on %lld tokens%s: %.0f tokens/s; held-out %lld tokens: explained "
                "variance %.4f, MSE %.5g, L0 %.1f, dead %lld, dense %lld; %s\n",
                to_string(s.architecture).c_str(), static_cast<long long>(s.d_sae), static_cast<long long>(r.tokens),
                r.resumed_from_step >= 0 ? (" (resumed at step " + std::to_string(r.resumed_from_step) + ")").c_str() : "",
                r.tokens_per_second, static_cast<long long>(r.eval.tokens), r.eval.explained_variance, r.eval.mse,
                r.eval.l0, static_cast<long long>(r.eval.dead_latents), static_cast<long long>(r.eval.dense_latents),
                out.c_str());
  std::fputs(summary, stderr);
  if (model && held_ids.defined() && held_ids.numel() > 0) {
    // SAELens's "CE loss recovered", on the held-out contexts, added to eval.json.
    const NextTokenLosses l = next_token_losses(model, held_ids, r.dictionary, hook, hook_out);
    const std::string path = out + "/eval.json";
    nlohmann::json ev;
    {
      std::ifstream in(path);
      in >> ev;
    }
    ev["next_token_loss_clean"] = l.clean;
    ev["next_token_loss_with_sae"] = l.with_sae;
    ev["next_token_loss_zeroed"] = l.zeroed;
    ev["ce_loss_recovered"] = l.recovered();
    write_file_atomic(path, ev.dump(2));
    char line[256];
    std::snprintf(line, sizeof line,
                  "flexmodel: next-token loss on %lld held-out contexts: clean %.4f, dictionary spliced %.4f, its place "
                  "zeroed %.4f; CE loss recovered %.4f\n",
                  static_cast<long long>(held_ids.size(0)), l.clean, l.with_sae, l.zeroed, l.recovered());
    std::fputs(line, stderr);
  }
  return 0;
}

}  // namespace flex::cli
