#include "config_reader.h"

#include <flex/hooks/errors.h>
#include <flex/models/architecture.h>
#include <flex/models/config.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace flex {

namespace {

using json = nlohmann::json;
using Reader = detail::ConfigReader;

// Phi-3's longrope (older configs call it "su"): one divisor per rotary
// frequency for short and for long contexts, and a cos/sin scale that
// grows with the context extension.
void parse_longrope(const Reader& r, const Reader& sub, const ModelConfig& c, RopeScaling& s) {
  s.rope_type = "longrope";
  s.original_max_position_embeddings =
      sub.int_or("original_max_position_embeddings", r.int_or("original_max_position_embeddings", 0));
  if (s.original_max_position_embeddings <= 0)
    r.fail("original_max_position_embeddings", "must be a positive integer for rope_type 'longrope'");
  const size_t want = static_cast<size_t>(c.head_dim / 2);
  for (auto [name, dst] : {std::pair<const char*, std::vector<double>*>{"short_factor", &s.short_factor},
                           {"long_factor", &s.long_factor}}) {
    const json* f = sub.find(name);
    const std::string field = std::string("rope_scaling.") + name;
    if (!f || !f->is_array()) r.fail(field, "must be a list of head_dim / 2 numbers for rope_type 'longrope'");
    if (f->size() != want)
      r.fail(field, "has " + std::to_string(f->size()) + " entries; head_dim / 2 = " + std::to_string(want));
    for (const auto& x : *f) {
      if (!x.is_number() || !(x.get<double>() > 0)) r.fail(field, "must hold positive numbers, got " + x.dump());
      dst->push_back(x.get<double>());
    }
  }
  const double scale =
      static_cast<double>(c.max_position_embeddings) / static_cast<double>(s.original_max_position_embeddings);
  s.attention_factor = scale <= 1.0 ? 1.0
                                    : std::sqrt(1.0 + std::log(scale) /
                                                          std::log(static_cast<double>(s.original_max_position_embeddings)));
  if (const json* a = sub.find("attention_factor")) {
    if (!a->is_number()) r.fail("rope_scaling.attention_factor", "must be a number, got " + a->dump());
    s.attention_factor = a->get<double>();
  }
}

// YaRN (gpt-oss, DeepSeek-V3, OLMo 3's full layers): the factor, the ramp's
// beta_fast / beta_slow (0 or null: 32 and 1, as Transformers' `or`), and the
// cos/sin attention factor, given or derived from mscale / mscale_all_dim.
void parse_yarn(const Reader& r, const Reader& sub, const std::string& where, const ModelConfig& c, RopeScaling& s) {
  s.original_max_position_embeddings = sub.int_or(
      "original_max_position_embeddings", r.int_or("original_max_position_embeddings", c.max_position_embeddings));
  if (s.original_max_position_embeddings <= 0) r.fail(where + ".original_max_position_embeddings", "must be positive");
  const json* f = sub.find("factor");
  s.factor = f ? sub.number_or("factor", 1.0)
               : static_cast<double>(c.max_position_embeddings) / static_cast<double>(s.original_max_position_embeddings);
  if (!(s.factor > 0)) r.fail(where + ".factor", "must be a positive number");
  s.beta_fast = sub.number_or("beta_fast", 0.0);
  s.beta_slow = sub.number_or("beta_slow", 0.0);
  if (s.beta_fast == 0.0) s.beta_fast = 32.0;
  if (s.beta_slow == 0.0) s.beta_slow = 1.0;
  s.mscale = sub.number_or("mscale", 0.0);
  s.mscale_all_dim = sub.number_or("mscale_all_dim", 0.0);
  s.truncate = sub.bool_or("truncate", true);
  if (const json* a = sub.find("attention_factor")) {
    if (!a->is_number()) r.fail(where + ".attention_factor", "must be a number, got " + a->dump());
    s.attention_factor = a->get<double>();
  } else if (s.mscale != 0.0 && s.mscale_all_dim != 0.0) {
    s.attention_factor = yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim);
  } else {
    s.attention_factor = yarn_mscale(s.factor, 1.0);
  }
}

// llama.cpp's per-frequency divisors (its rope_freqs tensor, which its
// converter computes from Llama 3's rope_scaling): a GGUF file carries them
// instead of the parameters, so flexmodel's config for it holds the list.
void parse_freq_factors(const Reader& r, const Reader& sub, const std::string& where, const ModelConfig& c,
                        RopeScaling& s) {
  const json* f = sub.find("freq_factors");
  const std::string field = where + ".freq_factors";
  if (!f || !f->is_array()) r.fail(field, "must be a list of head_dim / 2 numbers for rope_type 'freq_factors'");
  (void)c;  // the count is checked against the rotary size, which partial rotary makes smaller than head_dim
  for (const auto& x : *f) {
    if (!x.is_number() || !(x.get<double>() > 0)) r.fail(field, "must hold positive numbers, got " + x.dump());
    s.freq_factors.push_back(x.get<double>());
  }
}

// One RoPE scaling object (rope_scaling, rope_parameters, or one layer type's
// entry of rope_parameters) into `s`; `where` names it in messages.
void parse_rope_object(const Reader& r, const json& obj, const std::string& where, const Architecture& arch,
                       const ModelConfig& c, RopeScaling& s) {
  if (!obj.is_object()) r.fail(where, "must be an object or null, got " + obj.dump());
  Reader sub{obj, r.source, r.type};
  std::string kind = sub.string_or("rope_type", sub.string_or("type", "default"));
  s.rope_type = kind;
  if (kind == "default") return;
  if (arch.longrope) {
    if (kind != "longrope" && kind != "su")
      r.fail(where + ".type", "'" + kind + "' is not supported for " + c.model_type + " (supported: longrope)");
    return parse_longrope(r, sub, c, s);
  }
  if (kind == "yarn") return parse_yarn(r, sub, where, c, s);
  if (kind == "freq_factors") return parse_freq_factors(r, sub, where, c, s);
  if (kind != "linear" && kind != "dynamic" && kind != "llama3")
    r.fail(where + ".rope_type",
           "'" + kind + "' is not supported (supported: default, linear, dynamic, llama3, yarn, freq_factors)");
  const json* f = sub.find("factor");
  if (!f) r.fail(where + ".factor", "is required for rope_type '" + kind + "' but missing");
  if (!f->is_number() || f->get<double>() <= 0) r.fail(where + ".factor", "must be a positive number, got " + f->dump());
  s.factor = f->get<double>();
  if (kind == "llama3") {
    for (const char* k : {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
      if (!sub.find(k)) r.fail(where + "." + k, "is required for rope_type 'llama3' but missing");
    s.low_freq_factor = sub.number_or("low_freq_factor", 1.0);
    s.high_freq_factor = sub.number_or("high_freq_factor", 4.0);
    s.original_max_position_embeddings =
        sub.integer(*sub.find("original_max_position_embeddings"), where + ".original_max_position_embeddings");
    if (s.high_freq_factor == s.low_freq_factor) r.fail(where + ".high_freq_factor", "must differ from low_freq_factor");
  } else {
    s.original_max_position_embeddings = sub.int_or("original_max_position_embeddings", c.max_position_embeddings);
  }
}

// rope_scaling (Transformers 4), or rope_parameters (Transformers 5: the same
// fields beside rope_theta).
void parse_rope_scaling(const Reader& r, const Architecture& arch, ModelConfig& c) {
  const char* where = "rope_scaling";
  const json* rs = r.find(where);
  if (!rs) rs = r.find(where = "rope_parameters");
  if (!rs) return;
  parse_rope_object(r, *rs, where, arch, c, c.rope_scaling);
}

bool is_layer_type_key(const std::string& k) { return k == "full_attention" || k == "sliding_attention"; }

}  // namespace

namespace detail {

// RoPE per layer type (Gemma 3, OLMo 3). Transformers 5 writes
// rope_parameters = {"full_attention": {...}, "sliding_attention": {...}};
// older configs give the full layers' base and rope_scaling at the top level
// and the sliding layers' base under its own name (Gemma 3's
// rope_local_base_freq); legacy rope_scaling applies to full layers only.
void read_layer_type_rope(const ConfigReader& r, ModelConfig& c, const LayerTypeRope& d) {
  const Architecture& arch = architecture(c);
  RopeSettings full{d.full_theta, {}}, sliding{d.sliding_theta, {}};
  const json* rp = r.find("rope_parameters");
  const json* legacy = r.find("rope_scaling");
  if (rp) {
    if (!rp->is_object()) r.fail("rope_parameters", "must be an object keyed by layer type, got " + rp->dump());
    for (const auto& [k, v] : rp->items())
      if (!is_layer_type_key(k))
        r.fail("rope_parameters", "must be keyed by layer type (full_attention, sliding_attention) for " +
                                      c.model_type + ", got key '" + k + "'");
  }
  auto read_type = [&](const char* type, RopeSettings& out, const std::string& legacy_theta_field) {
    json merged = json::object();
    if (rp && rp->contains(type) && !(*rp)[type].is_null()) merged = (*rp)[type];
    if (!merged.is_object()) r.fail(std::string("rope_parameters.") + type, "must be an object, got " + merged.dump());
    if (legacy && std::string(type) == "full_attention") {
      if (!legacy->is_object()) r.fail("rope_scaling", "must be an object or null, got " + legacy->dump());
      merged.update(*legacy);
    }
    const std::string where = rp ? std::string("rope_parameters.") + type : std::string("rope_scaling");
    Reader sub{merged, r.source, r.type};
    if (merged.contains("rope_theta"))
      out.theta = sub.number_or("rope_theta", out.theta);
    else if (r.find(legacy_theta_field))
      out.theta = r.number_or(legacy_theta_field, out.theta);
    if (!(out.theta > 0)) r.fail(where + ".rope_theta", "must be positive");
    parse_rope_object(r, merged, where, arch, c, out.scaling);
    if (out.scaling.rope_type == "dynamic" || out.scaling.rope_type == "longrope")
      r.fail(where + ".rope_type", "'" + out.scaling.rope_type + "' is not supported per layer type");
  };
  read_type("full_attention", full, "rope_theta");
  read_type("sliding_attention", sliding, d.sliding_theta_field);
  c.rope_theta = full.theta;
  c.rope_scaling = full.scaling;
  c.sliding_rope = sliding;
}

}  // namespace detail

namespace {

void parse_gpt2(const Reader& r, ModelConfig& c) {
  c.vocab_size = r.required_int("vocab_size");
  c.hidden_size = r.required_int("n_embd");
  c.num_hidden_layers = r.required_int("n_layer");
  c.num_attention_heads = r.required_int("n_head");
  c.max_position_embeddings = r.required_int("n_positions");
  c.num_key_value_heads = c.num_attention_heads;
  c.intermediate_size = r.int_or("n_inner", 4 * c.hidden_size);
  c.norm_eps = r.number_or("layer_norm_epsilon", 1e-5);
  c.hidden_act = r.string_or("activation_function", "gelu_new");
  c.tie_word_embeddings = r.bool_or("tie_word_embeddings", true);
  c.scale_attn_weights = r.bool_or("scale_attn_weights", true);
  c.scale_attn_by_inverse_layer_idx = r.bool_or("scale_attn_by_inverse_layer_idx", false);
  c.reorder_and_upcast_attn = r.bool_or("reorder_and_upcast_attn", false);
  if (c.hidden_size % c.num_attention_heads != 0)
    r.fail("n_head", "must divide n_embd (" + std::to_string(c.hidden_size) + "), got " +
                         std::to_string(c.num_attention_heads));
  c.head_dim = c.hidden_size / c.num_attention_heads;
}

// layer_types (Transformers 5): which layers attend through the sliding
// window. Where given it overrides the architecture's pattern.
void parse_layer_types(const Reader& r, ModelConfig& c) {
  const json* lt = r.find("layer_types");
  if (!lt) return;
  if (!lt->is_array() || static_cast<int64_t>(lt->size()) != c.num_hidden_layers)
    r.fail("layer_types", "must be a list of num_hidden_layers (" + std::to_string(c.num_hidden_layers) +
                              ") layer types, got " + lt->dump());
  c.sliding_layers.clear();
  for (const auto& t : *lt) {
    const std::string type = t.is_string() ? t.get<std::string>() : t.dump();
    if (type != "sliding_attention" && type != "full_attention")
      r.fail("layer_types", "has '" + type + "'; supported: sliding_attention, full_attention");
    c.sliding_layers.push_back(type == "sliding_attention");
  }
}

// The Llama family: the same field names, Transformers' defaults from the
// registry entry, then what only the architecture reads (its read_config).
void parse_decoder(const Reader& r, const Architecture& arch, ModelConfig& c) {
  const ConfigDefaults& d = arch.defaults;
  c.vocab_size = r.required_int("vocab_size");
  c.hidden_size = r.required_int("hidden_size");
  c.num_hidden_layers = r.required_int("num_hidden_layers");
  c.num_attention_heads = r.required_int("num_attention_heads");
  c.intermediate_size = r.required_int("intermediate_size");
  c.max_position_embeddings = r.int_or("max_position_embeddings", d.max_position_embeddings);
  if (c.max_position_embeddings <= 0) r.fail("max_position_embeddings", "must be positive");
  c.num_key_value_heads = r.int_or("num_key_value_heads", c.num_attention_heads);
  if (c.num_key_value_heads <= 0 || c.num_attention_heads % c.num_key_value_heads != 0)
    r.fail("num_key_value_heads", "must divide num_attention_heads (" + std::to_string(c.num_attention_heads) +
                                      "), got " + std::to_string(c.num_key_value_heads));
  if (!r.find("head_dim") && d.head_dim == 0 && c.hidden_size % c.num_attention_heads != 0)
    r.fail("num_attention_heads", "must divide hidden_size when head_dim is absent");
  c.head_dim = r.int_or("head_dim", d.head_dim ? d.head_dim : c.hidden_size / c.num_attention_heads);
  if (c.head_dim <= 0 || c.head_dim % 2 != 0) r.fail("head_dim", "must be positive and even, got " + std::to_string(c.head_dim));
  c.norm_eps = r.number_or("rms_norm_eps", d.norm_eps);
  // An architecture whose activation field is not hidden_act (Gemma 2's
  // hidden_activation) still honours hidden_act when only that is given.
  const std::string act_field = d.act_field;
  c.hidden_act = r.string_or(act_field, act_field != "hidden_act" ? r.string_or("hidden_act", d.act) : d.act);
  c.tie_word_embeddings = r.bool_or("tie_word_embeddings", d.tie_word_embeddings);
  c.rope_theta = detail::rope_number(r, "rope_theta", d.rope_theta);
  if (!(c.rope_theta > 0)) r.fail("rope_theta", "must be positive");
  if (arch.read_config) arch.read_config(r, c);
  parse_layer_types(r, c);
  if (!c.sliding_rope) parse_rope_scaling(r, arch, c);  // else read per layer type by read_config
}

void parse_gpt_neox(const Reader& r, const Architecture& arch, ModelConfig& c) {
  c.vocab_size = r.required_int("vocab_size");
  c.hidden_size = r.required_int("hidden_size");
  c.num_hidden_layers = r.required_int("num_hidden_layers");
  c.num_attention_heads = r.required_int("num_attention_heads");
  c.intermediate_size = r.required_int("intermediate_size");
  c.max_position_embeddings = r.int_or("max_position_embeddings", 2048);
  c.num_key_value_heads = c.num_attention_heads;
  if (c.hidden_size % c.num_attention_heads != 0)
    r.fail("num_attention_heads", "must divide hidden_size (" + std::to_string(c.hidden_size) + "), got " +
                                      std::to_string(c.num_attention_heads));
  c.head_dim = c.hidden_size / c.num_attention_heads;
  c.norm_eps = r.number_or("layer_norm_eps", 1e-5);
  c.hidden_act = r.string_or("hidden_act", "gelu");
  c.tie_word_embeddings = r.bool_or("tie_word_embeddings", false);
  c.rotary_pct = detail::rope_number(r, "partial_rotary_factor", 0.25, {"rotary_pct"});
  if (!(c.rotary_pct > 0.0 && c.rotary_pct <= 1.0)) r.fail("rotary_pct", "must be in (0, 1]");
  c.rope_theta = detail::rope_number(r, "rope_theta", 10000.0, {"rotary_emb_base"});
  c.use_parallel_residual = r.bool_or("use_parallel_residual", true);
  c.attention_bias = r.bool_or("attention_bias", true);
  parse_rope_scaling(r, arch, c);
  if (c.rotary_dim() < 2 || c.rotary_dim() % 2 != 0)
    r.fail("rotary_pct", "gives " + std::to_string(c.rotary_dim()) + " rotary dims per head; it must be even and >= 2");
}

}  // namespace

double yarn_mscale(double factor, double m) { return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; }

ModelConfig ModelConfig::with_sliding_rope() const {
  ModelConfig c = *this;
  if (sliding_rope) c.rope_theta = sliding_rope->theta, c.rope_scaling = sliding_rope->scaling;
  return c;
}

int64_t ModelConfig::rotary_dim() const { return static_cast<int64_t>(static_cast<double>(head_dim) * rotary_pct); }

bool ModelConfig::layer_is_sparse(int64_t layer) const {
  if (num_experts <= 0 || layer < first_k_dense_replace) return false;
  for (int64_t m : mlp_only_layers)
    if (m == layer) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

namespace {

// Sizes far beyond any real model end here with the field named, before any
// tensor is allocated (a config with num_hidden_layers 2e8 must not reach the
// allocator as an untyped std::bad_alloc).
void check_sizes(const Reader& r, const Architecture& arch, const ModelConfig& c) {
  const bool gpt2 = arch.family == ArchFamily::GPT2;  // GPT-2's own field names in messages
  auto limit = [&](const char* field, const char* gpt2_field, int64_t v, int64_t max) {
    if (v > max)
      r.fail(gpt2 && gpt2_field ? gpt2_field : field,
             "is " + std::to_string(v) + ", beyond what any model needs (at most " + std::to_string(max) + ")");
  };
  limit("num_hidden_layers", "n_layer", c.num_hidden_layers, int64_t{1} << 16);
  limit("hidden_size", "n_embd", c.hidden_size, int64_t{1} << 20);
  limit("num_attention_heads", "n_head", c.num_attention_heads, int64_t{1} << 16);
  limit("head_dim", nullptr, c.head_dim, int64_t{1} << 16);
  limit("intermediate_size", "n_inner", c.intermediate_size, int64_t{1} << 24);
  limit("vocab_size", nullptr, c.vocab_size, int64_t{1} << 28);
  limit("max_position_embeddings", "n_positions", c.max_position_embeddings,
        arch.square_mask_buffer ? int64_t{1} << 15 : int64_t{1} << 30);
  // The whole model: embeddings plus per layer attention and MLP weights.
  const double h = static_cast<double>(c.hidden_size);
  const double attn = h * static_cast<double>(c.head_dim) *
                      static_cast<double>(2 * c.num_attention_heads + 2 * c.num_key_value_heads);
  const double mlp = 3.0 * h *
                     (c.num_experts > 0 ? static_cast<double>(c.num_experts) * static_cast<double>(c.moe_intermediate_size) +
                                              static_cast<double>(c.shared_expert_intermediate_size)
                                        : static_cast<double>(c.intermediate_size));
  const double params = static_cast<double>(c.num_hidden_layers) * (attn + mlp) +
                        2.0 * static_cast<double>(c.vocab_size) * h;
  if (params > 1e13)
    r.fail(gpt2 ? "n_layer" : "num_hidden_layers",
           "with the other sizes gives about " + std::to_string(static_cast<int64_t>(params / 1e9)) +
               " billion parameters, beyond what any model needs (at most 10,000 billion)");
}

}  // namespace

namespace {
ModelConfig parse_config_impl(const json& j, const std::string& source) {
  if (!j.is_object()) throw ConfigError(source + ": a config must be a JSON object");
  ModelConfig c;
  c.source = source;
  c.raw = j;
  auto it = j.find("model_type");
  if (it == j.end() || !it->is_string())
    throw ConfigError(source + ": field 'model_type' is required but missing (supported: " + supported_model_types() + ")");
  c.model_type = it->get<std::string>();
  const Architecture& arch = architecture(c);
  // A multimodal config keeps the language model's fields in a sub-object.
  const json* body = &j;
  json merged;
  if (!arch.nested_config.empty()) {
    auto sub = j.find(arch.nested_config);
    if (sub == j.end() || !sub->is_object())
      throw ConfigError(source + ": field '" + arch.nested_config + "' (the language model's config) is required for " +
                        "model_type '" + c.model_type + "'");
    merged = arch.nested_defaults.is_object() ? arch.nested_defaults : json::object();
    merged.update(*sub);
    body = &merged;
  }
  const std::string where = arch.nested_config.empty() ? source : source + " (" + arch.nested_config + ")";
  Reader r{*body, where, c.model_type};
  Reader top{j, source, c.model_type};
  switch (arch.family) {
    case ArchFamily::GPT2: parse_gpt2(r, c); break;
    case ArchFamily::GPTNeoX: parse_gpt_neox(r, arch, c); break;
    case ArchFamily::Decoder: parse_decoder(r, arch, c); break;
  }
  check_sizes(r, arch, c);
  for (const char* field : {"attn_implementation", "_attn_implementation"}) {
    const std::string impl = r.string_or(field, "eager");
    if (impl != "eager" && impl != "sdpa" && impl != "flash_attention_2")
      r.fail(field, "'" + impl + "' is not supported (eager, sdpa and flash_attention_2 compute the same attention)");
  }

  if (!c.hidden_act.empty() && c.hidden_act != "gelu_new" && c.hidden_act != "gelu" && c.hidden_act != "silu" &&
      c.hidden_act != "swish" && c.hidden_act != "relu" && c.hidden_act != "gelu_pytorch_tanh")
    r.fail(arch.defaults.act_field,
           "'" + c.hidden_act + "' is not supported (supported: gelu_new, gelu, gelu_pytorch_tanh, relu, silu)");
  c.bos_token_id = r.find("bos_token_id") ? r.optional_int("bos_token_id") : top.optional_int("bos_token_id");
  c.pad_token_id = r.find("pad_token_id") ? r.optional_int("pad_token_id") : top.optional_int("pad_token_id");
  if (const json* e = r.find("eos_token_id") ? r.find("eos_token_id") : top.find("eos_token_id")) {
    if (e->is_array()) {
      for (const auto& x : *e) c.eos_token_ids.push_back(r.integer(x, "eos_token_id"));
    } else {
      c.eos_token_ids.push_back(r.integer(*e, "eos_token_id"));
    }
  }
  c.torch_dtype = r.string_or("torch_dtype", r.string_or("dtype", top.string_or("torch_dtype", top.string_or("dtype", ""))));  // "dtype" in Transformers 5
  return c;
}
}  // namespace

ModelConfig parse_config(const json& j, const std::string& source) { return parse_config_impl(j, source); }

ModelConfig load_config(const std::string& dir_or_config_json) {
  namespace fs = std::filesystem;
  fs::path p(dir_or_config_json);
  std::error_code ec;
  if (fs::is_directory(p, ec)) p /= "config.json";
  if (!fs::exists(p, ec)) throw IOError("config file not found: " + p.string());
  std::ifstream in(p, std::ios::binary);
  if (!in) throw IOError("cannot open config file: " + p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw FileFormatError(p.string() + ": not valid JSON");
  return parse_config(j, p.string());
}

namespace detail {

double rope_number(const ConfigReader& r, const std::string& field, double dflt, const std::vector<std::string>& legacy) {
  if (const json* p = r.find("rope_parameters"); p && p->is_object()) {
    const ConfigReader sub{*p, r.source, r.type};
    if (sub.find(field)) {
      const json& v = *sub.find(field);
      if (!v.is_number()) r.fail("rope_parameters." + field, "must be a number, got " + v.dump());
      return v.get<double>();
    }
  }
  if (r.find(field)) return r.number_or(field, dflt);
  for (const auto& name : legacy)
    if (r.find(name)) return r.number_or(name, dflt);
  return dflt;
}

int64_t window_or(const ConfigReader& r, int64_t dflt) {
  auto it = r.j.find("sliding_window");
  if (it == r.j.end()) return dflt;
  if (it->is_null()) return 0;
  int64_t w = r.integer(*it, "sliding_window");
  if (w <= 0) r.fail("sliding_window", "must be positive or null, got " + std::to_string(w));
  return w;
}

double soft_cap_or(const ConfigReader& r, const char* field, double dflt) {
  auto it = r.j.find(field);
  if (it == r.j.end()) return dflt;
  if (it->is_null()) return 0.0;
  const double v = r.number_or(field, dflt);
  if (!(v > 0)) r.fail(field, "must be positive or null");
  return v;
}

void read_experts(const ConfigReader& r, ModelConfig& c, const ExpertFields& f) {
  // Transformers 5 writes some types' count under the other name (Qwen3-MoE:
  // num_local_experts, through its attribute_map); either is read.
  const std::string other = std::string(f.count_field) == "num_experts" ? "num_local_experts" : "num_experts";
  c.num_experts = r.int_or(f.count_field, r.int_or(other, f.count));
  c.num_experts_per_tok = r.int_or("num_experts_per_tok", f.per_token);
  if (c.num_experts <= 0) r.fail(f.count_field, "must be positive, got " + std::to_string(c.num_experts));
  if (c.num_experts > (int64_t{1} << 16))
    r.fail(f.count_field, "is " + std::to_string(c.num_experts) + ", beyond what any model needs (at most 65536)");
  if (c.num_experts_per_tok <= 0 || c.num_experts_per_tok > c.num_experts)
    r.fail("num_experts_per_tok", "must be between 1 and " + std::string(f.count_field) + " (" +
                                      std::to_string(c.num_experts) + "), got " + std::to_string(c.num_experts_per_tok));
  if (f.uniform) {
    c.moe_intermediate_size = c.intermediate_size;
    c.norm_topk_prob = true;
    return;
  }
  c.moe_intermediate_size = r.int_or("moe_intermediate_size", f.moe_intermediate);
  c.shared_expert_intermediate_size = f.shared_expert ? r.int_or("shared_expert_intermediate_size", 5632) : 0;
  c.norm_topk_prob = r.bool_or("norm_topk_prob", false);
  c.decoder_sparse_step = r.int_or("decoder_sparse_step", 1);
  if (c.moe_intermediate_size <= 0) r.fail("moe_intermediate_size", "must be positive");
  if (c.moe_intermediate_size > (int64_t{1} << 24)) r.fail("moe_intermediate_size", "is beyond what any model needs");
  if (c.shared_expert_intermediate_size < 0 || c.shared_expert_intermediate_size > (int64_t{1} << 24))
    r.fail("shared_expert_intermediate_size", "must be between 0 and 2^24");
  if (c.decoder_sparse_step <= 0) r.fail("decoder_sparse_step", "must be positive");
  if (const json* m = r.find("mlp_only_layers")) {
    if (!m->is_array()) r.fail("mlp_only_layers", "must be a list of layer indices, got " + m->dump());
    for (const auto& x : *m) c.mlp_only_layers.push_back(r.integer(x, "mlp_only_layers"));
  }
}

}  // namespace detail

}  // namespace flex
