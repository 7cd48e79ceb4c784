// Induction heads, found on a model trained on the spot: a 2-layer
// attention-only transformer built from flex::Modules learns to continue
// repeated random token sequences. Its attention patterns, captured with
// FlexModel, show a previous-token head in layer 0 and induction heads in
// layer 1 (attending from token i to the token after i's earlier copy);
// ablating those heads with an editing function makes the loss on the
// repeated half rise. Writes the scores and the best head's pattern as SVG.
//
//   induction_heads [--steps N] [--seconds S] [--work DIR]   (defaults: 4000 steps, 110 s)
#include "support/adam.h"
#include "support/example_util.h"
#include "support/svg.h"

#include <flex/flexcore/flex_model.h>
#include <flex/hooks/nn.h>
#include <flex/models/generate.h>

#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <cstdio>

namespace {

constexpr int64_t kVocab = 64, kHalf = 16, kDim = 64, kHeads = 4, kHeadDim = kDim / kHeads;

/// Causal multi-head attention with two hook points: the pattern
/// [B, H, T, T] and the per-head outputs [B, T, H, D].
struct Attention : flex::Module {
  std::shared_ptr<flex::Linear> q, k, v, o;
  std::shared_ptr<flex::Identity> hook_pattern, hook_z;
  Attention() : Module("Attention") {
    q = add("q", std::make_shared<flex::Linear>(kDim, kDim, false));
    k = add("k", std::make_shared<flex::Linear>(kDim, kDim, false));
    v = add("v", std::make_shared<flex::Linear>(kDim, kDim, false));
    o = add("o", std::make_shared<flex::Linear>(kDim, kDim, false));
    hook_pattern = add("hook_pattern", std::make_shared<flex::Identity>());
    hook_z = add("hook_z", std::make_shared<flex::Identity>());
  }
  flex::Value forward(flex::Inputs in) override {
    const at::Tensor& x = in.tensor(0);
    const int64_t B = x.size(0), T = x.size(1);
    auto heads = [&](const at::Tensor& t) { return t.view({B, T, kHeads, kHeadDim}).transpose(1, 2); };
    at::Tensor scores = at::matmul(heads((*q)(x)), heads((*k)(x)).transpose(-1, -2)) / std::sqrt(double(kHeadDim));
    at::Tensor mask = at::ones({T, T}, x.options().dtype(at::kBool)).triu(1);
    at::Tensor p = (*hook_pattern)(at::softmax(scores.masked_fill(mask, -1e9), -1));
    at::Tensor z = (*hook_z)(at::matmul(p, heads((*v)(x))).transpose(1, 2).contiguous());  // [B, T, H, D]
    return (*o)(z.view({B, T, kDim}));
  }
};

struct AttnOnly : flex::Module {
  std::shared_ptr<flex::Embedding> embed, pos;
  std::shared_ptr<flex::ModuleList> layers;
  std::shared_ptr<flex::Linear> unembed;
  AttnOnly() : Module("AttnOnlyTransformer") {
    embed = add("embed", std::make_shared<flex::Embedding>(kVocab, kDim));
    pos = add("pos", std::make_shared<flex::Embedding>(2 * kHalf, kDim));
    layers = add("layers", std::make_shared<flex::ModuleList>());
    for (int i = 0; i < 2; ++i) layers->push_back(std::make_shared<Attention>());
    unembed = add("unembed", std::make_shared<flex::Linear>(kDim, kVocab, false));
  }
  flex::Value forward(flex::Inputs in) override {
    const at::Tensor& ids = in.tensor(0);
    at::Tensor x = (*embed)(ids) + (*pos)(at::arange(ids.size(1), ids.options()));
    for (const auto& l : layers->items()) x = x + (*l)(x);
    return (*unembed)(x);
  }
};

/// Random halves, repeated: [B, 2 * kHalf].
at::Tensor repeated_batch(int64_t B, at::Generator& g) {
  at::Tensor half = at::randint(kVocab, {B, kHalf}, g, at::TensorOptions().dtype(at::kLong));
  return at::cat({half, half}, 1);
}

/// Mean next-token loss on the repeated half (predicting tokens kHalf+1 ..).
at::Tensor repeated_half_loss(const at::Tensor& logits, const at::Tensor& ids) {
  at::Tensor lp = at::log_softmax(logits.narrow(1, kHalf, kHalf - 1), -1);
  return at::nll_loss(lp.reshape({-1, kVocab}), ids.narrow(1, kHalf + 1, kHalf - 1).reshape({-1}));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto opt = flex_examples::parse_options(argc, argv, "induction_heads [--steps N] [--seconds S] [--work DIR]");
    const int max_steps = opt.steps > 0 ? opt.steps : 4000;
    const double max_seconds = opt.extra.count("--seconds") ? std::stod(opt.extra["--seconds"]) : 110.0;
    at::manual_seed(0);
    at::Generator gen = flex::make_cpu_generator(1234);
    auto model = std::make_shared<AttnOnly>();
    std::vector<at::Tensor> params;
    for (auto& p : model->parameters()) params.push_back(p.requires_grad_(true));
    flex_examples::Adam adam(params);

    // 1. Train (full next-token loss; only the repeated half is predictable).
    const auto start = std::chrono::steady_clock::now();
    int step = 0;
    double last = 0;
    for (; step < max_steps; ++step) {
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (elapsed > max_seconds) break;
      at::Tensor ids = repeated_batch(32, gen);
      at::Tensor logits = (*model)(ids);
      at::Tensor loss = at::nll_loss(at::log_softmax(logits.narrow(1, 0, 2 * kHalf - 1), -1).reshape({-1, kVocab}),
                                     ids.narrow(1, 1, 2 * kHalf - 1).reshape({-1}));
      loss.backward();
      adam.step();
      last = repeated_half_loss(logits.detach(), ids).item<double>();
      if (step % 500 == 0) std::printf("step %5d  loss on repeated half %.3f\n", step, last);
    }
    std::printf("trained %d steps in %.1f s; loss on repeated half %.3f (chance: %.3f)\n", step,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), last, std::log(double(kVocab)));

    // 2. Capture attention patterns with FlexModel; score every head.
    at::NoGradGuard ng;
    at::Tensor ids = repeated_batch(64, gen);
    flex::FlexModel fm(model);
    fm.create_hook_group("patterns", "hook_pattern");
    at::Tensor base_logits = fm.forward(ids, {"patterns"});
    const double base_loss = repeated_half_loss(base_logits, ids).item<double>();
    flex_examples::Heatmap scores;
    scores.title = "head scores: layer 0 previous-token, layer 1 induction";
    scores.value_label = "score";
    int best = 0;
    double best_score = -1;
    std::vector<double> induction(kHeads);
    for (int l = 1; l >= 0; --l) {
      at::Tensor p = fm.output().at("layers." + std::to_string(l) + ".hook_pattern")[0];  // [B, H, T, T]
      std::vector<double> row;
      std::vector<std::string> text;
      for (int h = 0; h < kHeads; ++h) {
        double s = 0;
        for (int64_t i = kHalf; i < 2 * kHalf; ++i) {
          const int64_t target = l == 1 ? i - kHalf + 1 : i - 1;  // token after the earlier copy / previous token
          s += p.select(1, h).select(1, i).select(1, target).mean().item<double>();
        }
        s /= kHalf;
        row.push_back(s);
        char buf[16];
        std::snprintf(buf, sizeof buf, "%.2f", s);
        text.push_back(buf);
        if (l == 1) {
          induction[h] = s;
          if (s > best_score) best_score = s, best = h;
        }
      }
      scores.values.push_back(row);
      scores.text.push_back(text);
      scores.row_labels.push_back(l == 1 ? "layer 1 (induction)" : "layer 0 (prev token)");
      std::printf("layer %d scores:", l);
      for (double s : row) std::printf(" %.3f", s);
      std::printf("\n");
    }
    for (int h = 0; h < kHeads; ++h) scores.col_labels.push_back("head " + std::to_string(h));
    flex_examples::write_heatmap_svg(opt.work + "/induction_scores.svg", scores);

    flex_examples::Heatmap pattern;
    pattern.title = "layer 1 head " + std::to_string(best) + " attention (query row, key column), example 0";
    at::Tensor p = fm.output().at("layers.1.hook_pattern")[0][0][best];
    for (int64_t i = 0; i < 2 * kHalf; ++i) {
      pattern.row_labels.push_back(std::to_string(i) + ":" + std::to_string(ids[0][i].item<int64_t>()));
      pattern.col_labels.push_back(std::to_string(i));
      std::vector<double> r;
      for (int64_t j = 0; j < 2 * kHalf; ++j) r.push_back(p[i][j].item<double>());
      pattern.values.push_back(r);
    }
    flex_examples::write_heatmap_svg(opt.work + "/induction_pattern.svg", pattern);

    // 3. Ablate: zero heads' outputs at layers.1.hook_z with an editing function.
    auto loss_with_ablated = [&](std::vector<int> heads) {
      flex::FlexModel f(model);
      flex::HookFunctionOptions o;
      o.save = false;
      o.editing_function = [heads](flex::Module&, const at::Tensor& z, flex::SaveContext&, flex::TrainableModules&) {
        at::Tensor out = z.clone();
        for (int h : heads) out.select(2, h).zero_();
        return out;
      };
      f.register_forward_hook(std::make_shared<flex::HookFunction>("layers.1.hook_z", o));
      return repeated_half_loss(f.forward(ids), ids).item<double>();
    };
    std::vector<int> induction_heads, others;
    for (int h = 0; h < kHeads; ++h) (induction[h] >= 0.3 || h == best ? induction_heads : others).push_back(h);
    const double ablated = loss_with_ablated(induction_heads);
    std::printf("loss on repeated half: %.3f; with induction head(s)", base_loss);
    for (int h : induction_heads) std::printf(" %d", h);
    std::printf(" ablated: %.3f", ablated);
    if (!others.empty()) std::printf("; with the other layer-1 head(s) ablated instead: %.3f", loss_with_ablated(others));
    std::printf("\nwrote %s/induction_scores.svg and %s/induction_pattern.svg\n", opt.work.c_str(), opt.work.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "induction_heads: error: %s\n", e.what());
    return 1;
  }
}
