// Forward latency of a Mixtral-shaped mixture-of-experts model loaded with
// flex::load_pretrained, against the same forward written with plain ATen
// calls on the same weights (router softmax, top-2, renormalised weights,
// one gather / expert MLP / index_add per expert, as Transformers runs it),
// interleaved so both see the same load. "flex/raw" is the framework's cost
// (modules, hooks points, the per-expert keyword call that records token
// indices): 1.00 = none. The raw logits also cross-check the model's.
//
// Part 2 is how expert dispatch scales with the number of experts: the same
// tokens and top-2 routing over 4 .. 64 experts (constant active compute per
// token), the per-expert overhead in microseconds = (flex - raw) / (layers * E).
//
//   OMP_WAIT_POLICY=PASSIVE ./bench_forward_moe [--iters N] [--threads T]
#include "bench_util.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <cstdlib>
#include <limits>

namespace {

struct Shape {
  int64_t layers, hidden, heads, kv, head_dim, experts, inter, vocab;
};

std::string config_json(const Shape& s) {
  return "{\"model_type\": \"mixtral\", \"vocab_size\": " + std::to_string(s.vocab) +
         ", \"hidden_size\": " + std::to_string(s.hidden) + ", \"num_hidden_layers\": " + std::to_string(s.layers) +
         ", \"num_attention_heads\": " + std::to_string(s.heads) + ", \"num_key_value_heads\": " +
         std::to_string(s.kv) + ", \"head_dim\": " + std::to_string(s.head_dim) +
         ", \"intermediate_size\": " + std::to_string(s.inter) + ", \"num_local_experts\": " +
         std::to_string(s.experts) +
         ", \"num_experts_per_tok\": 2, \"max_position_embeddings\": 1024, \"rope_theta\": 1000000.0,"
         " \"rms_norm_eps\": 1e-5, \"hidden_act\": \"silu\", \"tie_word_embeddings\": false,"
         " \"torch_dtype\": \"float32\"}";
}

// Mixtral with ATen ops only, reading the loaded model's weights.
struct RawMixtral {
  flex::CausalLM& m;
  Shape s;
  at::Tensor w(const std::string& n) const { return flex::get_module_tensor(m, n); }
  at::Tensor norm(const at::Tensor& x, const std::string& n) const {
    return w(n + ".weight") * (x * at::rsqrt(x.pow(2).mean(-1, true) + 1e-5));
  }
  at::Tensor lin(const at::Tensor& x, const std::string& n) const { return at::matmul(x, w(n + ".weight").t()); }
  static at::Tensor rot(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    const int64_t h = x.size(-1) / 2;
    return x * cos + at::cat({-x.narrow(-1, h, h), x.narrow(-1, 0, h)}, -1) * sin;
  }
  at::Tensor moe(const at::Tensor& x, const std::string& p) const {
    const at::Tensor flat = x.reshape({-1, s.hidden});
    const at::Tensor probs = at::softmax(lin(flat, p + "gate"), 1, at::kFloat);
    auto [top, sel] = at::topk(probs, 2, -1);
    top = top / top.sum(-1, true);
    at::Tensor out = at::zeros_like(flat);
    const at::Tensor by_slot = sel.t();
    for (int64_t e = 0; e < s.experts; ++e) {
      const at::Tensor hits = by_slot.eq(e).nonzero();
      const at::Tensor slot = hits.select(1, 0), tok = hits.select(1, 1);
      const std::string q = p + "experts." + std::to_string(e) + ".";
      const at::Tensor h = flat.index_select(0, tok);
      at::Tensor y = lin(at::silu(lin(h, q + "w1")) * lin(h, q + "w3"), q + "w2");
      out.index_add_(0, tok, y * at::index(top, {tok, slot}).unsqueeze(1));
    }
    return out.view(x.sizes());
  }
  at::Tensor forward(const at::Tensor& ids) const {
    const int64_t b = ids.size(0), t = ids.size(1), d = s.head_dim;
    at::Tensor x = at::embedding(w("model.embed_tokens.weight"), ids);
    at::Tensor inv = 1.0 / at::pow(1e6, at::arange(0, d, 2, at::kFloat) / static_cast<double>(d));
    at::Tensor f = at::arange(t, at::kFloat).unsqueeze(1) * inv;
    at::Tensor cos = at::cat({f, f}, -1).cos(), sin = at::cat({f, f}, -1).sin();
    at::Tensor causal = at::arange(t).unsqueeze(0).le(at::arange(t).unsqueeze(1));
    for (int64_t l = 0; l < s.layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      at::Tensor h = norm(x, p + "input_layernorm");
      auto heads = [&](const at::Tensor& y, int64_t n) { return y.view({b, t, n, d}).transpose(1, 2); };
      at::Tensor q = rot(heads(lin(h, p + "self_attn.q_proj"), s.heads), cos, sin);
      at::Tensor k = rot(heads(lin(h, p + "self_attn.k_proj"), s.kv), cos, sin).repeat_interleave(s.heads / s.kv, 1);
      at::Tensor v = heads(lin(h, p + "self_attn.v_proj"), s.kv).repeat_interleave(s.heads / s.kv, 1);
      at::Tensor sc = at::matmul(q, k.transpose(2, 3)) / std::sqrt(static_cast<double>(d));
      sc = sc.masked_fill(causal.logical_not(), std::numeric_limits<float>::lowest());
      at::Tensor z = at::matmul(at::softmax(sc, -1), v).transpose(1, 2).reshape({b, t, s.heads * d});
      x = x + lin(z, p + "self_attn.o_proj");
      x = x + moe(norm(x, p + "post_attention_layernorm"), p + "block_sparse_moe.");
    }
    return lin(norm(x, "model.norm"), "lm_head");
  }
};

std::shared_ptr<flex::CausalLM> write_and_load(const std::filesystem::path& dir, const Shape& s) {
  bench::write_random_model(dir, config_json(s));
  return flex::load_pretrained(dir.string(), at::kFloat);
}

void check(flex::CausalLM& model, const RawMixtral& raw, const at::Tensor& ids) {
  const at::Tensor got = model.logits(ids), ref = raw.forward(ids);
  if (!at::allclose(got, ref, 1e-3, 1e-3)) throw std::runtime_error("model logits differ from the raw ATen forward");
}

}  // namespace

int main(int argc, char** argv) {
  bench::ForwardArgs args;
  if (!bench::parse_forward_args(argc, argv, args)) return 2;
  const int iters = args.iters;
  const auto dir = bench::temp_dir("forward_moe");
  int rc = 0;
  try {
    at::NoGradGuard no_grad;
    const Shape base{4, 512, 8, 2, 64, 8, 1024, 8192};
    {
      auto model = write_and_load(dir, base);
      RawMixtral raw{*model, base};
      std::printf("Mixtral-shaped MoE (%lld layers, %lld wide, %lld/%lld heads, %lld experts of %lld, top-2, vocab %lld), "
                  "%d threads, %d rounds\n",
                  static_cast<long long>(base.layers), static_cast<long long>(base.hidden),
                  static_cast<long long>(base.heads), static_cast<long long>(base.kv),
                  static_cast<long long>(base.experts), static_cast<long long>(base.inter),
                  static_cast<long long>(base.vocab), at::get_num_threads(), iters);
      std::printf("%-8s %12s %12s %10s\n", "shape", "flex ms", "raw ms", "flex/raw");
      for (auto [b, t] : std::vector<std::pair<int64_t, int64_t>>{{1, 32}, {1, 128}, {8, 128}}) {
        const at::Tensor ids = at::randint(0, base.vocab, {b, t}, at::kLong);
        check(*model, raw, ids);
        const auto med = bench::interleaved({[&] { model->logits(ids); }, [&] { raw.forward(ids); }}, iters, 1);
        std::printf("%lldx%-6lld %12.2f %12.2f %10.3f\n", static_cast<long long>(b), static_cast<long long>(t), med[0],
                    med[1], med[0] / med[1]);
      }
    }
    std::printf("\nexpert dispatch vs number of experts (2 layers, 512 wide, experts of 256, top-2, 4x128 tokens)\n");
    std::printf("%-8s %12s %12s %10s %18s\n", "experts", "flex ms", "raw ms", "flex/raw", "us/expert call");
    for (int64_t e : {4, 8, 16, 32, 64}) {
      const Shape s{2, 512, 8, 2, 64, e, 256, 1024};
      std::filesystem::remove_all(dir);
      std::filesystem::create_directories(dir);
      auto model = write_and_load(dir, s);
      RawMixtral raw{*model, s};
      const at::Tensor ids = at::randint(0, s.vocab, {4, 128}, at::kLong);
      check(*model, raw, ids);
      const auto med = bench::interleaved({[&] { model->logits(ids); }, [&] { raw.forward(ids); }}, iters, 1);
      std::printf("%-8lld %12.2f %12.2f %10.3f %18.1f\n", static_cast<long long>(e), med[0], med[1], med[0] / med[1],
                  (med[0] - med[1]) * 1000.0 / static_cast<double>(s.layers * e));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_forward_moe: %s\n", e.what());
    rc = 1;
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return rc;
}
