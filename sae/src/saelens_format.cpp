// SAELens's saved folders: cfg.json + sae_weights.safetensors (FORMAT.md).
#include <flex/sae/load_sae.h>

#include <flex/dispatch/safetensors.h>
#include <flex/hooks/errors.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace flex {

namespace {

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw IOError(path.string() + ": cannot open (a SAELens folder holds cfg.json and sae_weights.safetensors)");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw FileFormatError(path.string() + ": not JSON (" + e.what() + ")");
  }
}

}  // namespace

std::shared_ptr<SparseDictionary> load_saelens_sae(const std::string& dir, std::optional<at::ScalarType> dtype) {
  const fs::path cfg_path = fs::path(dir) / "cfg.json";
  SaeConfig cfg = parse_sae_config(read_json(cfg_path), cfg_path.string());
  if (dtype) cfg.dtype = *dtype;
  cfg.source = dir;
  const fs::path weights_path = fs::path(dir) / "sae_weights.safetensors";
  if (!fs::exists(weights_path)) throw IOError(weights_path.string() + ": missing (the dictionary's weights)");
  const auto file = SafetensorsFile::open(weights_path.string());
  const std::string where = weights_path.string();

  auto sae = std::make_shared<SparseDictionary>(cfg);
  std::map<std::string, at::Tensor> tensors;
  for (const auto& name : file->names()) tensors[name] = file->get(name);
  // Older files: an all-ones scaling_factor is a no-op; log_threshold is the
  // training form of threshold (SAELens's inference loader refuses it).
  if (auto it = tensors.find("scaling_factor"); it != tensors.end()) {
    if (!it->second.to(at::kFloat).eq(1).all().item<bool>())
      throw UnsupportedError(where + ": tensor 'scaling_factor' is not all ones (a finetuning scale no inference "
                             "dictionary applies)");
    tensors.erase(it);
  }
  if (auto it = tensors.find("log_threshold"); it != tensors.end() && !tensors.count("threshold")) {
    tensors["threshold"] = it->second.to(at::kFloat).exp();
    tensors.erase(it);
  }
  sae->load_parameters(tensors, where);
  return sae;
}

}  // namespace flex
