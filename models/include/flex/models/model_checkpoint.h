#pragma once
// A model's view of its checkpoint folder: what every loader (load_pretrained,
// from_pretrained's dispatch, the parallel loader) reads through.
//   - the architecture's key renames and dropped parts (Gemma 3's multimodal
//     checkpoints: the language model under "model.language_model." or
//     "language_model.model.", the vision tower dropped);
//   - weights stored in a format Transformers dequantizes while loading
//     (quantization_config.quant_method "fp8": DeepSeek-V3's 128x128 FP8
//     blocks; "mxfp4": gpt-oss's experts), computed when read
//     (flex/quant/stored_formats.h).
#include <flex/dispatch/checkpoint.h>
#include <flex/models/config.h>

#include <string>

namespace flex {

/// The view for `cfg` over the stored checkpoint.
CheckpointView model_checkpoint_view(const ModelConfig& cfg, const Checkpoint& stored);

/// Checkpoint::open(dir) seen through model_checkpoint_view.
Checkpoint open_model_checkpoint(const std::string& dir, const ModelConfig& cfg);

/// Whether config.json's quantization_config is one dequantized at load (fp8, mxfp4).
bool dequantized_at_load(const ModelConfig& cfg);

}  // namespace flex
