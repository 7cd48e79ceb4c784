// The module tree and the causal LMs: flex.Module (names, submodules,
// parameters sharing storage with the C++ model), CausalLM (call, config,
// device map, generate) and from_pretrained.
#include "bindings.h"

#include <flex/dispatch/big_modeling.h>
#include <flex/dispatch/device_map.h>
#include <flex/dispatch/memory.h>
#include <flex/models/adopt_weights.h>
#include <flex/models/architecture.h>
#include <flex/models/config.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/nn.h>
#include <flex/models/from_pretrained.h>
#include <flex/models/generate.h>
#include <flex/models/gguf_model.h>
#include <flex/quant/quantize_model.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

namespace flex::python {

py::object module_to_py(Module& m) {
  // Modules live in shared_ptrs (torch::nn::Module is enable_shared_from_this).
  auto self = std::dynamic_pointer_cast<Module>(m.shared_from_this());
  if (auto lm = std::dynamic_pointer_cast<CausalLM>(self)) return py::cast(lm);
  return py::cast(self);
}

namespace {

nlohmann::json py_to_json(const py::handle& obj) {
  return nlohmann::json::parse(py::str(py::module_::import("json").attr("dumps")(obj)).cast<std::string>());
}

std::vector<std::pair<std::string, at::Tensor>> named_tensors(Module& m, bool buffers) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  if (buffers) {
    for (const auto& kv : m.named_buffers(/*recurse=*/true))
      if (kv.value().defined()) out.emplace_back(kv.key(), kv.value());
  } else {
    for (const auto& kv : m.named_parameters(/*recurse=*/true)) out.emplace_back(kv.key(), kv.value());
  }
  return out;
}

PretrainedOptions pretrained_options(const std::optional<std::string>& strategy,
                                     const std::optional<std::string>& device_map,
                                     const std::optional<std::string>& max_memory,
                                     const std::optional<std::string>& offload_folder, const std::string& torch_dtype,
                                     const py::object& quantization_config, bool mmap) {
  PretrainedOptions o;
  o.torch_dtype = torch_dtype;
  o.mmap = mmap;
  o.device_map_strategy = strategy.value_or("");
  if (device_map) o.device_map = DeviceMap::from_json(*device_map, "device_map");
  if (max_memory) o.max_memory = MaxMemory::from_json(*max_memory, "max_memory");
  o.offload_folder = offload_folder;
  if (py::isinstance<py::str>(quantization_config)) {
    o.quantization = quantization_from_string(quantization_config.cast<std::string>());
  } else if (!quantization_config.is_none()) {
    o.quantization = bnb_config_from_json(py_to_json(quantization_config), "quantization_config");
    o.quantization->validate();
  }
  return o;
}

}  // namespace

void bind_modules(py::module_& m) {
  py::class_<Module, std::shared_ptr<Module>>(m, "Module")
      .def_property_readonly("class_name", &Module::class_name)
      .def("named_modules",
           [](Module& self) {
             std::vector<std::pair<std::string, py::object>> out;
             for (auto& [name, mod] : self.named_flex_modules()) out.emplace_back(name, module_to_py(*mod));
             return out;
           })
      .def("named_children",
           [](Module& self) {
             std::vector<std::pair<std::string, py::object>> out;
             for (auto& [name, mod] : self.named_flex_children()) out.emplace_back(name, module_to_py(*mod));
             return out;
           })
      .def("get_submodule", [](Module& self, const std::string& path) { return module_to_py(*self.get_submodule(path)); })
      .def("named_parameters", [](Module& self) { return named_tensors(self, false); })
      .def("named_buffers", [](Module& self) { return named_tensors(self, true); })
      .def("state_dict", [](Module& self) { return state_dict(self); })
      .def("get_tensor", [](Module& self, const std::string& name) { return get_module_tensor(self, name); })
      .def(
          "call",
          [](Module& self, const at::Tensor& x) {
            py::gil_scoped_release nogil;
            return self(x);
          },
          "Runs the module (hooks included) on one positional tensor; its output's first tensor")
      .def(
          "float_weight",
          [](Module& self) -> at::Tensor {
            if (auto* d = dynamic_cast<DenseLayer*>(&self)) return d->float_weight();
            if (auto* e = dynamic_cast<Embedding*>(&self)) return e->float_weight();
            throw ConfigError(self.class_name() +
                              " has no weight for float_weight() (Linear, Conv1D and Embedding modules have one)");
          },
          "The weight in floating point: `weight` itself, or for a quantized layer or embedding its stored codes "
          "dequantized (a new tensor)")
      .def_property_readonly("hf_device_map_json", [](const Module& self) -> py::object {
        auto map = hf_device_map(self);
        if (!map) return py::none();
        return py::str(map->to_json());
      });

  py::class_<CausalLM, Module, std::shared_ptr<CausalLM>>(m, "CausalLM")
      .def(
          "logits",
          [](CausalLM& self, const at::Tensor& input_ids, const std::optional<at::Tensor>& attention_mask) {
            // Placed where the model takes its inputs (one device or a map).
            const c10::Device device = input_device(self);
            LMInputs in;
            in.input_ids = input_ids.to(device);
            if (attention_mask) in.attention_mask = attention_mask->to(device);
            py::gil_scoped_release nogil;
            return self.run(in).logits;
          },
          py::arg("input_ids"), py::arg("attention_mask") = py::none())
      .def_property_readonly("config_json", [](CausalLM& self) { return self.config().raw.dump(); })
      .def_property_readonly("model_type", [](CausalLM& self) { return self.config().model_type; })
      .def_property_readonly("base_model_prefix", &CausalLM::base_model_prefix)
      .def_property_readonly("no_split_modules", &CausalLM::no_split_modules)
      .def(
          "generate",
          [](CausalLM& self, const at::Tensor& input_ids, const std::optional<at::Tensor>& attention_mask,
             int64_t max_new_tokens, bool do_sample, double temperature, int64_t top_k, double top_p, uint64_t seed,
             const std::optional<std::vector<int64_t>>& stop_tokens, const std::optional<int64_t>& pad_token_id,
             bool use_cache, bool static_step, bool cuda_graph, int64_t static_capacity,
             const std::vector<std::string>& taps) {
            GenerateOptions g;
            g.max_new_tokens = max_new_tokens;
            g.do_sample = do_sample;
            g.temperature = temperature;
            g.top_k = top_k;
            g.top_p = top_p;
            g.seed = seed;
            g.stop_tokens = stop_tokens;
            g.pad_token_id = pad_token_id;
            g.use_cache = use_cache;
            g.static_step = static_step;
            g.cuda_graph = cuda_graph;
            g.static_capacity = static_capacity;
            g.taps = taps;
            py::gil_scoped_release nogil;
            const GenerateOutput out = generate(self, input_ids, attention_mask.value_or(at::Tensor()), g);
            return std::make_tuple(out.sequences, out.num_generated, out.taps);
          },
          py::arg("input_ids"), py::arg("attention_mask") = py::none(), py::arg("max_new_tokens") = 20,
          py::arg("do_sample") = false, py::arg("temperature") = 1.0, py::arg("top_k") = 0, py::arg("top_p") = 1.0,
          py::arg("seed") = 0, py::arg("stop_tokens") = py::none(), py::arg("pad_token_id") = py::none(),
          py::arg("use_cache") = true, py::arg("static_step") = false, py::arg("cuda_graph") = false,
          py::arg("static_capacity") = 0, py::arg("taps") = std::vector<std::string>{});

  m.def(
      "from_pretrained",
      [](const std::string& path, const std::optional<std::string>& strategy,
         const std::optional<std::string>& device_map, const std::optional<std::string>& max_memory,
         const std::optional<std::string>& offload_folder, const std::string& torch_dtype,
         const py::object& quantization_config, bool mmap, bool fast_activations, int prefetch_depth,
         const std::string& quantize_head, const std::string& quantize_embeddings) {
        PretrainedOptions o =
            pretrained_options(strategy, device_map, max_memory, offload_folder, torch_dtype, quantization_config, mmap);
        if (fast_activations && !is_gguf_file(path))
          throw ConfigError("fast_activations applies to GGUF files (their quantized layers); '" + path +
                            "' is not one");
        o.fast_activations = fast_activations;
        o.prefetch_depth = prefetch_depth;
        o.quantize_head = quantize_head;
        o.quantize_embeddings = quantize_embeddings;
        py::gil_scoped_release nogil;
        return from_pretrained(path, o);
      },
      py::arg("path"), py::arg("strategy"), py::arg("device_map"), py::arg("max_memory"), py::arg("offload_folder"),
      py::arg("torch_dtype"), py::arg("quantization_config"), py::arg("mmap"), py::arg("fast_activations") = false,
      py::arg("prefetch_depth") = 1, py::arg("quantize_head") = "none", py::arg("quantize_embeddings") = "none");

  m.def("knows_model_type", [](const std::string& model_type) { return find_architecture(model_type) != nullptr; },
        "Whether flexmodel has an architecture for this config.model_type");
  m.def(
      "adopt_weights",
      [](const std::string& config_json, const std::map<std::string, at::Tensor>& parameters,
         const std::map<std::string, at::Tensor>& buffers, const std::string& what) {
        const ModelConfig cfg = parse_config(nlohmann::json::parse(config_json), what + ".config");
        py::gil_scoped_release nogil;
        return adopt_weights(cfg, parameters, buffers, what);
      },
      py::arg("config_json"), py::arg("parameters"), py::arg("buffers"), py::arg("what"),
      "A causal LM of the config around the given tensors (their storage, no copy): flex/models/adopt_weights.h");
}

}  // namespace flex::python
