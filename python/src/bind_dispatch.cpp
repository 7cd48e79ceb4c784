// Accelerate's big-model functions over the C++ dispatch layer: building a
// model from its config (on meta inside init_empty_weights), planning a device
// map, loading a checkpoint into it and dispatching, and the offload helpers.
// Device maps and budgets cross as JSON text (DeviceMap/MaxMemory read it and
// name the field at fault); the Python wrappers (flexmodel/big_modeling.py)
// give them Accelerate's signatures.
#include "bindings.h"

#include <flex/dispatch/auto_device_map.h>
#include <flex/dispatch/big_modeling.h>
#include <flex/dispatch/checkpoint.h>
#include <flex/dispatch/load_checkpoint.h>
#include <flex/hooks/empty_init.h>
#include <flex/hooks/errors.h>
#include <flex/models/auto_model.h>
#include <flex/models/config.h>
#include <flex/models/model_checkpoint.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <optional>
#include <set>

namespace flex::python {

namespace {

std::optional<c10::Device> device_of(const std::optional<std::string>& name) {
  if (!name) return std::nullopt;
  try {
    return c10::Device(*name);
  } catch (const c10::Error&) {
    throw ConfigError("execution device '" + *name + "' is not a device (cpu, cuda:0, ...)");
  }
}

std::optional<at::ScalarType> dtype_of(const std::optional<std::string>& name) {
  if (!name) return std::nullopt;
  return parse_torch_dtype(*name);
}

std::shared_ptr<StateDictWeights> weights_of(const std::optional<std::map<std::string, at::Tensor>>& state_dict) {
  if (!state_dict) return nullptr;
  auto w = std::make_shared<StateDictWeights>();
  for (const auto& [name, t] : *state_dict) w->set(name, t);
  return w;
}

// A model's view of a checkpoint: its architecture's renamed and dequantized keys.
Checkpoint model_view(Module& model, const std::string& checkpoint, std::optional<CheckpointView>& view) {
  const Checkpoint stored = Checkpoint::open(checkpoint);
  if (auto* lm = dynamic_cast<CausalLM*>(&model)) {
    view = model_checkpoint_view(lm->config(), stored);
    return stored.with_view(*view);
  }
  return stored;
}

}  // namespace

void bind_dispatch(py::module_& m) {
  m.def(
      "from_config",
      [](const std::string& config_json, const std::string& torch_dtype, bool empty, bool include_buffers) {
        const ModelConfig cfg = parse_config(nlohmann::json::parse(config_json), "config");
        const at::TensorOptions opts = at::TensorOptions().dtype(parse_torch_dtype(torch_dtype));
        py::gil_scoped_release nogil;
        std::shared_ptr<CausalLM> model;
        if (empty) {
          EmptyInit scope(include_buffers);
          model = build_causal_lm(cfg, opts);
        } else {
          model = build_causal_lm(cfg, opts);
        }
        model->tie_weights();  // as from_pretrained: outside the empty scope
        return model;
      },
      py::arg("config_json"), py::arg("torch_dtype"), py::arg("empty"), py::arg("include_buffers"));

  m.def(
      "infer_auto_device_map",
      [](Module& model, const std::optional<std::string>& max_memory, const std::vector<std::string>& no_split,
         const std::optional<std::string>& dtype, const std::map<std::string, std::string>& special_dtypes,
         bool clean_result, bool offload_buffers, bool fallback_allocation, bool verbose) {
        InferDeviceMapOptions o;
        if (max_memory) o.max_memory = MaxMemory::from_json(*max_memory, "max_memory");
        o.no_split_module_classes = no_split;
        o.dtype = dtype_of(dtype);
        for (const auto& [name, d] : special_dtypes) o.special_dtypes[name] = parse_torch_dtype(d);
        o.clean_result = clean_result;
        o.offload_buffers = offload_buffers;
        o.fallback_allocation = fallback_allocation;
        o.verbose = verbose;
        // Hook points hold no tensors; leaving them out keeps maps identical to Accelerate's.
        o.skip_module = [](const std::string& name) { return is_hook_point_name(name); };
        py::gil_scoped_release nogil;
        return infer_auto_device_map(model, o).to_json();
      });

  m.def(
      "load_checkpoint_and_dispatch",
      [](Module& model, const std::string& checkpoint, const std::optional<std::string>& strategy,
         const std::optional<std::string>& device_map, const std::optional<std::string>& max_memory,
         const std::vector<std::string>& no_split, const std::optional<std::string>& offload_folder,
         bool offload_buffers, const std::optional<std::string>& dtype, const std::set<std::string>& skip_keys,
         const std::vector<std::string>& preload, bool force_hooks, bool strict) {
        LoadAndDispatchOptions o;
        o.device_map_strategy = strategy.value_or("");
        if (device_map) o.device_map = DeviceMap::from_json(*device_map, "device_map");
        if (max_memory) o.max_memory = MaxMemory::from_json(*max_memory, "max_memory");
        o.no_split_module_classes = no_split;
        o.offload_folder = offload_folder;
        o.offload_buffers = offload_buffers;
        o.dtype = dtype_of(dtype);
        o.skip_keys = skip_keys;
        o.preload_module_classes = preload;
        o.force_hooks = force_hooks;
        o.strict = strict;
        o.skip_module = [](const std::string& name) { return is_hook_point_name(name); };
        py::gil_scoped_release nogil;
        const Checkpoint ckpt = model_view(model, checkpoint, o.view);
        const LoadCheckpointReport report = load_checkpoint_and_dispatch(model, ckpt.source(), o);
        model.eval();
        return std::make_pair(report.missing_keys, report.unexpected_keys);
      });

  m.def("dispatch_model",
        [](Module& model, const std::string& device_map, const std::optional<std::string>& main_device,
           const std::optional<std::map<std::string, at::Tensor>>& state_dict,
           const std::optional<std::string>& offload_dir, bool offload_buffers, const std::set<std::string>& skip_keys,
           const std::vector<std::string>& preload, bool force_hooks) {
          DispatchOptions o;
          o.main_device = device_of(main_device);
          o.state_dict = weights_of(state_dict);
          o.offload_dir = offload_dir;
          o.offload_buffers = offload_buffers;
          o.skip_keys = skip_keys;
          o.preload_module_classes = preload;
          o.force_hooks = force_hooks;
          const DeviceMap map = DeviceMap::from_json(device_map, "device_map");
          py::gil_scoped_release nogil;
          dispatch_model(model, map, o);
        });

  m.def("cpu_offload",
        [](Module& model, const std::optional<std::string>& execution_device, bool offload_buffers,
           const std::optional<std::map<std::string, at::Tensor>>& state_dict, const std::vector<std::string>& preload) {
          const auto device = device_of(execution_device);
          auto weights = weights_of(state_dict);
          py::gil_scoped_release nogil;
          cpu_offload(model, device, offload_buffers, weights, preload);
        });

  m.def("disk_offload", [](Module& model, const std::string& offload_dir,
                           const std::optional<std::string>& execution_device, bool offload_buffers,
                           const std::vector<std::string>& preload) {
    const auto device = device_of(execution_device);
    py::gil_scoped_release nogil;
    disk_offload(model, offload_dir, device, offload_buffers, preload);
  });
}

}  // namespace flex::python
