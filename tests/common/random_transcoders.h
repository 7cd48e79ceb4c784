#pragma once
// Random per-layer transcoders for the attribution tests (test_attribution,
// test_attribution_stream, test_attribution_intervention): one factory, each
// test giving its seed, scales, architectures and hook names. The draw
// order (W_enc, b_enc, W_dec, b_dec, then W_skip and threshold where the
// architecture has them) is fixed, so a seed gives the same values it gave
// each test's own copy.
#include <flex/models/causal_lm.h>
#include <flex/sae/sparse_dictionary.h>

#include <ATen/ATen.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace flex_test {

struct RandomTranscoders {
  int64_t d_sae = 24;
  int64_t seed = 5;
  at::ScalarType dtype = at::kDouble;
  double enc_scale = 1.0;  // W_enc ~ N(0, 1) * enc_scale / sqrt(d)
  double dec_scale = 0.2;  // W_dec ~ N(0, 1) * dec_scale
  /// Layer l's architecture.
  std::function<flex::SaeArchitecture(int64_t)> architecture;
  /// Layer l's (hook_name, hook_name_out); default circuit-tracer's blocks.l.mlp.hook_in / hook_out.
  std::function<std::pair<std::string, std::string>(int64_t)> hooks = [](int64_t l) {
    const std::string ls = std::to_string(l);
    return std::make_pair("blocks." + ls + ".mlp.hook_in", "blocks." + ls + ".mlp.hook_out");
  };
  /// Whether layer l subtracts b_dec from its input.
  std::function<bool(int64_t)> apply_b_dec_to_input = [](int64_t) { return false; };
};

/// One transcoder per layer of `m`, drawn from at::manual_seed(spec.seed).
inline std::vector<std::shared_ptr<flex::SparseDictionary>> random_transcoders(const flex::CausalLM& m,
                                                                               const RandomTranscoders& spec) {
  const int64_t d = m.config().hidden_size, L = m.config().num_hidden_layers, d_sae = spec.d_sae;
  const at::ScalarType dt = spec.dtype;
  std::vector<std::shared_ptr<flex::SparseDictionary>> out;
  at::manual_seed(spec.seed);
  for (int64_t l = 0; l < L; ++l) {
    flex::SaeConfig c;
    c.architecture = spec.architecture(l);
    c.d_in = c.d_out = d;
    c.d_sae = d_sae;
    c.dtype = dt;
    c.apply_b_dec_to_input = spec.apply_b_dec_to_input(l);
    std::tie(c.hook_name, c.hook_name_out) = spec.hooks(l);
    c.source = "test/layer_" + std::to_string(l);
    auto t = std::make_shared<flex::SparseDictionary>(c);
    at::NoGradGuard ng;
    t->set_tensor("W_enc", (at::randn({d, d_sae}) * spec.enc_scale / std::sqrt(double(d))).to(dt));
    t->set_tensor("b_enc", (at::randn({d_sae}) * 0.3).to(dt));
    t->set_tensor("W_dec", (at::randn({d_sae, d}) * spec.dec_scale).to(dt));
    t->set_tensor("b_dec", (at::randn({d}) * 0.1).to(dt));
    if (c.has_skip()) t->set_tensor("W_skip", (at::randn({d, d}) * 0.05).to(dt));
    if (c.jump()) t->set_tensor("threshold", (at::rand({d_sae}) * 0.3).to(dt));
    out.push_back(t);
  }
  return out;
}

}  // namespace flex_test
