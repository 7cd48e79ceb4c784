// What a SaeTrainer hands on: the inference dictionary in SAELens's layout
// (scaling and decoder norms folded in, as SAELens folds them when it saves)
// and the full training state a resumed run continues from.
#include <flex/sae/trainer.h>

#include <flex/hooks/errors.h>
#include <flex/hooks/shape_text.h>

#include <ATen/ATen.h>

namespace flex {

namespace {

const char* kParamNames[6] = {"W_encT", "b_enc", "W_dec", "b_dec", "threshold", "W_skip"};

std::string inference_architecture(const SaeTrainingOptions& o) {
  const bool jump = o.architecture == TrainArchitecture::JumpReLU || o.architecture == TrainArchitecture::BatchTopK;
  if (o.transcoder) {
    std::string a = jump ? "jumprelu_" : "";
    return a + (o.skip_connection ? "skip_transcoder" : "transcoder");
  }
  if (o.architecture == TrainArchitecture::TopK) return "topk";
  return jump ? "jumprelu" : "standard";
}

}  // namespace

nlohmann::json SaeTrainer::saelens_config() const {
  nlohmann::json meta = {{"sae_lens_version", "6.54.12"},
                         {"sae_lens_training_version", "6.54.12"},
                         {"model_name", o_.model_name},
                         {"hook_name", o_.hook_name},
                         {"hook_head_index", nullptr},
                         {"context_size", o_.context_size},
                         {"prepend_bos", true},
                         {"trained_with", "flexmodel train-sae"},
                         {"training_architecture", to_string(o_.architecture)}};
  if (o_.transcoder) meta["hook_name_out"] = o_.hook_name_out;
  nlohmann::json cfg = {{"d_in", o_.d_in},
                        {"d_sae", o_.d_sae},
                        {"dtype", "float32"},
                        {"device", "cpu"},
                        {"apply_b_dec_to_input", !o_.transcoder},
                        {"normalize_activations", "none"},
                        {"reshape_activations", "none"},
                        {"metadata", meta},
                        {"architecture", inference_architecture(o_)}};
  if (o_.transcoder) cfg["d_out"] = d_out_;
  if (o_.architecture == TrainArchitecture::TopK) {
    cfg["k"] = static_cast<int64_t>(o_.k);
    cfg["rescale_acts_by_decoder_norm"] = false;
  }
  return cfg;
}

std::shared_ptr<SparseDictionary> SaeTrainer::dictionary() const {
  at::NoGradGuard no_grad;
  // Scaling folded first (inputs arrive unscaled): h is unchanged when W_enc
  // takes the input factor; outputs come back divided by the output factor.
  at::Tensor W_enc = W_encT.t() * scale_in_;
  at::Tensor Wd = W_dec / scale_out_;
  at::Tensor bd = b_dec / scale_out_;
  at::Tensor be = b_enc.clone();
  double thr = topk_threshold;
  const bool top_k = o_.architecture == TrainArchitecture::TopK || o_.architecture == TrainArchitecture::BatchTopK;
  if (top_k && o_.rescale_acts_by_decoder_norm) {
    // The selection ranked h x ||W_dec[f]||: fold the norms so plain h is that.
    // (A BatchTopK threshold, in units of h x norm, scales with the output factor.)
    thr = thr / scale_out_;
    const at::Tensor n = Wd.norm(2, {1});
    be = be * n;
    Wd = Wd / n.unsqueeze(1);
    W_enc = W_enc * n.unsqueeze(0);
  }
  std::map<std::string, at::Tensor> t = {{"W_enc", W_enc.contiguous()}, {"W_dec", Wd.contiguous()},
                                          {"b_enc", be.contiguous()}, {"b_dec", bd.contiguous()}};
  if (o_.architecture == TrainArchitecture::JumpReLU) t["threshold"] = threshold.clone();
  if (o_.architecture == TrainArchitecture::BatchTopK) t["threshold"] = at::full({o_.d_sae}, thr, at::kFloat);
  if (o_.skip_connection) t["W_skip"] = (W_skip * (scale_in_ / scale_out_)).contiguous();
  auto sae = std::make_shared<SparseDictionary>(parse_sae_config(saelens_config(), "sae training"));
  sae->load_parameters(t, "sae training");
  return sae;
}

void SaeTrainer::start_from(SparseDictionary& sae, const std::string& where) {
  at::NoGradGuard no_grad;
  const SaeConfig& c = sae.config();
  // The dictionary this run would save is the one it can start from: the
  // same class (architecture, transcoder, skip), widths and input handling.
  const SaeConfig want = parse_sae_config(saelens_config(), "sae training");
  auto mismatch = [&](const std::string& field, const std::string& have, const std::string& need) {
    return ConfigError(where + ": cannot start --architecture " + to_string(o_.architecture) + " training from it: " +
                       field + " is " + have + ", this run needs " + need);
  };
  if (c.class_name() != want.class_name()) throw mismatch("the architecture", c.class_name(), want.class_name());
  if (c.d_in != want.d_in) throw mismatch("d_in", std::to_string(c.d_in), std::to_string(want.d_in));
  if (c.d_sae != want.d_sae) throw mismatch("d_sae", std::to_string(c.d_sae), std::to_string(want.d_sae));
  if (c.transcoder() && c.d_out != want.d_out) throw mismatch("d_out", std::to_string(c.d_out), std::to_string(want.d_out));
  if (c.apply_b_dec_to_input != want.apply_b_dec_to_input)
    throw mismatch("apply_b_dec_to_input", c.apply_b_dec_to_input ? "true" : "false",
                   want.apply_b_dec_to_input ? "true" : "false");
  if (c.normalization != SaeNormalization::None || c.hook_z)
    throw UnsupportedError(where + ": a dictionary that normalises or reshapes its input at inference "
                           "(normalize_activations, hook_z) cannot be trained further here");
  auto own = sae.named_parameters(/*recurse=*/false);
  auto get = [&](const char* name) { return own[name].detach().to(at::kFloat); };
  // Unfold the scaling dictionary() folds: the raw parameters act on inputs
  // scaled by scale_in_ and produce outputs scaled by scale_out_.
  W_encT = (get("W_enc") / scale_in_).t().contiguous();
  W_dec = (get("W_dec") * scale_out_).contiguous();
  b_enc = get("b_enc").contiguous();
  b_dec = (get("b_dec") * scale_out_).contiguous();
  if (o_.architecture == TrainArchitecture::JumpReLU) threshold = get("threshold").contiguous();
  if (o_.architecture == TrainArchitecture::BatchTopK) topk_threshold = get("threshold").mean().item<double>() * scale_out_;
  if (o_.skip_connection) W_skip = (get("W_skip") * (scale_out_ / scale_in_)).contiguous();
  if (!at::isfinite(W_encT).all().item<bool>() || !at::isfinite(W_dec).all().item<bool>())
    throw ConfigError(where + ": its weights are not finite once the scaling factors (" + std::to_string(scale_in_) +
                      ", " + std::to_string(scale_out_) + ") are unfolded");
}

std::map<std::string, at::Tensor> SaeTrainer::state_tensors() const {
  const at::Tensor* params[6] = {&W_encT, &b_enc, &W_dec, &b_dec, &threshold, &W_skip};
  std::map<std::string, at::Tensor> out;
  for (int i = 0; i < 6; ++i) {
    if (params[i]->numel() == 0) continue;
    out[kParamNames[i]] = params[i]->clone();
    out[std::string("adam_m.") + kParamNames[i]] = m_[i].clone();
    out[std::string("adam_v.") + kParamNames[i]] = v_[i].clone();
  }
  out["steps_since_fired"] = since_fired_.clone();
  out["fired_count"] = fired_count_.clone();
  return out;
}

nlohmann::json SaeTrainer::state_json() const {
  return {{"step", step_},
          {"tokens_seen", tokens_seen_},
          {"scaling_factor_in", scale_in_},
          {"scaling_factor_out", scale_out_},
          {"topk_threshold", topk_threshold}};
}

void SaeTrainer::load_state(const std::map<std::string, at::Tensor>& tensors, const nlohmann::json& json,
                            const std::string& where) {
  at::Tensor* params[6] = {&W_encT, &b_enc, &W_dec, &b_dec, &threshold, &W_skip};
  auto take = [&](const std::string& name, const at::Tensor& like) {
    auto it = tensors.find(name);
    if (it == tensors.end()) throw FileFormatError(where + ": tensor '" + name + "' is missing");
    if (it->second.sizes() != like.sizes() || it->second.scalar_type() != like.scalar_type())
      throw ShapeError(where + ": tensor '" + name + "' is " + shape_text(it->second.sizes()) + ", the run needs " +
                       shape_text(like.sizes()));
    return it->second.clone();
  };
  for (int i = 0; i < 6; ++i) {
    if (params[i]->numel() == 0) continue;
    *params[i] = take(kParamNames[i], *params[i]);
    m_[i] = take(std::string("adam_m.") + kParamNames[i], m_[i]);
    v_[i] = take(std::string("adam_v.") + kParamNames[i], v_[i]);
  }
  since_fired_ = take("steps_since_fired", since_fired_);
  fired_count_ = take("fired_count", fired_count_);
  try {
    step_ = json.at("step").get<int64_t>();
    tokens_seen_ = json.at("tokens_seen").get<int64_t>();
    scale_in_ = json.at("scaling_factor_in").get<double>();
    scale_out_ = json.at("scaling_factor_out").get<double>();
    topk_threshold = json.at("topk_threshold").get<double>();
  } catch (const nlohmann::json::exception& e) {
    throw FileFormatError(where + ": " + e.what());
  }
}

}  // namespace flex
