#pragma once
// File names of checkpoints and saved training state, as Accelerate's
// utils.constants and Transformers name them. The loaders and writers use
// these, so a folder saved by either side is found by the other.
namespace flex {

inline constexpr const char* MODEL_NAME = "pytorch_model";
inline constexpr const char* SAFE_MODEL_NAME = "model";
inline constexpr const char* WEIGHTS_NAME = "pytorch_model.bin";
inline constexpr const char* SAFE_WEIGHTS_NAME = "model.safetensors";
inline constexpr const char* WEIGHTS_INDEX_NAME = "pytorch_model.bin.index.json";
inline constexpr const char* SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json";
inline constexpr const char* OPTIMIZER_NAME = "optimizer";
inline constexpr const char* SCHEDULER_NAME = "scheduler";
inline constexpr const char* SAMPLER_NAME = "sampler";
inline constexpr const char* RNG_STATE_NAME = "random_states";
inline constexpr const char* SCALER_NAME = "scaler.pt";

}  // namespace flex
