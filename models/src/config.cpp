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

// Phi-3's longrope (older configs call it "su"): one divisor per rotary
// frequency for short and for long contexts, and a cos/sin scale that
// grows with the context extension.
void parse_longrope(const Reader& r, const Reader& sub, ModelConfig& c) {
  RopeScaling& s = c.rope_scaling;
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

void parse_rope_scaling(const Reader& r, ModelConfig& c) {
  const json* rs = r.find("rope_scaling");
  if (!rs) return;
  if (!rs->is_object()) r.fail("rope_scaling", "must be an object or null, got " + rs->dump());
  Reader sub{*rs, r.source, r.type};
  std::string kind = sub.string_or("rope_type", sub.string_or("type", "default"));
  RopeScaling& s = c.rope_scaling;
  s.rope_type = kind;
  if (kind == "default") return;
  if (c.model_type == "phi3") {
    if (kind != "longrope" && kind != "su")
      r.fail("rope_scaling.type", "'" + kind + "' is not supported for phi3 (supported: longrope)");
    return parse_longrope(r, sub, c);
  }
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

// Transformers' defaults of the Llama family, where the architectures differ.
struct FamilyDefaults {
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  int64_t head_dim = 0;          // 0: hidden_size / num_attention_heads
  int64_t max_position_embeddings = 2048;
  const char* act_field = "hidden_act";
  const char* act = "silu";
};

FamilyDefaults family_defaults(const std::string& type) {
  FamilyDefaults d;
  if (type == "mistral") d.max_position_embeddings = 4096 * 32;
  if (type == "qwen2") d.max_position_embeddings = 32768;
  if (type == "qwen3") d.max_position_embeddings = 32768, d.head_dim = 128;
  if (type == "gemma2")
    d.max_position_embeddings = 8192, d.head_dim = 256, d.tie_word_embeddings = true, d.act_field = "hidden_activation",
    d.act = "gelu_pytorch_tanh";
  if (type == "phi3") d.max_position_embeddings = 4096, d.rms_norm_eps = 1e-5;
  if (type == "olmo2") d.rms_norm_eps = 1e-5;
  if (type == "mixtral") d.max_position_embeddings = 4096 * 32, d.rms_norm_eps = 1e-5;
  if (type == "qwen2_moe") d.max_position_embeddings = 32768;
  return d;
}

// A sliding window: absent takes `dflt`, null means none.
int64_t window_or(const Reader& r, int64_t dflt) {
  auto it = r.j.find("sliding_window");
  if (it == r.j.end()) return dflt;
  if (it->is_null()) return 0;
  int64_t w = r.integer(*it, "sliding_window");
  if (w <= 0) r.fail("sliding_window", "must be positive or null, got " + std::to_string(w));
  return w;
}

// Mixtral and Qwen2-MoE: the experts (Transformers' defaults when absent).
void parse_experts(const Reader& r, ModelConfig& c) {
  const bool mixtral = c.model_type == "mixtral";
  const char* n_field = mixtral ? "num_local_experts" : "num_experts";
  c.num_experts = r.int_or(n_field, mixtral ? 8 : 60);
  c.num_experts_per_tok = r.int_or("num_experts_per_tok", mixtral ? 2 : 4);
  if (c.num_experts <= 0) r.fail(n_field, "must be positive, got " + std::to_string(c.num_experts));
  if (c.num_experts > (int64_t{1} << 16))
    r.fail(n_field, "is " + std::to_string(c.num_experts) + ", beyond what any model needs (at most 65536)");
  if (c.num_experts_per_tok <= 0 || c.num_experts_per_tok > c.num_experts)
    r.fail("num_experts_per_tok", "must be between 1 and " + std::string(n_field) + " (" +
                                      std::to_string(c.num_experts) + "), got " + std::to_string(c.num_experts_per_tok));
  if (mixtral) {
    c.moe_intermediate_size = c.intermediate_size;
    c.norm_topk_prob = true;
    return;
  }
  c.moe_intermediate_size = r.int_or("moe_intermediate_size", 1408);
  c.shared_expert_intermediate_size = r.int_or("shared_expert_intermediate_size", 5632);
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

// Llama, Mistral, Qwen2, Qwen3, Gemma 2, Phi-3, OLMo 2: the same field names,
// different defaults and a few architecture-only fields.
void parse_llama_family(const Reader& r, ModelConfig& c) {
  const std::string& type = c.model_type;
  const FamilyDefaults d = family_defaults(type);
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
  if (type == "phi3" && r.find("head_dim")) r.fail("head_dim", "is not a Phi-3 field (Phi-3 uses hidden_size / heads)");
  if (!r.find("head_dim") && d.head_dim == 0 && c.hidden_size % c.num_attention_heads != 0)
    r.fail("num_attention_heads", "must divide hidden_size when head_dim is absent");
  c.head_dim = r.int_or("head_dim", d.head_dim ? d.head_dim : c.hidden_size / c.num_attention_heads);
  if (c.head_dim <= 0 || c.head_dim % 2 != 0) r.fail("head_dim", "must be positive and even, got " + std::to_string(c.head_dim));
  c.norm_eps = r.number_or("rms_norm_eps", d.rms_norm_eps);
  c.hidden_act = r.string_or(d.act_field, type == "gemma2" ? r.string_or("hidden_act", d.act) : d.act);
  c.tie_word_embeddings = r.bool_or("tie_word_embeddings", d.tie_word_embeddings);
  c.rope_theta = r.number_or("rope_theta", type == "mixtral" ? 1e6 : 10000.0);
  if (!(c.rope_theta > 0)) r.fail("rope_theta", "must be positive");

  // Biases: Llama, OLMo 2, Gemma 2, Qwen3 follow attention_bias on q/k/v/o;
  // Qwen2 always has q/k/v biases and none on o_proj; Mistral, Phi-3 none.
  if (type == "qwen2" || type == "qwen2_moe") {
    c.qkv_bias = true;
  } else if (type == "mistral" || type == "phi3" || type == "mixtral") {
    c.attention_bias = c.qkv_bias = false;
  } else {
    c.attention_bias = c.qkv_bias = r.bool_or("attention_bias", false);
  }
  if (type == "llama") {
    c.mlp_bias = r.bool_or("mlp_bias", false);
    if (r.int_or("pretraining_tp", 1) != 1)
      r.fail("pretraining_tp", "other than 1 is not supported (it only changes how HF splits matmuls)");
  }

  // Attention variants.
  if (type == "mistral") c.sliding_window = window_or(r, 4096);
  if (type == "phi3" || type == "mixtral") c.sliding_window = window_or(r, 0);
  if (type == "gemma2") {
    c.sliding_window = window_or(r, 4096);
    c.sliding_window_pattern = 2;
    c.query_pre_attn_scalar = r.number_or("query_pre_attn_scalar", 256);
    if (!(c.query_pre_attn_scalar > 0)) r.fail("query_pre_attn_scalar", "must be positive");
    auto cap = [&](const char* field, double dflt) {
      auto it = r.j.find(field);
      if (it == r.j.end()) return dflt;
      if (it->is_null()) return 0.0;
      const double v = r.number_or(field, dflt);
      if (!(v > 0)) r.fail(field, "must be positive or null");
      return v;
    };
    c.attn_logit_softcapping = cap("attn_logit_softcapping", 50.0);
    c.final_logit_softcapping = cap("final_logit_softcapping", 30.0);
  }
  if (type == "qwen2" || type == "qwen3" || type == "qwen2_moe") {
    if (r.bool_or("use_sliding_window", false))
      r.fail("use_sliding_window", "true is not supported (Qwen2/Qwen3 slide only in layers >= max_window_layers, "
                                   "and only under flash attention)");
  }
  if (type == "phi3" && r.number_or("partial_rotary_factor", 1.0) != 1.0)
    r.fail("partial_rotary_factor", "other than 1 is not supported for phi3");
  parse_rope_scaling(r, c);
  if (type == "mixtral" || type == "qwen2_moe") parse_experts(r, c);
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
  if (model_type == "mistral") return "MistralForCausalLM";
  if (model_type == "qwen2") return "Qwen2ForCausalLM";
  if (model_type == "qwen3") return "Qwen3ForCausalLM";
  if (model_type == "gemma2") return "Gemma2ForCausalLM";
  if (model_type == "phi3") return "Phi3ForCausalLM";
  if (model_type == "olmo2") return "Olmo2ForCausalLM";
  if (model_type == "mixtral") return "MixtralForCausalLM";
  if (model_type == "qwen2_moe") return "Qwen2MoeForCausalLM";
  return "";
}

bool ModelConfig::layer_is_sparse(int64_t layer) const {
  if (num_experts <= 0) return false;
  for (int64_t m : mlp_only_layers)
    if (m == layer) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

namespace {
bool is_llama_family(const std::string& t) {
  return t == "llama" || t == "mistral" || t == "qwen2" || t == "qwen3" || t == "gemma2" || t == "phi3" || t == "olmo2" ||
         t == "mixtral" || t == "qwen2_moe";
}

// Sizes far beyond any real model end here with the field named, before any
// tensor is allocated (a config with num_hidden_layers 2e8 must not reach the
// allocator as an untyped std::bad_alloc).
void check_sizes(const Reader& r, const ModelConfig& c) {
  const bool gpt2 = c.model_type == "gpt2";
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
  // GPT-2 and GPT-NeoX hold a [n, n] causal-mask buffer per layer.
  const bool square_mask = gpt2 || c.model_type == "gpt_neox";
  limit("max_position_embeddings", "n_positions", c.max_position_embeddings,
        square_mask ? int64_t{1} << 15 : int64_t{1} << 30);
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

std::string supported_model_types() { return "gpt2, llama, gpt_neox, mistral, qwen2, qwen3, gemma2, phi3, olmo2, mixtral, qwen2_moe"; }

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
  Reader r{j, source, c.model_type};
  if (c.model_type == "gpt2")
    parse_gpt2(r, c);
  else if (is_llama_family(c.model_type))
    parse_llama_family(r, c);
  else if (c.model_type == "gpt_neox")
    parse_gpt_neox(r, c);
  else
    throw ConfigError(source + ": model_type '" + c.model_type + "' is not supported (supported: " +
                      supported_model_types() + ")");
  check_sizes(r, c);
  for (const char* field : {"attn_implementation", "_attn_implementation"}) {
    const std::string impl = r.string_or(field, "eager");
    if (impl != "eager" && impl != "sdpa" && impl != "flash_attention_2")
      r.fail(field, "'" + impl + "' is not supported (eager, sdpa and flash_attention_2 compute the same attention)");
  }

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

}  // namespace flex
