#include <flex/sae/sae_config.h>

#include <flex/hooks/errors.h>
#include <flex/models/auto_model.h>

#include <map>

namespace flex {

namespace {

const std::map<std::string, SaeArchitecture>& architectures() {
  static const std::map<std::string, SaeArchitecture> m{
      {"standard", SaeArchitecture::Standard},
      {"gated", SaeArchitecture::Gated},
      {"jumprelu", SaeArchitecture::JumpReLU},
      {"topk", SaeArchitecture::TopK},
      {"abstopk", SaeArchitecture::AbsTopK},
      {"transcoder", SaeArchitecture::Transcoder},
      {"skip_transcoder", SaeArchitecture::SkipTranscoder},
      {"jumprelu_transcoder", SaeArchitecture::JumpReLUTranscoder},
      {"jumprelu_skip_transcoder", SaeArchitecture::JumpReLUSkipTranscoder}};
  return m;
}

// The major version of "6.54.12" / "6.0.0-rc.0"; nullopt when absent or unreadable.
std::optional<int> major_version(const nlohmann::json& v) {
  if (!v.is_string()) return std::nullopt;
  try {
    return std::stoi(v.get<std::string>());
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// A pre-6.0 cfg.json in the 6.x form (SAELens's own defaulting of old files).
nlohmann::json from_legacy(nlohmann::json j) {
  auto rename = [&](const char* from, const char* to) {
    if (j.contains(from) && !j.contains(to)) j[to] = j[from];
  };
  rename("hook_point", "hook_name");
  rename("hook_point_head_index", "hook_head_index");
  rename("activation_fn_str", "activation_fn");
  if (!j.contains("apply_b_dec_to_input")) j["apply_b_dec_to_input"] = true;
  if (!j.contains("architecture")) j["architecture"] = "standard";
  if (j.value("activation_fn", std::string("relu")) == "topk") {
    j["architecture"] = "topk";
    const auto& kw = j.value("activation_fn_kwargs", nlohmann::json::object());
    if (kw.is_object() && kw.contains("k")) j["k"] = kw["k"];
  }
  const auto norm = j.value("normalize_activations", nlohmann::json());
  if (norm.is_boolean()) j["normalize_activations"] = norm.get<bool>() ? "expected_average_only_in" : "none";
  if (norm.is_null()) j["normalize_activations"] = "none";
  if (!j.contains("reshape_activations") && j.value("hook_name", std::string()).find("hook_z") != std::string::npos)
    j["reshape_activations"] = "hook_z";
  // Old files keep what 6.x puts in metadata at the top level.
  nlohmann::json meta = nlohmann::json::object();
  for (const char* key : {"model_name", "hook_name", "hook_head_index", "hook_name_out", "hook_head_index_out",
                          "context_size", "prepend_bos", "dataset_path", "neuronpedia_id", "model_class_name",
                          "sae_lens_version", "sae_lens_training_version", "hf_hook_name", "hf_hook_name_out"})
    if (j.contains(key)) meta[key] = j[key];
  j["metadata"] = meta;
  return j;
}

template <typename T>
T field(const nlohmann::json& j, const char* key, const T& fallback, const std::string& source) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  try {
    return j[key].get<T>();
  } catch (const nlohmann::json::exception&) {
    throw ConfigError(source + ": field '" + key + "' has the wrong type (" + j[key].dump() + ")");
  }
}

int64_t positive(const nlohmann::json& j, const char* key, const std::string& source) {
  if (!j.contains(key) || j[key].is_null()) throw ConfigError(source + ": field '" + std::string(key) + "' is missing");
  const auto v = field<int64_t>(j, key, 0, source);
  if (v < 1) throw ConfigError(source + ": field '" + std::string(key) + "' must be positive, got " + std::to_string(v));
  return v;
}

at::ScalarType sae_dtype(const std::string& name, const std::string& source) {
  try {
    return parse_torch_dtype(name);
  } catch (const ConfigError&) {
    throw ConfigError(source + ": field 'dtype' is '" + name + "', not float32, bfloat16, float16 or float64");
  }
}

}  // namespace

bool SaeConfig::transcoder() const { return architecture >= SaeArchitecture::Transcoder; }
bool SaeConfig::has_skip() const {
  return architecture == SaeArchitecture::SkipTranscoder || architecture == SaeArchitecture::JumpReLUSkipTranscoder;
}
bool SaeConfig::jump() const {
  return architecture == SaeArchitecture::JumpReLU || architecture == SaeArchitecture::JumpReLUTranscoder ||
         architecture == SaeArchitecture::JumpReLUSkipTranscoder;
}
bool SaeConfig::top_k() const { return architecture == SaeArchitecture::TopK || architecture == SaeArchitecture::AbsTopK; }

std::string SaeConfig::class_name() const {
  switch (architecture) {
    case SaeArchitecture::Standard: return "StandardSAE";
    case SaeArchitecture::Gated: return "GatedSAE";
    case SaeArchitecture::JumpReLU: return "JumpReLUSAE";
    case SaeArchitecture::TopK: return "TopKSAE";
    case SaeArchitecture::AbsTopK: return "AbsTopKSAE";
    case SaeArchitecture::Transcoder: return "Transcoder";
    case SaeArchitecture::SkipTranscoder: return "SkipTranscoder";
    case SaeArchitecture::JumpReLUTranscoder: return "JumpReLUTranscoder";
    case SaeArchitecture::JumpReLUSkipTranscoder: return "JumpReLUSkipTranscoder";
  }
  return "SAE";
}

SaeConfig parse_sae_config(const nlohmann::json& given, const std::string& source) {
  if (!given.is_object()) throw ConfigError(source + ": expected a JSON object");
  const nlohmann::json& meta0 = given.contains("metadata") && given["metadata"].is_object() ? given["metadata"] : given;
  auto version = major_version(meta0.value("sae_lens_version", nlohmann::json()));
  if (!version) version = major_version(given.value("sae_lens_version", nlohmann::json()));
  const nlohmann::json j = version && *version >= 6 ? given : from_legacy(given);

  SaeConfig c;
  const std::string arch = field<std::string>(j, "architecture", "standard", source);
  const auto it = architectures().find(arch);
  if (it == architectures().end()) {
    std::string known;
    for (const auto& [name, _] : architectures()) known += (known.empty() ? "" : ", ") + name;
    throw UnsupportedError(source + ": architecture '" + arch + "' is not supported (" + known + ")");
  }
  c.architecture = it->second;
  c.d_in = positive(j, "d_in", source);
  c.d_sae = positive(j, "d_sae", source);
  // SAELens's transcoder default when d_out is absent.
  c.d_out = c.transcoder() ? (j.contains("d_out") ? positive(j, "d_out", source) : 768) : c.d_in;
  c.dtype = sae_dtype(field<std::string>(j, "dtype", "float32", source), source);
  c.apply_b_dec_to_input = field<bool>(j, "apply_b_dec_to_input", true, source);
  if (c.transcoder() && c.apply_b_dec_to_input)
    throw ConfigError(source + ": a transcoder needs apply_b_dec_to_input false (its b_dec is the output's bias)");
  const std::string norm = field<std::string>(j, "normalize_activations", "none", source);
  if (norm == "none" || norm == "expected_average_only_in" || norm == "covariance_whitening") {
    c.normalization = SaeNormalization::None;
  } else if (norm == "constant_norm_rescale") {
    c.normalization = SaeNormalization::ConstantNormRescale;
  } else if (norm == "layer_norm") {
    c.normalization = SaeNormalization::LayerNorm;
  } else {
    throw ConfigError(source + ": normalize_activations '" + norm +
                      "' is not none, expected_average_only_in, constant_norm_rescale, layer_norm or covariance_whitening");
  }
  const std::string reshape = field<std::string>(j, "reshape_activations", "none", source);
  if (reshape != "none" && reshape != "hook_z")
    throw ConfigError(source + ": reshape_activations '" + reshape + "' is not none or hook_z");
  c.hook_z = reshape == "hook_z" && !c.transcoder();
  if (c.top_k()) {
    c.k = field<int64_t>(j, "k", 100, source);
    if (c.k < 1 || c.k > c.d_sae)
      throw ConfigError(source + ": k = " + std::to_string(c.k) + " must be in 1.." + std::to_string(c.d_sae));
    c.rescale_acts_by_decoder_norm = field<bool>(j, "rescale_acts_by_decoder_norm", false, source);
  }
  c.metadata = j.contains("metadata") && j["metadata"].is_object() ? j["metadata"] : nlohmann::json::object();
  c.hook_name = field<std::string>(c.metadata, "hook_name", field<std::string>(j, "hook_name", "", source), source);
  c.hook_name_out = field<std::string>(c.metadata, "hook_name_out", "", source);
  c.model_name = field<std::string>(c.metadata, "model_name", "", source);
  if (c.metadata.contains("hook_head_index") && c.metadata["hook_head_index"].is_number_integer())
    c.hook_head_index = c.metadata["hook_head_index"].get<int64_t>();
  return c;
}

}  // namespace flex
