#include <flex/dispatch/block_prefetch.h>
#include <flex/dispatch/checkpoint.h>
#include <flex/dispatch/load_checkpoint.h>
#include <flex/hooks/empty_init.h>
#include <flex/hooks/errors.h>
#include <flex/models/auto_model.h>
#include <flex/models/from_pretrained.h>
#include <flex/models/gguf_model.h>
#include <flex/models/model_checkpoint.h>
#include <flex/models/quantized_embedding.h>
#include <flex/quant/quantize_model.h>

#include <ATen/ATen.h>

#include <map>

namespace flex {

namespace {
// Every CPU tensor replaced by a copy in process memory; tied tensors (one
// storage under several names) stay tied to one copy.
void copy_into_memory(Module& model) {
  at::NoGradGuard no_grad;
  std::map<const void*, at::Tensor> copies;
  for (const auto& [name, t] : state_dict(model)) {
    if (!t.defined() || !t.device().is_cpu() || t.numel() == 0) continue;
    auto it = copies.find(t.data_ptr());
    if (it == copies.end()) it = copies.emplace(t.data_ptr(), t.detach().clone()).first;
    set_module_tensor(model, name, it->second);
  }
}
}  // namespace

namespace {
std::shared_ptr<CausalLM> load_any(const std::string& dir, const PretrainedOptions& o);
}  // namespace

std::shared_ptr<CausalLM> from_pretrained(const std::string& dir, const PretrainedOptions& o) {
  check_quantize_head(o.quantize_head);
  check_quantize_embeddings(o.quantize_embeddings);
  std::shared_ptr<CausalLM> model = load_any(dir, o);
  quantize_output_head(*model, o.quantize_head);
  quantize_input_embeddings(*model, o.quantize_embeddings);
  return model;
}

namespace {
std::shared_ptr<CausalLM> load_any(const std::string& dir, const PretrainedOptions& o) {
  if (is_gguf_file(dir)) return gguf_from_pretrained(dir, o);
  ModelConfig cfg = load_config(dir);
  const Checkpoint stored = Checkpoint::open(dir);
  const CheckpointView view = model_checkpoint_view(cfg, stored);
  const Checkpoint ckpt = stored.with_view(view);
  LoadOptions lo;
  if (o.torch_dtype == "auto") {
    lo.dtype_auto = true;
  } else {
    lo.dtype = parse_torch_dtype(o.torch_dtype);
  }
  const at::ScalarType dtype = resolve_dtype(cfg, ckpt, lo);
  // A checkpoint saved quantized, or quantizing while loading: the quantized
  // layers are planned on meta (plan_quantized_layers reads which).
  // (FP8 / MXFP4 checkpoints are dequantized while read: not quantized layers.)
  const bool quantized = (cfg.raw.contains("quantization_config") && !dequantized_at_load(cfg)) ||
                         (o.quantization && o.quantization->enabled());
  const bool dispatched = o.device_map || !o.device_map_strategy.empty() || quantized;
  if (!dispatched) {
    lo.dtype = dtype;
    lo.dtype_auto = false;
    std::shared_ptr<CausalLM> model = load_pretrained(dir, lo);
    if (!o.mmap) copy_into_memory(*model);
    return model;
  }
  std::shared_ptr<CausalLM> model;
  {
    EmptyInit scope;  // parameters on meta; computed buffers stay real
    model = build_causal_lm(cfg, at::TensorOptions().dtype(dtype));
  }
  model->tie_weights();
  LoadAndDispatchOptions d;
  d.transform = plan_quantized_layers(*model, dir, o.quantization, dtype);
  d.device_map_strategy = o.device_map || !o.device_map_strategy.empty() ? o.device_map_strategy : "cpu";
  d.device_map = o.device_map;
  d.max_memory = o.max_memory;
  d.no_split_module_classes = o.no_split_module_classes.value_or(model->no_split_modules());
  d.offload_folder = o.offload_folder;
  d.offload_buffers = o.offload_buffers;
  d.dtype = dtype;
  d.strict = o.strict;
  d.log = o.log;
  d.view = view;
  // The KV cache is state, never moved between devices.
  d.skip_keys = {"past_key_values"};
  // Hook points hold no tensors; leaving them out keeps maps identical to Accelerate's.
  d.skip_module = [](const std::string& name) { return is_hook_point_name(name); };
  load_checkpoint_and_dispatch(*model, ckpt.source(), d);
  if (!o.mmap) copy_into_memory(*model);
  if (o.prefetch_depth < 0)
    throw ConfigError("prefetch_depth must be 0 (off) or more, got " + std::to_string(o.prefetch_depth));
  enable_block_prefetch(*model, o.prefetch_depth);
  model->eval();
  return model;
}
}  // namespace

std::string output_head_name(CausalLM& model) {
  const auto head = model.output_embeddings();
  for (const auto& [name, m] : model.named_flex_modules())
    if (m == head) return name;
  return "lm_head";
}

decltype(LoadCheckpointOptions::transform) plan_quantized_layers(CausalLM& model, const std::string& dir,
                                                                 const std::optional<BnbQuantizationConfig>& q,
                                                                 at::ScalarType dtype) {
  // A checkpoint saved by bitsandbytes: its layers named as the model names
  // them (Mixtral's block_sparse_moe. keys are its mlp.). A folder with a
  // config only (inspect) has no checkpoint to read.
  std::optional<CheckpointView> view;
  const auto& raw = model.config().raw;
  if (auto q = raw.find("quantization_config");
      q != raw.end() && q->is_object() && q->value("quant_method", std::string()) == "bitsandbytes") {
    const Checkpoint stored = Checkpoint::open(dir);
    view = model_checkpoint_view(model.config(), stored);
  }
  const CheckpointView* v = view ? &*view : nullptr;
  if (auto bnb = read_bnb_checkpoint(dir, v)) {
    if (q && q->enabled() && q->method() != bnb->config.method())
      throw ConfigError(dir + " holds " + bnb->config.method() + " weights; it cannot be loaded as " + q->method());
    return prepare_bnb_checkpoint(model, *bnb, dir, v);
  }
  if (!q || !q->enabled()) return nullptr;
  const auto layers = layers_to_quantize(model, *q, {output_head_name(model)});
  replace_with_bnb_layers(model, *q, layers);
  return quantizing_transform(model, *q, layers, q->torch_dtype.value_or(dtype));
}

}  // namespace flex
