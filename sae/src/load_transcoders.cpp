#include <flex/hooks/errors.h>
#include <flex/sae/attribution.h>
#include <flex/sae/load_sae.h>

#include <algorithm>
#include <filesystem>
#include <regex>

namespace fs = std::filesystem;

namespace flex {

namespace {

// The layer a hook name reads at: blocks.L.… (TransformerLens, circuit-tracer)
// or a module path (transformer.h.L…, model.layers.L…); -1 when none.
int64_t transcoder_layer_of(const std::string& hook) {
  std::smatch m;
  static const std::regex tl("^blocks\\.(\\d+)\\."), module("\\.(?:h|layers)\\.(\\d+)(?:\\.|$)");
  if (std::regex_search(hook, m, tl) || std::regex_search(hook, m, module)) return std::stoll(m[1].str());
  return -1;
}

}  // namespace

std::vector<std::shared_ptr<SparseDictionary>> load_transcoders(const std::string& dir, int64_t n_layers) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw IOError("transcoders: '" + dir + "' is not a folder");
  std::vector<std::string> folders;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory() && fs::exists(e.path() / "cfg.json")) folders.push_back(e.path().string());
  std::sort(folders.begin(), folders.end());
  if (folders.empty())
    throw ConfigError("transcoders: '" + dir + "' holds no transcoder folders (subfolders with cfg.json)");
  std::vector<std::shared_ptr<SparseDictionary>> out(n_layers);
  for (const auto& f : folders) {
    auto t = load_saelens_sae(f);
    if (!t->config().transcoder())
      throw ConfigError("transcoders: '" + f + "' is a " + t->config().class_name() + ", not a transcoder");
    const int64_t layer = transcoder_layer_of(t->config().hook_name);
    if (layer < 0)
      throw ConfigError("transcoders: '" + f + "' reads '" + t->config().hook_name + "', which names no layer");
    if (layer >= n_layers)
      throw ConfigError("transcoders: '" + f + "' reads layer " + std::to_string(layer) + " of a model of " +
                        std::to_string(n_layers) + " layers");
    if (out[layer])
      throw ConfigError("transcoders: layer " + std::to_string(layer) + " twice, in '" + out[layer]->config().source +
                        "' and '" + f + "'");
    out[layer] = t;
  }
  for (int64_t l = 0; l < n_layers; ++l)
    if (!out[l]) throw ConfigError("transcoders: '" + dir + "' has no transcoder for layer " + std::to_string(l));
  return out;
}

Transcoders load_attribution_transcoders(const std::string& path, int64_t n_layers) {
  if (!is_cross_layer_transcoder(path)) return load_transcoders(path, n_layers);
  auto clt = load_cross_layer_transcoder(path);
  if (clt->n_layers() != n_layers)
    throw ConfigError("transcoders: the cross-layer transcoder '" + path + "' spans " + std::to_string(clt->n_layers()) +
                      " layers (W_enc_0..W_enc_" + std::to_string(clt->n_layers() - 1) + ") but the model has " +
                      std::to_string(n_layers));
  return clt;
}

}  // namespace flex
