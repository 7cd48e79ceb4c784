// Activation patching: run a clean and a corrupted prompt, then re-run the
// corrupted one with one block's output at one position replaced by the
// clean run's (a FlexModel editing function), and measure how much of the
// clean answer's logit comes back. Prints a layer x position table.
//
//   activation_patching [MODEL_DIR] [--work DIR]
#include "support/example_util.h"

#include <flex/flexcore/flex_model.h>
#include <flex/models/auto_model.h>
#include <flex/tokenizers/tokenizer.h>

#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>

int main(int argc, char** argv) {
  try {
    auto opt = flex_examples::parse_options(argc, argv, "activation_patching [MODEL_DIR] [--work DIR]");
    const std::string dir = flex_examples::model_dir_or_tiny(opt);
    auto model = flex::load_pretrained(dir);
    auto tok = flex::load_tokenizer(dir);
    // Same length by construction: one byte differs.
    const auto clean = tok->encode("the cat sat on the mat, the cat");
    const auto corrupt = tok->encode("the dog sat on the mat, the cat");
    if (clean.size() != corrupt.size()) throw std::runtime_error("prompts tokenize to different lengths");
    const int layers = static_cast<int>(model->config().num_hidden_layers);
    const int64_t T = static_cast<int64_t>(clean.size());
    at::NoGradGuard ng;

    // 1. Clean run: capture every block's output.
    flex::FlexModel fm(model);
    std::vector<flex::HookFunctionPtr> capture;
    for (int l = 0; l < layers; ++l)
      capture.push_back(std::make_shared<flex::HookFunction>(flex_examples::block_name(*model, l)));
    for (auto& h : capture) fm.register_forward_hook(h);
    at::Tensor clean_logits = fm.forward(at::tensor(clean, at::kLong).unsqueeze(0)).select(1, T - 1)[0];
    const int64_t answer = clean_logits.argmax().item<int64_t>();
    std::map<int, at::Tensor> clean_acts;
    for (int l = 0; l < layers; ++l) clean_acts[l] = fm.output().at(flex_examples::block_name(*model, l))[0];
    fm.restore();

    auto logit_of = [&](flex::FlexModel& f) {
      return f.forward(at::tensor(corrupt, at::kLong).unsqueeze(0)).select(1, T - 1)[0][answer].item<double>();
    };
    flex::FlexModel plain(model);
    const double corrupt_logit = logit_of(plain);
    plain.restore();
    const double clean_logit = clean_logits[answer].item<double>();
    std::printf("answer token %s: clean logit %.3f, corrupted %.3f\n", tok->decode({answer}).c_str(), clean_logit, corrupt_logit);
    std::printf("recovered fraction when patching block output (rows: layer, cols: position)\n");

    // 2. Patched runs: editing function writes the clean activation at one position.
    for (int l = 0; l < layers; ++l) {
      std::printf("layer %d:", l);
      for (int64_t pos = 0; pos < T; ++pos) {
        flex::FlexModel pf(model);
        flex::HookFunctionOptions o;
        o.save = false;
        at::Tensor src = clean_acts[l];
        o.editing_function = [src, pos](flex::Module&, const at::Tensor& act, flex::SaveContext&, flex::TrainableModules&) {
          at::Tensor out = act.clone();
          out.select(1, pos).copy_(src.select(1, pos));
          return out;
        };
        pf.register_forward_hook(std::make_shared<flex::HookFunction>(flex_examples::block_name(*model, l), o));
        const double patched = logit_of(pf);
        const double denom = clean_logit - corrupt_logit;
        std::printf(" %5.2f", std::abs(denom) < 1e-9 ? 0.0 : (patched - corrupt_logit) / denom);
      }
      std::printf("\n");
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "activation_patching: error: %s\n", e.what());
    return 1;
  }
}
