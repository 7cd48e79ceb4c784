#pragma once
// Building and loading the zoo's causal LMs from Hugging Face checkpoint
// folders (config.json + model.safetensors, a sharded index, or a torch .bin),
// as AutoModelForCausalLM.from_pretrained does, through flex::Checkpoint.
#include <flex/models/causal_lm.h>
#include <flex/models/config.h>
#include <flex/models/decoder.h>
#include <flex/models/gpt2.h>
#include <flex/models/gpt_neox.h>
#include <flex/models/llama.h>

#include <c10/core/Device.h>
#include <c10/core/TensorOptions.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace flex {

class Checkpoint;

/// The architecture for cfg.model_type, parameters created with `opts`
/// (dtype, device). Inside flex::EmptyInit the parameters are on meta.
/// Returned in eval mode (dropout off); call train() to enable dropout.
std::shared_ptr<CausalLM> build_causal_lm(const ModelConfig& cfg, const at::TensorOptions& opts = {});

struct LoadOptions {
  /// Parameter dtype; unset means float32, as Transformers' default.
  std::optional<at::ScalarType> dtype;
  /// torch_dtype="auto": config.json's torch_dtype, else the checkpoint's
  /// first floating dtype. Overrides `dtype`.
  bool dtype_auto = false;
  at::Device device = at::Device(at::kCPU);
  /// Build under EmptyInit (no random init, no double memory) and fill from
  /// the checkpoint. false: build with random weights, then overwrite.
  bool empty_init = true;
};

/// What load_weights did.
struct LoadReport {
  std::vector<std::string> loaded;      // model names filled from the checkpoint
  std::vector<std::string> unexpected;  // checkpoint keys the model has no place for
  at::ScalarType dtype = at::kFloat;    // the parameter dtype used
};

/// "float32"/"float"/"fp32", "bfloat16"/"bf16", "float16"/"half"/"fp16",
/// "float64"/"double"; ConfigError otherwise. Accepts a "torch." prefix.
at::ScalarType parse_torch_dtype(const std::string& name);

/// The parameter dtype `opts` asks for with this config and checkpoint.
at::ScalarType resolve_dtype(const ModelConfig& cfg, const Checkpoint& ckpt, const LoadOptions& opts);

/// Fills every parameter and persistent buffer of `model` from `ckpt`: shape
/// checked (ShapeError naming key, file and both shapes), floating tensors
/// cast to the resolved dtype, moved to opts.device (zero-copy views of the
/// mapped file when nothing changes; the mapping is copy-on-write). A tied
/// output embedding may be absent. Keys stored without the base-model prefix
/// ("h.0.attn..." in the original GPT-2 files) are found too. Missing keys:
/// NotFoundError naming them and the checkpoint. Then re-ties the weights and
/// recreates the non-persistent buffers on opts.device.
LoadReport load_weights(CausalLM& model, const Checkpoint& ckpt, const LoadOptions& opts = {});
LoadReport load_weights(CausalLM& model, const std::string& checkpoint_path, const LoadOptions& opts = {});

/// config.json + checkpoint in `dir` -> a ready model in eval mode.
std::shared_ptr<CausalLM> load_pretrained(const std::string& dir, const LoadOptions& opts = {});
std::shared_ptr<CausalLM> load_pretrained(const std::string& dir, at::ScalarType dtype);
/// torch_dtype as Transformers spells it: "auto", "float32", "bfloat16", ...
std::shared_ptr<CausalLM> load_pretrained(const std::string& dir, const std::string& torch_dtype);

}  // namespace flex
