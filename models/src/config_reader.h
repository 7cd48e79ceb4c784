#pragma once
// Reading config.json fields (internal to flex::models): the reader every
// parser uses, whose messages name the file, the model type and the field,
// and the field groups more than one architecture shares.
#include <flex/hooks/errors.h>
#include <flex/models/config.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

namespace flex::detail {

using json = nlohmann::json;

// Field readers: every message names the file, the model type and the field.
struct ConfigReader {
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

/// A RoPE setting: Transformers 5 writes rope_theta, the scaling fields and
/// partial_rotary_factor inside "rope_parameters"; older configs at the top
/// level (under `legacy` names too, e.g. GPT-NeoX's rotary_emb_base). The
/// first present wins: rope_parameters.<field>, <field>, each legacy name.
double rope_number(const ConfigReader& r, const std::string& field, double dflt,
                   const std::vector<std::string>& legacy = {});

/// A sliding window: absent takes `dflt`, null means none.
int64_t window_or(const ConfigReader& r, int64_t dflt);
/// A soft-cap: absent takes `dflt`, null means none (0), else a positive number.
double soft_cap_or(const ConfigReader& r, const char* field, double dflt);

/// Where a mixture-of-experts config keeps its expert count, and
/// Transformers' defaults when fields are absent.
struct ExpertFields {
  const char* count_field = "num_experts";
  int64_t count = 60, per_token = 4;
  int64_t moe_intermediate = 1408;  // moe_intermediate_size's default
  bool shared_expert = true;        // a shared expert (shared_expert_intermediate_size, default 5632)
  /// Every expert is intermediate_size wide and the top-k weights always
  /// renormalised (Mixtral); otherwise moe_intermediate_size, a shared
  /// expert, norm_topk_prob, decoder_sparse_step and mlp_only_layers (Qwen2-MoE).
  bool uniform = false;
};
void read_experts(const ConfigReader& r, ModelConfig& c, const ExpertFields& f);

/// Per-layer-type RoPE (Gemma 3, OLMo 3): Transformers' default bases and the
/// legacy top-level field that holds the sliding layers' base.
struct LayerTypeRope {
  double full_theta = 10000.0, sliding_theta = 10000.0;
  std::string sliding_theta_field;  // "rope_local_base_freq" (Gemma 3); OLMo 3: none
};
/// Fills rope_theta / rope_scaling (full layers) and sliding_rope.
void read_layer_type_rope(const ConfigReader& r, ModelConfig& c, const LayerTypeRope& d);

}  // namespace flex::detail
