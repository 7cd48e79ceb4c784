// Activation datasets: capture_dataset (a corpus through a FlexModel into
// safetensors shards, written by a background thread) and reading them back
// (ActivationDataset, its shards and a batch loader), over flex/datasets.
#include "bindings.h"

#include <flex/datasets/activation_shards.h>
#include <flex/datasets/capture_dataset.h>
#include <flex/flexcore/flex_model.h>
#include <flex/hooks/errors.h>
#include <flex/models/auto_model.h>
#include <flex/models/causal_lm.h>
#include <flex/models/parallel_lm.h>
#include <flex/parallel/communicator.h>
#include <flex/tokenizers/tokenizer.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

namespace flex::python {

namespace {

py::dict sample_dict(const std::map<std::string, at::Tensor>& activations, const at::Tensor& token_ids,
                     const at::Tensor& document, const at::Tensor& position, const at::Tensor& context,
                     const at::Tensor& offset) {
  py::dict d;
  for (const auto& [hook, t] : activations) d[py::str(hook)] = t;
  d["token_ids"] = token_ids;
  d["document"] = document;
  d["position"] = position;
  d["context"] = context;
  d["offset"] = offset;
  return d;
}

const ModelConfig* config_of(Module& m) {
  if (auto* lm = dynamic_cast<CausalLM*>(&m)) return &lm->config();
  if (auto* p = dynamic_cast<ParallelCausalLM*>(&m)) return &p->config();
  return nullptr;
}

py::dict run_capture(FlexModel& fm, const std::optional<std::string>& tokenizer_dir, const std::string& corpus,
                     const std::optional<std::string>& text_field, int64_t context_len, int64_t batch_size,
                     int64_t max_contexts, const std::vector<std::string>& hooks, const std::string& out_dir,
                     const std::string& store_dtype, int64_t random_positions, uint64_t seed, bool exclude_bos,
                     uint64_t max_shard_bytes, const std::string& describe, const py::object& progress,
                     bool distributed) {
  DatasetCaptureOptions o;
  o.corpus.path = corpus;
  if (text_field) {
    o.corpus.text_field = *text_field;
    o.corpus.format = DatasetFormat::JsonLines;
  }
  o.corpus.context_len = context_len;
  o.corpus.batch_size = batch_size;
  o.corpus.max_contexts = max_contexts;
  o.hooks = hooks;
  o.out_dir = out_dir;
  o.dtype = parse_torch_dtype(store_dtype);
  o.random_positions = random_positions;
  o.seed = seed;
  o.exclude_bos = exclude_bos;
  o.max_shard_bytes = max_shard_bytes;
  o.describe = nlohmann::json::parse(describe);
  std::shared_ptr<const Tokenizer> tok;
  if (tokenizer_dir) tok = load_tokenizer(*tokenizer_dir);
  if (const ModelConfig* cfg = config_of(*fm.module())) {
    o.vocab_size = cfg->vocab_size;
    o.bos_id = tok && tok->bos_id() ? tok->bos_id() : cfg->bos_token_id;
  }
  if (!progress.is_none()) {
    o.on_progress = [progress](const DatasetCaptureProgress& p) {
      py::gil_scoped_acquire gil;
      py::dict d;
      d["contexts"] = p.contexts;
      d["contexts_total"] = p.contexts_total;
      d["tokens_run"] = p.tokens_run;
      d["tokens_stored"] = p.tokens_stored;
      d["seconds"] = p.seconds;
      d["corpus_fraction"] = p.corpus_fraction;
      progress(d);
    };
  }
  DatasetCaptureResult r;
  {
    py::gil_scoped_release nogil;
    r = capture_dataset(fm, tok, o, distributed ? make_world_communicator().get() : nullptr);
  }
  py::dict d;
  d["resumed_at"] = r.resumed_at;
  d["contexts"] = r.contexts;
  d["tokens_run"] = r.tokens_run;
  d["tokens_stored"] = r.tokens_stored;
  d["bytes_written"] = r.bytes_written;
  d["tokens_dropped"] = r.tokens_dropped;
  d["seconds"] = r.seconds;
  return d;
}

}  // namespace

void bind_datasets(py::module_& m) {
  m.def("capture_dataset", &run_capture, py::arg("flex_model"), py::arg("tokenizer_dir"), py::arg("corpus"),
        py::arg("text_field"), py::arg("context_len"), py::arg("batch_size"), py::arg("max_contexts"),
        py::arg("hooks"), py::arg("out_dir"), py::arg("store_dtype"), py::arg("random_positions"), py::arg("seed"),
        py::arg("exclude_bos"), py::arg("max_shard_bytes"), py::arg("describe"), py::arg("progress"),
        py::arg("distributed"));

  py::class_<ActivationLoader>(m, "ActivationLoader").def("next", [](ActivationLoader& loader) -> py::object {
    std::optional<ActivationSample> s;
    {
      py::gil_scoped_release nogil;
      s = loader.next();
    }
    if (!s) return py::none();
    return sample_dict(s->activations, s->token_ids, s->document, s->position, s->context, s->offset);
  });

  // The loader keeps a pointer to its dataset: keep_alive ties their lifetimes.
  py::class_<ActivationDataset, std::shared_ptr<ActivationDataset>>(m, "ActivationDataset")
      .def(py::init<const std::string&>())
      .def_property_readonly("settings_json", [](const ActivationDataset& d) { return d.settings().dump(); })
      .def_property_readonly("hooks", &ActivationDataset::hooks)
      .def_property_readonly("num_shards", &ActivationDataset::num_shards)
      .def_property_readonly("num_tokens", &ActivationDataset::num_tokens)
      .def_property_readonly("num_contexts", &ActivationDataset::num_contexts)
      .def("shard",
           [](const ActivationDataset& d, size_t i) {
             if (i >= d.num_shards())
               throw NotFoundError("shard " + std::to_string(i) + " of a dataset of " + std::to_string(d.num_shards()));
             const ActivationShard s = d.shard(i);
             return sample_dict(s.activations, s.token_ids, s.document, s.position, s.context, s.offset);
           })
      .def(
          "loader",
          [](const ActivationDataset& d, int64_t batch_tokens, bool shuffle, int64_t shuffle_window, uint64_t seed,
             const std::vector<std::string>& hooks, bool keep_last) {
            ActivationLoaderOptions o;
            o.batch_tokens = batch_tokens;
            o.shuffle = shuffle;
            o.shuffle_window = shuffle_window;
            o.seed = seed;
            o.hooks = hooks;
            o.keep_last = keep_last;
            return d.loader(o);
          },
          py::keep_alive<0, 1>(), py::arg("batch_tokens"), py::arg("shuffle"), py::arg("shuffle_window"),
          py::arg("seed"), py::arg("hooks"), py::arg("keep_last"));
}

}  // namespace flex::python
