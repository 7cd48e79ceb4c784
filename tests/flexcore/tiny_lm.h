#pragma once
// A small language-model-shaped network of flex::Modules for the flexcore
// tests: embedding, blocks of (LayerNorm -> MLP) with residuals whose output
// is a tuple (hidden,), and an untied head.
#include <flex/hooks/nn.h>

#include <ATen/ATen.h>

namespace tiny {

struct Block : flex::Module {
  std::shared_ptr<flex::LayerNorm> ln_1;
  std::shared_ptr<flex::Sequential> mlp;
  explicit Block(int64_t d) : Module("TinyBlock") {
    ln_1 = add("ln_1", std::make_shared<flex::LayerNorm>(d));
    mlp = add("mlp", std::make_shared<flex::Sequential>(std::vector<std::shared_ptr<flex::Module>>{
                         std::make_shared<flex::Linear>(d, 4 * d), std::make_shared<flex::Activation>("gelu"),
                         std::make_shared<flex::Linear>(4 * d, d)}));
  }
  // Returns (hidden,) like Hugging Face decoder blocks.
  flex::Value forward(flex::Inputs in) override {
    at::Tensor x = in.tensor(0);
    return c10::ivalue::Tuple::create({flex::Value(x + (*mlp)((*ln_1)(x)))});
  }
};

struct LM : flex::Module {
  std::shared_ptr<flex::Embedding> wte;
  std::shared_ptr<flex::ModuleList> h;
  std::shared_ptr<flex::LayerNorm> ln_f;
  std::shared_ptr<flex::Linear> lm_head;
  LM(int64_t vocab = 32, int64_t d = 16, int layers = 3) : Module("TinyLM") {
    wte = add("wte", std::make_shared<flex::Embedding>(vocab, d));
    h = add("h", std::make_shared<flex::ModuleList>());
    for (int i = 0; i < layers; ++i) h->push_back(std::make_shared<Block>(d));
    ln_f = add("ln_f", std::make_shared<flex::LayerNorm>(d));
    lm_head = add("lm_head", std::make_shared<flex::Linear>(d, vocab, false));
  }
  flex::Value forward(flex::Inputs in) override {
    at::Tensor x = (*wte)(in.tensor(0));
    for (const auto& b : h->items()) x = (*b)(x);
    return (*lm_head)((*ln_f)(x));
  }
  std::shared_ptr<Block> block(size_t i) const { return std::dynamic_pointer_cast<Block>((*h)[i]); }
};

}  // namespace tiny
