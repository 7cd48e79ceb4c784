// Training rows straight from a model's forward (train-sae --model): contexts
// of a corpus run through the model, the hooked activations collected into a
// block of --buffer-tokens, shuffled by (seed, block) and handed out; no disk.
// Blocks are whole batches of contexts, so a resumed run finds the block it
// was in by reading the corpus alone and re-runs only that block's forwards.
#include <flex/sae/model_source.h>

#include <flex/datasets/batch_runner.h>
#include <flex/datasets/token_contexts.h>
#include <flex/flexcore/flex_model.h>
#include <flex/hooks/errors.h>
#include <flex/models/causal_lm.h>
#include <flex/sae/splice.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

namespace flex {

namespace {

class ModelSource : public ActivationSource {
 public:
  ModelSource(std::shared_ptr<CausalLM> model, std::shared_ptr<const Tokenizer> tok, ModelSourceOptions o)
      : model_(std::move(model)), tok_(std::move(tok)), o_(std::move(o)), fm_(model_) {
    attach(o_.hook, x_);
    if (!o_.hook_out.empty()) attach(o_.hook_out, y_);
    // The first contexts are held out for the evaluation; training starts after them.
    const int64_t held_contexts = (o_.held_out_tokens + o_.context_len - 1) / o_.context_len;
    TokenContexts held(contexts_options(held_contexts > 0 ? held_contexts : -1), tok_);
    std::vector<at::Tensor> xs, ys, ids;
    if (held_contexts > 0) {
      while (auto b = held.next()) {
        run(b->input_ids);
        xs.push_back(flat(*x_));
        if (y_->defined()) ys.push_back(flat(*y_));
        ids.push_back(b->input_ids);
        train_start_ = b->next;
      }
      if (xs.empty()) throw ConfigError(o_.dataset + ": the corpus is shorter than one context");
      held_x_ = at::cat(xs);
      held_y_ = ys.empty() ? at::Tensor() : at::cat(ys);
      held_ids_ = at::cat(ids);
    } else {
      run(at::zeros({1, o_.context_len}, at::kLong));  // only to learn the widths
    }
    d_in_ = x_->size(-1);
    d_out_ = y_->defined() ? y_->size(-1) : 0;
    block_start_ = train_start_;
  }

  ~ModelSource() override {
    for (auto& h : handles_) h.remove();
  }

  int64_t d_in() const override { return d_in_; }
  int64_t d_out() const override { return d_out_; }

  std::pair<at::Tensor, at::Tensor> next(int64_t tokens) override {
    std::vector<at::Tensor> xs, ys;
    while (tokens > 0) {
      if (pos_ >= size_) next_block(true);
      const int64_t take = std::min(tokens, size_ - pos_);
      const at::Tensor idx = perm_.narrow(0, pos_, take);
      xs.push_back(block_x_.index_select(0, idx));
      if (block_y_.defined()) ys.push_back(block_y_.index_select(0, idx));
      pos_ += take;
      tokens -= take;
    }
    return {at::cat(xs), ys.empty() ? at::Tensor() : at::cat(ys)};
  }

  void skip(int64_t tokens) override {
    while (tokens > 0) {
      if (pos_ >= size_) {
        // Count the next block's tokens from the corpus; run it only if the skip ends inside it.
        const ContextCursor start = block_start_;
        const int64_t n = next_block(false);
        if (tokens < n) {
          block_start_ = start;
          --block_;
          next_block(true);
        }
      }
      const int64_t take = std::min(tokens, size_ - pos_);
      pos_ += take;
      tokens -= take;
    }
  }

  std::pair<at::Tensor, at::Tensor> held_out(int64_t tokens) override {
    if (!held_x_.defined()) return {at::empty({0, d_in_}), d_out_ ? at::empty({0, d_out_}) : at::Tensor()};
    const int64_t n = std::min(tokens, held_x_.size(0));
    return {held_x_.narrow(0, 0, n), held_y_.defined() ? held_y_.narrow(0, 0, n) : at::Tensor()};
  }

  nlohmann::json describe() const override {
    return {{"model", o_.model_dir}, {"dataset", o_.dataset}, {"context_len", o_.context_len},
            {"batch_size", o_.batch_size}, {"buffer_tokens", o_.buffer_tokens}, {"hook", o_.hook},
            {"hook_out", o_.hook_out}, {"held_out", o_.held_out_tokens}, {"d_in", d_in_}, {"d_out", d_out_}};
  }

  const at::Tensor& held_out_ids() const { return held_ids_; }

 private:
  TokenContextsOptions contexts_options(int64_t max_contexts) const {
    TokenContextsOptions co;
    co.path = o_.dataset;
    if (!o_.text_field.empty()) {
      co.text_field = o_.text_field;
      co.format = DatasetFormat::JsonLines;
    }
    co.context_len = o_.context_len;
    co.batch_size = o_.batch_size;
    co.max_contexts = max_contexts;
    co.prefetch_batches = 0;
    return co;
  }

  void attach(const std::string& name, std::shared_ptr<at::Tensor> into) {
    const HookPointRef at = resolve_hook_name(*model_, name);
    handles_.push_back(attach_at(fm_, at, [into](Module&, const at::Tensor& x, SaveContext&, TrainableModules&) {
      *into = x.detach();
      return x;
    }));
  }

  void run(const at::Tensor& ids) {
    at::NoGradGuard no_grad;
    if (ids.max().item<int64_t>() >= model_->config().vocab_size)
      throw ConfigError(o_.dataset + ": a token id is outside the model's vocabulary of " +
                        std::to_string(model_->config().vocab_size));
    *x_ = at::Tensor();
    *y_ = at::Tensor();
    LMInputs in;
    in.input_ids = ids;
    BatchRunner(fm_).forward(std::move(in));  // placed where the model takes its inputs
    if (!x_->defined()) throw NotFoundError("hook '" + o_.hook + "' did not run in the model's forward");
    if (!o_.hook_out.empty() && !y_->defined())
      throw NotFoundError("hook '" + o_.hook_out + "' did not run in the model's forward");
  }

  // Rows on the CPU, as an activation dataset gives them, whatever device the model ran on.
  static at::Tensor flat(const at::Tensor& t) { return t.reshape({-1, t.size(-1)}).to(at::kCPU, at::kFloat).contiguous(); }

  // The next block: batches of contexts from block_start_ until buffer_tokens
  // (a pass ends a block early; the next pass starts again after the held-out
  // contexts). Runs the forwards only when `forward`; returns its tokens.
  int64_t next_block(bool forward) {
    std::vector<at::Tensor> xs, ys;
    int64_t n = 0;
    for (int attempt = 0; attempt < 2 && n == 0; ++attempt) {
      TokenContexts contexts(contexts_options(-1), tok_, block_start_);
      while (n < o_.buffer_tokens) {
        auto b = contexts.next();
        if (!b) {
          block_start_ = train_start_;  // the next pass
          break;
        }
        block_start_ = b->next;
        n += b->input_ids.numel();
        if (forward) {
          run(b->input_ids);
          xs.push_back(flat(*x_));
          if (y_->defined()) ys.push_back(flat(*y_));
        }
      }
    }
    if (n == 0) throw ConfigError(o_.dataset + ": no contexts left to train on after the held-out ones");
    ++block_;
    size_ = n;
    pos_ = 0;
    if (forward) {
      block_x_ = at::cat(xs);
      block_y_ = ys.empty() ? at::Tensor() : at::cat(ys);
      auto gen = at::make_generator<at::CPUGeneratorImpl>(o_.seed * 1000003ull + static_cast<uint64_t>(block_) * 7919ull);
      perm_ = at::randperm(n, gen, at::kLong);
    }
    return n;
  }

  std::shared_ptr<CausalLM> model_;
  std::shared_ptr<const Tokenizer> tok_;
  ModelSourceOptions o_;
  FlexModel fm_;
  std::vector<HookHandle> handles_;
  std::shared_ptr<at::Tensor> x_ = std::make_shared<at::Tensor>(), y_ = std::make_shared<at::Tensor>();
  at::Tensor held_x_, held_y_, held_ids_;
  ContextCursor train_start_, block_start_;
  int64_t d_in_ = 0, d_out_ = 0;
  int64_t block_ = 0, size_ = 0, pos_ = 0;
  at::Tensor block_x_, block_y_, perm_;
};

}  // namespace

std::unique_ptr<ActivationSource> model_source(std::shared_ptr<CausalLM> model, std::shared_ptr<const Tokenizer> tok,
                                               ModelSourceOptions options, at::Tensor* held_out_ids) {
  auto s = std::make_unique<ModelSource>(std::move(model), std::move(tok), std::move(options));
  if (held_out_ids) *held_out_ids = s->held_out_ids();
  return s;
}

NextTokenLosses next_token_losses(const std::shared_ptr<CausalLM>& model, const at::Tensor& ids,
                                  const std::shared_ptr<SparseDictionary>& sae, const std::string& hook,
                                  const std::string& hook_out) {
  at::NoGradGuard no_grad;
  NextTokenLosses r;
  FlexModel fm(model);
  BatchRunner runner(fm);
  auto loss = [&] {
    double total = 0;
    int64_t count = 0;
    for (int64_t b = 0; b < ids.size(0); b += 8) {
      LMInputs in;
      in.input_ids = ids.narrow(0, b, std::min<int64_t>(8, ids.size(0) - b));
      in = runner.place(std::move(in));
      const at::Tensor& x = in.input_ids;
      const at::Tensor logits = LMOutput::from_value(fm.forward(in.to_inputs())).logits.to(at::kFloat);
      const at::Tensor lp = logits.narrow(1, 0, x.size(1) - 1).log_softmax(-1);
      total -= lp.gather(-1, x.narrow(1, 1, x.size(1) - 1).unsqueeze(-1)).sum().item<double>();
      count += x.size(0) * (x.size(1) - 1);
    }
    return total / std::max<int64_t>(count, 1);
  };
  r.clean = loss();
  {
    SpliceOptions so;
    so.mode = SpliceMode::Replace;
    so.hook_name = hook;
    so.hook_name_out = hook_out;
    Splice sp = splice_sae(fm, sae, so);
    r.with_sae = loss();
    sp.remove();
  }
  // The dictionary's place zeroed: the loss a useless dictionary would give.
  const HookPointRef place = resolve_hook_name(*model, hook_out.empty() ? hook : hook_out);
  HookHandle h = attach_at(fm, {place.module, place.input, false},
                           [](Module&, const at::Tensor& x, SaveContext&, TrainableModules&) { return at::zeros_like(x); });
  r.zeroed = loss();
  h.remove();
  return r;
}

}  // namespace flex
