// The main job's model: a 2-layer GPT-2 trained on the spot (about 200
// steps, 5 s; single-threaded so that OMP_NUM_THREADS cannot change the model
// it ends with) to continue repeated random token sequences, the task on
// which transformers form induction heads (Olsson et al., 2022). It is written as a
// Hugging Face folder (config.json, model.safetensors, tokenizer) so that
// `flexmodel capture` and `flexmodel report` treat it like any downloaded
// model, together with held-out repeated sequences as input_ids.
//
//   train_induction_gpt2 [--work DIR] [--steps N] [--seconds S] [--seed K]
//       trains, writes DIR/induction-gpt2/ and DIR/repeated_ids.safetensors;
//       exit code 3 when the limit comes before the model learnt the copy
//   train_induction_gpt2 MODEL_DIR [--work DIR]
//       writes only DIR/repeated_ids.safetensors, drawn from MODEL_DIR's vocabulary
#include "support/adam.h"
#include "support/example_util.h"

#include <flex/dispatch/safetensors.h>
#include <flex/models/auto_model.h>
#include <flex/models/generate.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <malloc.h>

#include <chrono>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <unordered_set>

namespace {

constexpr int64_t kHalf = 24;  // every row: [bos, x_1..x_kHalf, x_1..x_kHalf]

/// The token ids sequences are drawn from: the tiny tokenizer's letters and
/// digits (readable labels), or for a real model a band of ordinary ids.
std::vector<int64_t> alphabet(const flex::ModelConfig& cfg, bool tiny) {
  std::vector<int64_t> ids;
  if (tiny) {
    for (int c = 0; c < 256; ++c)
      if (std::isalnum(c)) ids.push_back(c);  // the tiny tokenizer's id of byte c is c
    return ids;
  }
  const int64_t lo = std::min<int64_t>(1000, cfg.vocab_size / 4), hi = std::min<int64_t>(cfg.vocab_size, 20000);
  for (int64_t i = lo; i < hi; ++i) ids.push_back(i);
  return ids;
}

at::Tensor draw(const std::vector<int64_t>& alpha, std::vector<int64_t> shape, at::Generator& g) {
  at::Tensor pick = at::randint(static_cast<int64_t>(alpha.size()), shape, g, at::TensorOptions().dtype(at::kLong));
  return at::tensor(alpha, at::kLong).index_select(0, pick.flatten()).view(shape);
}

/// [B, 1 + 2 * kHalf]: a BOS (when the model has one), then kHalf random
/// tokens, repeated.
at::Tensor repeated_batch(int64_t B, const std::vector<int64_t>& alpha, std::optional<int64_t> bos, at::Generator& g) {
  at::Tensor half = draw(alpha, {B, kHalf}, g);
  std::vector<at::Tensor> parts;
  if (bos) parts.push_back(at::full({B, 1}, *bos, at::kLong));
  parts.push_back(half);
  parts.push_back(half);
  return at::cat(parts, 1);
}

/// Mean next-token loss where `mask` [B, T - 1] is set.
at::Tensor masked_loss(const at::Tensor& logits, const at::Tensor& ids, const at::Tensor& mask) {
  const int64_t T = ids.size(1);
  at::Tensor nll = -at::log_softmax(logits.narrow(1, 0, T - 1), -1).gather(2, ids.narrow(1, 1, T - 1).unsqueeze(2)).squeeze(2);
  return nll.masked_select(mask).mean();
}

/// Trains until the model predicts the copy; false when the step or time limit came first.
bool train(const std::string& dir, int max_steps, double max_seconds, uint64_t seed) {
  // Every step allocates and frees the same few MB; glibc would hand them back
  // to the kernel and page-fault them in again (a third of the step time).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  mallopt(M_TOP_PAD, 64 << 20);
  flex_examples::TinyGpt2Options o;
  o.n_layer = 2;
  o.n_embd = 64;
  o.n_head = 4;
  o.n_positions = 64;
  o.seed = 0;
  flex_examples::write_tiny_gpt2(dir, o);  // config, tokenizer, random weights
  auto model = flex::load_pretrained(dir);
  // One thread: the training's floating-point sums, and so the model it ends
  // with, are the same whatever OMP_NUM_THREADS says (a 64-wide model gains
  // little from a second thread).
  at::set_num_threads(1);
  at::Generator init_gen = flex::make_cpu_generator(seed);
  const auto alpha = alphabet(model->config(), true);
  const auto bos = model->config().bos_token_id;

  // Initialisation: matrices N(0, 1/fan_in), zero biases, unit norms, each
  // tensor once (lm_head.weight is wte.weight). GPT-2's own N(0, 0.02) is
  // sized for 768-wide layers: at 64 wide it shrinks every product by ~6x,
  // the model starts deep in the saddle before the copy is found, and how long
  // it stays there depended on float rounding (it stalled with 2 threads).
  // Conv1D weights are [in, out]; embeddings [vocab or positions, width].
  std::vector<at::Tensor> params;
  std::unordered_set<const void*> seen;
  for (auto& [name, t] : flex::state_dict(*model)) {
    at::NoGradGuard init_guard;
    if (!t.is_floating_point() || !seen.insert(t.unsafeGetTensorImpl()).second) continue;
    if (name.find("ln_") != std::string::npos) {
      if (name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0) t.fill_(1);
      else t.zero_();
    } else if (t.dim() >= 2) {
      const bool embedding = name.find("wte") != std::string::npos || name.find("wpe") != std::string::npos;
      t.normal_(0, 1.0 / std::sqrt(static_cast<double>(embedding ? t.size(1) : t.size(0))), init_gen);
    } else {
      t.zero_();
    }
    params.push_back(t);
  }
  for (auto& t : params) t.requires_grad_(true);
  flex_examples::Adam adam(params, 3e-3);

  // Training rows are like the held-out ones. The copy always starts kHalf
  // tokens later, so a head can also find it by position alone; the report's
  // scores say which heads do it, not how. `second` [B, T - 1] marks the
  // positions whose next token continues the copy (predicting copy tokens 2 .. kHalf).
  const int64_t B = 32, T = 1 + 2 * kHalf;
  const at::Tensor second = at::zeros({B, T - 1}, at::kBool).index_fill_(1, at::arange(1 + kHalf, T - 1), true);
  const at::Tensor first = second.logical_not();

  at::Generator gen = flex::make_cpu_generator(1234 + seed);
  const auto start = std::chrono::steady_clock::now();
  const double chance = std::log(static_cast<double>(alpha.size()));
  int step = 0;
  bool learnt = false;
  double last_loss = chance;
  for (; step < max_steps; ++step) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (elapsed > max_seconds) break;
    const at::Tensor ids = repeated_batch(B, alpha, bos, gen);
    const at::Tensor logits = model->logits(ids);
    // The two parts weigh the same in the loss.
    const at::Tensor loss_first = masked_loss(logits, ids, first), loss_second = masked_loss(logits, ids, second);
    (loss_first + loss_second).backward();
    adam.step();
    if (step % 50 == 0 || step + 1 == max_steps) {
      last_loss = loss_second.item<double>();
      if (step % 250 == 0) {
        std::printf("step %5d  %5.1f s  next-token loss: first copy %.2f, second copy %.2f  (chance %.2f)\n", step,
                    elapsed, loss_first.item<double>(), last_loss, chance);
        std::fflush(stdout);
      }
      if (last_loss < 0.02) {  // the model has learnt to predict the copy
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
    std::printf("training stopped at its limit (%d steps, %.0f s) before the model learnt the copy: second-copy loss "
                "%.2f nats, the goal is below 0.02. Give it more time (--seconds; run.sh: FLEXMODEL_TRAIN_SECONDS).\n",
                step, seconds, last_loss);
    return false;
  }
  flex_examples::save_gpt2_weights(dir, *model);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto opt = flex_examples::parse_options(
        argc, argv, "train_induction_gpt2 [MODEL_DIR] [--work DIR] [--steps N] [--seconds S] [--seed K] [--batch B]");
    const bool tiny = opt.model_dir.empty();
    std::string dir = opt.model_dir;
    if (tiny) {
      dir = opt.work + "/induction-gpt2";
      const double seconds = opt.extra.count("--seconds") ? std::stod(opt.extra["--seconds"]) : 300.0;
      const uint64_t seed = opt.extra.count("--seed") ? std::stoull(opt.extra["--seed"]) : 0;
      if (!train(dir, opt.steps > 0 ? opt.steps : 3000, seconds, seed)) return 3;
      std::printf("wrote the trained model to %s\n", dir.c_str());
    }
    const auto cfg = flex::load_config(dir);
    const int64_t batch = opt.extra.count("--batch") ? std::stoll(opt.extra["--batch"]) : 4;
    at::Generator gen = flex::make_cpu_generator(99);  // held out: not a training seed
    at::Tensor ids = repeated_batch(batch, alphabet(cfg, tiny), cfg.bos_token_id, gen);
    const std::string out = opt.work + "/repeated_ids.safetensors";
    flex::save_safetensors(out, {{"input_ids", ids}});
    std::printf("wrote %s: %lld sequences of %lld random tokens, each repeated once\n", out.c_str(),
                static_cast<long long>(batch), static_cast<long long>(kHalf));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_induction_gpt2: error: %s\n", e.what());
    return 1;
  }
}
