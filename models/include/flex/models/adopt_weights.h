#pragma once
// A causal LM built around tensors that already exist: a Transformers model
// in the same process (flexmodel.from_transformers). The model is built on
// meta from the config, then every parameter and persistent buffer becomes
// the given tensor's storage (a detached alias: same memory, dtype and device,
// no copy; the caller's own tensors keep their requires_grad and autograd
// state). Transformers 5 holds a sparse block's routed experts fused
// ([E, 2I, H] gate_up_proj, [E, H, I] down_proj); flexmodel has a module per
// expert, whose weights become views of the fused tensors' rows.
#include <flex/models/causal_lm.h>
#include <flex/models/config.h>

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>

namespace flex {

/// The model of `cfg` whose parameters are `parameters` (the model's names,
/// as Transformers 5.23 names them, tied ones under each or either name).
/// `buffers` fill the persistent buffers of those names; the rest are
/// recomputed (rotary tables, masks). Typed errors: ShapeError naming the
/// tensor and both shapes; NotFoundError naming what the model needs and
/// `what` lacks; UnsupportedError naming the parameters the architecture has
/// no place for (an adapter's, say), or a quantized (non-floating) weight.
std::shared_ptr<CausalLM> adopt_weights(const ModelConfig& cfg, const std::map<std::string, at::Tensor>& parameters,
                                        const std::map<std::string, at::Tensor>& buffers,
                                        const std::string& what = "the given model");

}  // namespace flex
