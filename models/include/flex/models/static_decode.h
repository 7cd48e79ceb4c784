#pragma once
// The static decode step behind generate(..., static_step / cuda_graph)
// (design decision 51): fixed shapes per KV-capacity bucket, static device
// input buffers, a KV cache written at a device position, no host read-back
// inside the step, so the step can be recorded once as a CUDA graph.
#include <flex/models/generate.h>

#include <cstdint>

namespace flex {

/// KV slots for a static decode that must hold `tokens` (prompt + new): the
/// smallest power of two >= max(256, tokens).
int64_t static_capacity_bucket(int64_t tokens);

/// UnsupportedError naming the architecture and why when its decode step
/// cannot have static shapes with `capacity` slots: mixture-of-experts
/// routing (data-dependent shapes), dynamic / long RoPE (the frequencies
/// depend on the largest position value), latent attention (not validated).
/// Sliding windows are applied at the device slot (Gemma 2, Mistral).
void check_static_decode(CausalLM& model, int64_t capacity);

/// generate() with the static step; generate() calls it when opts.static_step
/// or opts.cuda_graph is set.
GenerateOutput generate_static(CausalLM& model, const at::Tensor& input_ids, const at::Tensor& attention_mask,
                               const GenerateOptions& opts);

/// True in a build against a CUDA libtorch (where cuda_graph can run).
bool cuda_graph_compiled();

}  // namespace flex
