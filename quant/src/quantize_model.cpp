// Planning, quantizing and loading quantized layers (quantize_model.h).
#include <flex/dispatch/atomic_file.h>
#include <flex/dispatch/big_modeling.h>
#include <flex/dispatch/checkpoint.h>
#include <flex/dispatch/safetensors.h>
#include <flex/hooks/errors.h>
#include <flex/quant/quantize_model.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <map>
#include <set>
#include <sstream>

namespace flex {

namespace {

// Accelerate's rule: the layer itself, or any layer whose dotted name holds
// "p." (so "mlp" matches every layer of every MLP); also a name ending in ".p".
bool matches(const std::string& name, const std::string& p) {
  if (p.empty()) return false;
  if (name == p || name.find(p + ".") != std::string::npos) return true;
  return name.size() > p.size() && name.compare(name.size() - p.size(), p.size(), p) == 0 &&
         name[name.size() - p.size() - 1] == '.';
}

DenseLayer& dense_at(Module& model, const std::string& name) {
  auto m = model.get_submodule(name);
  auto* d = dynamic_cast<DenseLayer*>(m.get());
  if (!d) throw ConfigError("'" + name + "' is a " + m->class_name() + ", not a Linear or Conv1D layer to quantize");
  return *d;
}

at::Tensor meta(std::vector<int64_t> shape, at::ScalarType t) {
  return at::empty(shape, at::TensorOptions().dtype(t).device(at::kMeta));
}

// A 4-bit layer's tensors on meta for quant state `w` (shape, block size,
// type, dtype; double-quantized when `nested`), its packed JSON taking
// `state_bytes` (0: as long as this state's JSON).
void plan_four_bit(DenseLayer& layer, FourBitWeight w, bool nested, int64_t state_bytes, at::ScalarType compute) {
  const int64_t n = layer.out_features * layer.in_features, blocks = (n + w.blocksize - 1) / w.blocksize;
  w.absmax = meta({blocks}, nested ? at::kByte : at::kFloat);
  std::vector<std::pair<std::string, at::Tensor>> t{{"weight_absmax", w.absmax},
                                                     {"weight_quant_map", meta({16}, at::kFloat)}};
  if (nested) {
    w.nested_absmax = meta({(blocks + 255) / 256}, at::kFloat);
    w.nested_code = meta({256}, at::kFloat);
    t.emplace_back("weight_nested_absmax", w.nested_absmax);
    t.emplace_back("weight_nested_quant_map", w.nested_code);
  }
  if (state_bytes == 0) state_bytes = static_cast<int64_t>(quant_state_json(w).size());
  t.emplace_back("weight_quant_state", meta({state_bytes}, at::kByte));
  layer.set_weight_format(std::make_shared<FourBitFormat>(w, compute), meta({(n + 1) / 2, 1}, at::kByte), t);
}

// The quantized tensors' shapes on meta, and the format (its scalars as a
// fresh quantization of an [out, in] weight of `dtype` would have them).
void plan_layer(DenseLayer& layer, const BnbQuantizationConfig& cfg, at::ScalarType dtype) {
  const int64_t out = layer.out_features, in = layer.in_features;
  if (cfg.load_in_8bit) {
    layer.set_weight_format(std::make_shared<Int8Format>(cfg.llm_int8_threshold), meta({out, in}, at::kChar),
                            {{"SCB", meta({out}, at::kFloat)}, {"weight_format", meta({}, at::kByte)}});
    return;
  }
  FourBitWeight w;
  w.type = four_bit_type(cfg.bnb_4bit_quant_type);
  w.shape = {out, in};
  w.dtype = dtype;
  plan_four_bit(layer, w, cfg.bnb_4bit_use_double_quant, 0, cfg.bnb_4bit_compute_dtype);
}

// The layer's quantized tensors from its full-precision [out, in] weight;
// the layer's format takes the new quant state.
std::vector<std::pair<std::string, at::Tensor>> quantize_into(DenseLayer& layer, const BnbQuantizationConfig& cfg,
                                                              const at::Tensor& w) {
  if (cfg.load_in_8bit) return int8_tensors(w);
  FourBitWeight q = quantize_4bit(w, four_bit_type(cfg.bnb_4bit_quant_type), cfg.bnb_4bit_use_double_quant);
  layer.reset_weight_format(std::make_shared<FourBitFormat>(q, cfg.bnb_4bit_compute_dtype));
  return four_bit_tensors(q);
}

at::ScalarType dtype_name_to_type(const nlohmann::json& v, const std::string& where) {
  if (v.is_null()) return at::kFloat;
  std::string s = v.get<std::string>();
  if (s.rfind("torch.", 0) == 0) s = s.substr(6);
  if (s == "float32") return at::kFloat;
  if (s == "float16") return at::kHalf;
  if (s == "bfloat16") return at::kBFloat16;
  throw ConfigError(where + ": unsupported bnb_4bit_compute_dtype '" + s + "'");
}

}  // namespace

std::vector<std::string> layers_to_quantize(Module& model, const BnbQuantizationConfig& cfg,
                                            const std::vector<std::string>& default_skip) {
  cfg.validate();
  const std::vector<std::string>& skip = cfg.skip_modules ? *cfg.skip_modules : default_skip;
  std::vector<std::string> out;
  for (const auto& [name, m] : model.named_flex_modules()) {
    if (!dynamic_cast<DenseLayer*>(m.get())) continue;
    bool skipped = false;
    for (const auto& p : skip) skipped = skipped || matches(name, p);
    for (const auto& p : cfg.keep_in_fp32_modules) skipped = skipped || matches(name, p);
    if (!skipped) out.push_back(name);
  }
  return out;
}

void replace_with_bnb_layers(Module& model, const BnbQuantizationConfig& cfg, const std::vector<std::string>& layers) {
  cfg.validate();
  for (const auto& name : layers) {
    DenseLayer& layer = dense_at(model, name);
    plan_layer(layer, cfg, cfg.torch_dtype.value_or(layer.weight.scalar_type()));
  }
}

void quantize_model(Module& model, const BnbQuantizationConfig& cfg, const std::vector<std::string>& layers) {
  cfg.validate();
  at::NoGradGuard no_grad;
  for (const auto& name : layers) {
    DenseLayer& layer = dense_at(model, name);
    if (layer.weight_format()) continue;  // quantized already
    if (layer.weight.is_meta())
      throw ConfigError("'" + name + "' has no weights loaded (meta): load the model or pass weights_location");
    const at::Tensor w = weight_out_in(layer).detach();
    const c10::Device device = w.device();
    plan_layer(layer, cfg, w.scalar_type());
    for (auto& [local, t] : quantize_into(layer, cfg, w)) layer.set_tensor(local, t.to(device));
    if (layer.bias.defined() && cfg.load_in_4bit) layer.set_tensor("bias", layer.bias.to(cfg.bnb_4bit_compute_dtype));
  }
}

decltype(LoadCheckpointOptions::transform) quantizing_transform(Module& model, const BnbQuantizationConfig& cfg,
                                                                const std::vector<std::string>& layers,
                                                                at::ScalarType weight_dtype) {
  std::map<std::string, DenseLayer*> by_weight;
  for (const auto& name : layers) by_weight[name + ".weight"] = &dense_at(model, name);
  return [by_weight, cfg, weight_dtype](const std::string& key, const std::function<at::Tensor()>& read)
             -> std::optional<std::vector<std::pair<std::string, at::Tensor>>> {
    auto it = by_weight.find(key);
    if (it == by_weight.end()) return std::nullopt;
    DenseLayer& layer = *it->second;
    at::Tensor w = read().to(weight_dtype);
    const bool conv = dynamic_cast<Conv1D*>(&layer) != nullptr;
    const std::vector<int64_t> expect = conv ? std::vector<int64_t>{layer.in_features, layer.out_features}
                                             : std::vector<int64_t>{layer.out_features, layer.in_features};
    if (w.sizes() != at::IntArrayRef(expect)) {
      std::ostringstream os;
      os << "checkpoint tensor '" << key << "' has shape " << w.sizes() << " but the model expects "
         << at::IntArrayRef(expect);
      throw ShapeError(os.str());
    }
    if (conv) w = w.t();
    at::NoGradGuard no_grad;
    auto produced = quantize_into(layer, cfg, w.contiguous());
    const std::string prefix = key.substr(0, key.size() - std::string("weight").size());
    for (auto& p : produced) p.first = prefix + p.first;
    return produced;
  };
}

BnbQuantizationConfig bnb_config_from_json(const nlohmann::json& q, const std::string& where) {
  if (!q.is_object()) throw ConfigError(where + ": expected a JSON object, got " + std::string(q.type_name()));
  BnbQuantizationConfig c;
  try {
    c.load_in_8bit = q.value("load_in_8bit", false);
    c.load_in_4bit = q.value("load_in_4bit", false);
    if (q.contains("llm_int8_threshold") && !q["llm_int8_threshold"].is_null())
      c.llm_int8_threshold = q["llm_int8_threshold"].get<double>();
    if (q.contains("bnb_4bit_quant_type") && !q["bnb_4bit_quant_type"].is_null())
      c.bnb_4bit_quant_type = q["bnb_4bit_quant_type"].get<std::string>();
    c.bnb_4bit_use_double_quant = q.value("bnb_4bit_use_double_quant", false);
    c.bnb_4bit_compute_dtype =
        dtype_name_to_type(q.contains("bnb_4bit_compute_dtype") ? q["bnb_4bit_compute_dtype"] : nlohmann::json(), where);
    if (q.contains("llm_int8_skip_modules") && !q["llm_int8_skip_modules"].is_null())
      c.skip_modules = q["llm_int8_skip_modules"].get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(where + ": " + e.what());
  }
  return c;
}

std::optional<BnbCheckpoint> read_bnb_checkpoint(const std::string& dir, const CheckpointView* view) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(path + ": " + e.what());
  }
  if (!j.contains("quantization_config") || !j["quantization_config"].is_object()) return std::nullopt;
  const auto& q = j["quantization_config"];
  const std::string where = path + ": quantization_config";
  // FP8 blocks and MXFP4 are dequantized while the checkpoint is read
  // (stored_formats.h); the model has no quantized layers from them.
  const std::string method = q.value("quant_method", std::string());
  if (method == "fp8" || method == "mxfp4") return std::nullopt;
  if (method != "bitsandbytes")
    throw ConfigError(where + ": quant_method '" + q.value("quant_method", std::string("?")) +
                      "' is not supported (bitsandbytes; fp8 and mxfp4 are dequantized at load)");
  BnbCheckpoint b;
  b.config = bnb_config_from_json(q, where);
  if (q.value("llm_int8_has_fp16_weight", false))
    throw ConfigError(where + ": llm_int8_has_fp16_weight checkpoints hold fp16 weights; load them unquantized");
  if (q.contains("bnb_4bit_quant_storage") && q["bnb_4bit_quant_storage"].is_string() &&
      q["bnb_4bit_quant_storage"].get<std::string>() != "uint8")
    throw ConfigError(where + ": bnb_4bit_quant_storage '" + q["bnb_4bit_quant_storage"].get<std::string>() +
                      "' is not supported (uint8 only)");
  b.config.validate();
  Checkpoint ck = Checkpoint::open(dir);
  if (view) ck = ck.with_view(*view);
  const std::string qs = ".weight.quant_state.bitsandbytes__";
  for (const auto& key : ck.keys()) {
    if (b.config.load_in_8bit && key.size() > 4 && key.compare(key.size() - 4, 4, ".SCB") == 0)
      b.layers.push_back(key.substr(0, key.size() - 4));
    const size_t at = key.find(qs);
    if (b.config.load_in_4bit && at != std::string::npos) b.layers.push_back(key.substr(0, at));
  }
  if (b.layers.empty()) throw ConfigError(dir + ": config.json says bitsandbytes but the checkpoint holds no quantized layer");
  return b;
}

decltype(LoadCheckpointOptions::transform) prepare_bnb_checkpoint(Module& model, const BnbCheckpoint& bnb,
                                                                  const std::string& dir, const CheckpointView* view) {
  Checkpoint ck = Checkpoint::open(dir);
  if (view) ck = ck.with_view(*view);
  std::set<std::string> layers(bnb.layers.begin(), bnb.layers.end());
  for (const auto& name : bnb.layers) {
    DenseLayer& layer = dense_at(model, name);
    if (!bnb.config.load_in_4bit) {
      plan_layer(layer, bnb.config, layer.weight.scalar_type());
      continue;
    }
    // The checkpoint's own quant state (shape, block size, type, offset).
    std::string key;
    for (const char* t : {"nf4", "fp4"})
      if (ck.contains(name + ".weight.quant_state.bitsandbytes__" + t)) key = name + ".weight.quant_state.bitsandbytes__" + t;
    const int64_t bytes = ck.shape(key).empty() ? 0 : ck.shape(key)[0];
    if (bytes <= 0 || bytes > (1 << 16)) throw ShapeError(dir + ": '" + key + "' is not a packed quant state");
    FourBitWeight w;
    read_quant_state_tensor(ck.get(key), w, dir + ": " + key);
    if (w.shape != std::vector<int64_t>{layer.out_features, layer.in_features})
      throw ShapeError(dir + ": '" + key + "' is for a weight of another shape than " + name + "'s");
    plan_four_bit(layer, w, ck.contains(name + ".weight.nested_absmax"), bytes, bnb.config.bnb_4bit_compute_dtype);
  }
  return [layers](const std::string& key, const std::function<at::Tensor()>& read)
             -> std::optional<std::vector<std::pair<std::string, at::Tensor>>> {
    // "<layer>.<bnb local>" of a quantized layer: renamed, dtype kept.
    for (size_t dot = key.find('.'); dot != std::string::npos; dot = key.find('.', dot + 1)) {
      const std::string layer = key.substr(0, dot), local = key.substr(dot + 1);
      if (!layers.count(layer)) continue;
      if (local == "weight" || local == "bias") return std::nullopt;
      auto name = model_tensor_name(local);
      if (!name) return std::nullopt;
      return std::vector<std::pair<std::string, at::Tensor>>{{layer + "." + *name, read()}};
    }
    return std::nullopt;
  };
}

nlohmann::json bnb_quantization_config_json(const BnbQuantizationConfig& cfg) {
  auto dt = [](at::ScalarType t) -> std::string {
    return t == at::kHalf ? "float16" : t == at::kBFloat16 ? "bfloat16" : "float32";
  };
  nlohmann::json q;
  q["_load_in_4bit"] = cfg.load_in_4bit;
  q["_load_in_8bit"] = cfg.load_in_8bit;
  q["bnb_4bit_compute_dtype"] = dt(cfg.bnb_4bit_compute_dtype);
  q["bnb_4bit_quant_storage"] = "uint8";
  q["bnb_4bit_quant_type"] = cfg.bnb_4bit_quant_type;
  q["bnb_4bit_use_double_quant"] = cfg.bnb_4bit_use_double_quant;
  q["llm_int8_enable_fp32_cpu_offload"] = false;
  q["llm_int8_has_fp16_weight"] = false;
  q["llm_int8_skip_modules"] = cfg.skip_modules ? nlohmann::json(*cfg.skip_modules) : nlohmann::json();
  q["llm_int8_threshold"] = cfg.llm_int8_threshold;
  q["load_in_4bit"] = cfg.load_in_4bit;
  q["load_in_8bit"] = cfg.load_in_8bit;
  q["quant_method"] = "bitsandbytes";
  return q;
}

std::vector<std::pair<std::string, at::Tensor>> bnb_state_dict(Module& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& [name, t] : state_dict(model)) {
    const size_t dot = name.rfind('.');
    const std::string owner = dot == std::string::npos ? "" : name.substr(0, dot);
    auto* layer = dynamic_cast<DenseLayer*>(model.get_submodule(owner).get());
    if (layer && layer->weight_format())
      out.emplace_back((owner.empty() ? "" : owner + ".") + bnb_tensor_name(name.substr(dot + 1), *layer), t);
    else
      out.emplace_back(name, t);
  }
  return out;
}

Module& load_and_quantize_model(Module& model, const BnbQuantizationConfig& cfg,
                                const std::optional<std::string>& weights_location, const LoadAndQuantizeOptions& o) {
  const auto layers = layers_to_quantize(model, cfg, o.default_skip);
  bool on_meta = false;
  for (const auto& name : layers) on_meta = on_meta || dense_at(model, name).weight.is_meta();
  if (!on_meta) {
    quantize_model(model, cfg, layers);
    return model;
  }
  if (!weights_location) throw ConfigError("load_and_quantize_model: the model is on meta; pass weights_location");
  // Weights are cast to torch_dtype (else the model's) before quantizing, as Transformers does.
  const at::ScalarType dtype = cfg.torch_dtype.value_or(dense_at(model, layers.front()).weight.scalar_type());
  replace_with_bnb_layers(model, cfg, layers);
  LoadAndDispatchOptions d;
  d.device_map = o.device_map;
  d.device_map_strategy = o.device_map ? "" : (o.device_map_strategy.empty() ? "cpu" : o.device_map_strategy);
  d.max_memory = o.max_memory;
  d.no_split_module_classes = o.no_split_module_classes;
  d.offload_folder = o.offload_folder;
  d.dtype = cfg.torch_dtype;
  d.keep_in_fp32_modules = cfg.keep_in_fp32_modules;
  d.log = o.log;
  d.transform = quantizing_transform(model, cfg, layers, dtype);
  load_checkpoint_and_dispatch(model, *weights_location, d);
  return model;
}

}  // namespace flex
