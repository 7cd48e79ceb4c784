#include <flex/datasets/capture_dataset.h>

#include "shard_format.h"

#include <flex/datasets/activation_shards.h>
#include <flex/datasets/batch_runner.h>
#include <flex/flexcore/flex_model.h>
#include <flex/hooks/errors.h>
#include <flex/models/causal_lm.h>
#include <flex/parallel/communicator.h>

#include <ATen/ATen.h>

#include <chrono>
#include <filesystem>
#include <map>

namespace fs = std::filesystem;

namespace flex {

namespace {

/// This forward's captures, by hook: exactly what the dataset needs, no more.
class ForwardCaptures : public ActivationSink {
 public:
  void write(const std::string& key, int64_t, const at::Tensor& t) override { got_[key].push_back(t); }
  void end_forward(int64_t) override {}
  std::map<std::string, std::vector<at::Tensor>> take() { return std::move(got_); }

 private:
  std::map<std::string, std::vector<at::Tensor>> got_;
};

// [B, T, ...] or [B*T, ...] -> [B*T, ...].
at::Tensor per_token(const std::string& hook, const at::Tensor& t, int64_t B, int64_t T) {
  if (t.dim() >= 2 && t.size(0) == B && t.size(1) == T) {
    std::vector<int64_t> shape{B * T};
    shape.insert(shape.end(), t.sizes().begin() + 2, t.sizes().end());
    return t.reshape(shape);
  }
  if (t.dim() >= 1 && t.size(0) == B * T) return t;
  throw ShapeError("module '" + hook + "' gives " + shape_text(t.sizes()) + " for a batch of " + std::to_string(B) +
                   " x " + std::to_string(T) + " tokens: a dataset capture stores one row per token ([B, T, ...] or "
                   "[B*T, ...]); capture it with --out instead");
}

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::string broadcast_text(Communicator& world, std::string text) {
  at::Tensor n = at::full({1}, static_cast<int64_t>(text.size()), at::kLong);
  world.broadcast(n, 0);
  at::Tensor bytes = at::zeros({n.item<int64_t>()}, at::kByte);
  if (world.rank() == 0 && !text.empty()) std::memcpy(bytes.data_ptr(), text.data(), text.size());
  world.broadcast(bytes, 0);
  return std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(bytes.numel()));
}

}  // namespace

std::vector<int64_t> stored_offsets(const at::Tensor& context_ids, int64_t context_number,
                                    const DatasetCaptureOptions& o) {
  at::Tensor ids = context_ids.to(at::kLong).contiguous();
  const int64_t* p = ids.data_ptr<int64_t>();
  std::vector<int64_t> eligible;
  for (int64_t k = 0; k < ids.numel(); ++k)
    if (!(o.exclude_bos && o.bos_id && p[k] == *o.bos_id)) eligible.push_back(k);
  if (o.random_positions <= 0 || o.random_positions >= static_cast<int64_t>(eligible.size())) return eligible;
  // A partial Fisher-Yates shuffle from a generator of (seed, context): the
  // same draw whichever run, batch or rank makes it.
  uint64_t state = o.seed * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(context_number);
  splitmix64(state);
  for (int64_t i = 0; i < o.random_positions; ++i) {
    const uint64_t j = i + splitmix64(state) % (eligible.size() - i);
    std::swap(eligible[i], eligible[j]);
  }
  eligible.resize(o.random_positions);
  std::sort(eligible.begin(), eligible.end());
  return eligible;
}

DatasetCaptureResult capture_dataset(FlexModel& fm, std::shared_ptr<const Tokenizer> tokenizer,
                                     const DatasetCaptureOptions& o, Communicator* world) {
  const auto t0 = std::chrono::steady_clock::now();
  if (o.hooks.empty() && o.columns.empty()) throw ConfigError("dataset capture: no hooks given");
  if (o.exclude_bos && !o.bos_id)
    throw ConfigError("exclude BOS: the model declares no BOS token (no bos_token_id, and no BOS in its tokenizer)");
  if (o.random_positions < 0) throw ConfigError("random positions: K must be positive");
  const bool writes = !world || world->rank() == 0;

  nlohmann::json settings = o.describe;
  std::vector<std::string> stored = o.hooks;
  for (const auto& c : o.columns) stored.push_back(c.name);
  settings["hooks"] = stored;
  settings["dataset"] = fs::absolute(o.corpus.path).lexically_normal().string();
  settings["dataset_bytes"] = fs::exists(o.corpus.path) ? static_cast<int64_t>(fs::file_size(o.corpus.path)) : 0;
  settings["text_field"] = o.corpus.text_field;
  settings["context_len"] = o.corpus.context_len;
  settings["positions"] = o.random_positions > 0 ? "random:" + std::to_string(o.random_positions) : "all";
  settings["seed"] = o.seed;
  settings["exclude_bos"] = o.exclude_bos;
  if (o.bos_id) settings["bos_id"] = *o.bos_id;

  std::unique_ptr<ActivationShardWriter> writer;
  std::string cursor_text;
  if (writes) {
    ActivationShardWriterOptions wo;
    wo.max_shard_bytes = o.max_shard_bytes;
    wo.queue_batches = o.write_queue_batches;
    wo.dtype = o.dtype;
    writer = std::make_unique<ActivationShardWriter>(o.out_dir, settings, wo);
    cursor_text = writer->resume_cursor().value_or("");
  }
  if (world && world->size() > 1) cursor_text = broadcast_text(*world, cursor_text);
  const ContextCursor start =
      cursor_text.empty() ? ContextCursor{} : ContextCursor::from_json(cursor_text, o.out_dir + " (last shard)");

  DatasetCaptureResult r;
  r.resumed_at = start.context;
  TokenContexts contexts(o.corpus, std::move(tokenizer), start);

  auto sink = std::make_shared<ForwardCaptures>();
  std::vector<HookHandle> handles;
  for (const auto& h : o.hooks) handles.push_back(fm.register_forward_hook(std::make_shared<HookFunction>(h)));
  fm.set_sink(sink);
  struct Restore {
    FlexModel& fm;
    std::vector<HookHandle>& handles;
    ~Restore() {
      for (auto& h : handles) h.remove();
      fm.set_sink(nullptr);
    }
  } restore{fm, handles};

  at::NoGradGuard no_grad;
  BatchRunner runner(fm);  // each batch goes where the model takes its inputs
  DatasetCaptureProgress p;
  p.contexts = start.context;
  p.contexts_total = o.corpus.max_contexts;
  const int64_t T = o.corpus.context_len;
  while (auto batch = contexts.next()) {
    const int64_t B = batch->input_ids.size(0);
    if (o.vocab_size > 0) {
      const int64_t top = batch->input_ids.max().item<int64_t>();
      if (top >= o.vocab_size)
        throw ConfigError(o.corpus.path + ": token id " + std::to_string(top) + " (in contexts from " +
                          std::to_string(batch->first_context) + ") is outside the model's vocabulary of " +
                          std::to_string(o.vocab_size));
    }
    LMInputs in;
    in.input_ids = batch->input_ids;
    runner.forward(std::move(in));
    auto got = sink->take();
    // Every rank takes the columns (a caller may gather them over the ranks).
    std::vector<at::Tensor> column_values;
    for (const auto& c : o.columns) column_values.push_back(c.take(B, T));
    if (writes) {
      ActivationBatch ab;
      ab.first_context = batch->first_context;
      ab.end_context = batch->first_context + B;
      ab.cursor = batch->next.to_json();
      ab.token_ids = batch->input_ids.reshape({-1});
      ab.document = batch->document.reshape({-1});
      ab.position = batch->position.reshape({-1});
      ab.context = (at::arange(B, at::kLong) + batch->first_context).unsqueeze(1).expand({B, T}).reshape({-1});
      ab.offset = at::arange(T, at::kLong).unsqueeze(0).expand({B, T}).reshape({-1});
      for (const auto& h : o.hooks) {
        auto it = got.find(h);
        if (it == got.end())
          throw NotFoundError("module '" + h + "' was not called in the forward: nothing to capture");
        if (it->second.size() != 1)
          throw ConfigError("module '" + h + "' ran " + std::to_string(it->second.size()) +
                            " times in one forward: a dataset capture needs one call per forward");
        ab.activations.push_back(per_token(h, it->second[0], B, T));
      }
      for (size_t i = 0; i < o.columns.size(); ++i)
        ab.activations.push_back(per_token(o.columns[i].name, column_values[i], B, T));
      if (o.exclude_bos || o.random_positions > 0) {
        std::vector<int64_t> keep;
        for (int64_t b = 0; b < B; ++b)
          for (int64_t k : stored_offsets(batch->input_ids[b], batch->first_context + b, o)) keep.push_back(b * T + k);
        ab.keep = at::tensor(keep, at::kLong);
        r.tokens_stored += static_cast<int64_t>(keep.size());
      } else {
        r.tokens_stored += B * T;
      }
      writer->add(std::move(ab));
    }
    r.tokens_run += B * T;
    p.contexts = batch->first_context + B;
    p.tokens_run = r.tokens_run;
    p.tokens_stored = r.tokens_stored;
    p.corpus_fraction = batch->corpus_fraction;
    p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (writes && o.on_progress) o.on_progress(p);
  }
  if (writer) {
    writer->finish();
    r.bytes_written = writer->bytes_written();
  }
  r.contexts = p.contexts;
  r.tokens_dropped = contexts.tokens_dropped();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!writes) r.tokens_stored = 0;
  return r;
}

}  // namespace flex
