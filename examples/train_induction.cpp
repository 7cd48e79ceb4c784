// The main job's model: a 2-layer Llama (RoPE, four 16-wide heads, tied
// embeddings) trained on the spot to continue token sequences that occur a
// second time in a row of random tokens, the task on which transformers form
// induction heads (Olsson et al., 2022). It is written as a Hugging Face
// folder (config.json, model.safetensors, tokenizer) so that `flexmodel
// capture` and `flexmodel report` treat it like any downloaded model,
// together with held-out rows as input_ids.
//
//   train_induction [--work DIR] [--steps N] [--seconds S] [--seed K]
//       trains, writes DIR/induction-llama/ and DIR/repeated_ids.safetensors;
//       exit code 3 when the limit comes before the model learnt the copy
//   train_induction MODEL_DIR [--work DIR] [--batch B] [--seed K]
//       writes only DIR/repeated_ids.safetensors, drawn from MODEL_DIR's vocabulary
//       (--seed K > 0: other rows than the held-out ones)
// Both also write DIR/induction_prompt.safetensors: row 0 cut inside its
// first repeated copy (the prompt run.sh traces an attribution graph of).
//
// Why the rows look as they do (each choice measured; see docs/design.md):
// - Two segments of 8-15 distinct tokens, each occurring twice, at random
//   places: position cannot find a copy, only content can. With one segment
//   per row some seeds learnt the row's single offset instead (a first-layer
//   head at a fixed distance plus a second-layer head at a distance read from
//   the row), which predicts the copy without an induction head.
// - Filler tokens are drawn from the tokens not in a segment, so every copy
//   token has exactly one earlier occurrence and its continuation is certain.
// - RoPE instead of GPT-2's learnt positions: a previous-token head is then one
//   rotation, the same at every position; with learnt positions the 2-layer
//   GPT-2 found blurred "roughly behind me" heads and no circuit in 3000 steps.
#include "support/adam.h"
#include "support/example_util.h"

#include <flex/dispatch/safetensors.h>
#include <flex/models/auto_model.h>
#include <flex/models/generate.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>

namespace {

constexpr int64_t kRowLength = 64;              // tokens per row, BOS included
constexpr int64_t kSegments = 2;                // repeated segments per row
constexpr int64_t kMinSegment = 8, kMaxSegment = 15;

/// splitmix64: a fixed, platform-independent stream, so the same seed gives
/// the same rows everywhere (std:: distributions differ between libraries).
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, n) (n small: the modulo bias is below 1e-15).
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
  template <class T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(static_cast<int64_t>(i))]);
  }
};

/// The demo model's vocabulary: letters and digits (readable labels) and
/// <|endoftext|> as BOS. A small vocabulary matters: with the 265-token byte
/// tokenizer, the ~200 tokens no row uses slowed the first ~1000 steps down
/// until no circuit formed in 5000 (measured, also in PyTorch).
const std::string kLetters = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// The token ids rows are drawn from: every id but BOS/EOS for the demo
/// model, or for a real model a band of ordinary ids.
std::vector<int64_t> alphabet(const flex::ModelConfig& cfg, bool tiny) {
  const int64_t lo = tiny ? 0 : std::min<int64_t>(1000, cfg.vocab_size / 4);
  const int64_t hi = tiny ? cfg.vocab_size : std::min<int64_t>(cfg.vocab_size, 20000);
  std::vector<int64_t> ids;
  const auto& eos = cfg.eos_token_ids;
  for (int64_t i = lo; i < hi; ++i)
    if (i != cfg.bos_token_id.value_or(-1) && std::find(eos.begin(), eos.end(), i) == eos.end()) ids.push_back(i);
  return ids;
}

struct Rows {
  at::Tensor ids;          // [B, kRowLength]
  at::Tensor predictable;  // [B, kRowLength - 1]: the next token continues a copy (its 2nd..last token)
  std::vector<int64_t> first_copy_at;  // per row: where the earliest second occurrence starts
};

/// B rows: a BOS (when the model has one), then fillers and the two
/// occurrences of each segment in a random order at random places.
Rows repeated_rows(int64_t B, const std::vector<int64_t>& alpha, std::optional<int64_t> bos, Rng& rng) {
  const int64_t T = kRowLength, body = T - (bos ? 1 : 0);
  at::Tensor ids = at::empty({B, T}, at::kLong), predictable = at::zeros({B, T - 1}, at::kBool);
  std::vector<int64_t> first_copy_at(B, -1);
  auto id = ids.accessor<int64_t, 2>();
  auto pred = predictable.accessor<bool, 2>();
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int64_t> tokens = alpha;
    rng.shuffle(tokens);
    std::vector<int64_t> length(kSegments), start(kSegments, -1);
    int64_t used = 0;
    for (auto& l : length) l = kMinSegment + rng.below(kMaxSegment - kMinSegment + 1), used += l;
    const int64_t free = body - 2 * used;
    // 2K cut points split the fillers into 2K + 1 runs between the occurrences.
    std::vector<int64_t> cuts(2 * kSegments);
    for (auto& c : cuts) c = rng.below(free + 1);
    std::sort(cuts.begin(), cuts.end());
    std::vector<int64_t> order;
    for (int64_t k = 0; k < kSegments; ++k) order.push_back(k), order.push_back(k);
    rng.shuffle(order);
    // Segment k is tokens[offset[k] .. + length[k]); fillers come from the rest.
    std::vector<int64_t> offset(kSegments);
    for (int64_t k = 0, o = 0; k < kSegments; o += length[k], ++k) offset[k] = o;
    const int64_t n_fill = static_cast<int64_t>(tokens.size()) - used;
    int64_t t = 0;
    if (bos) id[b][t++] = *bos;
    auto fill = [&](int64_t n) {
      for (int64_t i = 0; i < n; ++i) id[b][t++] = tokens[used + rng.below(n_fill)];
    };
    for (size_t i = 0; i < order.size(); ++i) {
      fill(cuts[i] - (i ? cuts[i - 1] : 0));
      const int64_t k = order[i];
      const bool second = start[k] >= 0;
      if (!second) start[k] = t;
      if (second && first_copy_at[b] < 0) first_copy_at[b] = t;
      for (int64_t j = 0; j < length[k]; ++j, ++t) {
        id[b][t] = tokens[offset[k] + j];
        if (second && j > 0) pred[b][t - 1] = true;
      }
    }
    fill(free - cuts.back());
  }
  return {ids, predictable, first_copy_at};
}

/// Mean next-token loss where `mask` [B, T - 1] is set.
at::Tensor masked_loss(const at::Tensor& logits, const at::Tensor& ids, const at::Tensor& mask) {
  const int64_t T = ids.size(1);
  at::Tensor nll = -at::log_softmax(logits.narrow(1, 0, T - 1), -1).gather(2, ids.narrow(1, 1, T - 1).unsqueeze(2)).squeeze(2);
  return nll.masked_select(mask).mean();
}

/// Trains until the model predicts the copies; false when the step or time limit came first.
bool train(const std::string& dir, int max_steps, double max_seconds, uint64_t seed) {
  // Every step allocates and frees the same few MB; glibc would hand them back
  // to the kernel and page-fault them in again (a third of the step time).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  mallopt(M_TOP_PAD, 64 << 20);
  flex_examples::TinyLlamaOptions o;
  o.max_positions = kRowLength;
  o.alphabet = kLetters;
  flex_examples::write_tiny_llama(dir, o);  // config, tokenizer, random weights (replaced below)
  auto model = flex::load_pretrained(dir);
  // One thread: the training's floating-point sums, and so the model it ends
  // with, are the same whatever OMP_NUM_THREADS says (a 64-wide model gains
  // little from a second thread).
  at::set_num_threads(1);
  at::Generator init_gen = flex::make_cpu_generator(seed);
  const auto alpha = alphabet(model->config(), true);
  const auto bos = model->config().bos_token_id;

  // Initialisation: matrices N(0, 1/fan_in) (Linear weights are [out, in],
  // the embedding [vocab, width]: fan-in is dimension 1 for both), RMSNorm
  // weights 1. Llama's own N(0, 0.02) is sized for 4096-wide layers.
  std::vector<at::Tensor> params;
  for (auto& [name, t] : flex::state_dict(*model)) {
    at::NoGradGuard init_guard;
    if (!t.is_floating_point() || name == "lm_head.weight") continue;  // tied: the embedding
    if (t.dim() >= 2) t.normal_(0, 1.0 / std::sqrt(static_cast<double>(t.size(1))), init_gen);
    else t.fill_(1);
    params.push_back(t);
  }
  for (auto& t : params) t.requires_grad_(true);
  flex_examples::Adam adam(params, 3e-3);

  // The loss is taken on the copies only: nothing else in a row is predictable.
  const int64_t B = 32;
  Rng rng{1234 + seed};
  const auto start = std::chrono::steady_clock::now();
  const double chance = std::log(static_cast<double>(alpha.size()));
  int step = 0, below = 0;
  bool learnt = false;
  double last_loss = chance;
  for (; step < max_steps; ++step) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (elapsed > max_seconds) break;
    const Rows rows = repeated_rows(B, alpha, bos, rng);
    const at::Tensor loss = masked_loss(model->logits(rows.ids), rows.ids, rows.predictable);
    loss.backward();
    adam.step();
    if (step % 50 == 0 || step + 1 == max_steps) {
      last_loss = loss.item<double>();
      if (step % 250 == 0) {
        std::printf("step %5d  %5.1f s  next-token loss on the copies %.3f (chance %.2f)\n", step, elapsed, last_loss,
                    chance);
        std::fflush(stdout);
      }
      // Learnt when three checks in a row (100 steps) are below 0.02 nats:
      // one good batch comes while the heads are still sharpening.
      below = last_loss < 0.02 ? below + 1 : 0;
      if (below == 3) {
        learnt = true;
        ++step;
        break;
      }
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("trained %d steps in %.1f s\n", step, seconds);
  if (!learnt) {
    // Not a finding about the model: it simply has not been trained enough.
    std::printf("training stopped at its limit (%d steps, %.0f s) before the model learnt the copy: loss on the "
                "copies %.2f nats, the goal is below 0.02. Give it more time (--seconds; run.sh: "
                "FLEXMODEL_TRAIN_SECONDS).\n",
                step, seconds, last_loss);
    return false;
  }
  flex_examples::save_weights(dir, *model);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto opt = flex_examples::parse_options(
        argc, argv, "train_induction [MODEL_DIR] [--work DIR] [--steps N] [--seconds S] [--seed K] [--batch B]");
    const bool tiny = opt.model_dir.empty();
    std::string dir = opt.model_dir;
    if (tiny) {
      dir = opt.work + "/induction-llama";
      const double seconds = opt.extra.count("--seconds") ? std::stod(opt.extra["--seconds"]) : 300.0;
      const uint64_t seed = opt.extra.count("--seed") ? std::stoull(opt.extra["--seed"]) : 0;
      if (!train(dir, opt.steps > 0 ? opt.steps : 5000, seconds, seed)) return 3;
      std::printf("wrote the trained model to %s\n", dir.c_str());
    }
    const auto cfg = flex::load_config(dir);
    const int64_t batch = opt.extra.count("--batch") ? std::stoll(opt.extra["--batch"]) : 8;
    // Not a training seed; --seed K (K > 0) with MODEL_DIR draws other rows,
    // e.g. a corpus to train dictionaries on apart from the held-out rows.
    const uint64_t rows_seed = !tiny && opt.extra.count("--seed") ? std::stoull(opt.extra["--seed"]) : 0;
    Rng held_out{99 + rows_seed};
    const Rows rows = repeated_rows(batch, alphabet(cfg, tiny), cfg.bos_token_id, held_out);
    const std::string out = opt.work + "/repeated_ids.safetensors";
    flex::save_safetensors(out, {{"input_ids", rows.ids}});
    std::printf("wrote %s: %lld rows of %lld random tokens, each with %lld segments of %lld-%lld tokens occurring "
                "twice at random places\n",
                out.c_str(), static_cast<long long>(batch), static_cast<long long>(kRowLength),
                static_cast<long long>(kSegments), static_cast<long long>(kMinSegment),
                static_cast<long long>(kMaxSegment));
    // One prompt for an attribution graph: row 0 up to the 7th token of its
    // first repeated copy, so the next token is predictable only by induction.
    const int64_t cut = rows.first_copy_at[0] + 6;
    const std::string prompt = opt.work + "/induction_prompt.safetensors";
    flex::save_safetensors(prompt, {{"input_ids", rows.ids[0].narrow(0, 0, cut).contiguous()}});
    std::printf("wrote %s: row 0's first %lld tokens, ending inside its first repeated copy\n", prompt.c_str(),
                static_cast<long long>(cut));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_induction: error: %s\n", e.what());
    return 1;
  }
}
