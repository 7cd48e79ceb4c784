// A training run (flex/sae/trainer.h): settings, resume, steps, metrics,
// checkpoints, the final dictionary and its held-out evaluation.
#include <flex/sae/trainer.h>

#include <flex/sae/load_sae.h>

#include <flex/dispatch/atomic_file.h>
#include <flex/dispatch/safetensors.h>
#include <flex/hooks/errors.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

namespace flex {

namespace fs = std::filesystem;

std::string training_curves_svg(const std::vector<nlohmann::json>& metrics);  // training_curves.cpp

nlohmann::json SaeEvaluation::to_json() const {
  return {{"tokens", tokens}, {"mse", mse}, {"explained_variance", explained_variance}, {"l0", l0},
          {"dead_latents", dead_latents}, {"dense_latents", dense_latents}};
}

SaeEvaluation evaluate_dictionary(SparseDictionary& sae, const at::Tensor& x, const at::Tensor& y) {
  at::NoGradGuard no_grad;
  SaeEvaluation e;
  e.tokens = x.size(0);
  if (e.tokens == 0) return e;
  const bool transcoder = sae.config().transcoder();
  const at::Tensor t = (transcoder ? y : x).to(at::kFloat);
  const bool error_term = sae.use_error_term;
  sae.use_error_term = false;
  double se = 0;
  at::Tensor fires = at::zeros({sae.config().d_sae}, at::kLong);
  int64_t active = 0;
  // Tokens per chunk: the dense [chunk, d_sae] activations stay near 64 MiB
  // (1024 tokens at 16k latents), however many tokens are evaluated.
  const int64_t chunk = std::max<int64_t>(1, (int64_t{64} << 20) / (4 * sae.config().d_sae));
  for (int64_t b = 0; b < e.tokens; b += chunk) {
    const int64_t n = std::min<int64_t>(chunk, e.tokens - b);
    const at::Tensor xb = x.narrow(0, b, n).to(at::kFloat);
    const at::Tensor acts = sae.encode(xb);
    at::Tensor out = sae.decode(acts);
    if (sae.config().has_skip()) out = out + at::matmul(xb, sae.W_skip.t());
    se += (out - t.narrow(0, b, n)).pow(2).sum().item<double>();
    const at::Tensor on = acts.ne(0);
    fires += on.sum(0);
    active += on.sum().item<int64_t>();
  }
  sae.use_error_term = error_term;
  const double var = (t - t.mean(0)).pow(2).sum().item<double>();
  e.mse = se / e.tokens;
  e.explained_variance = 1.0 - se / var;
  e.l0 = static_cast<double>(active) / e.tokens;
  e.dead_latents = fires.eq(0).sum().item<int64_t>();
  e.dense_latents = fires.gt(e.tokens / 10).sum().item<int64_t>();
  return e;
}

namespace {

nlohmann::json options_json(const SaeTrainingOptions& o) {
  return {{"architecture", to_string(o.architecture)}, {"d_in", o.d_in}, {"d_out", o.d_out}, {"d_sae", o.d_sae},
          {"transcoder", o.transcoder}, {"skip_connection", o.skip_connection}, {"k", o.k},
          {"rescale_acts_by_decoder_norm", o.rescale_acts_by_decoder_norm},
          {"aux_loss_coefficient", o.aux_loss_coefficient}, {"topk_threshold_lr", o.topk_threshold_lr},
          {"l1_coefficient", o.l1_coefficient}, {"l0_coefficient", o.l0_coefficient},
          {"jumprelu_init_threshold", o.jumprelu_init_threshold}, {"jumprelu_bandwidth", o.jumprelu_bandwidth},
          {"coefficient_warm_up_steps", o.coefficient_warm_up_steps}, {"lr", o.lr}, {"adam_beta1", o.adam_beta1},
          {"adam_beta2", o.adam_beta2}, {"lr_warm_up_steps", o.lr_warm_up_steps}, {"lr_decay_steps", o.lr_decay_steps},
          {"max_grad_norm", o.max_grad_norm}, {"dead_feature_window", o.dead_feature_window},
          {"decoder_init_norm", o.decoder_init_norm}, {"b_dec_init", static_cast<int>(o.b_dec_init)},
          {"normalize_activations", o.normalize_activations}, {"bf16_encoder", o.bf16_encoder}, {"seed", o.seed}};
}

// The first field where two settings objects differ ("a.b"), or "".
std::string first_difference(const nlohmann::json& a, const nlohmann::json& b, const std::string& at = "") {
  if (a.is_object() && b.is_object()) {
    for (const auto& [k, v] : a.items()) {
      const std::string here = at.empty() ? k : at + "." + k;
      if (!b.contains(k)) return here;
      const std::string d = first_difference(v, b.at(k), here);
      if (!d.empty()) return d;
    }
    for (const auto& [k, v] : b.items())
      if (!a.contains(k)) return at.empty() ? k : at + "." + k;
    return "";
  }
  return a == b ? "" : (at.empty() ? "(value)" : at);
}

// Complete checkpoints (checkpoints/step-N) by step, highest last.
std::vector<std::pair<int64_t, fs::path>> checkpoints(const fs::path& dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  if (!fs::exists(dir)) return out;
  const std::regex name("step-(\\d+)");
  for (const auto& e : fs::directory_iterator(dir)) {
    std::smatch m;
    const std::string n = e.path().filename().string();
    if (std::regex_match(n, m, name)) out.push_back({std::stoll(m[1].str()), e.path()});
  }
  std::sort(out.begin(), out.end());
  return out;
}

void write_dictionary(const SaeTrainer& tr, SparseDictionary& sae, const fs::path& dir) {
  std::vector<std::pair<std::string, at::Tensor>> t;
  for (const auto& kv : sae.named_parameters(/*recurse=*/false)) t.push_back({kv.key(), kv.value().detach()});
  save_safetensors((dir / "sae_weights.safetensors").string(), t);
  write_file_atomic((dir / "cfg.json").string(), tr.saelens_config().dump());
}

void write_checkpoint(const SaeTrainer& tr, SparseDictionary& sae, const fs::path& root, int64_t step) {
  const fs::path tmp = root / (".tmp-step-" + std::to_string(step));
  const fs::path done = root / ("step-" + std::to_string(step));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  try {
    write_dictionary(tr, sae, tmp);
    std::vector<std::pair<std::string, at::Tensor>> state;
    for (const auto& [k, v] : tr.state_tensors()) state.push_back({k, v});
    save_safetensors((tmp / "trainer_state.safetensors").string(), state);
    write_file_atomic((tmp / "trainer_state.json").string(), tr.state_json().dump(2));
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);  // a full disk leaves no half checkpoint
    throw;
  }
  fs::remove_all(done);
  fs::rename(tmp, done);
  for (const auto& [s, p] : checkpoints(root))
    if (s != step) fs::remove_all(p);
}

void load_checkpoint(SaeTrainer& tr, const fs::path& dir) {
  const auto file = SafetensorsFile::open((dir / "trainer_state.safetensors").string());
  std::map<std::string, at::Tensor> t;
  for (const auto& n : file->names()) t[n] = file->get(n).clone();
  std::ifstream in(dir / "trainer_state.json");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    throw FileFormatError((dir / "trainer_state.json").string() + ": " + e.what());
  }
  tr.load_state(t, j, dir.string());
}

}  // namespace

SaeTrainResult train_sae(ActivationSource& source, const SaeTrainRunOptions& o,
                         const std::function<void(const SaeTrainProgress&)>& on_progress) {
  if (o.out_dir.empty()) throw ConfigError("sae training: no output folder");
  if (o.batch_tokens <= 0) throw ConfigError("sae training: batch tokens must be positive");
  if (o.total_tokens < o.batch_tokens)
    throw ConfigError("sae training: total tokens (" + std::to_string(o.total_tokens) + ") below one batch (" +
                      std::to_string(o.batch_tokens) + ")");
  SaeTrainingOptions so = o.sae;
  so.d_in = source.d_in();
  if (so.transcoder) {
    so.d_out = source.d_out();
    if (so.d_out <= 0) throw ConfigError("sae training: a transcoder needs an output hook");
  }
  const int64_t steps_total = o.total_tokens / o.batch_tokens;
  so.total_steps = steps_total;
  const int64_t every = o.checkpoint_every_tokens > 0 ? std::max<int64_t>(1, o.checkpoint_every_tokens / o.batch_tokens)
                                                      : std::max<int64_t>(1, steps_total / 10);
  const fs::path out(o.out_dir), ckdir = out / "checkpoints";
  nlohmann::json settings = {{"format", "flexmodel-sae-training"}, {"version", 1}, {"sae", options_json(so)},
                             {"source", source.describe()}, {"batch_tokens", o.batch_tokens},
                             {"total_tokens", o.total_tokens}, {"checkpoint_every_steps", every},
                             {"eval_tokens", o.eval_tokens}, {"init_tokens", o.init_tokens},
                             {"hook_name", so.hook_name}, {"hook_name_out", so.hook_name_out}};
  if (!o.from_pretrained.empty()) settings["from_pretrained"] = o.from_pretrained;
  try {
    fs::create_directories(ckdir);
  } catch (const fs::filesystem_error& e) {
    throw IOError("cannot create '" + ckdir.string() + "': " + e.code().message());
  }
  const fs::path settings_path = out / "training.json";
  if (fs::exists(settings_path)) {
    nlohmann::json before;
    try {
      std::ifstream in(settings_path);
      in >> before;
    } catch (const nlohmann::json::exception& e) {
      throw FileFormatError(settings_path.string() + ": " + e.what());
    }
    const std::string d = first_difference(before, settings);
    if (!d.empty())
      throw ConfigError("'" + o.out_dir + "' holds a run with other settings (" + d + " differs: " +
                        (before.contains(d) ? before.at(d).dump() : std::string("see training.json")) +
                        "); use another --out or the same options");
  } else {
    write_file_atomic(settings_path.string(), settings.dump(2));
  }
  for (const auto& e : fs::directory_iterator(ckdir))
    if (e.path().filename().string().rfind(".tmp-", 0) == 0) fs::remove_all(e.path());

  SaeTrainer tr(so);
  SaeTrainResult result;
  const auto done = checkpoints(ckdir);
  if (!done.empty()) {
    load_checkpoint(tr, done.back().second);
    result.resumed_from_step = done.back().first;
    source.skip(o.init_tokens + tr.steps() * o.batch_tokens);
  } else {
    auto [x, y] = source.next(o.init_tokens);
    tr.initialize(x, y);
    if (!o.from_pretrained.empty()) tr.start_from(*load_sae(o.from_pretrained), o.from_pretrained);
  }
  // Metrics: the lines of the steps already done (a killed run may have written past its checkpoint).
  std::vector<nlohmann::json> metrics;
  const fs::path metrics_path = out / "metrics.jsonl";
  if (result.resumed_from_step >= 0 && fs::exists(metrics_path)) {
    std::ifstream in(metrics_path);
    std::string line;
    while (std::getline(in, line)) {
      try {
        auto j = nlohmann::json::parse(line);
        if (j.value("step", int64_t{0}) <= tr.steps()) metrics.push_back(j);
      } catch (const nlohmann::json::exception&) {
        break;  // a line cut by the kill
      }
    }
  }
  {
    std::string text;
    for (const auto& j : metrics) text += j.dump() + "\n";
    write_file_atomic(metrics_path.string(), text);
  }
  std::ofstream mf(metrics_path, std::ios::app);
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t first = tr.steps();
  while (tr.steps() < steps_total) {
    auto [x, y] = source.next(o.batch_tokens);
    TrainStepStats st;
    try {
      st = tr.step(x, y);
    } catch (const NumericError& e) {
      const auto kept = checkpoints(ckdir);
      throw NumericError(std::string(e.what()) + "; training stopped, the last good checkpoint is " +
                         (kept.empty() ? std::string("none (no checkpoint was written yet)") : kept.back().second.string()));
    }
    const int64_t tokens = st.step * o.batch_tokens;
    nlohmann::json line = {{"step", st.step}, {"tokens", tokens}, {"loss", st.loss}, {"mse", st.mse},
                           {"sparsity_loss", st.sparsity_loss}, {"aux_loss", st.aux_loss}, {"l0", st.l0},
                           {"explained_variance", st.explained_variance}, {"dead", st.dead},
                           {"dead_fraction", static_cast<double>(st.dead) / so.d_sae}, {"lr", st.lr},
                           {"grad_norm", st.grad_norm}};
    if (so.architecture == TrainArchitecture::BatchTopK) line["topk_threshold"] = tr.topk_threshold;
    mf << line.dump() << "\n";
    mf.flush();
    if (!mf) throw IOError("cannot write '" + metrics_path.string() + "' (disk full?)");
    metrics.push_back(line);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    SaeTrainProgress p;
    p.step = st;
    p.tokens = tokens;
    p.total_tokens = steps_total * o.batch_tokens;
    p.tokens_per_second = secs > 0 ? (st.step - first) * o.batch_tokens / secs : 0;
    p.eta_seconds = p.tokens_per_second > 0 ? (p.total_tokens - tokens) / p.tokens_per_second : 0;
    result.last = st;
    result.tokens_per_second = p.tokens_per_second;
    if (on_progress) on_progress(p);
    if (st.step % every == 0 || st.step == steps_total) {
      // A step may leave the weights non-finite before any loss shows it: never checkpoint those.
      std::shared_ptr<SparseDictionary> dict;
      try {
        dict = tr.dictionary();  // checks every folded weight is finite
      } catch (const FileFormatError& e) {
        const auto kept = checkpoints(ckdir);
        throw NumericError("sae training: the weights turned NaN or infinite at step " + std::to_string(st.step) +
                           " (learning rate " + std::to_string(st.lr) + "); training stopped, the last good checkpoint is " +
                           (kept.empty() ? std::string("none") : kept.back().second.string()));
      }
      try {
        write_checkpoint(tr, *dict, ckdir, st.step);
      } catch (const fs::filesystem_error& e) {
        throw IOError("cannot write a checkpoint under '" + ckdir.string() + "': " + e.code().message());
      }
    }
  }
  mf.close();
  result.steps = tr.steps();
  result.tokens = tr.steps() * o.batch_tokens;
  result.dictionary = tr.dictionary();
  write_dictionary(tr, *result.dictionary, out);
  auto [hx, hy] = source.held_out(o.eval_tokens);
  result.eval = evaluate_dictionary(*result.dictionary, hx, hy);
  nlohmann::json ev = result.eval.to_json();
  ev["steps"] = result.steps;
  ev["training_tokens"] = result.tokens;
  write_file_atomic((out / "eval.json").string(), ev.dump(2));
  write_file_atomic((out / "curves.svg").string(), training_curves_svg(metrics));
  return result;
}

}  // namespace flex
