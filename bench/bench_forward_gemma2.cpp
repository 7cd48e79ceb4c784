// Forward latency of a GPT-2-small-sized Gemma 2 (12 layers, 768 wide, 12
// query heads over 4 key/value heads of 64, MLP 3072, vocab 32000, window 64
// on even layers, both soft-caps) loaded with flex::load_pretrained, against
// the same forward written with plain ATen calls on the same weights,
// interleaved so both see the same load. "flex/raw" is the framework's cost
// (modules, hook points, the generic Llama-family code): 1.00 = none. The raw
// logits also cross-check the model's.
//
//   OMP_WAIT_POLICY=PASSIVE ./bench_forward_gemma2 [--iters N] [--threads T]
#include "bench_util.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <cstdlib>
#include <limits>

namespace {

constexpr int64_t kLayers = 12, kHidden = 768, kHeads = 12, kKv = 4, kHeadDim = 64, kInter = 3072, kVocab = 32000,
                  kWindow = 64;

const char* kConfig = R"({"model_type": "gemma2", "vocab_size": 32000, "hidden_size": 768, "num_hidden_layers": 12,
  "num_attention_heads": 12, "num_key_value_heads": 4, "head_dim": 64, "intermediate_size": 3072,
  "max_position_embeddings": 1024, "sliding_window": 64, "query_pre_attn_scalar": 64,
  "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "rms_norm_eps": 1e-6,
  "hidden_activation": "gelu_pytorch_tanh", "torch_dtype": "float32"})";

// Gemma 2 with ATen ops only, reading the loaded model's weights.
struct RawGemma2 {
  flex::CausalLM& m;
  at::Tensor w(const std::string& n) const { return flex::get_module_tensor(m, n); }
  at::Tensor norm(const at::Tensor& x, const std::string& n) const {
    return x * at::rsqrt(x.pow(2).mean(-1, true) + 1e-6) * (1.0 + w(n + ".weight"));
  }
  at::Tensor lin(const at::Tensor& x, const std::string& n) const { return at::matmul(x, w(n + ".weight").t()); }
  static at::Tensor rot(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    const int64_t h = x.size(-1) / 2;
    return x * cos + at::cat({-x.narrow(-1, h, h), x.narrow(-1, 0, h)}, -1) * sin;
  }
  at::Tensor forward(const at::Tensor& ids) const {
    const int64_t b = ids.size(0), t = ids.size(1);
    at::Tensor x = at::embedding(w("model.embed_tokens.weight"), ids) * std::sqrt(double(kHidden));
    at::Tensor inv = 1.0 / at::pow(10000.0, at::arange(0, kHeadDim, 2, at::kFloat) / kHeadDim);
    at::Tensor f = at::arange(t, at::kFloat).unsqueeze(1) * inv;
    at::Tensor cos = at::cat({f, f}, -1).cos(), sin = at::cat({f, f}, -1).sin();
    at::Tensor i = at::arange(t).unsqueeze(1), j = at::arange(t).unsqueeze(0);
    at::Tensor global = j.le(i), local = global.logical_and(j.gt(i - kWindow));
    for (int64_t l = 0; l < kLayers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      at::Tensor h = norm(x, p + "input_layernorm");
      auto heads = [&](const at::Tensor& y, int64_t n) { return y.view({b, t, n, kHeadDim}).transpose(1, 2); };
      at::Tensor q = rot(heads(lin(h, p + "self_attn.q_proj"), kHeads), cos, sin);
      at::Tensor k = rot(heads(lin(h, p + "self_attn.k_proj"), kKv), cos, sin).repeat_interleave(kHeads / kKv, 1);
      at::Tensor v = heads(lin(h, p + "self_attn.v_proj"), kKv).repeat_interleave(kHeads / kKv, 1);
      at::Tensor s = at::tanh(at::matmul(q, k.transpose(2, 3)) * std::pow(64.0, -0.5) / 50.0) * 50.0;
      s = s.masked_fill((l % 2 == 0 ? local : global).logical_not(), std::numeric_limits<float>::lowest());
      at::Tensor z = at::matmul(at::softmax(s, -1), v).transpose(1, 2).reshape({b, t, kHeads * kHeadDim});
      x = x + norm(lin(z, p + "self_attn.o_proj"), p + "post_attention_layernorm");
      h = norm(x, p + "pre_feedforward_layernorm");
      h = lin(at::gelu(lin(h, p + "mlp.gate_proj"), "tanh") * lin(h, p + "mlp.up_proj"), p + "mlp.down_proj");
      x = x + norm(h, p + "post_feedforward_layernorm");
    }
    at::Tensor logits = at::matmul(norm(x, "model.norm"), w("model.embed_tokens.weight").t());
    return at::tanh(logits / 30.0) * 30.0;
  }
};

}  // namespace

int main(int argc, char** argv) {
  bench::ForwardArgs args;
  if (!bench::parse_forward_args(argc, argv, args)) return 2;
  const int iters = args.iters;
  const auto dir = bench::temp_dir("forward_gemma2");
  int rc = 0;
  try {
    // Random weights (norm scales around 0: Gemma uses 1 + w), saved without the tied head.
    bench::write_random_model(dir, kConfig, [](const std::string& name, const at::Tensor& t) {
      if (name == "lm_head.weight") return at::Tensor();
      return name.find("norm") != std::string::npos ? at::randn_like(t) * 0.1 : t;
    });
    auto model = flex::load_pretrained(dir.string(), at::kFloat);
    RawGemma2 raw{*model};
    std::printf("Gemma 2 at GPT-2-small size (%lld layers, %lld wide, %lld/%lld heads, vocab %lld), %d threads, %d rounds\n",
                static_cast<long long>(kLayers), static_cast<long long>(kHidden), static_cast<long long>(kHeads),
                static_cast<long long>(kKv), static_cast<long long>(kVocab), at::get_num_threads(), iters);
    std::printf("%-8s %12s %12s %10s\n", "shape", "flex ms", "raw ms", "flex/raw");
    at::NoGradGuard no_grad;
    for (auto [b, t] : std::vector<std::pair<int64_t, int64_t>>{{1, 32}, {1, 128}, {8, 128}}) {
      const at::Tensor ids = at::randint(0, kVocab, {b, t}, at::kLong);
      const at::Tensor got = model->logits(ids), ref = raw.forward(ids);
      if (!at::allclose(got, ref, 1e-3, 1e-3)) throw std::runtime_error("model logits differ from the raw ATen forward");
      const auto med = bench::interleaved({[&] { model->logits(ids); }, [&] { raw.forward(ids); }}, iters, 1);
      std::printf("%lldx%-6lld %12.2f %12.2f %10.3f\n", static_cast<long long>(b), static_cast<long long>(t), med[0],
                  med[1], med[0] / med[1]);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_forward_gemma2: %s\n", e.what());
    rc = 1;
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return rc;
}
