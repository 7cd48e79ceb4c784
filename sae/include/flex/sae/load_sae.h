#pragma once
// Reading sparse dictionaries from the formats they are published in; each
// format is one reader (src/<format>_format.cpp).
#include <flex/sae/sparse_dictionary.h>

#include <memory>
#include <optional>
#include <string>

namespace flex {

/// A SAELens folder (cfg.json + sae_weights.safetensors, the 6.x layout or
/// an older one): every tensor checked against the config (FileFormatError
/// naming the file and tensor for a missing, unexpected or non-finite one,
/// ShapeError with both shapes) and cast to the config's dtype, or `dtype`.
std::shared_ptr<SparseDictionary> load_saelens_sae(const std::string& dir,
                                                   std::optional<at::ScalarType> dtype = std::nullopt);

struct GemmaScopeOptions {
  /// Where it reads, as SAELens names it; empty: from the release path
  /// (".../gemma-scope-2b-pt-res/layer_12/..." -> blocks.12.hook_resid_post;
  /// -mlp -> hook_mlp_out, -att -> attn.hook_z, embedding -> hook_embed).
  std::string hook_name;
  at::ScalarType dtype = at::kFloat;
};

/// Gemma Scope's params.npz (W_enc, W_dec, b_enc, b_dec, threshold): a
/// JumpReLU dictionary with b_dec not subtracted from the input, sizes from
/// the arrays; embedding dictionaries rescaled by sqrt(d_in) as SAELens does.
std::shared_ptr<SparseDictionary> load_gemma_scope_sae(const std::string& params_npz,
                                                       const GemmaScopeOptions& options = {});

/// Either of the above by what `path` holds: a folder with cfg.json
/// (SAELens), a params.npz or a folder holding one (Gemma Scope).
std::shared_ptr<SparseDictionary> load_sae(const std::string& path);

}  // namespace flex
