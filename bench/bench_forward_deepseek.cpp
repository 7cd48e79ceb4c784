// Forward latency of a DeepSeek-V3-shaped model (multi-head latent attention
// with q-LoRA and interleaved RoPE, a dense first layer, then MoE layers with
// sigmoid group-limited routing, the correction bias and a shared expert)
// loaded with flex::load_pretrained, against the same forward written with
// plain ATen calls on the same weights, interleaved so both see the same load.
// "flex/raw" is the framework's cost (modules, hook points, the per-expert
// keyword call that records token indices): 1.00 = none. The raw logits also
// cross-check the model's.
//
//   OMP_WAIT_POLICY=PASSIVE ./bench_forward_deepseek [--iters N] [--threads T]
#include "bench_util.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <limits>

namespace {

struct Shape {
  int64_t layers = 4, hidden = 512, heads = 8, q_lora = 192, kv_lora = 128, nope = 32, rope = 16, v = 32;
  int64_t experts = 16, inter = 256, dense_inter = 1024, groups = 4, topk_group = 2, top_k = 4, vocab = 8192;
};

std::string config_json(const Shape& s) {
  auto n = [](int64_t v) { return std::to_string(v); };
  return "{\"model_type\": \"deepseek_v3\", \"vocab_size\": " + n(s.vocab) + ", \"hidden_size\": " + n(s.hidden) +
         ", \"num_hidden_layers\": " + n(s.layers) + ", \"num_attention_heads\": " + n(s.heads) +
         ", \"num_key_value_heads\": " + n(s.heads) + ", \"q_lora_rank\": " + n(s.q_lora) +
         ", \"kv_lora_rank\": " + n(s.kv_lora) + ", \"qk_nope_head_dim\": " + n(s.nope) +
         ", \"qk_rope_head_dim\": " + n(s.rope) + ", \"v_head_dim\": " + n(s.v) +
         ", \"intermediate_size\": " + n(s.dense_inter) + ", \"moe_intermediate_size\": " + n(s.inter) +
         ", \"n_routed_experts\": " + n(s.experts) + ", \"n_shared_experts\": 1, \"num_experts_per_tok\": " +
         n(s.top_k) + ", \"n_group\": " + n(s.groups) + ", \"topk_group\": " + n(s.topk_group) +
         ", \"first_k_dense_replace\": 1, \"routed_scaling_factor\": 2.5, \"norm_topk_prob\": true,"
         " \"rope_interleave\": true, \"rope_theta\": 10000.0, \"max_position_embeddings\": 1024,"
         " \"rms_norm_eps\": 1e-6, \"hidden_act\": \"silu\", \"tie_word_embeddings\": false,"
         " \"torch_dtype\": \"float32\"}";
}

// DeepSeek-V3 with ATen ops only, reading the loaded model's weights.
struct RawDeepseek {
  flex::CausalLM& m;
  Shape s;
  at::Tensor w(const std::string& n) const { return flex::get_module_tensor(m, n); }
  at::Tensor norm(const at::Tensor& x, const std::string& n) const {
    return w(n + ".weight") * (x * at::rsqrt(x.pow(2).mean(-1, true) + 1e-6));
  }
  at::Tensor lin(const at::Tensor& x, const std::string& n) const { return at::matmul(x, w(n + ".weight").t()); }
  at::Tensor mlp(const at::Tensor& x, const std::string& p) const {
    return lin(at::silu(lin(x, p + "gate_proj")) * lin(x, p + "up_proj"), p + "down_proj");
  }
  // Pairs (2i, 2i+1) rotated, output de-interleaved; cos / sin [T, rope / 2].
  static at::Tensor rot(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    const at::Tensor x1 = x.slice(-1, 0, x.size(-1), 2), x2 = x.slice(-1, 1, x.size(-1), 2);
    return at::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1);
  }
  at::Tensor moe(const at::Tensor& x, const std::string& p) const {
    const at::Tensor flat = x.reshape({-1, s.hidden});
    const int64_t n = flat.size(0), per = s.experts / s.groups;
    const at::Tensor scores = at::sigmoid(lin(flat, p + "gate"));
    at::Tensor choice = scores + w(p + "gate.e_score_correction_bias");
    const at::Tensor gs = std::get<0>(at::topk(choice.view({n, s.groups, per}), 2, -1)).sum(-1);
    const at::Tensor keep = at::zeros_like(gs).scatter_(1, std::get<1>(at::topk(gs, s.topk_group, -1)), 1.0);
    choice = choice.masked_fill(keep.repeat_interleave(per, 1).eq(0), -std::numeric_limits<float>::infinity());
    const at::Tensor sel = std::get<1>(at::topk(choice, s.top_k, -1));
    at::Tensor top = scores.gather(1, sel);
    top = top / (top.sum(-1, true) + 1e-20) * 2.5;
    at::Tensor out = at::zeros_like(flat);
    const at::Tensor by_slot = sel.t();
    for (int64_t e = 0; e < s.experts; ++e) {
      const at::Tensor hits = by_slot.eq(e).nonzero();
      const at::Tensor slot = hits.select(1, 0), tok = hits.select(1, 1);
      const at::Tensor y = mlp(flat.index_select(0, tok), p + "experts." + std::to_string(e) + ".");
      out.index_add_(0, tok, y * at::index(top, {tok, slot}).unsqueeze(1));
    }
    return (out + mlp(flat, p + "shared_experts.")).view(x.sizes());
  }
  at::Tensor forward(const at::Tensor& ids) const {
    const int64_t b = ids.size(0), t = ids.size(1), h = s.heads;
    at::Tensor x = at::embedding(w("model.embed_tokens.weight"), ids);
    const at::Tensor inv = 1.0 / at::pow(10000.0, at::arange(0, s.rope, 2, at::kFloat) / static_cast<double>(s.rope));
    const at::Tensor f = at::arange(t, at::kFloat).unsqueeze(1) * inv;
    const at::Tensor cos = f.cos(), sin = f.sin();
    const at::Tensor causal = at::arange(t).unsqueeze(0).le(at::arange(t).unsqueeze(1));
    const double scale = std::pow(static_cast<double>(s.nope + s.rope), -0.5);
    for (int64_t l = 0; l < s.layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".", a = p + "self_attn.";
      const at::Tensor hn = norm(x, p + "input_layernorm");
      const at::Tensor q = lin(norm(lin(hn, a + "q_a_proj"), a + "q_a_layernorm"), a + "q_b_proj")
                               .view({b, t, h, s.nope + s.rope}).transpose(1, 2);
      const at::Tensor latent = lin(hn, a + "kv_a_proj_with_mqa");
      const at::Tensor c = norm(latent.narrow(-1, 0, s.kv_lora), a + "kv_a_layernorm");
      const at::Tensor k_rot = rot(latent.narrow(-1, s.kv_lora, s.rope).unsqueeze(1), cos, sin);
      const at::Tensor kv = lin(c, a + "kv_b_proj").view({b, t, h, s.nope + s.v}).transpose(1, 2);
      const at::Tensor qf = at::cat({q.narrow(-1, 0, s.nope), rot(q.narrow(-1, s.nope, s.rope), cos, sin)}, -1);
      const at::Tensor kf = at::cat({kv.narrow(-1, 0, s.nope), k_rot.expand({b, h, t, s.rope})}, -1);
      at::Tensor sc = at::matmul(qf, kf.transpose(2, 3)) * scale;
      sc = sc.masked_fill(causal.logical_not(), std::numeric_limits<float>::lowest());
      const at::Tensor z = at::matmul(at::softmax(sc, -1), kv.narrow(-1, s.nope, s.v)).transpose(1, 2);
      x = x + lin(z.reshape({b, t, h * s.v}), a + "o_proj");
      const at::Tensor m = norm(x, p + "post_attention_layernorm");
      x = x + (l == 0 ? mlp(m, p + "mlp.") : moe(m, p + "mlp."));
    }
    return lin(norm(x, "model.norm"), "lm_head");
  }
};

}  // namespace

int main(int argc, char** argv) {
  bench::ForwardArgs args;
  if (!bench::parse_forward_args(argc, argv, args)) return 2;
  const auto dir = bench::temp_dir("forward_deepseek");
  int rc = 0;
  try {
    at::NoGradGuard no_grad;
    const Shape s;
    bench::write_random_model(dir, config_json(s));
    auto model = flex::load_pretrained(dir.string(), at::kFloat);
    RawDeepseek raw{*model, s};
    std::printf("DeepSeek-V3-shaped (%lld layers, %lld wide, %lld heads, q-LoRA %lld, kv-LoRA %lld, %lld experts of %lld "
                "in %lld groups, top-%lld, 1 shared, vocab %lld), %d threads, %d rounds\n",
                static_cast<long long>(s.layers), static_cast<long long>(s.hidden), static_cast<long long>(s.heads),
                static_cast<long long>(s.q_lora), static_cast<long long>(s.kv_lora), static_cast<long long>(s.experts),
                static_cast<long long>(s.inter), static_cast<long long>(s.groups), static_cast<long long>(s.top_k),
                static_cast<long long>(s.vocab), at::get_num_threads(), args.iters);
    std::printf("%-8s %12s %12s %10s\n", "shape", "flex ms", "raw ms", "flex/raw");
    for (auto [b, t] : std::vector<std::pair<int64_t, int64_t>>{{1, 32}, {1, 128}, {8, 128}}) {
      const at::Tensor ids = at::randint(0, s.vocab, {b, t}, at::kLong);
      const at::Tensor got = model->logits(ids), ref = raw.forward(ids);
      if (!at::allclose(got, ref, 1e-3, 1e-3))
        throw std::runtime_error("model logits differ from the raw ATen forward by " +
                                 std::to_string((got - ref).abs().max().item<double>()));
      const auto med = bench::interleaved({[&] { model->logits(ids); }, [&] { raw.forward(ids); }}, args.iters, 1);
      std::printf("%lldx%-6lld %12.2f %12.2f %10.3f\n", static_cast<long long>(b), static_cast<long long>(t), med[0],
                  med[1], med[0] / med[1]);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_forward_deepseek: %s\n", e.what());
    rc = 1;
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return rc;
}
