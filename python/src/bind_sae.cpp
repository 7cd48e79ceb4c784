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
#include <flex/sae/model_source.h>
#include <flex/tokenizers/tokenizer.h>
#include <flex/sae/sparse_code.h>
#include <flex/sae/splice.h>
#include <flex/sae/trainer.h>

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
  s.def("transformer_lens_names", [](Module& model) { return transformer_lens_names(model); }, py::arg("model"),
        "Every TransformerLens hook name the model has a place for (flex/sae/tl_hook_names.h)");

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
      "train_sae",
      [](const std::string& activations, const std::string& hook, const std::string& architecture, int64_t d_sae,
         const std::string& out, const std::string& transcoder_out, bool skip, std::optional<double> k,
         std::optional<double> l1, std::optional<double> l0_coefficient, double lr, int64_t batch_tokens,
         int64_t total_tokens, uint64_t seed, bool bf16, int64_t checkpoint_every, int64_t eval_tokens,
         bool normalize, int64_t dead_feature_window, std::shared_ptr<Module> model, const std::string& dataset,
         int64_t context_len, int64_t batch_size, int64_t buffer_tokens, const std::string& text_field,
         const std::string& tokenizer, const std::string& from_pretrained) {
        SaeTrainRunOptions o;
        SaeTrainingOptions& t = o.sae;
        t.architecture = parse_train_architecture(architecture);
        t.d_sae = d_sae;
        if (k) t.k = *k;
        if (l1) t.l1_coefficient = *l1;
        if (l0_coefficient) t.l0_coefficient = *l0_coefficient;
        t.lr = lr;
        t.seed = seed;
        t.bf16_encoder = bf16;
        t.transcoder = !transcoder_out.empty();
        t.skip_connection = skip;
        t.normalize_activations = normalize;
        t.dead_feature_window = dead_feature_window;
        t.hook_name = hook;
        t.hook_name_out = transcoder_out;
        o.out_dir = out;
        o.batch_tokens = batch_tokens;
        o.total_tokens = total_tokens;
        o.checkpoint_every_tokens = checkpoint_every;
        o.eval_tokens = eval_tokens;
        o.init_tokens = std::max<int64_t>(batch_tokens, 16384);
        o.from_pretrained = from_pretrained;
        std::unique_ptr<ActivationSource> source;
        std::shared_ptr<CausalLM> lm;
        at::Tensor held_ids;
        if (model) {
          lm = std::dynamic_pointer_cast<CausalLM>(model);
          if (!lm) throw ConfigError("train_sae: model must be a causal LM from flexmodel.from_pretrained");
          ModelSourceOptions mo;
          mo.dataset = dataset;
          mo.text_field = text_field;
          mo.context_len = context_len;
          mo.batch_size = batch_size;
          mo.buffer_tokens = buffer_tokens;
          mo.held_out_tokens = eval_tokens;
          mo.hook = hook;
          mo.hook_out = transcoder_out;
          mo.seed = seed;
          mo.model_dir = tokenizer;
          std::shared_ptr<const Tokenizer> tok;
          if (!tokenizer.empty()) tok = load_tokenizer(tokenizer);
          t.context_size = context_len;
          // cfg.json's metadata.hook_name as SAELens and Neuronpedia look it up (as flexmodel train-sae writes it).
          for (auto [name, given] : {std::pair<std::string*, std::string>{&t.hook_name, hook},
                                     std::pair<std::string*, std::string>{&t.hook_name_out, transcoder_out}})
            if (!given.empty())
              if (const std::string tl = transformer_lens_name_of(*lm, given); !tl.empty()) *name = tl;
          source = model_source(lm, tok, mo, &held_ids);
        } else {
          source = shard_source(activations, hook, transcoder_out, eval_tokens, seed);
        }
        SaeTrainResult r;
        {
          py::gil_scoped_release release;
          r = train_sae(*source, o);
        }
        py::dict d;
        if (lm && held_ids.defined() && held_ids.numel() > 0) {
          const NextTokenLosses l = next_token_losses(lm, held_ids, r.dictionary, hook, transcoder_out);
          d["next_token_loss_clean"] = l.clean;
          d["next_token_loss_with_sae"] = l.with_sae;
          d["next_token_loss_zeroed"] = l.zeroed;
          d["ce_loss_recovered"] = l.recovered();
          d["held_out_ids"] = held_ids;
        }
        d["steps"] = r.steps;
        d["tokens"] = r.tokens;
        d["resumed_from_step"] = r.resumed_from_step;
        d["tokens_per_second"] = r.tokens_per_second;
        d["explained_variance"] = r.eval.explained_variance;
        d["mse"] = r.eval.mse;
        d["l0"] = r.eval.l0;
        d["dead_latents"] = r.eval.dead_latents;
        d["dense_latents"] = r.eval.dense_latents;
        d["eval_tokens"] = r.eval.tokens;
        d["sae"] = r.dictionary;
        return d;
      },
      py::arg("activations"), py::arg("hook"), py::arg("architecture"), py::arg("d_sae"), py::arg("out"),
      py::arg("transcoder_out") = "", py::arg("skip") = false, py::arg("k") = py::none(), py::arg("l1") = py::none(),
      py::arg("l0_coefficient") = py::none(), py::arg("lr") = 3e-4, py::arg("batch_tokens") = 4096,
      py::arg("total_tokens"), py::arg("seed") = 0, py::arg("bf16") = false, py::arg("checkpoint_every") = 0,
      py::arg("eval_tokens") = 8192, py::arg("normalize") = true, py::arg("dead_feature_window") = 1000,
      py::arg("model") = nullptr, py::arg("dataset") = "", py::arg("context_len") = 128, py::arg("batch_size") = 8,
      py::arg("buffer_tokens") = 65536, py::arg("text_field") = "", py::arg("tokenizer") = "",
      py::arg("from_pretrained") = "");

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
