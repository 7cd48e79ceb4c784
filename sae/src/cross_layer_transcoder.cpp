// Reading circuit-tracer's CLT files (flex/sae/cross_layer_transcoder.h):
// every tensor is looked up by name in its layer's file (or the one file),
// and every shape is checked against layer 0's before anything is stacked.
#include <flex/dispatch/safetensors.h>
#include <flex/hooks/errors.h>
#include <flex/sae/cross_layer_transcoder.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <map>

namespace fs = std::filesystem;

namespace flex {

namespace {

std::string clt_dims_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// The files tensors are read from: per layer in a folder, or one file.
class CltFiles {
 public:
  explicit CltFiles(const std::string& path) : path_(path) {
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
      folder_ = true;
    } else if (fs::is_regular_file(path, ec)) {
      one_ = SafetensorsFile::open(path);
    } else {
      throw IOError("cross-layer transcoder: '" + path + "' is neither a folder nor a file");
    }
  }

  // Layers: W_enc_0, W_enc_1, ... until the first one missing.
  int64_t count_layers() const {
    int64_t n = 0;
    while (has("W_enc", n)) ++n;
    return n;
  }

  // Whether tensor stem_l is there (in file_stem_l.safetensors in a folder).
  bool has(const std::string& stem, int64_t l, const std::string& file_stem = "") const {
    const std::string name = stem + "_" + std::to_string(l);
    if (!folder_) return one_->contains(name);
    const std::string file = file_name(file_stem.empty() ? stem : file_stem, l);
    std::error_code ec;
    return fs::exists(fs::path(path_) / file, ec) && open(file)->contains(name);
  }

  std::vector<int64_t> shape(const std::string& name, const std::string& file_stem, int64_t l) const {
    std::shared_ptr<SafetensorsFile> f = folder_ ? open(file_name(file_stem, l)) : one_;
    return f->info(name).shape;
  }

  // tensor `name` (e.g. b_enc_3) from the file that holds it in circuit-tracer's
  // layout (W_dec_i in W_dec_i.safetensors, the rest in W_enc_i.safetensors).
  at::Tensor get(const std::string& name, const std::string& file_stem, int64_t l, const std::vector<int64_t>& shape) const {
    const std::string file = folder_ ? (fs::path(path_) / file_name(file_stem, l)).string() : path_;
    std::shared_ptr<SafetensorsFile> f = folder_ ? open(file_name(file_stem, l)) : one_;
    if (!f->contains(name)) throw ConfigError("cross-layer transcoder: " + file + " has no tensor '" + name + "'");
    const at::Tensor t = f->get(name);
    if (t.sizes().vec() != shape)
      throw ConfigError("cross-layer transcoder: " + file + ": tensor '" + name + "' has shape " + clt_dims_text(t.sizes().vec()) +
                        ", not " + clt_dims_text(shape) + " (the shape W_enc_0 " +
                        "and the layer count imply)");
    return t;
  }

  std::string where(const std::string& stem, int64_t l) const {
    return folder_ ? (fs::path(path_) / file_name(stem, l)).string() : path_;
  }

 private:
  static std::string file_name(const std::string& stem, int64_t l) { return stem + "_" + std::to_string(l) + ".safetensors"; }
  std::shared_ptr<SafetensorsFile> open(const std::string& name) const {
    auto it = files_.find(name);
    if (it != files_.end()) return it->second;
    const fs::path p = fs::path(path_) / name;
    std::error_code ec;
    if (!fs::exists(p, ec)) throw IOError("cross-layer transcoder: " + p.string() + ": missing");
    return files_[name] = SafetensorsFile::open(p.string());
  }

  std::string path_;
  bool folder_ = false;
  std::shared_ptr<SafetensorsFile> one_;
  mutable std::map<std::string, std::shared_ptr<SafetensorsFile>> files_;
};

// feature_input_hook / feature_output_hook from circuit-tracer's config.yaml
// (one "key: value" line each, the value optionally quoted); others ignored.
void read_hooks(const fs::path& config, CrossLayerTranscoder& clt) {
  std::ifstream in(config);
  std::string line;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos || line.empty() || line[0] == ' ' || line[0] == '#') continue;
    const std::string key = line.substr(0, colon);
    std::string value = line.substr(colon + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    value.erase(value.find_last_not_of(" \t\r") + 1);
    if (value.size() >= 2 && (value[0] == '"' || value[0] == '\'') && value.back() == value[0])
      value = value.substr(1, value.size() - 2);
    if (key == "feature_input_hook") clt.input_hook = value;
    if (key == "feature_output_hook") clt.output_hook = value;
  }
}

}  // namespace

bool is_cross_layer_transcoder(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return fs::exists(fs::path(path) / "W_enc_0.safetensors", ec);
  if (!fs::is_regular_file(path, ec) || fs::path(path).extension() != ".safetensors") return false;
  return SafetensorsFile::open(path)->contains("W_enc_0");
}

std::shared_ptr<CrossLayerTranscoder> load_cross_layer_transcoder(const std::string& path) {
  const CltFiles files(path);
  const int64_t L = files.count_layers();
  if (L == 0)
    throw ConfigError("cross-layer transcoder: '" + path +
                      "' has no tensor W_enc_0 (circuit-tracer's layout: W_enc_i.safetensors and W_dec_i.safetensors per layer)");
  const std::vector<int64_t> enc0 = files.shape("W_enc_0", "W_enc", 0);
  if (enc0.size() != 2)
    throw ConfigError("cross-layer transcoder: " + files.where("W_enc", 0) + ": tensor 'W_enc_0' has shape " + clt_dims_text(enc0) +
                      ", not [features, d_model]");
  const int64_t F = enc0[0], d = enc0[1];
  const bool jump = files.has("threshold", 0, "W_enc");
  std::vector<at::Tensor> W_enc, b_enc, b_dec, threshold;
  auto clt = std::make_shared<CrossLayerTranscoder>();
  for (int64_t l = 0; l < L; ++l) {
    const std::string i = std::to_string(l);
    W_enc.push_back(files.get("W_enc_" + i, "W_enc", l, {F, d}));
    b_enc.push_back(files.get("b_enc_" + i, "W_enc", l, {F}));
    b_dec.push_back(files.get("b_dec_" + i, "W_enc", l, {d}));
    if (files.has("threshold", l, "W_enc") != jump)
      throw ConfigError("cross-layer transcoder: " + files.where("W_enc", l) + (jump ? " has no tensor 'threshold_" + i + "'" : " has a tensor 'threshold_" + i + "'") +
                        " where layer 0 " + (jump ? "has one (JumpReLU: every layer has a threshold)" : "has none (ReLU)"));
    if (jump) threshold.push_back(files.get("threshold_" + i, "W_enc", l, {F}));
    if (!files.has("W_dec", l, "W_dec"))
      throw ConfigError("cross-layer transcoder: " + files.where("W_dec", l) + " has no tensor 'W_dec_" + i + "' (layer " + i +
                        "'s decoders, [" + std::to_string(F) + ", " + std::to_string(L - l) + ", " + std::to_string(d) + "])");
    clt->W_dec.push_back(files.get("W_dec_" + i, "W_dec", l, {F, L - l, d}));
  }
  if (files.has("W_dec", L, "W_dec"))
    throw ConfigError("cross-layer transcoder: '" + path + "' has W_dec_" + std::to_string(L) + " but no W_enc_" + std::to_string(L));
  clt->W_enc = at::stack(W_enc);
  clt->b_enc = at::stack(b_enc);
  clt->b_dec = at::stack(b_dec);
  if (jump) clt->threshold = at::stack(threshold);
  clt->source = path;
  std::error_code ec;
  if (fs::is_directory(path, ec) && fs::exists(fs::path(path) / "config.yaml", ec))
    read_hooks(fs::path(path) / "config.yaml", *clt);
  return clt;
}

}  // namespace flex
