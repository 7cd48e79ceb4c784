// Gemma Scope's params.npz, as SAELens's gemma_2 loader turns it into a
// JumpReLU dictionary (FORMAT.md section 7), and load_sae's choice of reader.
#include <flex/sae/load_sae.h>

#include <flex/hooks/errors.h>
#include <flex/hooks/shape_text.h>
#include <flex/sae/npz.h>

#include <ATen/ATen.h>

#include <cmath>
#include <filesystem>
#include <regex>

namespace fs = std::filesystem;

namespace flex {

namespace {

// blocks.<n>.<hook> from a Gemma Scope release path, "" when it says nothing.
std::string hook_from_path(const std::string& path) {
  std::smatch m;
  if (path.find("embedding") != std::string::npos) return "hook_embed";
  if (!std::regex_search(path, m, std::regex("layer_(\\d+)"))) return "";
  const std::string layer = m[1].str();
  if (std::regex_search(path, std::regex("-res(/|$|-)"))) return "blocks." + layer + ".hook_resid_post";
  if (std::regex_search(path, std::regex("-mlp(/|$|-)"))) return "blocks." + layer + ".hook_mlp_out";
  if (std::regex_search(path, std::regex("-att(/|$|-)"))) return "blocks." + layer + ".attn.hook_z";
  return "";
}

}  // namespace

std::shared_ptr<SparseDictionary> load_gemma_scope_sae(const std::string& params_npz, const GemmaScopeOptions& o) {
  auto arrays = read_npz(params_npz);
  std::map<std::string, at::Tensor> t;
  for (auto& [name, v] : arrays) t[name.rfind("w_", 0) == 0 ? "W_" + name.substr(2) : name] = v;
  t.erase("scaling_factor");  // SAELens drops an all-ones one
  // The sizes come from W_enc; the other arrays are checked against them by load_parameters.
  if (!t.count("W_enc")) throw FileFormatError(params_npz + ": array 'W_enc' is missing");
  if (t["W_enc"].dim() != 2) throw ShapeError(params_npz + ": W_enc must be 2-D, got " + shape_text(t["W_enc"].sizes()));
  SaeConfig cfg;
  cfg.architecture = SaeArchitecture::JumpReLU;
  cfg.d_in = cfg.d_out = t["W_enc"].size(0);
  cfg.d_sae = t["W_enc"].size(1);
  cfg.dtype = o.dtype;
  cfg.apply_b_dec_to_input = false;
  cfg.hook_name = o.hook_name.empty() ? hook_from_path(fs::absolute(params_npz).string()) : o.hook_name;
  cfg.hook_z = cfg.hook_name.size() >= 7 && cfg.hook_name.compare(cfg.hook_name.size() - 7, 7, ".hook_z") == 0;
  cfg.model_name = "gemma-2";
  cfg.source = params_npz;
  auto sae = std::make_shared<SparseDictionary>(cfg);
  sae->load_parameters(t, params_npz);
  if (cfg.hook_name == "hook_embed") {
    const double root = std::sqrt(static_cast<double>(cfg.d_in));
    at::NoGradGuard no_grad;
    sae->W_enc.div_(root);
    sae->W_dec.mul_(root);
  }
  return sae;
}

std::shared_ptr<SparseDictionary> load_sae(const std::string& path) {
  const fs::path p(path);
  if (fs::is_directory(p) && fs::exists(p / "cfg.json")) return load_saelens_sae(path);
  if (fs::is_directory(p) && fs::exists(p / "params.npz")) return load_gemma_scope_sae((p / "params.npz").string());
  if (p.extension() == ".npz") return load_gemma_scope_sae(path);
  if (!fs::exists(p)) throw IOError(path + ": no such dictionary (a SAELens folder or a Gemma Scope params.npz)");
  throw FileFormatError(path + ": neither a SAELens folder (cfg.json) nor a Gemma Scope params.npz");
}

}  // namespace flex
