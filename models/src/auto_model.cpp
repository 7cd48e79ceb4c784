#include <flex/dispatch/checkpoint.h>
#include <flex/hooks/empty_init.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/shape_text.h>
#include <flex/models/architecture.h>
#include <flex/models/auto_model.h>
#include <flex/models/model_checkpoint.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <set>

namespace flex {

namespace {
std::string join(const std::vector<std::string>& v, size_t limit) {
  std::string out;
  for (size_t i = 0; i < v.size() && i < limit; ++i) out += (i ? ", " : "") + std::string("'") + v[i] + "'";
  if (v.size() > limit) out += ", ... (" + std::to_string(v.size()) + " in all)";
  return out;
}
}  // namespace

std::shared_ptr<CausalLM> build_causal_lm(const ModelConfig& cfg, const at::TensorOptions& opts) {
  const Architecture& arch = architecture(cfg);
  std::shared_ptr<CausalLM> m;
  switch (arch.family) {
    case ArchFamily::GPT2: m = std::make_shared<GPT2LMHeadModel>(cfg, opts); break;
    case ArchFamily::GPTNeoX: m = std::make_shared<GPTNeoXForCausalLM>(cfg, opts); break;
    case ArchFamily::Decoder: m = std::make_shared<DecoderForCausalLM>(*arch.decoder, cfg, opts); break;
  }
  m->eval();  // dropout off unless the caller asks for train()
  return m;
}

at::ScalarType parse_torch_dtype(const std::string& name) {
  std::string n = name.rfind("torch.", 0) == 0 ? name.substr(6) : name;
  if (n == "float32" || n == "float" || n == "fp32") return at::kFloat;
  if (n == "bfloat16" || n == "bf16") return at::kBFloat16;
  if (n == "float16" || n == "half" || n == "fp16") return at::kHalf;
  if (n == "float64" || n == "double") return at::kDouble;
  throw ConfigError("torch_dtype '" + name + "' is not supported (float32, bfloat16, float16, float64, auto)");
}

at::ScalarType resolve_dtype(const ModelConfig& cfg, const Checkpoint& ckpt, const LoadOptions& opts) {
  if (!opts.dtype_auto) return opts.dtype.value_or(at::kFloat);
  if (!cfg.torch_dtype.empty()) {
    try {
      return parse_torch_dtype(cfg.torch_dtype);
    } catch (const ConfigError&) {
      throw ConfigError(cfg.source + ": field 'torch_dtype' is '" + cfg.torch_dtype + "', which is not supported");
    }
  }
  // Transformers: the first floating tensor of the (first shard's) state dict.
  for (const auto& file : ckpt.files())
    for (const auto& key : ckpt.keys_in(file))
      if (at::isFloatingType(ckpt.dtype(key))) return ckpt.dtype(key);
  return at::kFloat;
}

LoadReport load_weights(CausalLM& model, const Checkpoint& ckpt, const LoadOptions& opts) {
  LoadReport report;
  report.dtype = resolve_dtype(model.config(), ckpt, opts);
  const std::string prefix = model.base_model_prefix() + ".";
  std::set<std::string> tied_out;
  for (const auto& group : model.tied_parameters())
    for (const auto& name : group)
      if (name.rfind(prefix, 0) != 0) tied_out.insert(name);  // the head's side of the tie

  std::set<std::string> used;
  std::vector<std::string> missing;
  for (const auto& [name, current] : state_dict(model)) {
    std::string key = name;
    if (!ckpt.contains(key) && name.rfind(prefix, 0) == 0 && ckpt.contains(name.substr(prefix.size())))
      key = name.substr(prefix.size());  // checkpoints saved from the base model
    if (!ckpt.contains(key)) {
      if (!tied_out.count(name)) missing.push_back(name);
      continue;
    }
    const std::vector<int64_t> shape = ckpt.shape(key);
    if (at::IntArrayRef(shape) != current.sizes())
      throw ShapeError("checkpoint " + ckpt.file_of(key) + ": tensor '" + key + "' has shape " + shape_text(shape) +
                       " but " + model.class_name() + " expects " + shape_text(current.sizes()) + " for '" + name + "'");
    at::Tensor t = ckpt.get(key);
    if (at::isFloatingType(t.scalar_type()) && t.scalar_type() != report.dtype) t = t.to(report.dtype);
    if (t.device() != opts.device) t = t.to(opts.device);
    set_module_tensor(model, name, t);
    used.insert(key);
    report.loaded.push_back(name);
  }
  if (!missing.empty())
    throw NotFoundError("checkpoint " + ckpt.source() + " lacks " + std::to_string(missing.size()) + " tensor(s) that " +
                        model.class_name() + " needs: " + join(missing, 8));
  for (const auto& key : ckpt.keys())
    if (!used.count(key)) report.unexpected.push_back(key);
  model.tie_weights();
  model.reset_computed_buffers(opts.device);
  for (const auto& [name, t] : state_dict(model))
    if (t.is_meta())
      throw NotFoundError("after loading " + ckpt.source() + ", '" + name + "' is still on the meta device");
  return report;
}

LoadReport load_weights(CausalLM& model, const std::string& checkpoint_path, const LoadOptions& opts) {
  // Read through the architecture's view (renamed keys, dequantized tensors), as load_pretrained does.
  const Checkpoint stored = Checkpoint::open(checkpoint_path);
  return load_weights(model, stored.with_view(model_checkpoint_view(model.config(), stored)), opts);
}

std::shared_ptr<CausalLM> load_pretrained(const std::string& dir, const LoadOptions& opts) {
  ModelConfig cfg = load_config(dir);
  Checkpoint ckpt = open_model_checkpoint(dir, cfg);
  const at::ScalarType dtype = resolve_dtype(cfg, ckpt, opts);
  const auto topts = at::TensorOptions().dtype(dtype).device(opts.device);
  std::shared_ptr<CausalLM> model;
  if (opts.empty_init) {
    EmptyInit scope;
    model = build_causal_lm(cfg, topts);
  } else {
    model = build_causal_lm(cfg, topts);
  }
  LoadOptions resolved = opts;
  resolved.dtype = dtype;
  resolved.dtype_auto = false;
  load_weights(*model, ckpt, resolved);
  model->eval();
  return model;
}

std::shared_ptr<CausalLM> load_pretrained(const std::string& dir, at::ScalarType dtype) {
  LoadOptions o;
  o.dtype = dtype;
  return load_pretrained(dir, o);
}

std::shared_ptr<CausalLM> load_pretrained(const std::string& dir, const std::string& torch_dtype) {
  LoadOptions o;
  if (torch_dtype == "auto")
    o.dtype_auto = true;
  else
    o.dtype = parse_torch_dtype(torch_dtype);
  return load_pretrained(dir, o);
}

}  // namespace flex
