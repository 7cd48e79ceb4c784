#include <flex/dispatch/checkpoint.h>
#include <flex/dispatch/load_checkpoint.h>
#include <flex/hooks/empty_init.h>
#include <flex/hooks/errors.h>
#include <flex/models/auto_model.h>
#include <flex/models/from_pretrained.h>

namespace flex {

std::shared_ptr<CausalLM> from_pretrained(const std::string& dir, const PretrainedOptions& o) {
  ModelConfig cfg = load_config(dir);
  Checkpoint ckpt = Checkpoint::open(dir);
  LoadOptions lo;
  if (o.torch_dtype == "auto") {
    lo.dtype_auto = true;
  } else {
    lo.dtype = parse_torch_dtype(o.torch_dtype);
  }
  const at::ScalarType dtype = resolve_dtype(cfg, ckpt, lo);
  const bool dispatched = o.device_map || !o.device_map_strategy.empty();
  if (!dispatched) {
    lo.dtype = dtype;
    lo.dtype_auto = false;
    return load_pretrained(dir, lo);
  }
  std::shared_ptr<CausalLM> model;
  {
    EmptyInit scope;  // parameters on meta; computed buffers stay real
    model = build_causal_lm(cfg, at::TensorOptions().dtype(dtype));
  }
  model->tie_weights();
  LoadAndDispatchOptions d;
  d.device_map_strategy = o.device_map_strategy;
  d.device_map = o.device_map;
  d.max_memory = o.max_memory;
  d.no_split_module_classes = o.no_split_module_classes.value_or(model->no_split_modules());
  d.offload_folder = o.offload_folder;
  d.offload_buffers = o.offload_buffers;
  d.dtype = dtype;
  d.strict = o.strict;
  d.log = o.log;
  // The KV cache is state, never moved between devices.
  d.skip_keys = {"past_key_values"};
  // Hook points hold no tensors; leaving them out keeps maps identical to Accelerate's.
  d.skip_module = [](const std::string& name) { return is_hook_point_name(name); };
  load_checkpoint_and_dispatch(*model, ckpt.source(), d);
  model->eval();
  return model;
}

}  // namespace flex
