#pragma once
// Models from GGUF files (llama.cpp's format): the Transformers config
// rebuilt from the file's metadata, the tensors renamed to Transformers'
// module names, dequantized to float32 and the rewrites of llama.cpp's
// converter undone (Llama's q/k rows, GPT-NeoX's q|k|v rows, GPT-2's
// transposed Conv1D weights, Gemma's 1 + w norms, experts stacked in 3-D
// tensors, DeepSeek's kv_b split). Architectures (llama.cpp's names): llama
// (also Mistral), qwen2, qwen3, qwen2moe, qwen3moe, phi3, gemma2, gemma3,
// olmo2, gpt2, gptneox, deepseek2 (DeepSeek-V2, or V3 by its routing keys).
// from_pretrained("model.gguf")
// comes here; matrices in a quantized ggml type stay in their blocks
// (flex/quant/ggml_format.h) unless options.gguf_quantized is false.
#include <flex/models/causal_lm.h>
#include <flex/models/from_pretrained.h>

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace flex {

class GgufFile;

/// A regular file whose first bytes are "GGUF".
bool is_gguf_file(const std::string& path);

/// config.json as Transformers would write it for the model in `f`.
/// UnsupportedError naming the file and general.architecture for other
/// architectures; NotFoundError / FileFormatError naming the file and key
/// for a missing or ill-typed metadata key.
nlohmann::json gguf_config_json(const GgufFile& f);

/// The model's tensors under Transformers' names, float32 (dequantized; q/k
/// rows un-permuted), in file order. UnsupportedError naming the file and
/// tensor for a tensor with no Transformers counterpart or a type flexmodel
/// does not dequantize; FileFormatError for q/k rows that do not split into
/// the heads.
std::vector<std::pair<std::string, at::Tensor>> gguf_state_dict(const GgufFile& f);

/// from_pretrained for a GGUF file: the model on the CPU in
/// options.torch_dtype ("auto": float32). UnsupportedError for device maps,
/// offloading and quantization options (not yet taken for GGUF);
/// NotFoundError naming the file and tensors a model parameter lacks,
/// ShapeError naming the tensor for a shape the config does not give.
std::shared_ptr<CausalLM> gguf_from_pretrained(const std::string& path, const PretrainedOptions& options = {});

}  // namespace flex
