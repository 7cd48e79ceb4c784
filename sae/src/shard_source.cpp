// Training rows from an activation dataset's shards, shuffled per pass by
// the seed and never touching the held-out tail (flex/sae/trainer.h).
#include <flex/sae/trainer.h>

#include <flex/datasets/activation_shards.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/shape_text.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <numeric>

namespace flex {

namespace {

class ShardSource : public ActivationSource {
 public:
  ShardSource(const std::string& dir, std::string hook, std::string hook_out, int64_t held_out, uint64_t seed)
      : dir_(dir), ds_(dir), hook_(std::move(hook)), hook_out_(std::move(hook_out)), seed_(seed) {
    const auto hooks = ds_.hooks();
    auto check = [&](const std::string& h) {
      if (std::find(hooks.begin(), hooks.end(), h) != hooks.end()) return;
      std::string list;
      for (const auto& n : hooks) list += (list.empty() ? "" : ", ") + n;
      throw NotFoundError("activation dataset '" + dir + "' has no hook '" + h + "' (it holds: " + list + ")");
    };
    check(hook_);
    if (!hook_out_.empty()) check(hook_out_);
    int64_t start = 0;
    for (size_t i = 0; i < ds_.num_shards(); ++i) {
      const ActivationShard s = ds_.shard(i);
      starts_.push_back(start);
      sizes_.push_back(s.size());
      start += s.size();
      auto width = [&](const std::string& h) {
        const at::Tensor& a = s.activations.at(h);
        if (a.dim() != 2)
          throw ShapeError("activation dataset '" + dir + "': hook '" + h + "' stores per-token shape " +
                           shape_text(a.sizes().slice(1)) + "; a dictionary trains on vectors");
        return a.size(1);
      };
      d_in_ = width(hook_);
      if (!hook_out_.empty()) d_out_ = width(hook_out_);
    }
    total_ = start;
    train_end_ = total_ - held_out;
    if (train_end_ <= 0)
      throw ConfigError("activation dataset '" + dir + "' holds " + std::to_string(total_) + " tokens; holding out " +
                        std::to_string(held_out) + " for the evaluation leaves none to train on");
    begin_pass(0);
  }

  int64_t d_in() const override { return d_in_; }
  int64_t d_out() const override { return d_out_; }

  std::pair<at::Tensor, at::Tensor> next(int64_t tokens) override {
    std::vector<at::Tensor> xs, ys;
    int64_t need = tokens;
    while (need > 0) {
      if (order_pos_ >= order_.size()) begin_pass(pass_ + 1);
      const size_t shard = order_[order_pos_];
      if (!rows_.defined()) rows_ = shard_rows(shard);
      const int64_t take = std::min(need, rows_.size(0) - row_pos_);
      if (take > 0) {
        const ActivationShard s = ds_.shard(shard);
        const at::Tensor idx = rows_.narrow(0, row_pos_, take);
        xs.push_back(s.activations.at(hook_).index_select(0, idx).to(at::kFloat));
        if (!hook_out_.empty()) ys.push_back(s.activations.at(hook_out_).index_select(0, idx).to(at::kFloat));
        row_pos_ += take;
        need -= take;
      }
      if (row_pos_ >= rows_.size(0)) next_shard();
    }
    return {at::cat(xs), ys.empty() ? at::Tensor() : at::cat(ys)};
  }

  void skip(int64_t tokens) override {
    while (tokens > 0) {
      if (order_pos_ >= order_.size()) begin_pass(pass_ + 1);
      const size_t shard = order_[order_pos_];
      const int64_t left = train_rows(shard) - row_pos_;
      const int64_t take = std::min(tokens, left);
      row_pos_ += take;
      tokens -= take;
      if (row_pos_ >= train_rows(shard)) next_shard();
    }
  }

  std::pair<at::Tensor, at::Tensor> held_out(int64_t tokens) override {
    std::vector<at::Tensor> xs, ys;
    const int64_t from = train_end_, to = std::min(total_, train_end_ + tokens);
    for (size_t i = 0; i < sizes_.size(); ++i) {
      const int64_t a = std::max(from, starts_[i]), b = std::min(to, starts_[i] + sizes_[i]);
      if (a >= b) continue;
      const ActivationShard s = ds_.shard(i);
      xs.push_back(s.activations.at(hook_).narrow(0, a - starts_[i], b - a).to(at::kFloat));
      if (!hook_out_.empty()) ys.push_back(s.activations.at(hook_out_).narrow(0, a - starts_[i], b - a).to(at::kFloat));
    }
    if (xs.empty()) return {at::empty({0, d_in_}), hook_out_.empty() ? at::Tensor() : at::empty({0, d_out_})};
    return {at::cat(xs), ys.empty() ? at::Tensor() : at::cat(ys)};
  }

  nlohmann::json describe() const override {
    return {{"activations", dir_},          {"hook", hook_},     {"hook_out", hook_out_}, {"tokens", total_},
            {"held_out", total_ - train_end_}, {"d_in", d_in_}, {"d_out", d_out_}};
  }

 private:
  int64_t train_rows(size_t shard) const {
    return std::max<int64_t>(0, std::min(sizes_[shard], train_end_ - starts_[shard]));
  }
  // The shard's training rows in this pass's order.
  at::Tensor shard_rows(size_t shard) const {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed_ * 1000003ull + pass_ * 7919ull + shard + 1);
    return at::randperm(train_rows(shard), gen, at::kLong);
  }
  void next_shard() {
    ++order_pos_;
    row_pos_ = 0;
    rows_ = at::Tensor();
  }
  void begin_pass(uint64_t pass) {
    pass_ = pass;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed_ * 1000003ull + pass * 7919ull);
    const at::Tensor perm = at::randperm(static_cast<int64_t>(sizes_.size()), gen, at::kLong);
    order_.clear();
    for (int64_t i = 0; i < perm.numel(); ++i) {
      const size_t s = static_cast<size_t>(perm[i].item<int64_t>());
      if (train_rows(s) > 0) order_.push_back(s);
    }
    order_pos_ = 0;
    row_pos_ = 0;
    rows_ = at::Tensor();
  }

  std::string dir_;
  ActivationDataset ds_;
  std::string hook_, hook_out_;
  uint64_t seed_;
  int64_t d_in_ = 0, d_out_ = 0, total_ = 0, train_end_ = 0;
  std::vector<int64_t> starts_, sizes_;
  uint64_t pass_ = 0;
  std::vector<size_t> order_;
  size_t order_pos_ = 0;
  int64_t row_pos_ = 0;
  at::Tensor rows_;
};

}  // namespace

std::unique_ptr<ActivationSource> shard_source(const std::string& dir, const std::string& hook,
                                               const std::string& hook_out, int64_t held_out_tokens, uint64_t seed) {
  return std::make_unique<ShardSource>(dir, hook, hook_out, held_out_tokens, seed);
}

}  // namespace flex
