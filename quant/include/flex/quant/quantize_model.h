#pragma once
// Quantizing a model's dense layers (Accelerate's utils.bnb): choosing the
// layers, planning them on meta (so module sizes and device maps count
// quantized bytes: about 0.5 byte per weight plus scales for 4-bit),
// quantizing while loading, tensor by tensor from the memory-mapped
// checkpoint (never holding the full-precision model), and loading
// checkpoints that Transformers + bitsandbytes saved quantized.
#include <flex/dispatch/load_checkpoint.h>
#include <flex/quant/bnb_config.h>
#include <flex/quant/weight_formats.h>

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace flex {

/// The Linear / Conv1D layers of `model` that `cfg` quantizes: all but
/// those matched by cfg.skip_modules (default: `default_skip`, the output
/// head) and cfg.keep_in_fp32_modules. A pattern p matches a layer named p,
/// any layer whose name holds "p." (Accelerate's rule: "mlp" is every MLP
/// layer), or one whose name ends in ".p".
std::vector<std::string> layers_to_quantize(Module& model, const BnbQuantizationConfig& cfg,
                                            const std::vector<std::string>& default_skip);

/// Gives those layers (on meta, no memory) their quantized tensors' shapes
/// and dtypes and the format that computes with them.
void replace_with_bnb_layers(Module& model, const BnbQuantizationConfig& cfg, const std::vector<std::string>& layers);

/// Quantizes the layers of a loaded model in place.
void quantize_model(Module& model, const BnbQuantizationConfig& cfg, const std::vector<std::string>& layers);

/// Loader transform (LoadCheckpointOptions::transform): each layer's
/// full-precision weight, cast to `weight_dtype` (what Transformers does
/// before quantizing), becomes its quantized tensors; the layer's format
/// takes the quant state's scalars.
decltype(LoadCheckpointOptions::transform) quantizing_transform(Module& model, const BnbQuantizationConfig& cfg,
                                                                const std::vector<std::string>& layers,
                                                                at::ScalarType weight_dtype);

/// A bitsandbytes-quantized checkpoint (its config.json quantization_config
/// read into `cfg`): which layers it holds quantized, found from its keys
/// ("<layer>.SCB", "<layer>.weight.quant_state.bitsandbytes__*").
struct BnbCheckpoint {
  BnbQuantizationConfig config;
  std::vector<std::string> layers;
};
/// nullopt when config.json has no bitsandbytes quantization_config.
/// ConfigError for a bitsandbytes config this loader cannot read
/// (llm_int8_has_fp16_weight, a quant storage other than uint8).
/// `view`: the model's view of the checkpoint (its architecture's renamed
/// keys), so that layers are named as the model names them.
std::optional<BnbCheckpoint> read_bnb_checkpoint(const std::string& dir, const CheckpointView* view = nullptr);
/// Plans `model`'s quantized layers from the checkpoint's own quant states
/// (shapes, block sizes, types) and returns the loader transform that
/// renames bitsandbytes' dotted names and keeps the stored dtypes.
decltype(LoadCheckpointOptions::transform) prepare_bnb_checkpoint(Module& model, const BnbCheckpoint& bnb,
                                                                  const std::string& dir,
                                                                  const CheckpointView* view = nullptr);

/// A bitsandbytes quantization_config object (config.json's, or Transformers'
/// BitsAndBytesConfig.to_dict()) read: load_in_8bit / load_in_4bit,
/// llm_int8_threshold, bnb_4bit_quant_type, bnb_4bit_use_double_quant,
/// bnb_4bit_compute_dtype, llm_int8_skip_modules. ConfigError naming `where`
/// for a field of the wrong type. Not validated (validate() does that).
BnbQuantizationConfig bnb_config_from_json(const nlohmann::json& q, const std::string& where);
/// config.json's "quantization_config" for `cfg`, as Transformers writes it.
nlohmann::json bnb_quantization_config_json(const BnbQuantizationConfig& cfg);
/// The state-dict entries of `model` under bitsandbytes' checkpoint names.
std::vector<std::pair<std::string, at::Tensor>> bnb_state_dict(Module& model);

struct LoadAndQuantizeOptions {
  std::optional<DeviceMap> device_map;
  /// "auto", "balanced", "sequential", "cpu", ... when no explicit map.
  std::string device_map_strategy;
  std::vector<std::string> no_split_module_classes;
  std::optional<MaxMemory> max_memory;
  std::optional<std::string> offload_folder;
  /// Accepted for Accelerate's signature: CPU weights are loaded tensor by
  /// tensor from the memory map already, so there is no state dict to offload.
  bool offload_state_dict = false;
  /// Default: {the output head}, as get_keys_to_not_convert finds it.
  std::vector<std::string> default_skip;
  std::ostream* log = nullptr;
};

/// Accelerate's load_and_quantize_model: a model on meta is planned
/// quantized, loaded from `weights_location` (quantizing each weight as it
/// is read) and dispatched; a loaded model is quantized in place.
Module& load_and_quantize_model(Module& model, const BnbQuantizationConfig& cfg,
                                const std::optional<std::string>& weights_location,
                                const LoadAndQuantizeOptions& options = {});

}  // namespace flex
