#include <flex/hooks/errors.h>
#include <flex/models/config.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace flex {

namespace {

using json = nlohmann::json;

// Field readers: every message names the file, the model type and the field.
struct Reader {
  const json& j;
  const std::string& source;
  const std::string& type;

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw ConfigError(source + ": field '" + field + "' " + what + " (model_type '" + type + "')");
  }
  const json* find(const std::string& field) const {
    auto it = j.find(field);
    if (it == j.end() || it->is_null()) return nullptr;
    return &*it;
  }
  int64_t integer(const json& v, const std::string& field) const {
    if (v.is_number_integer()) return v.get<int64_t>();
    // Some configs write sizes as 64.0. Only whole numbers an int64 holds
    // exactly (|x| <= 2^53) convert; a cast of 7.8e48 would be undefined.
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::floor(d) == d && std::fabs(d) <= 9007199254740992.0) return static_cast<int64_t>(d);
    }
    fail(field, "must be an integer, got " + v.dump());
  }
  int64_t required_int(const std::string& field) const {
    const json* v = find(field);
    if (!v) fail(field, "is required but missing");
    int64_t x = integer(*v, field);
    if (x <= 0) fail(field, "must be positive, got " + std::to_string(x));
    return x;
  }
  int64_t int_or(const std::string& field, int64_t dflt) const {
    const json* v = find(field);
    return v ? integer(*v, field) : dflt;
  }
  double number_or(const std::string& field, double dflt) const {
    const json* v = find(field);
    if (!v) return dflt;
    if (!v->is_number()) fail(field, "must be a number, got " + v->dump());
    return v->get<double>();
  }
  bool bool_or(const std::string& field, bool dflt) const {
    const json* v = find(field);
    if (!v) return dflt;
    if (!v->is_boolean()) fail(field, "must be true or false, got " + v->dump());
    return v->get<bool>();
  }
  std::string string_or(const std::string& field, const std::string& dflt) const {
    const json* v = find(field);
    if (!v) return dflt;
    if (!v->is_string()) fail(field, "must be a string, got " + v->dump());
    return v->get<std::string>();
  }
  std::optional<int64_t> optional_int(const std::string& field) const {
    const json* v = find(field);
    if (!v) return std::nullopt;
    return integer(*v, field);
  }
};

void parse_rope_scaling(const Reader& r, ModelConfig& c) {
  const json* rs = r.find("rope_scaling");
  if (!rs) return;
  if (!rs->is_object()) r.fail("rope_scaling", "must be an object or null, got " + rs->dump());
  Reader sub{*rs, r.source, r.type};
  std::string kind = sub.string_or("rope_type", sub.string_or("type", "default"));
  RopeScaling& s = c.rope_scaling;
  s.rope_type = kind;
  if (kind == "default") return;
  if (kind != "linear" && kind != "dynamic" && kind != "llama3")
    r.fail("rope_scaling.rope_type", "'" + kind + "' is not supported (supported: default, linear, dynamic, llama3)");
  const json* f = sub.find("factor");
  if (!f) r.fail("rope_scaling.factor", "is required for rope_type '" + kind + "' but missing");
  if (!f->is_number() || f->get<double>() <= 0) r.fail("rope_scaling.factor", "must be a positive number, got " + f->dump());
  s.factor = f->get<double>();
  if (kind == "llama3") {
    for (const char* k : {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
      if (!sub.find(k)) r.fail(std::string("rope_scaling.") + k, "is required for rope_type 'llama3' but missing");
    s.low_freq_factor = sub.number_or("low_freq_factor", 1.0);
    s.high_freq_factor = sub.number_or("high_freq_factor", 4.0);
    s.original_max_position_embeddings = sub.integer(*sub.find("original_max_position_embeddings"),
                                                     "rope_scaling.original_max_position_embeddings");
    if (s.high_freq_factor == s.low_freq_factor)
      r.fail("rope_scaling.high_freq_factor", "must differ from low_freq_factor");
  } else {
    s.original_max_position_embeddings = sub.int_or("original_max_position_embeddings", c.max_position_embeddings);
  }
}

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

void parse_llama(const Reader& r, ModelConfig& c) {
  c.vocab_size = r.required_int("vocab_size");
  c.hidden_size = r.required_int("hidden_size");
  c.num_hidden_layers = r.required_int("num_hidden_layers");
  c.num_attention_heads = r.required_int("num_attention_heads");
  c.intermediate_size = r.required_int("intermediate_size");
  c.max_position_embeddings = r.int_or("max_position_embeddings", 2048);
  c.num_key_value_heads = r.int_or("num_key_value_heads", c.num_attention_heads);
  if (c.num_key_value_heads <= 0 || c.num_attention_heads % c.num_key_value_heads != 0)
    r.fail("num_key_value_heads", "must divide num_attention_heads (" + std::to_string(c.num_attention_heads) +
                                      "), got " + std::to_string(c.num_key_value_heads));
  if (!r.find("head_dim") && c.hidden_size % c.num_attention_heads != 0)
    r.fail("num_attention_heads", "must divide hidden_size when head_dim is absent");
  c.head_dim = r.int_or("head_dim", c.hidden_size / c.num_attention_heads);
  if (c.head_dim <= 0 || c.head_dim % 2 != 0) r.fail("head_dim", "must be positive and even, got " + std::to_string(c.head_dim));
  c.norm_eps = r.number_or("rms_norm_eps", 1e-6);
  c.hidden_act = r.string_or("hidden_act", "silu");
  c.tie_word_embeddings = r.bool_or("tie_word_embeddings", false);
  c.rope_theta = r.number_or("rope_theta", 10000.0);
  c.attention_bias = r.bool_or("attention_bias", false);
  c.mlp_bias = r.bool_or("mlp_bias", false);
  if (r.int_or("pretraining_tp", 1) != 1)
    r.fail("pretraining_tp", "other than 1 is not supported (it only changes how HF splits matmuls)");
  parse_rope_scaling(r, c);
}

void parse_gpt_neox(const Reader& r, ModelConfig& c) {
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
  c.rotary_pct = r.number_or("rotary_pct", r.number_or("partial_rotary_factor", 0.25));
  if (!(c.rotary_pct > 0.0 && c.rotary_pct <= 1.0)) r.fail("rotary_pct", "must be in (0, 1]");
  c.rope_theta = r.number_or("rope_theta", r.number_or("rotary_emb_base", 10000.0));
  c.use_parallel_residual = r.bool_or("use_parallel_residual", true);
  c.attention_bias = r.bool_or("attention_bias", true);
  parse_rope_scaling(r, c);
  if (c.rotary_dim() < 2 || c.rotary_dim() % 2 != 0)
    r.fail("rotary_pct", "gives " + std::to_string(c.rotary_dim()) + " rotary dims per head; it must be even and >= 2");
}

}  // namespace

int64_t ModelConfig::rotary_dim() const { return static_cast<int64_t>(static_cast<double>(head_dim) * rotary_pct); }

std::string ModelConfig::causal_lm_class() const {
  if (model_type == "gpt2") return "GPT2LMHeadModel";
  if (model_type == "llama") return "LlamaForCausalLM";
  if (model_type == "gpt_neox") return "GPTNeoXForCausalLM";
  return "";
}

ModelConfig parse_config(const json& j, const std::string& source) {
  if (!j.is_object()) throw ConfigError(source + ": a config must be a JSON object");
  ModelConfig c;
  c.source = source;
  c.raw = j;
  auto it = j.find("model_type");
  if (it == j.end() || !it->is_string())
    throw ConfigError(source + ": field 'model_type' is required but missing (supported: gpt2, llama, gpt_neox)");
  c.model_type = it->get<std::string>();
  Reader r{j, source, c.model_type};
  if (c.model_type == "gpt2")
    parse_gpt2(r, c);
  else if (c.model_type == "llama")
    parse_llama(r, c);
  else if (c.model_type == "gpt_neox")
    parse_gpt_neox(r, c);
  else
    throw ConfigError(source + ": model_type '" + c.model_type + "' is not supported (supported: gpt2, llama, gpt_neox)");

  if (!c.hidden_act.empty() && c.hidden_act != "gelu_new" && c.hidden_act != "gelu" && c.hidden_act != "silu" &&
      c.hidden_act != "swish" && c.hidden_act != "relu" && c.hidden_act != "gelu_pytorch_tanh")
    r.fail(c.model_type == "gpt2" ? "activation_function" : "hidden_act",
           "'" + c.hidden_act + "' is not supported (supported: gelu_new, gelu, gelu_pytorch_tanh, relu, silu)");
  c.bos_token_id = r.optional_int("bos_token_id");
  c.pad_token_id = r.optional_int("pad_token_id");
  if (const json* e = r.find("eos_token_id")) {
    if (e->is_array()) {
      for (const auto& x : *e) c.eos_token_ids.push_back(r.integer(x, "eos_token_id"));
    } else {
      c.eos_token_ids.push_back(r.integer(*e, "eos_token_id"));
    }
  }
  c.torch_dtype = r.string_or("torch_dtype", "");
  return c;
}

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

}  // namespace flex
