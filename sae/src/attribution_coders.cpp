#include "attribution_coders.h"

#include <flex/hooks/errors.h>

#include <ATen/ATen.h>

namespace flex::detail {

at::Tensor LayerCoder::pre(const at::Tensor& x) const {
  return at::matmul(in_shift.defined() ? x - in_shift : x, W_enc) + b_enc;
}

at::Tensor LayerCoder::act(const at::Tensor& p) const {
  if (!threshold.defined()) return at::relu(p);
  return (relu_then_threshold ? at::relu(p) : p) * p.gt(threshold);
}

at::Tensor LayerCoder::skip(const at::Tensor& x) const { return at::matmul(x, W_skip.t()); }

namespace {

std::string coder_shape_text(const at::Tensor& t) { return c10::str(t.sizes()); }

std::vector<LayerCoder> clt_coders(Module&, const AttributionPlaces& places, const CrossLayerTranscoder& c,
                                   at::ScalarType dt) {
  const int64_t L = static_cast<int64_t>(places.mlps.size()), d = places.hidden_size;
  const std::string who = "attribution: the cross-layer transcoder '" + c.source + "'";
  if (c.n_layers() != L)
    throw ConfigError(who + " spans " + std::to_string(c.n_layers()) + " layers (b_dec " + coder_shape_text(c.b_dec) +
                      "), the model has " + std::to_string(L));
  if (c.d_model() != d)
    throw ConfigError(who + ": W_enc " + coder_shape_text(c.W_enc) + " and b_dec " + coder_shape_text(c.b_dec) + " have width " +
                      std::to_string(c.d_model()) + ", the model's MLP input and output have " + std::to_string(d));
  if (c.W_enc.sizes() != at::IntArrayRef({L, c.d_transcoder(), d}) || (c.jump_relu() && c.threshold.sizes() != c.b_enc.sizes()) ||
      static_cast<int64_t>(c.W_dec.size()) != L)
    throw ConfigError(who + ": W_enc " + coder_shape_text(c.W_enc) + ", b_enc " + coder_shape_text(c.b_enc) +
                      (c.jump_relu() ? ", threshold " + coder_shape_text(c.threshold) : std::string()) + " and " +
                      std::to_string(c.W_dec.size()) + " W_dec tensors do not fit " + std::to_string(L) + " layers of width " +
                      std::to_string(d));
  for (int64_t l = 0; l < L; ++l)
    if (c.W_dec[l].sizes() != at::IntArrayRef({c.d_transcoder(), L - l, d}))
      throw ConfigError(who + ": W_dec_" + std::to_string(l) + " has shape " + coder_shape_text(c.W_dec[l]) + ", not [" +
                        std::to_string(c.d_transcoder()) + ", " + std::to_string(L - l) + ", " + std::to_string(d) + "]");
  const std::string& in = c.input_hook;
  if (in != "mlp.hook_in" && in != "ln2.hook_normalized" && in != "hook_resid_mid")
    throw ConfigError(who + ": feature_input_hook '" + in +
                      "' is not supported (mlp.hook_in or ln2.hook_normalized: the MLP input; hook_resid_mid: the "
                      "residual before the MLP's norm)");
  if (c.output_hook != "mlp.hook_out" && c.output_hook != "hook_mlp_out")
    throw ConfigError(who + ": feature_output_hook '" + c.output_hook +
                      "' is not supported (mlp.hook_out or hook_mlp_out: the MLP output)");
  std::vector<LayerCoder> out(L);
  for (int64_t l = 0; l < L; ++l) {
    LayerCoder& lc = out[l];
    lc.source = c.source + " (layer " + std::to_string(l) + ")";
    lc.W_enc = c.W_enc[l].detach().t().to(dt);
    lc.b_enc = c.b_enc[l].detach().to(dt);
    lc.b_dec = c.b_dec[l].detach().to(dt);
    if (c.jump_relu()) lc.threshold = c.threshold[l].detach().to(dt);
    lc.relu_then_threshold = false;
    lc.reads_residual = in == "hook_resid_mid";
    // [F, L - l, d] as stored (a mapped file): only active features' rows are
    // read and converted (a real CLT's decoders are tens of GB in float32).
    const at::Tensor w = c.W_dec[l].detach();
    lc.sparse_decode = true;
    for (int64_t k = 0; k < L - l; ++k) lc.W_dec.push_back(w.select(1, k));
  }
  return out;
}

}  // namespace

std::vector<LayerCoder> layer_coders(Module& model, const AttributionPlaces& places, const Transcoders& t, at::ScalarType dt) {
  if (t.cross_layer) return clt_coders(model, places, *t.cross_layer, dt);
  check_transcoders(model, places, t.per_layer);
  std::vector<LayerCoder> out;
  for (const auto& sd : t.per_layer) {
    LayerCoder lc;
    lc.source = sd->config().source;
    lc.W_enc = sd->W_enc.detach().to(dt);
    lc.b_enc = sd->b_enc.detach().to(dt);
    lc.b_dec = sd->b_dec.detach().to(dt);
    if (sd->config().apply_b_dec_to_input) lc.in_shift = lc.b_dec;
    if (sd->config().has_skip()) lc.W_skip = sd->W_skip.detach().to(dt);
    if (sd->config().jump()) lc.threshold = sd->threshold.detach().to(dt);
    lc.W_dec.push_back(sd->W_dec.detach().to(dt));
    out.push_back(std::move(lc));
  }
  return out;
}

void move_coders(std::vector<LayerCoder>& coders, const at::Device& device) {
  auto move = [&](at::Tensor& t) {
    if (t.defined() && t.device() != device) t = t.to(device);
  };
  for (LayerCoder& c : coders) {
    move(c.W_enc), move(c.b_enc), move(c.in_shift), move(c.threshold), move(c.b_dec), move(c.W_skip);
    if (!c.sparse_decode)
      for (at::Tensor& w : c.W_dec) move(w);
  }
}

bool reads_residual(const Transcoders& t) { return t.cross_layer && t.cross_layer->input_hook == "hook_resid_mid"; }

at::Tensor reconstruction(const std::vector<LayerCoder>& coders, const std::vector<at::Tensor>& acts, int64_t l,
                          const at::Tensor& x) {
  at::Tensor r;
  for (int64_t l0 = 0; l0 <= l; ++l0) {
    const int64_t k = l - l0;
    if (k >= static_cast<int64_t>(coders[l0].W_dec.size())) continue;
    at::Tensor part;
    if (coders[l0].sparse_decode) {
      const at::Tensor nz = acts[l0].nonzero();  // [n, 2] (pos, feature)
      const at::Tensor pos = nz.select(1, 0), feat = nz.select(1, 1);
      // The stored decoders may sit elsewhere (a mapped file on the CPU for a model on a GPU).
      const at::Tensor& w = coders[l0].W_dec[k];
      const at::Tensor rows = w.index_select(0, feat.to(w.device())).to(acts[l0].options()) *
                              acts[l0].index({pos, feat}).unsqueeze(1);
      part = at::zeros({acts[l0].size(0), rows.size(1)}, acts[l0].options()).index_add_(0, pos, rows);
    } else {
      part = at::matmul(acts[l0], coders[l0].W_dec[k]);
    }
    r = r.defined() ? r + part : part;
  }
  r = r + coders[l].b_dec;
  if (coders[l].W_skip.defined()) r = r + coders[l].skip(x);
  return r;
}

}  // namespace flex::detail
