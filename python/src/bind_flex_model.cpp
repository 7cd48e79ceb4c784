// FlexModel over the C++ engine: hooks by module name whose editing
// functions may be Python callables (GIL taken only inside them), hook
// groups, the forward returning the logits and this forward's captures, and
// the built-in edits (steer, ablate, patch, expert routing) as opaque Edit
// objects so the CLI and Python share one implementation.
#include "bindings.h"

#include <flex/datasets/batch_runner.h>
#include <flex/flexcore/activation_edits.h>
#include <flex/flexcore/flex_model.h>
#include <flex/flexcore/routing_edits.h>
#include <flex/hooks/errors.h>
#include <flex/models/causal_lm.h>
#include <flex/models/parallel_lm.h>
#include <flex/parallel/device_mesh.h>

#include <ATen/ATen.h>

#include <regex>

namespace flex::python {

namespace {

HookType hook_type(const std::string& t) {
  if (t == "forward") return HookType::Forward;
  if (t == "forward_pre") return HookType::ForwardPre;
  if (t == "full_backward") return HookType::FullBackward;
  if (t == "full_backward_pre") return HookType::FullBackwardPre;
  if (t == "tensor") return HookType::Tensor;
  throw ConfigError("unknown hook type '" + t + "' (forward, forward_pre, full_backward, full_backward_pre, tensor)");
}

// HookFunction options from Python's arguments: expected_shape (None: no
// check; -1 or None entries are wildcards), an editing function that is a
// Python callable, a built-in Edit, or None.
HookFunctionOptions hook_options(const std::string& what, const py::object& expected_shape,
                                 const py::object& editing_function, size_t unpack_idx, bool save,
                                 bool save_after_edit) {
  HookFunctionOptions o;
  if (!expected_shape.is_none()) {
    for (const auto& d : expected_shape)
      o.expected_shape.push_back(d.is_none() ? kAnyDim : d.cast<int64_t>());
  }
  if (py::isinstance<Edit>(editing_function)) {
    o.editing_function = editing_function.cast<const Edit&>().fn;
  } else if (!editing_function.is_none()) {
    if (!PyCallable_Check(editing_function.ptr()))
      throw ConfigError(what + ": editing_function must be callable, got a " +
                        std::string(py::str(py::type::of(editing_function).attr("__name__"))));
    o.editing_function = python_editing_function(editing_function, what);
  }
  o.unpack_idx = unpack_idx;
  o.save = save;
  o.save_after_edit = save_after_edit;
  return o;
}

// This forward's captures as {key: [tensor per call]}, then emptied.
py::dict take_captures(FlexModel& fm) {
  py::dict out;
  for (auto& [key, tensors] : fm.output()) out[py::str(key)] = py::cast(tensors);
  fm.clear();
  return out;
}

Value run(FlexModel& fm, const at::Tensor& input_ids, const std::optional<at::Tensor>& attention_mask,
          const std::vector<std::string>& groups, bool complement) {
  Inputs in;
  const auto& model = fm.module();
  if (std::dynamic_pointer_cast<CausalLM>(model) || std::dynamic_pointer_cast<ParallelCausalLM>(model)) {
    LMInputs lm;
    lm.input_ids = input_ids;
    if (attention_mask) lm.attention_mask = *attention_mask;
    in = BatchRunner(fm).place(std::move(lm)).to_inputs();  // where the model takes its inputs
  } else {
    in.args.emplace_back(input_ids);
  }
  return fm.forward(std::move(in), groups, complement);
}

}  // namespace

void bind_flex_model(py::module_& m) {
  py::class_<HookHandle>(m, "HookHandle").def("remove", &HookHandle::remove);

  py::class_<HookFunction, std::shared_ptr<HookFunction>>(m, "HookFunction")
      .def_property_readonly("module_name", &HookFunction::module_name)
      .def_property_readonly("hook_type", [](const HookFunction& h) { return std::string(hook_type_name(h.type())); })
      .def("describe", &HookFunction::describe)
      .def_property_readonly("key", [](const HookFunction& h) { return reinterpret_cast<uintptr_t>(&h); });

  py::class_<Edit>(m, "Edit", "A built-in editing function (steer, ablate, patch, expert routing)");
  auto edits = m.def_submodule("edits", "Built-in editing functions (flex/flexcore/activation_edits.h, routing_edits.h)");
  edits.def("add_vector", [](const at::Tensor& v, double alpha) { return Edit{add_vector(v, alpha)}; });
  edits.def("zero_activation", [] { return Edit{zero_activation()}; });
  edits.def("zero_head", [](int64_t head) { return Edit{zero_head(head)}; });
  edits.def("head_hook_point", [](Module& model, const std::string& attention) { return head_hook_point(model, attention); });
  edits.def(
      "patch_positions", [](const at::Tensor& p, bool cached) { return Edit{patch_positions(p, cached)}; },
      py::arg("patch"), py::arg("cached") = false);
  edits.def(
      "force_experts",
      [](std::vector<int64_t> experts, std::vector<int64_t> tokens) { return Edit{force_experts(experts, tokens)}; },
      py::arg("experts"), py::arg("tokens") = std::vector<int64_t>{});
  edits.def("ban_experts", [](std::vector<int64_t> experts) { return Edit{ban_experts(experts)}; });
  edits.def("scale_output", [](double factor) { return Edit{scale_output(factor)}; });

  py::class_<FlexModel, std::shared_ptr<FlexModel>>(m, "FlexModel")
      .def(py::init([](std::shared_ptr<Module> module) { return std::make_shared<FlexModel>(std::move(module)); }))
      .def(
          "register",
          [](FlexModel& fm, const std::string& module_name, const std::string& type, const py::object& expected_shape,
             const py::object& editing_function, size_t unpack_idx, bool save, bool save_after_edit) {
            const HookType t = hook_type(type);
            const std::string what = std::string(hook_type_name(t)) + " hook on '" + module_name + "'";
            auto hook = std::make_shared<HookFunction>(
                module_name, hook_options(what, expected_shape, editing_function, unpack_idx, save, save_after_edit));
            HookHandle handle = fm.register_hook_function(hook, t);
            return std::make_pair(hook, std::move(handle));
          },
          py::arg("module_name"), py::arg("type") = "forward", py::arg("expected_shape") = py::none(),
          py::arg("editing_function") = py::none(), py::arg("unpack_idx") = 0, py::arg("save") = true,
          py::arg("save_after_edit") = false)
      .def(
          "create_hook_group",
          [](FlexModel& fm, const std::string& group, const std::string& pattern, bool regex, const std::string& type,
             const py::object& expected_shape, const py::object& editing_function, size_t unpack_idx, bool save) {
            const HookType t = hook_type(type);
            const HookFunctionOptions o = hook_options("hook group '" + group + "'", expected_shape, editing_function,
                                                       unpack_idx, save, false);
            return regex ? fm.create_hook_group(group, std::regex(pattern), o, t)
                         : fm.create_hook_group(group, pattern, o, t);
          },
          py::arg("group"), py::arg("pattern"), py::arg("regex") = false, py::arg("type") = "forward",
          py::arg("expected_shape") = py::none(), py::arg("editing_function") = py::none(), py::arg("unpack_idx") = 0,
          py::arg("save") = true)
      .def("update_hook_groups",
           py::overload_cast<const std::vector<HookFunctionPtr>&, const std::string&>(&FlexModel::update_hook_groups))
      .def("update_hook_groups_matching",
           py::overload_cast<const std::string&, const std::string&>(&FlexModel::update_hook_groups))
      .def("remove_hook_groups",
           py::overload_cast<const std::vector<HookFunctionPtr>&, const std::string&>(&FlexModel::remove_hook_groups))
      .def("remove_hook_groups_matching",
           py::overload_cast<const std::string&, const std::string&>(&FlexModel::remove_hook_groups))
      .def("get_hook_function_groups", &FlexModel::get_hook_function_groups)
      .def("get_group_hook_functions", &FlexModel::get_group_hook_functions)
      .def("hook_functions", &FlexModel::hook_functions)
      .def(
          "forward",
          [](FlexModel& fm, const at::Tensor& input_ids, const std::optional<at::Tensor>& attention_mask,
             const std::vector<std::string>& groups, bool complement) {
            at::Tensor logits;
            {
              py::gil_scoped_release nogil;
              const Value out = run(fm, input_ids, attention_mask, groups, complement);
              logits = out.isTensor() ? out.toTensor() : find_first_tensor(out);
            }
            return std::make_pair(logits, take_captures(fm));
          },
          py::arg("input_ids"), py::arg("attention_mask") = py::none(), py::arg("groups") = std::vector<std::string>{"all"},
          py::arg("complement") = false)
      .def("take_captures", &take_captures, "Captures made since the last forward (e.g. by generate), then emptied")
      .def("clear", &FlexModel::clear, "Drops the captures not taken yet")
      .def("set_capture_by_reference", &FlexModel::set_capture_by_reference)
      .def(
          "set_mesh",
          [](FlexModel& fm, const DeviceMesh& mesh, const std::shared_ptr<ParallelCausalLM>& model) {
            py::gil_scoped_release nogil;  // collective (trainable modules are made equal)
            fm.set_mesh(mesh, model->layout());
          },
          py::arg("mesh"), py::arg("model"))
      .def("wrapped_module_requires_grad", &FlexModel::wrapped_module_requires_grad)
      .def("get_module_parameter", &FlexModel::get_module_parameter, py::arg("name"),
           py::arg("expected_shape") = std::vector<int64_t>{})
      .def("wrapped_module_names", &FlexModel::wrapped_module_names)
      .def_property_readonly("forward_count", &FlexModel::forward_count)
      .def_property_readonly("module", [](FlexModel& fm) { return module_to_py(*fm.module()); })
      .def("restore", [](FlexModel& fm) { return module_to_py(*fm.restore()); });
}

}  // namespace flex::python
