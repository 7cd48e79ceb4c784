#pragma once
// Per-layer transcoders and a cross-layer transcoder (CLT) seen the same way
// by attribution and interventions (design decision 44): layer l's encoder
// reads its MLP input; its features write into the MLP outputs of layers
// l, l+1, ... (a per-layer transcoder: layer l only). Internal.
#include "attribution_places.h"

#include <flex/sae/attribution.h>

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace flex::detail {

struct LayerCoder {
  at::Tensor W_enc;     // [d, F]
  at::Tensor b_enc;     // [F]
  at::Tensor in_shift;  // [d] subtracted from the input (apply_b_dec_to_input), or undefined
  at::Tensor threshold; // [F] JumpReLU's, or undefined
  bool relu_then_threshold = true;  // SAELens: relu(pre) * (pre > t); circuit-tracer's CLT: pre * (pre > t)
  std::vector<at::Tensor> W_dec;    // W_dec[k]: [F, d], written into layer l + k's MLP output (a CLT's: as stored)
  bool sparse_decode = false;       // a CLT: decoders are read at the active features' rows only, converted then
  at::Tensor b_dec;     // [d]: the bias of layer l's MLP output reconstruction
  at::Tensor W_skip;    // [d, d] (x W_skip^T), or undefined
  std::string source;   // named in errors
  bool reads_residual = false;  // reads the residual before the MLP's norm (a CLT at hook_resid_mid), not the MLP input

  at::Tensor pre(const at::Tensor& x) const;
  at::Tensor act(const at::Tensor& pre) const;
  at::Tensor skip(const at::Tensor& x) const;
  int64_t width() const { return W_enc.size(1); }
};

/// Checks `t` against the model (check_transcoders for per-layer ones; for a
/// CLT ConfigError naming its source and the tensor whose layer count or
/// width does not fit), then gives one LayerCoder per layer in dtype `dt`.
std::vector<LayerCoder> layer_coders(Module& model, const AttributionPlaces& places, const Transcoders& t, at::ScalarType dt);

/// Moves every coder's tensors to `device` (the model's), except a CLT's
/// stored decoders (sparse_decode: their active rows are moved when read).
void move_coders(std::vector<LayerCoder>& coders, const at::Device& device);

/// Whether the encoders read the residual stream before each MLP's norm
/// (circuit-tracer's hook_resid_mid) rather than the MLP input.
bool reads_residual(const Transcoders& t);

/// Layer l's MLP output reconstruction from every layer's activations
/// acts[l0] ([T, F]): sum_{l0 <= l} acts[l0] W_dec[l0][l - l0] + b_dec[l]
/// (+ the skip path of x, layer l's MLP input, where there is one).
at::Tensor reconstruction(const std::vector<LayerCoder>& coders, const std::vector<at::Tensor>& acts, int64_t l,
                          const at::Tensor& x);

}  // namespace flex::detail
