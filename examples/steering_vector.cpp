// Steering vector: the difference of a middle block's mean output on two
// contrasting prompts, added (times alpha) to that block's output during
// generation through a FlexModel editing function. Prints the continuation
// without and with steering. `flexmodel generate --steer` does the same from
// the shell.
//
//   steering_vector [MODEL_DIR] [--work DIR] [--prompt TEXT] [--alpha A]
#include "support/example_util.h"

#include <flex/dispatch/safetensors.h>
#include <flex/flexcore/flex_model.h>
#include <flex/models/auto_model.h>
#include <flex/models/generate.h>
#include <flex/tokenizers/tokenizer.h>

#include <ATen/ATen.h>

#include <cstdio>

int main(int argc, char** argv) {
  try {
    auto opt = flex_examples::parse_options(argc, argv, "steering_vector [MODEL_DIR] [--work DIR] [--prompt TEXT] [--alpha A]");
    const std::string dir = flex_examples::model_dir_or_tiny(opt);
    const double alpha = opt.extra.count("--alpha") ? std::stod(opt.extra["--alpha"]) : 8.0;
    auto model = flex::load_pretrained(dir);
    auto tok = flex::load_tokenizer(dir);
    const int layer = static_cast<int>(model->config().num_hidden_layers / 2);
    const std::string name = flex_examples::block_name(*model, layer);
    at::NoGradGuard ng;

    // 1. Mean activation on each side of the contrast.
    auto mean_act = [&](const std::string& text) {
      flex::FlexModel fm(model);
      fm.register_forward_hook(std::make_shared<flex::HookFunction>(name));
      fm.forward(at::tensor(tok->encode(text), at::kLong).unsqueeze(0));
      return fm.output().at(name)[0][0].mean(0);  // [C]
    };
    at::Tensor vec = mean_act("love love love happy joy") - mean_act("hate hate hate sad anger");
    flex::save_safetensors(opt.work + "/steer.safetensors", {{"vector", vec}});

    // 2. Generate with and without the edit.
    auto run = [&](bool steer) {
      flex::FlexModel fm(model);
      if (steer) {
        flex::HookFunctionOptions o;
        o.save = false;
        o.editing_function = [vec, alpha](flex::Module&, const at::Tensor& act, flex::SaveContext&, flex::TrainableModules&) {
          return act + alpha * vec;
        };
        fm.register_forward_hook(std::make_shared<flex::HookFunction>(name, o));
      }
      flex::GenerateOptions g;
      g.max_new_tokens = opt.small ? 8 : 24;
      auto out = flex::generate(*model, at::tensor(tok->encode(opt.prompt), at::kLong).unsqueeze(0), {}, g);
      return tok->decode(out.new_tokens(0));
    };
    const std::string base = run(false), steered = run(true);
    std::printf("steering %s with alpha %.1f (vector norm %.3f, saved to %s/steer.safetensors)\n", name.c_str(), alpha,
                vec.norm().item<double>(), opt.work.c_str());
    std::printf("plain:   %s|%s\nsteered: %s|%s\n", opt.prompt.c_str(), base.c_str(), opt.prompt.c_str(), steered.c_str());
    std::printf("shell:   flexmodel generate %s --prompt '%s' --steer %s=%s/steer.safetensors:%.1f\n", dir.c_str(),
                opt.prompt.c_str(), name.c_str(), opt.work.c_str(), alpha);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "steering_vector: error: %s\n", e.what());
    return 1;
  }
}
