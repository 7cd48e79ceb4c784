// The model's view of a checkpoint (model_checkpoint.h).
#include <flex/hooks/errors.h>
#include <flex/models/architecture.h>
#include <flex/models/model_checkpoint.h>
#include <flex/quant/stored_formats.h>

#include <ATen/ATen.h>

namespace flex {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string quant_method(const ModelConfig& cfg) {
  auto q = cfg.raw.find("quantization_config");
  if (q == cfg.raw.end() || !q->is_object()) return "";
  auto m = q->find("quant_method");
  return m != q->end() && m->is_string() ? m->get<std::string>() : "";
}

// FP8 blocks: every float8 "<x>.weight" with a "<x>.weight_scale_inv" beside it.
void add_fp8(const ModelConfig& cfg, const Checkpoint& st, CheckpointView& v) {
  int64_t bm = 128, bn = 128;
  const auto& q = cfg.raw["quantization_config"];
  if (auto b = q.find("weight_block_size"); b != q.end() && !b->is_null()) {
    if (!b->is_array() || b->size() != 2 || !(*b)[0].is_number_integer() || !(*b)[1].is_number_integer() ||
        (*b)[0].get<int64_t>() <= 0 || (*b)[1].get<int64_t>() <= 0)
      throw ConfigError(cfg.source + ": quantization_config.weight_block_size must be two positive integers, got " +
                        b->dump());
    bm = (*b)[0].get<int64_t>(), bn = (*b)[1].get<int64_t>();
  }
  for (const auto& key : st.keys()) {
    if (!ends_with(key, ".weight") || !st.contains(key + "_scale_inv")) continue;
    CheckpointView::Computed c;
    c.name = key;
    c.sources = {key, key + "_scale_inv"};
    c.shape = st.shape(key);
    const std::string what = st.file_of(key) + ": '" + key + "'";
    c.compute = [bm, bn, what](const std::vector<at::Tensor>& in) {
      return dequantize_fp8_blocks(in[0], in[1], bm, bn, at::kFloat, what);
    };
    v.computed.push_back(std::move(c));
  }
}

// MXFP4: every "<x>_blocks" with a "<x>_scales" beside it becomes "<x>".
void add_mxfp4(const Checkpoint& st, CheckpointView& v) {
  for (const auto& key : st.keys()) {
    if (!ends_with(key, "_blocks")) continue;
    const std::string base = key.substr(0, key.size() - 7);
    if (!st.contains(base + "_scales")) continue;
    std::vector<int64_t> shape = st.shape(key);  // [..., R, G, B]
    if (shape.size() < 3)
      throw ShapeError(st.file_of(key) + ": MXFP4 tensor '" + key + "' must have at least 3 dims");
    const int64_t rows = shape[shape.size() - 3], cols = shape[shape.size() - 2] * shape.back() * 2;
    shape.resize(shape.size() - 3);
    shape.push_back(cols);
    shape.push_back(rows);
    CheckpointView::Computed c;
    c.name = base;
    c.sources = {key, base + "_scales"};
    c.shape = shape;
    const std::string what = st.file_of(key) + ": '" + base + "'";
    c.compute = [what](const std::vector<at::Tensor>& in) { return dequantize_mxfp4(in[0], in[1], at::kFloat, what); };
    v.computed.push_back(std::move(c));
  }
}

}  // namespace

bool dequantized_at_load(const ModelConfig& cfg) {
  const std::string m = quant_method(cfg);
  return m == "fp8" || m == "mxfp4";
}

CheckpointView model_checkpoint_view(const ModelConfig& cfg, const Checkpoint& stored) {
  const Architecture& arch = architecture(cfg);
  CheckpointView v;
  v.renames = arch.checkpoint_renames;
  const std::string blocks = arch.names.base + "." + arch.names.blocks + ".";
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i)
    for (const auto& [from, to] : arch.checkpoint_block_renames)
      v.renames.emplace_back(blocks + std::to_string(i) + "." + from, blocks + std::to_string(i) + "." + to);
  v.dropped = arch.checkpoint_dropped;
  // Layers past num_hidden_layers (DeepSeek-V3's multi-token-prediction
  // layer) are not part of the causal LM; Transformers skips them too.
  if (arch.drop_extra_layers)
    for (const auto& key : stored.keys()) {
      const std::string prefix = arch.names.base + "." + arch.names.blocks + ".";
      if (key.rfind(prefix, 0) != 0) continue;
      const size_t dot = key.find('.', prefix.size());
      const std::string idx = key.substr(prefix.size(), dot - prefix.size());
      if (!idx.empty() && idx.find_first_not_of("0123456789") == std::string::npos &&
          std::stoll(idx) >= cfg.num_hidden_layers)
        v.dropped.push_back(prefix + idx + ".");
    }
  const std::string m = quant_method(cfg);
  if (m == "fp8") add_fp8(cfg, stored, v);
  if (m == "mxfp4") add_mxfp4(stored, v);
  return v;
}

Checkpoint open_model_checkpoint(const std::string& dir, const ModelConfig& cfg) {
  const Checkpoint stored = Checkpoint::open(dir);
  return stored.with_view(model_checkpoint_view(cfg, stored));
}

}  // namespace flex
