// Sparse dictionaries from Python: flexmodel._C.sae.SparseDictionary (a
// flex.Module whose hook points are SAELens's), the readers, splicing into a
// FlexModel, TransformerLens hook-name resolution, sparse codes, and the
// feature edits as Edit objects (the same C++ the CLI runs).
#include "bindings.h"

#include <flex/flexcore/flex_model.h>
#include <flex/hooks/errors.h>
#include <flex/models/auto_model.h>
#include <flex/sae/feature_edits.h>
#include <flex/sae/load_sae.h>
#include <flex/sae/sparse_code.h>
#include <flex/sae/splice.h>

#include <ATen/ATen.h>

namespace flex::python {

namespace {

SpliceMode splice_mode(const std::string& mode) {
  if (mode == "observe") return SpliceMode::Observe;
  if (mode == "replace") return SpliceMode::Replace;
  if (mode == "replace_with_error" || mode == "replace-with-error") return SpliceMode::ReplaceWithError;
  throw ConfigError("splice mode '" + mode + "' is not 'observe', 'replace' or 'replace_with_error'");
}

std::optional<at::ScalarType> dtype_or_none(const std::optional<std::string>& name) {
  if (!name) return std::nullopt;
  return parse_torch_dtype(*name);
}

py::dict config_dict(const SaeConfig& c) {
  py::dict d;
  d["architecture"] = c.class_name();
  d["d_in"] = c.d_in;
  d["d_sae"] = c.d_sae;
  d["d_out"] = c.d_out;
  d["dtype"] = std::string(c10::toString(c.dtype));
  d["apply_b_dec_to_input"] = c.apply_b_dec_to_input;
  d["k"] = c.top_k() ? py::cast(c.k) : py::none();
  d["hook_name"] = c.hook_name;
  d["hook_name_out"] = c.hook_name_out;
  d["model_name"] = c.model_name;
  d["transcoder"] = c.transcoder();
  d["source"] = c.source;
  d["metadata"] = py::module_::import("json").attr("loads")(c.metadata.dump());
  return d;
}

}  // namespace

void bind_sae(py::module_& m) {
  auto s = m.def_submodule("sae", "Sparse dictionaries (flex/sae)");
  py::class_<SparseDictionary, Module, std::shared_ptr<SparseDictionary>>(s, "SparseDictionary")
      .def_property_readonly("cfg", [](const SparseDictionary& d) { return config_dict(d.config()); })
      .def("encode", [](SparseDictionary& d, const at::Tensor& x) { return d.encode(x); }, py::arg("x"))
      .def("decode", [](SparseDictionary& d, const at::Tensor& f) { return d.decode(f); }, py::arg("feature_acts"))
      .def("forward", [](SparseDictionary& d, const at::Tensor& x) { at::Tensor y = d(x); return y; }, py::arg("x"))
      .def("__call__", [](SparseDictionary& d, const at::Tensor& x) { at::Tensor y = d(x); return y; }, py::arg("x"))
      .def_readwrite("use_error_term", &SparseDictionary::use_error_term);

  s.def(
      "load_sae", [](const std::string& path) { return load_sae(path); }, py::arg("path"),
      "A SAELens folder, a Gemma Scope params.npz, or a folder holding one");
  s.def(
      "load_saelens_sae",
      [](const std::string& dir, const std::optional<std::string>& dtype) { return load_saelens_sae(dir, dtype_or_none(dtype)); },
      py::arg("path"), py::arg("dtype") = py::none());
  s.def(
      "load_gemma_scope_sae",
      [](const std::string& path, const std::string& hook_name, const std::optional<std::string>& dtype) {
        GemmaScopeOptions o;
        o.hook_name = hook_name;
        if (dtype) o.dtype = parse_torch_dtype(*dtype);
        return load_gemma_scope_sae(path, o);
      },
      py::arg("path"), py::arg("hook_name") = "", py::arg("dtype") = py::none());

  py::class_<Splice>(s, "Splice")
      .def_readonly("module", &Splice::module)
      .def_property_readonly("sae", [](const Splice& sp) { return sp.sae; })
      .def("remove", &Splice::remove);
  s.def(
      "splice_sae",
      [](FlexModel& fm, std::shared_ptr<SparseDictionary> sae, const std::string& mode, const std::string& hook_name,
         const std::string& hook_name_out) {
        SpliceOptions o;
        o.mode = splice_mode(mode);
        o.hook_name = hook_name;
        o.hook_name_out = hook_name_out;
        return splice_sae(fm, std::move(sae), o);
      },
      py::arg("flex_model"), py::arg("sae"), py::arg("mode") = "replace", py::arg("hook_name") = "",
      py::arg("hook_name_out") = "");
  s.def(
      "resolve_hook_name",
      [](Module& model, const std::string& name) {
        const HookPointRef r = resolve_hook_name(model, name);
        return py::make_tuple(r.module, r.input, r.normalized);
      },
      py::arg("model"), py::arg("hook_name"));

  s.def(
      "sparse_code",
      [](const at::Tensor& acts) {
        const SparseCode c = sparse_code(acts);
        return py::make_tuple(c.indptr, c.indices, c.values);
      },
      py::arg("feature_acts"));
  s.def(
      "strongest_features",
      [](const at::Tensor& acts, int64_t width) {
        const StrongestFeatures f = strongest_features(sparse_code(acts), width);
        return py::make_tuple(f.indices, f.values, f.l0);
      },
      py::arg("feature_acts"), py::arg("width") = 0);

  s.def(
      "ablate_features",
      [](std::vector<int64_t> features, std::vector<int64_t> positions) { return Edit{ablate_features(features, positions)}; },
      py::arg("features"), py::arg("positions") = std::vector<int64_t>{});
  s.def(
      "clamp_feature",
      [](int64_t feature, double value, std::vector<int64_t> positions) { return Edit{clamp_feature(feature, value, positions)}; },
      py::arg("feature"), py::arg("value"), py::arg("positions") = std::vector<int64_t>{});
  s.def(
      "scale_feature",
      [](int64_t feature, double factor, std::vector<int64_t> positions) { return Edit{scale_feature(feature, factor, positions)}; },
      py::arg("feature"), py::arg("factor"), py::arg("positions") = std::vector<int64_t>{});
  s.def(
      "steer_feature",
      [](const SparseDictionary& sae, int64_t feature, double alpha, std::vector<int64_t> positions) {
        return Edit{steer_feature(sae, feature, alpha, positions)};
      },
      py::arg("sae"), py::arg("feature"), py::arg("alpha"), py::arg("positions") = std::vector<int64_t>{});
}

}  // namespace flex::python
