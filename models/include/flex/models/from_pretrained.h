#pragma once
// Transformers-style from_pretrained for the zoo's causal LMs, with the
// big-model options: a device map (explicit, a strategy string or one
// device), memory budgets, torch_dtype (incl. "auto"), an offload folder.
// The model is built on meta (no memory, no random init), then every tensor
// is loaded straight to where the map puts it; the result carries its
// hf_device_map (flex::hf_device_map(model)).
#include <flex/dispatch/device_map.h>
#include <flex/dispatch/load_checkpoint.h>
#include <flex/dispatch/memory.h>
#include <flex/models/causal_lm.h>
#include <flex/quant/bnb_config.h>

#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace flex {

struct PretrainedOptions {
  /// "auto", "balanced", "balanced_low_0", "sequential", or one device
  /// ("cpu", "disk", "0", "cuda:1"); empty: everything on CPU, no hooks.
  std::string device_map_strategy;
  /// An explicit map (wins over the strategy).
  std::optional<DeviceMap> device_map;
  std::optional<MaxMemory> max_memory;
  /// "float32" (default), "bfloat16", "float16", "float64" or "auto"
  /// (config.json's torch_dtype, else the checkpoint's first floating dtype).
  std::string torch_dtype = "float32";
  /// Folder for disk-offloaded weights of non-safetensors checkpoints (with
  /// safetensors the checkpoint itself is the store).
  std::optional<std::string> offload_folder;
  /// Default: the architecture's block class (model->no_split_modules()).
  std::optional<std::vector<std::string>> no_split_module_classes;
  bool offload_buffers = false;
  /// Offloaded blocks (device map cpu/disk entries) read ahead while the
  /// previous block computes: the next `prefetch_depth` blocks (0: off).
  /// Outputs are bit-equal either way (flex/dispatch/block_prefetch.h).
  int prefetch_depth = 1;
  /// Quantize the dense layers while loading (8-bit or 4-bit, bitsandbytes'
  /// formats; the output head stays unless skip_modules says otherwise).
  /// Checkpoints saved quantized (config.json quantization_config) load
  /// quantized without it.
  std::optional<BnbQuantizationConfig> quantization;
  /// Missing checkpoint keys are errors (true) or warnings.
  bool strict = true;
  /// CPU weights stored as the model's dtype stay views of the memory-mapped
  /// checkpoint (true: no copy, shared with the page cache), or are copied
  /// into the process's memory at load (false, llama.cpp's --no-mmap): on
  /// this project's 2-core VM the decode step's GEMVs read mapped file pages
  /// at ~19 GB/s against ~30 GB/s from process memory (bench_decode).
  bool mmap = true;
  /// GGUF files: quantized matrices stay in their ggml blocks and the dense
  /// layers compute on them (true), or every tensor is dequantized to float
  /// at load (false: float speed and memory; a reference for the kernels).
  bool gguf_quantized = true;
  /// GGUF quantized layers quantize their inputs to 8 bits per 32 values and
  /// take integer dot products, as llama.cpp does (--fast-activations);
  /// false keeps the inputs in float (faithful captures). docs/gguf.md gives the error.
  bool fast_activations = false;
  /// The output head quantized at load (--quantize-head): "none" (default:
  /// the head stays as stored, bitsandbytes' behaviour), "int8", "nf4"
  /// (bitsandbytes' formats), "q8_0", "q6_k" (ggml blocks). A tied head gets
  /// its own quantized copy; the input embedding stays exact. docs/gguf.md
  /// gives the error it adds.
  std::string quantize_head = "none";
  /// The input token embedding stored quantized at load
  /// (--quantize-embeddings): "none" (default: bit-identical to loading
  /// without it), "int8", "nf4" (bitsandbytes' Embedding8bit / EmbeddingNF4
  /// arithmetic), "q8_0", "q6_k" (ggml blocks); a lookup dequantizes only
  /// the rows it gathers. A tied head keeps the float table unless
  /// quantize_head is set too. GGUF files keep a quantized token_embd in its
  /// blocks without this option. docs/gguf.md gives the error it adds.
  std::string quantize_embeddings = "none";
  std::ostream* log = nullptr;
};

std::shared_ptr<CausalLM> from_pretrained(const std::string& dir, const PretrainedOptions& options = {});

/// The names of the layers `model` (built from `dir`'s config, on meta)
/// would hold quantized, after planning them: the checkpoint's own when it
/// was saved quantized, else those `quantization` selects; empty when neither.
/// Returns the loader transform to pass on (null when nothing is quantized).
decltype(LoadCheckpointOptions::transform) plan_quantized_layers(CausalLM& model, const std::string& dir,
                                                                 const std::optional<BnbQuantizationConfig>& quantization,
                                                                 at::ScalarType dtype);
/// The output head's module name (what quantization skips by default).
std::string output_head_name(CausalLM& model);

/// ConfigError naming quantize_head (--quantize-head) and the allowed
/// formats unless `format` is one of them.
void check_quantize_head(const std::string& format);
/// Quantizes `model`'s output head in place as `format` (a no-op for
/// "none"); the layer keeps its module name, class and hooks.
void quantize_output_head(CausalLM& model, const std::string& format);

}  // namespace flex
