#pragma once
// Cross-layer transcoders (CLTs; Ameisen et al. 2025) in circuit-tracer
// 0.5.0's format (design decision 44): layer l's features read layer l's
// MLP input and write into the MLP output of every layer l..L-1.
//
//   auto clt = flex::load_cross_layer_transcoder("path/to/clt");  // a folder or one .safetensors file
//   auto graph = flex::attribute(*model, clt, ids);                 // flex/sae/attribution.h
//
// Files (circuit-tracer's CrossLayerTranscoder.to_safetensors): for each
// layer i, W_enc_i.safetensors holding W_enc_i [F, d] (features x model
// width, circuit-tracer's orientation), b_enc_i [F], b_dec_i [d] and, for a
// JumpReLU CLT, threshold_i [F]; W_dec_i.safetensors holding W_dec_i
// [F, L - i, d] (what feature f of layer i writes into layer i + k's MLP
// output at [f, k]). One .safetensors file holding all those tensors is read
// the same way. Activations: ReLU, or JumpReLU as circuit-tracer computes it,
// pre * (pre > threshold). circuit-tracer's load_clt reads no skip weights,
// so a CLT here has none. Where it reads and writes: a config.yaml in the
// folder (circuit-tracer's hub config) may give feature_input_hook
// ("mlp.hook_in", the MLP input, the default; "ln2.hook_normalized", the
// same place; or "hook_resid_mid", the residual stream before the MLP's
// norm) and feature_output_hook ("mlp.hook_out" or "hook_mlp_out", the MLP
// output place).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace flex {

struct CrossLayerTranscoder {
  at::Tensor W_enc;               // [L, F, d]
  at::Tensor b_enc;               // [L, F]
  at::Tensor b_dec;               // [L, d]: layer l's reconstruction bias
  at::Tensor threshold;           // [L, F]; undefined for ReLU
  std::vector<at::Tensor> W_dec;  // W_dec[l]: [F, L - l, d]
  std::string source;             // the folder or file it came from (named in errors)
  std::string input_hook = "mlp.hook_in";    // circuit-tracer's feature_input_hook
  std::string output_hook = "mlp.hook_out";  // its feature_output_hook

  int64_t n_layers() const { return b_dec.size(0); }
  int64_t d_model() const { return b_dec.size(1); }
  int64_t d_transcoder() const { return b_enc.size(1); }
  bool jump_relu() const { return threshold.defined(); }
};

/// True when `path` is a CLT: a folder holding W_enc_0.safetensors, or a
/// .safetensors file holding a W_enc_0 tensor.
bool is_cross_layer_transcoder(const std::string& path);

/// The CLT at `path` (a folder or one file, see above), tensors as stored.
/// Errors: IOError for a missing path or file; ConfigError naming the file
/// and the tensor that is missing or whose shape does not fit the others
/// (layers counted from W_enc_0.., 0-based without gaps; thresholds on every
/// layer or none).
std::shared_ptr<CrossLayerTranscoder> load_cross_layer_transcoder(const std::string& path);

}  // namespace flex
