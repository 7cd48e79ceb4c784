// Logit lens: decode every layer's residual stream with the model's final
// norm and unembedding, and draw layer x position as an SVG heatmap whose
// colour is the probability of the top token (the token is written in the
// cell). Hooks: a FlexModel HookFunction on every block.
//
//   logit_lens [MODEL_DIR] [--prompt TEXT] [--svg FILE] [--work DIR]
// Without MODEL_DIR a tiny random GPT-2 is written to WORK/tiny-gpt2.
#include "support/example_util.h"
#include "support/svg.h"

#include <flex/flexcore/flex_model.h>
#include <flex/models/auto_model.h>
#include <flex/tokenizers/tokenizer.h>

#include <ATen/ATen.h>

#include <cstdio>

int main(int argc, char** argv) {
  try {
    auto opt = flex_examples::parse_options(argc, argv, "logit_lens [MODEL_DIR] [--prompt TEXT] [--svg FILE] [--work DIR]");
    const std::string dir = flex_examples::model_dir_or_tiny(opt);
    const std::string svg = opt.svg.empty() ? opt.work + "/logit_lens.svg" : opt.svg;
    auto model = flex::load_pretrained(dir);
    auto tok = flex::load_tokenizer(dir);
    const auto ids = tok->encode(opt.prompt);
    const int layers = static_cast<int>(model->config().num_hidden_layers);

    flex::FlexModel fm(model);
    for (int i = 0; i < layers; ++i) fm.register_forward_hook(std::make_shared<flex::HookFunction>(flex_examples::block_name(*model, i)));
    auto norm = model->get_submodule(flex_examples::final_norm_name(*model));
    auto unembed = model->output_embeddings();

    at::NoGradGuard ng;
    flex::LMInputs in;
    in.input_ids = at::tensor(ids, at::kLong).unsqueeze(0);
    fm.forward(in.to_inputs());

    flex_examples::Heatmap h;
    h.title = "logit lens: top-token probability, layer x position (" + model->class_name() + ")";
    for (int64_t id : ids) h.col_labels.push_back(tok->decode({id}));
    for (int i = layers - 1; i >= 0; --i) {  // last layer on top
      at::Tensor resid = fm.output().at(flex_examples::block_name(*model, i))[0];  // [1, T, C]
      at::Tensor x = (*norm)(resid);  // block outputs are un-normed residual streams
      at::Tensor probs = at::softmax(unembed->compute(x)[0], -1);  // [T, V]
      auto [p, top] = probs.max(-1);
      std::vector<double> row;
      std::vector<std::string> text;
      for (int64_t t = 0; t < p.size(0); ++t) {
        row.push_back(p[t].item<double>());
        text.push_back(tok->decode({top[t].item<int64_t>()}));
      }
      h.values.push_back(row);
      h.text.push_back(text);
      h.row_labels.push_back("layer " + std::to_string(i));
      std::printf("layer %d: top tokens", i);
      for (size_t t = 0; t < text.size(); ++t) std::printf(" %s(%.2f)", text[t].c_str(), row[t]);
      std::printf("\n");
    }
    flex_examples::write_heatmap_svg(svg, h);
    std::printf("wrote %s (%d layers x %zu positions)\n", svg.c_str(), layers, ids.size());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "logit_lens: error: %s\n", e.what());
    return 1;
  }
}
