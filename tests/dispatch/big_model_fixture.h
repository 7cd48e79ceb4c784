#pragma once
// A small LM-shaped model for the dispatch/offload tests: embedding, blocks
// ("Block": LayerNorm + MLP, with a buffer), final norm and a head tied to
// the embedding. Same structure under EmptyInit for meta construction.
#include <flex/hooks/empty_init.h>
#include <flex/hooks/nn.h>

#include <ATen/ATen.h>

namespace bigm {

struct Block : flex::Module {
  std::shared_ptr<flex::LayerNorm> ln;
  std::shared_ptr<flex::Linear> fc, proj;
  at::Tensor scale;  // a persistent buffer
  at::Tensor mask;   // a non-persistent buffer
  explicit Block(int64_t d) : Module("Block") {
    ln = add("ln", std::make_shared<flex::LayerNorm>(d));
    fc = add("fc", std::make_shared<flex::Linear>(d, 4 * d));
    proj = add("proj", std::make_shared<flex::Linear>(4 * d, d));
    add_buffer("scale", scale, flex::new_buffer({d}).fill_(0.5));
    add_buffer("mask", mask, at::ones({d}), /*persistent=*/false);
  }
  flex::Value forward(flex::Inputs in) override {
    at::Tensor x = in.tensor(0);
    return x + (*proj)(at::gelu((*fc)((*ln)(x)))) * scale * mask;
  }
};

struct LM : flex::Module {
  std::shared_ptr<flex::Embedding> wte;
  std::shared_ptr<flex::ModuleList> h;
  std::shared_ptr<flex::LayerNorm> ln_f;
  std::shared_ptr<flex::Linear> lm_head;
  explicit LM(int64_t vocab = 64, int64_t d = 32, int layers = 4, bool tied = true) : Module("LM") {
    wte = add("wte", std::make_shared<flex::Embedding>(vocab, d));
    h = add("h", std::make_shared<flex::ModuleList>());
    for (int i = 0; i < layers; ++i) h->push_back(std::make_shared<Block>(d));
    ln_f = add("ln_f", std::make_shared<flex::LayerNorm>(d));
    lm_head = add("lm_head", std::make_shared<flex::Linear>(d, vocab, false));
    if (tied) lm_head->set_tensor("weight", wte->weight);
  }
  flex::Value forward(flex::Inputs in) override {
    at::Tensor x = (*wte)(in.tensor(0));
    for (const auto& b : h->items()) x = (*b)(x);
    return (*lm_head)((*ln_f)(x));
  }
};

/// Deterministic non-trivial weights (norm scales and biases away from 1 and 0).
inline void randomize(flex::Module& m, uint64_t seed) {
  at::manual_seed(seed);
  at::NoGradGuard ng;
  for (auto& p : m.parameters()) p.normal_(0.0, 0.3);
}

inline at::Tensor ids() { return at::tensor({1, 5, 9, 33, 2, 7, 60, 11}, at::kLong).view({2, 4}); }

}  // namespace bigm
