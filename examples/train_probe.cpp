// Train a probe: a linear classifier registered as a FlexModel trainable
// module reads a middle block's residual stream inside an editing function,
// which stores its loss in the save context; the wrapped model stays frozen.
// The probe learns whether the current token contains a vowel.
//
//   train_probe [MODEL_DIR] [--work DIR] [--steps N]
#include "support/example_util.h"

#include <flex/flexcore/flex_model.h>
#include <flex/hooks/nn.h>
#include <flex/models/auto_model.h>
#include <flex/tokenizers/tokenizer.h>

#include <ATen/ATen.h>

#include <cstdio>
#include <random>

int main(int argc, char** argv) {
  try {
    auto opt = flex_examples::parse_options(argc, argv, "train_probe [MODEL_DIR] [--work DIR] [--steps N]");
    const std::string dir = flex_examples::model_dir_or_tiny(opt);
    const int steps = opt.steps > 0 ? opt.steps : 300;
    auto model = flex::load_pretrained(dir);
    auto tok = flex::load_tokenizer(dir);
    const std::string name = flex_examples::block_name(*model, static_cast<int>(model->config().num_hidden_layers / 2));
    const int64_t C = model->config().hidden_size;

    // Data: random lowercase "words"; label 1 when a token's text has a vowel.
    std::mt19937 rng(0);
    auto make_batch = [&](int rows) {
      std::vector<std::vector<int64_t>> ids;
      size_t len = 1 << 30;
      for (int r = 0; r < rows; ++r) {
        std::string s;
        for (int c = 0; c < 24; ++c) s += (rng() % 5 == 0) ? ' ' : static_cast<char>('a' + rng() % 26);
        ids.push_back(tok->encode(s));
        len = std::min(len, ids.back().size());
      }
      at::Tensor x = at::empty({rows, static_cast<int64_t>(len)}, at::kLong), y = at::empty_like(x);
      for (int r = 0; r < rows; ++r)
        for (size_t t = 0; t < len; ++t) {
          x[r][t] = ids[r][t];
          const std::string text = tok->decode({ids[r][t]});
          y[r][t] = static_cast<int64_t>(text.find_first_of("aeiou") != std::string::npos);
        }
      return std::make_pair(x, y);
    };

    flex::FlexModel fm(model);
    fm.wrapped_module_requires_grad(false);
    fm.register_trainable_module("probe", std::make_shared<flex::Linear>(C, 2));
    flex::HookFunctionOptions o;
    o.save = false;
    o.editing_function = [](flex::Module&, const at::Tensor& act, flex::SaveContext& ctx, flex::TrainableModules& mods) {
      at::Tensor logits = mods.get<flex::Linear>("probe")->compute(act.detach());  // [B, T, 2]
      at::Tensor y = ctx.tensor("labels");
      ctx.set("loss", at::nll_loss(at::log_softmax(logits.reshape({-1, 2}), -1), y.reshape({-1})));
      ctx.set("accuracy", (logits.argmax(-1) == y).to(at::kFloat).mean());
      return act;  // the model's computation is not changed
    };
    fm.register_forward_hook(std::make_shared<flex::HookFunction>(name, o));

    auto params = fm.trainable_modules().parameters();
    const double lr = 0.05;
    double acc = 0;
    for (int step = 1; step <= steps; ++step) {
      auto [x, y] = make_batch(16);
      fm.save_ctx().set("labels", y);
      fm.forward(x);
      at::Tensor loss = fm.save_ctx().tensor("loss");
      loss.backward();
      {
        at::NoGradGuard ng;
        for (auto& p : params) {
          p.sub_(lr * p.grad());
          p.mutable_grad().zero_();
        }
      }
      if (step % (steps / 5 > 0 ? steps / 5 : 1) == 0)
        std::printf("step %4d  loss %.4f  batch accuracy %.3f\n", step, loss.item<double>(),
                    fm.save_ctx().tensor("accuracy").item<double>());
    }
    {
      at::NoGradGuard ng;
      auto [x, y] = make_batch(64);
      fm.save_ctx().set("labels", y);
      fm.forward(x);
      acc = fm.save_ctx().tensor("accuracy").item<double>();
      const double base = y.to(at::kFloat).mean().item<double>();
      std::printf("held-out accuracy of the probe on %s: %.3f (majority class: %.3f)\n", name.c_str(), acc,
                  std::max(base, 1 - base));
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_probe: error: %s\n", e.what());
    return 1;
  }
}
