#include <flex/datasets/activation_shards.h>

#include "shard_format.h"

#include <flex/dispatch/atomic_file.h>
#include <flex/dispatch/safetensors.h>
#include <flex/hooks/errors.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <random>

namespace fs = std::filesystem;

namespace flex {

using activation_shards::meta_int;

ActivationDataset::ActivationDataset(const std::string& dir) : dir_(dir) {
  if (!fs::is_directory(dir)) throw IOError(dir + ": no such activation dataset directory");
  const fs::path meta = fs::path(dir) / "dataset.json";
  if (!fs::exists(meta)) throw FileFormatError(dir + ": no dataset.json (not an activation dataset)");
  try {
    settings_ = nlohmann::json::parse(read_file(meta.string()));
  } catch (const nlohmann::json::exception& e) {
    throw FileFormatError(meta.string() + ": not JSON: " + e.what());
  }
  if (!settings_.is_object() || !settings_.contains("hooks") || !settings_["hooks"].is_array())
    throw FileFormatError(meta.string() + ": no \"hooks\" array");
  int64_t expect = 0;
  for (int64_t i = 0;; ++i) {
    const fs::path p = fs::path(dir) / activation_shards::shard_file_name(i);
    if (!fs::exists(p)) break;
    auto f = SafetensorsFile::open(p.string());
    const int64_t first = meta_int(*f, "flexmodel.first_context"), end = meta_int(*f, "flexmodel.end_context");
    if (first != expect || end < first)
      throw FileFormatError(p.string() + ": holds contexts [" + std::to_string(first) + ", " + std::to_string(end) +
                            ") but the shards before it end at context " + std::to_string(expect));
    for (const auto& n : activation_index_names())
      if (!f->contains(n)) throw FileFormatError(p.string() + ": no index tensor '" + n + "'");
    for (const auto& h : hooks())
      if (!f->contains(h)) throw FileFormatError(p.string() + ": no activations of hook '" + h + "'");
    const int64_t n = f->info("token_ids").shape.at(0);
    expect = end;
    shard_tokens_.push_back(n);
    num_tokens_ += n;
    files_.push_back(f);
  }
  num_contexts_ = expect;
}

std::vector<std::string> ActivationDataset::hooks() const {
  std::vector<std::string> out;
  for (const auto& h : settings_["hooks"]) out.push_back(h.get<std::string>());
  return out;
}

ActivationShard ActivationDataset::shard(size_t i) const {
  if (i >= files_.size())
    throw NotFoundError(dir_ + ": no shard " + std::to_string(i) + " (" + std::to_string(files_.size()) + " shards)");
  const SafetensorsFile& f = *files_[i];
  ActivationShard s;
  for (const auto& h : hooks()) s.activations[h] = f.get(h);
  s.token_ids = f.get("token_ids");
  s.document = f.get("document");
  s.position = f.get("position");
  s.context = f.get("context");
  s.offset = f.get("offset");
  s.first_context = meta_int(f, "flexmodel.first_context");
  s.end_context = meta_int(f, "flexmodel.end_context");
  return s;
}

ActivationLoader ActivationDataset::loader(ActivationLoaderOptions options) const {
  return ActivationLoader(*this, std::move(options));
}

ActivationLoader::ActivationLoader(const ActivationDataset& dataset, ActivationLoaderOptions options)
    : dataset_(&dataset), o_(std::move(options)), rng_(o_.seed) {
  if (o_.batch_tokens < 1) throw ConfigError("activation loader: batch_tokens must be at least 1");
  if (o_.shuffle_window < 1) throw ConfigError("activation loader: shuffle_window must be at least 1");
  const auto all = dataset.hooks();
  if (o_.hooks.empty()) o_.hooks = all;
  for (const auto& h : o_.hooks)
    if (std::find(all.begin(), all.end(), h) == all.end())
      throw NotFoundError("activation dataset has no hook '" + h + "'");
  for (size_t i = 0; i < dataset.num_shards(); ++i) shard_order_.push_back(i);
  if (o_.shuffle) {
    std::mt19937_64 g(rng_);
    for (size_t i = shard_order_.size(); i > 1; --i) std::swap(shard_order_[i - 1], shard_order_[g() % i]);
    rng_ = g();
  }
}

// Loads the next window of shards, keeping the shards rows still to be handed out refer to.
void ActivationLoader::refill() {
  std::vector<std::pair<int32_t, int64_t>> left(rows_.begin() + static_cast<int64_t>(row_pos_), rows_.end());
  std::vector<ActivationShard> window;
  std::map<int32_t, int32_t> renumber;
  for (auto& r : left) {
    auto it = renumber.find(r.first);
    if (it == renumber.end()) {
      it = renumber.emplace(r.first, static_cast<int32_t>(window.size())).first;
      window.push_back(window_[r.first]);
    }
    r.first = it->second;
  }
  const int64_t take = o_.shuffle ? o_.shuffle_window : 1;
  for (int64_t k = 0; k < take && next_shard_ < shard_order_.size(); ++k) {
    window.push_back(dataset_->shard(shard_order_[next_shard_++]));
    const int32_t w = static_cast<int32_t>(window.size() - 1);
    for (int64_t r = 0; r < window.back().size(); ++r) left.emplace_back(w, r);
  }
  if (o_.shuffle) {
    std::mt19937_64 g(rng_);
    for (size_t i = left.size(); i > 1; --i) std::swap(left[i - 1], left[g() % i]);
    rng_ = g();
  }
  window_ = std::move(window);
  rows_ = std::move(left);
  row_pos_ = 0;
}

std::optional<ActivationSample> ActivationLoader::next() {
  while (rows_.size() - row_pos_ < static_cast<size_t>(o_.batch_tokens) && next_shard_ < shard_order_.size()) refill();
  const size_t n = std::min(rows_.size() - row_pos_, static_cast<size_t>(o_.batch_tokens));
  if (n == 0 || (n < static_cast<size_t>(o_.batch_tokens) && !o_.keep_last)) return std::nullopt;
  // Runs of rows from one shard: contiguous runs are views, others gathers.
  std::vector<std::pair<int32_t, std::vector<int64_t>>> runs;
  for (size_t i = row_pos_; i < row_pos_ + n; ++i) {
    const auto& r = rows_[i];
    if (runs.empty() || runs.back().first != r.first) runs.push_back({r.first, {}});
    runs.back().second.push_back(r.second);
  }
  row_pos_ += n;
  auto pick = [&](const at::Tensor& t, const std::vector<int64_t>& rows) {
    bool contiguous = true;
    for (size_t i = 1; i < rows.size() && contiguous; ++i) contiguous = rows[i] == rows[i - 1] + 1;
    if (contiguous) return t.narrow(0, rows.front(), static_cast<int64_t>(rows.size()));
    return t.index_select(0, at::tensor(rows, at::kLong));
  };
  auto gather = [&](auto get) {
    std::vector<at::Tensor> parts;
    for (const auto& [w, rows] : runs) parts.push_back(pick(get(window_[w]), rows));
    return parts.size() == 1 ? parts[0].clone() : at::cat(parts, 0);
  };
  ActivationSample s;
  for (const auto& h : o_.hooks) s.activations[h] = gather([&](const ActivationShard& sh) { return sh.activations.at(h); });
  s.token_ids = gather([](const ActivationShard& sh) { return sh.token_ids; });
  s.document = gather([](const ActivationShard& sh) { return sh.document; });
  s.position = gather([](const ActivationShard& sh) { return sh.position; });
  s.context = gather([](const ActivationShard& sh) { return sh.context; });
  s.offset = gather([](const ActivationShard& sh) { return sh.offset; });
  return s;
}

}  // namespace flex
