// Quickstart: build a small model from flex::Modules, hook named modules,
// run it, and print what the hooks captured.
#include <flex/hooks/nn.h>

#include <ATen/ATen.h>

#include <cstdio>
#include <map>

namespace {

struct Block : flex::Module {
  std::shared_ptr<flex::LayerNorm> ln_1;
  std::shared_ptr<flex::Sequential> mlp;
  explicit Block(int64_t d) : Module("Block") {
    ln_1 = add("ln_1", std::make_shared<flex::LayerNorm>(d));
    mlp = add("mlp", std::make_shared<flex::Sequential>(std::vector<std::shared_ptr<flex::Module>>{
                         std::make_shared<flex::Linear>(d, 4 * d), std::make_shared<flex::Activation>("gelu_new"),
                         std::make_shared<flex::Linear>(4 * d, d)}));
  }
  flex::Value forward(flex::Inputs in) override {
    at::Tensor x = in.tensor(0);
    return x + (*mlp)((*ln_1)(x));
  }
};

struct TinyLM : flex::Module {
  std::shared_ptr<flex::Embedding> wte;
  std::shared_ptr<flex::ModuleList> h;
  std::shared_ptr<flex::Linear> lm_head;
  TinyLM(int64_t vocab, int64_t d, int layers) : Module("TinyLM") {
    wte = add("wte", std::make_shared<flex::Embedding>(vocab, d));
    h = add("h", std::make_shared<flex::ModuleList>());
    for (int i = 0; i < layers; ++i) h->push_back(std::make_shared<Block>(d));
    lm_head = add("lm_head", std::make_shared<flex::Linear>(d, vocab, false));
  }
  flex::Value forward(flex::Inputs in) override {
    at::Tensor x = (*wte)(in.tensor(0));
    for (const auto& b : h->items()) x = (*b)(x);
    return (*lm_head)(x);
  }
};

}  // namespace

int main() {
  at::manual_seed(0);
  auto model = std::make_shared<TinyLM>(256, 64, 2);
  std::map<std::string, at::Tensor> captured;
  std::vector<flex::HookHandle> handles;
  for (const char* name : {"h.0.mlp", "h.1.mlp", "h.1.mlp.1", "lm_head"}) {
    std::string n = name;
    handles.push_back(model->get_submodule(n)->register_forward_hook(
        [&captured, n](flex::Module&, const flex::Inputs&, flex::Value& out) {
          captured[n] = flex::find_first_tensor(out).detach().clone();
        }));
  }
  at::Tensor ids = at::randint(0, 256, {2, 8}, at::kLong);
  at::NoGradGuard no_grad;
  at::Tensor logits = (*model)(ids);
  std::printf("model: %zu modules, logits %s\n", model->named_flex_modules().size(),
              c10::str(logits.sizes()).c_str());
  for (const auto& kv : captured)
    std::printf("captured %-10s shape %-12s mean % .5f  std %.5f\n", kv.first.c_str(),
                c10::str(kv.second.sizes()).c_str(), kv.second.mean().item<double>(),
                kv.second.std().item<double>());
  for (auto& h : handles) h.remove();
  return 0;
}
