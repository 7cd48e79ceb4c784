// The main job's model: a 2-layer GPT-2 trained on the spot (about a minute
// on 2 cores) to continue repeated random token sequences, the task on which
// transformers form induction heads (Olsson et al., 2022). It is written as a
// Hugging Face folder (config.json, model.safetensors, tokenizer) so that
// `flexmodel capture` and `flexmodel report` treat it like any downloaded
// model, together with held-out repeated sequences as input_ids.
//
//   train_induction_gpt2 [--work DIR] [--steps N] [--seconds S]
//       trains, writes DIR/induction-gpt2/ and DIR/repeated_ids.safetensors
//   train_induction_gpt2 MODEL_DIR [--work DIR]
//       writes only DIR/repeated_ids.safetensors, drawn from MODEL_DIR's vocabulary
#include "support/adam.h"
#include "support/example_util.h"

#include <flex/dispatch/safetensors.h>
#include <flex/models/auto_model.h>
#include <flex/models/generate.h>

#include <ATen/ATen.h>

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

void train(const std::string& dir, int max_steps, double max_seconds) {
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
  const auto alpha = alphabet(model->config(), true);
  const auto bos = model->config().bos_token_id;

  // GPT-2's initialisation (N(0, 0.02) matrices, zero biases, unit norms),
  // each tensor once (lm_head.weight is wte.weight).
  std::vector<at::Tensor> params;
  std::unordered_set<const void*> seen;
  for (auto& [name, t] : flex::state_dict(*model)) {
    at::NoGradGuard init_guard;
    if (!t.is_floating_point() || !seen.insert(t.unsafeGetTensorImpl()).second) continue;
    if (name.find("ln_") != std::string::npos) {
      if (name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0) t.fill_(1);
      else t.zero_();
    } else if (t.dim() >= 2) {
      t.normal_(0, 0.02);
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

  at::Generator gen = flex::make_cpu_generator(1234);
  const auto start = std::chrono::steady_clock::now();
  const double chance = std::log(static_cast<double>(alpha.size()));
  int step = 0;
  for (; step < max_steps; ++step) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (elapsed > max_seconds) break;
    const at::Tensor ids = repeated_batch(B, alpha, bos, gen);
    const at::Tensor logits = model->logits(ids);
    // The two parts weigh the same in the loss.
    const at::Tensor loss_first = masked_loss(logits, ids, first), loss_second = masked_loss(logits, ids, second);
    (loss_first + loss_second).backward();
    adam.step();
    if (step % 250 == 0 || step + 1 == max_steps) {
      const double l2 = loss_second.item<double>();
      std::printf("step %5d  %5.1f s  next-token loss: first copy %.2f, second copy %.2f  (chance %.2f)\n", step,
                  elapsed, loss_first.item<double>(), l2, chance);
      std::fflush(stdout);
      if (l2 < 0.02) {  // the model has learnt to predict the copy
        ++step;
        break;
      }
    }
  }
  std::printf("trained %d steps in %.1f s\n", step,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());

  flex_examples::save_gpt2_weights(dir, *model);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto opt = flex_examples::parse_options(
        argc, argv, "train_induction_gpt2 [MODEL_DIR] [--work DIR] [--steps N] [--seconds S] [--batch B]");
    const bool tiny = opt.model_dir.empty();
    std::string dir = opt.model_dir;
    if (tiny) {
      dir = opt.work + "/induction-gpt2";
      const double seconds = opt.extra.count("--seconds") ? std::stod(opt.extra["--seconds"]) : 110.0;
      train(dir, opt.steps > 0 ? opt.steps : 3000, seconds);
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
