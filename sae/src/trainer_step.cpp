// One training step of a sparse dictionary with hand-written gradients
// (flex/sae/trainer.h). The formulas are SAELens 6.54's; where a product is
// mathematically simpler than autograd's route it says so.
#include <flex/sae/trainer.h>

#include "dense_passes.h"

#include <flex/hooks/errors.h>
#include <flex/hooks/shape_text.h>
#include <flex/kernels/linear.h>
#include <flex/sae/sparse_code.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

namespace flex {

TrainArchitecture parse_train_architecture(const std::string& name) {
  if (name == "topk") return TrainArchitecture::TopK;
  if (name == "batchtopk") return TrainArchitecture::BatchTopK;
  if (name == "jumprelu") return TrainArchitecture::JumpReLU;
  if (name == "standard") return TrainArchitecture::Standard;
  throw ConfigError("architecture '" + name + "' is not one of topk, batchtopk, jumprelu, standard");
}

std::string to_string(TrainArchitecture a) {
  switch (a) {
    case TrainArchitecture::TopK: return "topk";
    case TrainArchitecture::BatchTopK: return "batchtopk";
    case TrainArchitecture::JumpReLU: return "jumprelu";
    case TrainArchitecture::Standard: return "standard";
  }
  return "?";
}

namespace {

bool top_k_like(TrainArchitecture a) { return a == TrainArchitecture::TopK || a == TrainArchitecture::BatchTopK; }

// The positive entries among the `total` largest values of relu(pre) over the
// whole batch (BatchTopK), as a code by row. Chunk maxima bound the
// total-th value from below, so only the values above that bound are ranked.
SparseCode batch_top_k_code(const at::Tensor& pre, int64_t total) {
  const int64_t N = pre.size(0), D = pre.size(1), M = N * D;
  const float* p = pre.const_data_ptr<float>();
  constexpr int64_t S = 64;
  const int64_t chunks = (M + S - 1) / S;
  float bound = 0.0f;
  if (total > 0 && chunks > total) {
    std::vector<float> maxima(chunks);
    at::parallel_for(0, chunks, 1024, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t e = std::min(M, (c + 1) * S);
        float m = p[c * S];
        for (int64_t j = c * S + 1; j < e; ++j) m = p[j] > m ? p[j] : m;
        maxima[c] = m;
      }
    });
    std::nth_element(maxima.begin(), maxima.begin() + (total - 1), maxima.end(), std::greater<float>());
    bound = std::max(bound, maxima[total - 1]);
  }
  struct Entry {
    float value;
    int64_t flat;
  };
  std::vector<Entry> got;
  for (int64_t j = 0; j < M; ++j)
    if (p[j] > 0.0f && p[j] >= bound) got.push_back({p[j], j});
  if (static_cast<int64_t>(got.size()) > total) {
    std::nth_element(got.begin(), got.begin() + (total - 1), got.end(), [](const Entry& a, const Entry& b) {
      return a.value > b.value || (a.value == b.value && a.flat < b.flat);
    });
    got.resize(total);
  }
  std::sort(got.begin(), got.end(), [](const Entry& a, const Entry& b) { return a.flat < b.flat; });
  SparseCode c;
  c.rows = N;
  c.width = D;
  std::vector<int64_t> ptr(N + 1, 0);
  c.indices = at::empty({static_cast<int64_t>(got.size())}, at::kLong);
  c.values = at::empty({static_cast<int64_t>(got.size())}, at::kFloat);
  int64_t* idx = c.indices.data_ptr<int64_t>();
  float* val = c.values.data_ptr<float>();
  for (size_t j = 0; j < got.size(); ++j) {
    ++ptr[got[j].flat / D + 1];
    idx[j] = got[j].flat % D;
    val[j] = got[j].value;
  }
  std::partial_sum(ptr.begin(), ptr.end(), ptr.begin());
  c.indptr = at::tensor(ptr, at::kLong);
  return c;
}

// Row of each entry of a code ([nnz] int64).
at::Tensor entry_rows(const SparseCode& c) {
  return at::repeat_interleave(at::arange(c.rows, at::kLong), c.indptr.narrow(0, 1, c.rows) - c.indptr.narrow(0, 0, c.rows));
}

// Per feature: the sum of `values` over the code's entries of that feature.
at::Tensor column_sums(const SparseCode& c, const at::Tensor& values) {
  return at::zeros({c.width}, at::kFloat).index_add_(0, c.indices, values);
}

// The AuxK code: per row the k_aux largest pre-activations among dead
// latents (any sign), values the raw pre-activations.
SparseCode aux_code(const at::Tensor& pre, const at::Tensor& dead_idx, int64_t k_aux) {
  const at::Tensor dead_pre = pre.index_select(1, dead_idx);
  auto [v, i] = dead_pre.topk(k_aux, -1, /*largest=*/true, /*sorted=*/false);
  auto [si, order] = dead_idx.index_select(0, i.flatten()).view(i.sizes()).sort(-1);
  SparseCode c;
  c.rows = pre.size(0);
  c.width = pre.size(1);
  c.indices = si.flatten().contiguous();
  c.values = v.gather(-1, order).flatten().contiguous();
  c.indptr = at::arange(0, c.rows + 1, at::kLong) * k_aux;
  return c;
}

void adam_update(at::Tensor& p, const at::Tensor& g, at::Tensor& m, at::Tensor& v, double clip, double lr, double b1,
                 double b2, double eps, int64_t step) {
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(b2, static_cast<double>(step)));
  const float step_size = static_cast<float>(lr / bc1), fb1 = b1, fb2 = b2, fc = clip;
  const float f1 = 1.0f - fb1, f2 = 1.0f - fb2, fbc = bc2_sqrt, feps = eps;
  float* pp = p.data_ptr<float>();
  const float* pg = g.const_data_ptr<float>();
  float* pm = m.data_ptr<float>();
  float* pv = v.data_ptr<float>();
  at::parallel_for(0, p.numel(), 16384, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      const float gj = pg[j] * fc;
      pm[j] = pm[j] + f1 * (gj - pm[j]);
      pv[j] = fb2 * pv[j] + f2 * gj * gj;
      pp[j] -= step_size * pm[j] / (std::sqrt(pv[j]) / fbc + feps);
    }
  });
}

}  // namespace

struct SaeTrainer::Forward {
  at::Tensor sin;       // encoder input [N, d_in]
  at::Tensor pre;       // SAELens's hidden_pre (TopK: rescaled by the decoder norms)
  at::Tensor h;         // encoder output before any rescaling
  at::Tensor norms;     // decoder row norms (TopK rescaling, standard L1)
  at::Tensor act_sums;  // [d_sae] float: activations summed over the batch (standard)
  SparseCode code;      // active features; values: the activations (sparse mode)
  at::Tensor acts;      // [N, d_sae] the activations (dense mode: JumpReLU / standard with many active)
  at::Tensor fired;     // [d_sae] int64 tokens each latent fired on
  int64_t nnz = 0;
  at::Tensor coef;      // [nnz] what multiplies each decoder row (activation / norm when rescaled)
  bool dense = false;   // too many active for sparse products (JumpReLU / standard): acts holds them
  at::Tensor out;       // [N, d_out]
  SparseCode aux;       // AuxK entries (values: raw pre-activations / norm)
  double aux_scale = 0;
  double mse = 0, sparsity = 0, aux_loss = 0;
};

SaeTrainer::SaeTrainer(SaeTrainingOptions options) : o_(std::move(options)) {
  if (o_.d_in <= 0 || o_.d_sae <= 0)
    throw ConfigError("sae training: d_in and d_sae must be positive, got " + std::to_string(o_.d_in) + " and " +
                      std::to_string(o_.d_sae));
  d_out_ = o_.transcoder ? o_.d_out : o_.d_in;
  if (d_out_ <= 0) throw ConfigError("sae training: a transcoder needs d_out > 0");
  if (!o_.transcoder && o_.skip_connection) throw ConfigError("sae training: a skip connection needs a transcoder");
  if (top_k_like(o_.architecture) && (o_.k <= 0 || o_.k > o_.d_sae))
    throw ConfigError("sae training: k = " + std::to_string(o_.k) + " must be in 1 .. d_sae (" +
                      std::to_string(o_.d_sae) + ")");
  if (o_.architecture == TrainArchitecture::TopK && std::floor(o_.k) != o_.k)
    throw ConfigError("sae training: a TopK k must be a whole number, got " + std::to_string(o_.k));
  if (o_.transcoder && o_.architecture == TrainArchitecture::TopK)
    throw UnsupportedError("sae training: SAELens has no TopK transcoder format; train a batchtopk transcoder "
                           "(saved as a JumpReLU transcoder) instead");
  if (!(o_.lr > 0) || !std::isfinite(o_.lr)) throw ConfigError("sae training: lr must be positive");
  if (o_.jumprelu_bandwidth <= 0) throw ConfigError("sae training: jumprelu bandwidth must be positive");
  const auto f = at::TensorOptions().dtype(at::kFloat);
  W_encT = at::zeros({o_.d_sae, o_.d_in}, f);
  b_enc = at::zeros({o_.d_sae}, f);
  W_dec = at::zeros({o_.d_sae, d_out_}, f);
  b_dec = at::zeros({d_out_}, f);
  threshold = at::full({o_.d_sae}, o_.jumprelu_init_threshold, f);
  W_skip = at::zeros({o_.skip_connection ? d_out_ : 0, o_.skip_connection ? o_.d_in : 0}, f);
  at::Tensor* params[6] = {&W_encT, &b_enc, &W_dec, &b_dec, &threshold, &W_skip};
  for (int i = 0; i < 6; ++i) {
    m_[i] = at::zeros_like(*params[i]);
    v_[i] = at::zeros_like(*params[i]);
  }
  since_fired_ = at::zeros({o_.d_sae}, at::kLong);
  fired_count_ = at::zeros({o_.d_sae}, at::kLong);
}

at::Tensor SaeTrainer::scale_in(const at::Tensor& x) const {
  if (x.dim() != 2 || x.size(1) != o_.d_in)
    throw ShapeError("sae training: input activations must be [N, " + std::to_string(o_.d_in) + "], got " +
                     shape_text(x.sizes()));
  at::Tensor s = x.to(at::kFloat).contiguous();
  return scale_in_ == 1.0 ? s : s * scale_in_;
}

at::Tensor SaeTrainer::target(const at::Tensor& x, const at::Tensor& y) const {
  if (!o_.transcoder) return scale_in(x);
  if (!y.defined() || y.dim() != 2 || y.size(1) != d_out_ || y.size(0) != x.size(0))
    throw ShapeError("sae training: a transcoder's targets must be [" + std::to_string(x.size(0)) + ", " +
                     std::to_string(d_out_) + "], got " + (y.defined() ? shape_text(y.sizes()) : "none"));
  at::Tensor t = y.to(at::kFloat).contiguous();
  return scale_out_ == 1.0 ? t : t * scale_out_;
}

void SaeTrainer::initialize(const at::Tensor& x, const at::Tensor& y) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o_.seed);
  auto unit_rows = [&](int64_t rows, int64_t cols) {
    // kaiming_uniform_ bound for fan_in = cols, then rows rescaled to decoder_init_norm.
    const double bound = std::sqrt(2.0) * std::sqrt(3.0 / static_cast<double>(cols));
    at::Tensor w = at::empty({rows, cols}, at::kFloat).uniform_(-bound, bound, gen);
    if (o_.decoder_init_norm > 0) w = w / w.norm(2, {1}, true) * o_.decoder_init_norm;
    return w.contiguous();
  };
  W_dec = unit_rows(o_.d_sae, d_out_);
  W_encT = o_.transcoder ? unit_rows(o_.d_sae, o_.d_in) : W_dec.clone();
  b_enc.zero_();
  threshold.fill_(o_.jumprelu_init_threshold);
  if (W_skip.numel()) W_skip.zero_();
  scale_in_ = scale_out_ = 1.0;
  if (o_.normalize_activations) {
    const at::Tensor xs = x.to(at::kFloat);
    scale_in_ = std::sqrt(static_cast<double>(o_.d_in)) / xs.norm(2, {1}).mean().item<double>();
    if (o_.transcoder) scale_out_ = std::sqrt(static_cast<double>(d_out_)) / y.to(at::kFloat).norm(2, {1}).mean().item<double>();
    else scale_out_ = scale_in_;
    if (!std::isfinite(scale_in_) || !std::isfinite(scale_out_))
      throw ConfigError("sae training: the activations' norms are zero or not finite; cannot normalise them");
  }
  const at::Tensor t = target(x, y);
  switch (o_.b_dec_init) {
    case BDecInit::Zeros:
      b_dec.zero_();
      break;
    case BDecInit::Mean:
      b_dec = t.mean(0).contiguous();
      break;
    case BDecInit::GeometricMedian: {
      // Weiszfeld's iteration from the mean, in float64.
      const at::Tensor p = t.to(at::kDouble);
      at::Tensor m = p.mean(0);
      for (int it = 0; it < 100; ++it) {
        const at::Tensor w = 1.0 / (p - m).norm(2, {1}).clamp_min(1e-12);
        const at::Tensor next = (p * w.unsqueeze(1)).sum(0) / w.sum();
        const double moved = (next - m).norm().item<double>();
        m = next;
        if (moved < 1e-7 * (1.0 + m.norm().item<double>())) break;
      }
      b_dec = m.to(at::kFloat).contiguous();
      break;
    }
  }
  for (int i = 0; i < 6; ++i) {
    m_[i].zero_();
    v_[i].zero_();
  }
  since_fired_.zero_();
  fired_count_.zero_();
  tokens_seen_ = 0;
  step_ = 0;
  topk_threshold = 0;
}

double SaeTrainer::coefficient() const {
  const double c = o_.architecture == TrainArchitecture::Standard ? o_.l1_coefficient : o_.l0_coefficient;
  if (step_ < o_.coefficient_warm_up_steps)
    return c * static_cast<double>(step_) / static_cast<double>(o_.coefficient_warm_up_steps);
  return c;
}

double SaeTrainer::lr_at(int64_t step) const {
  double f = 1.0;
  const int64_t w = o_.lr_warm_up_steps;
  if (w > 0 && step < w) f = w == 1 ? 1.0 : 1.0 / w + (1.0 - 1.0 / w) * static_cast<double>(step) / (w - 1);
  const int64_t d = o_.lr_decay_steps, start = o_.total_steps - d;
  if (d > 0 && step >= start) f = std::max(0.0, 1.0 - static_cast<double>(step - start) / d);
  return o_.lr * f;
}

at::Tensor SaeTrainer::dead_mask() const { return since_fired_.gt(o_.dead_feature_window); }

at::Tensor SaeTrainer::firing_frequency() const {
  return fired_count_.to(at::kDouble) / std::max<int64_t>(tokens_seen_, 1);
}

SaeTrainer::Forward SaeTrainer::forward(const at::Tensor& s, const at::Tensor& t) {
  Forward f;
  const int64_t N = s.size(0);
  f.sin = o_.transcoder ? s : (s - b_dec).contiguous();
  if (o_.bf16_encoder)
    f.h = at::addmm(b_enc.to(at::kBFloat16), f.sin.to(at::kBFloat16), W_encT.to(at::kBFloat16).t()).to(at::kFloat);
  else
    f.h = dense_linear(f.sin, W_encT, b_enc);  // the step's one product at any L0: oneDNN where it is faster
  const auto arch = o_.architecture;
  if (top_k_like(arch)) {
    if (o_.rescale_acts_by_decoder_norm) {
      f.norms = W_dec.norm(2, {1});
      f.pre = f.h * f.norms;
    } else {
      f.pre = f.h;
    }
    f.code = arch == TrainArchitecture::TopK ? top_k_code(f.pre, static_cast<int64_t>(o_.k))
                                             : batch_top_k_code(f.pre, static_cast<int64_t>(o_.k * N));
    f.coef = o_.rescale_acts_by_decoder_norm ? f.code.values * f.norms.reciprocal().index_select(0, f.code.indices)
                                             : f.code.values;
  } else {
    f.pre = f.h;
    f.norms = W_dec.norm(2, {1});
    at::Tensor acts;
    if (arch == TrainArchitecture::Standard) {
      // relu in place (h > 0 is acts > 0, so h itself is not needed again),
      // counting and summing each latent's activations in the same pass.
      detail::ReluColumns rc = detail::relu_columns_(f.h);
      acts = f.h;
      f.fired = rc.fired;
      f.nnz = rc.nnz;
      f.act_sums = rc.sums;
    } else {
      acts = f.h * f.h.gt(threshold);
      f.fired = acts.ne(0).sum(0);
      f.nnz = f.fired.sum().item<int64_t>();
    }
    f.dense = f.nnz * kDenseFraction > acts.numel();
    if (f.dense) {
      f.acts = acts;  // too many active for sparse products: everything below is dense
    } else {
      f.code = sparse_code(acts);
      f.coef = f.code.values;
    }
  }
  if (top_k_like(arch)) {
    f.fired = at::zeros({o_.d_sae}, at::kLong).index_add_(0, f.code.indices, at::ones_like(f.code.indices));
    f.nnz = f.code.nnz();
  }
  if (f.acts.defined()) {
    f.out = dense_linear(f.acts, W_dec, b_dec, WeightLayout::InOut);
  } else {
    const SparseCode c = with_values(f.code, f.coef);
    f.out = (f.code.nnz() * kDenseFraction > N * o_.d_sae ? at::mm(densify(c), W_dec) : decode_sparse(c, W_dec)) + b_dec;
  }
  if (o_.skip_connection) f.out = f.out + at::mm(s, W_skip.t());
  f.mse = (f.out - t).pow(2).sum().item<double>() / N;
  if (arch == TrainArchitecture::Standard)
    f.sparsity = coefficient() * at::dot(f.act_sums.to(at::kDouble), f.norms.to(at::kDouble)).item<double>() / N;
  else if (arch == TrainArchitecture::JumpReLU)
    f.sparsity = coefficient() * static_cast<double>(f.nnz) / N;
  if (top_k_like(arch)) {
    const at::Tensor dead_idx = at::nonzero(dead_mask()).flatten();
    const int64_t num_dead = dead_idx.numel();
    if (num_dead > 0 && o_.aux_loss_coefficient != 0) {
      const int64_t base = o_.d_in / 2;
      const int64_t k_aux = std::min(base, num_dead);
      f.aux_scale = std::min(static_cast<double>(num_dead) / base, 1.0);
      f.aux = aux_code(f.pre, dead_idx, k_aux);
      // pre / norm is the raw h: the rescaling cancels in the reconstruction.
      if (o_.rescale_acts_by_decoder_norm)
        f.aux.values = f.aux.values * f.norms.reciprocal().index_select(0, f.aux.indices);
      const at::Tensor recons = decode_sparse(f.aux, W_dec);
      const at::Tensor residual = t - f.out;
      f.aux_loss = o_.aux_loss_coefficient * f.aux_scale * (recons - residual).pow(2).sum().item<double>() / N;
    }
  }
  return f;
}

TrainGradients SaeTrainer::backward(const at::Tensor& s, const at::Tensor& t, Forward& f) {
  const int64_t N = s.size(0);
  const auto arch = o_.architecture;
  TrainGradients g;
  g.mse = f.mse;
  g.sparsity_loss = f.sparsity;
  g.aux_loss = f.aux_loss;
  g.loss = f.mse + f.sparsity + f.aux_loss;
  const at::Tensor go = ((f.out - t) * (2.0 / N)).contiguous();  // dL/dout
  g.b_dec = go.sum(0);
  if (o_.skip_connection) g.W_skip = at::mm(go.t(), s);
  // dL/d(coefficient) at the active entries: go . W_dec[f].
  at::Tensor Q;  // dense [N, d_sae] when needed
  if (f.acts.defined()) Q = dense_linear(go, W_dec, at::Tensor());
  const double c = coefficient();
  if (arch == TrainArchitecture::JumpReLU) {
    // Straight-through gradients of the threshold: JumpReLU (through the
    // reconstruction) and the L0 step, within the rectangle |h - theta| < bw/2.
    // Once few entries sit in it (a trained dictionary), their dots go . W_dec[f]
    // are sampled instead of making the whole product Q.
    const double bw = o_.jumprelu_bandwidth;
    const at::Tensor u = (f.h - threshold) / bw;
    const at::Tensor rect_f = (u > -0.5).logical_and(u < 0.5).to(at::kFloat);
    const at::Tensor in_rect = rect_f.sum(0);
    if (!Q.defined() && in_rect.sum().item<double>() * kDenseFraction > static_cast<double>(rect_f.numel()))
      Q = dense_linear(go, W_dec, at::Tensor());
    if (Q.defined()) {
      g.threshold = -(threshold / bw) * (rect_f * Q).sum(0) - (c / N / bw) * in_rect;
    } else {
      const SparseCode rect = sparse_code(rect_f);
      g.threshold = -(threshold / bw) * column_sums(rect, sampled_dots(rect, go, W_dec)) - (c / N / bw) * in_rect;
    }
  }
  // Standard: L1 of acts x ||W_dec[f]||, so d/dacts = c/N ||W_dec[f]|| and
  // d/dW_dec[f] = c/N (sum_n acts) W_dec[f] / ||W_dec[f]||.
  const at::Tensor norm_shift = arch == TrainArchitecture::Standard ? (c / N) * f.norms : at::Tensor();
  const at::Tensor norm_grad = arch == TrainArchitecture::Standard
                                   ? W_dec * ((c / N) * f.act_sums / f.norms).unsqueeze(1)
                                   : at::Tensor();
  if (f.acts.defined()) {
    // Dense mode: the same formulas as below on whole [N, d_sae] tensors.
    // dH is made in Q's storage (it is not needed after).
    at::Tensor& dH = Q;
    if (arch == TrainArchitecture::Standard) {
      g.b_enc = detail::mask_shift_columns_(dH, f.acts, norm_shift);
      g.W_dec = at::addmm(norm_grad, f.acts.t(), go);
    } else {
      dH.masked_fill_(f.h.le(threshold), 0.0);
      g.W_dec = at::mm(f.acts.t(), go);
      g.b_enc = dH.sum(0);
    }
    g.W_enc = at::mm(dH.t(), f.sin).t();  // made as [d_sae, d_in], the layout Adam updates
    if (!o_.transcoder) g.b_dec = g.b_dec - at::mv(W_encT.t(), g.b_enc);
    return g;
  }
  at::Tensor dW_dec = norm_grad.defined() ? norm_grad : at::zeros_like(W_dec);
  at::Tensor dW_encT = at::zeros_like(W_encT);
  add_code_t_dense_(dW_dec, with_values(f.code, f.coef), go);
  const at::Tensor q =
      Q.defined() ? Q.index({entry_rows(f.code), f.code.indices}) : sampled_dots(f.code, go, W_dec);
  // dL/dh at the active entries. TopK: the activation over the norm is relu(h)
  // itself, so the norms' gradients through selection and decode cancel.
  const at::Tensor dh = norm_shift.defined() ? q + norm_shift.index_select(0, f.code.indices) : q;
  SparseCode dcode = with_values(f.code, dh.contiguous());
  add_code_t_dense_(dW_encT, dcode, f.sin);
  g.b_enc = column_sums(f.code, dcode.values);
  if (f.aux.nnz() > 0) {
    const at::Tensor recons = decode_sparse(f.aux, W_dec);
    const at::Tensor ga = ((recons - (t - f.out)) * (2.0 * o_.aux_loss_coefficient * f.aux_scale / N)).contiguous();
    add_code_t_dense_(dW_dec, f.aux, ga);
    const at::Tensor dha = sampled_dots(f.aux, ga, W_dec);
    add_code_t_dense_(dW_encT, with_values(f.aux, dha), f.sin);
    g.b_enc += column_sums(f.aux, dha);
  }
  // The input side of b_dec: sin = s - b_dec, so d/db_dec = -sum_n dL/dsin = -(sum_n dL/dh) W_enc^T.
  if (!o_.transcoder) g.b_dec = g.b_dec - at::mv(W_encT.t(), g.b_enc);
  g.W_enc = dW_encT.t();
  g.W_dec = dW_dec;
  return g;
}

TrainGradients SaeTrainer::gradients(const at::Tensor& x, const at::Tensor& y) {
  at::NoGradGuard no_grad;
  const at::Tensor s = scale_in(x);
  const at::Tensor t = target(x, y);
  Forward f = forward(s, t);
  return backward(s, t, f);
}

TrainStepStats SaeTrainer::step(const at::Tensor& x, const at::Tensor& y) {
  at::NoGradGuard no_grad;
  const at::Tensor s = scale_in(x);
  const at::Tensor t = target(x, y);
  const int64_t N = s.size(0);
  if (o_.architecture == TrainArchitecture::JumpReLU) threshold.clamp_min_(0.0);
  Forward f = forward(s, t);
  TrainGradients g = backward(s, t, f);
  TrainStepStats st;
  st.mse = f.mse;
  st.sparsity_loss = f.sparsity;
  st.aux_loss = f.aux_loss;
  st.loss = g.loss;
  st.l0 = static_cast<double>(f.nnz) / N;
  const double total_var = (t - t.mean(0)).pow(2).sum().item<double>() / N;
  st.explained_variance = 1.0 - f.mse / total_var;
  st.dead = dead_mask().sum().item<int64_t>();
  st.lr = lr_at(step_);
  if (!std::isfinite(st.loss))
    throw NumericError("sae training: the loss is " + std::to_string(st.loss) + " at step " + std::to_string(step_) +
                       " (learning rate " + std::to_string(st.lr) + ")");
  // Dead-latent counts: steps since each latent fired in a batch.
  since_fired_.add_(1).masked_fill_(f.fired.gt(0), 0);
  fired_count_.add_(f.fired);
  tokens_seen_ += N;
  if (o_.architecture == TrainArchitecture::BatchTopK && f.nnz > 0) {
    const double min_positive = f.code.values.min().item<double>();
    topk_threshold = (1.0 - o_.topk_threshold_lr) * topk_threshold + o_.topk_threshold_lr * min_positive;
  }
  // Clip the whole gradient to max_grad_norm, then one Adam step.
  at::Tensor grads[6] = {g.W_enc.t().contiguous(), g.b_enc, g.W_dec, g.b_dec, g.threshold, g.W_skip};
  double sq = 0;
  for (const auto& gr : grads)
    if (gr.defined() && gr.numel()) {
      const double n = gr.norm().item<double>();
      sq += n * n;
    }
  st.grad_norm = std::sqrt(sq);
  const double clip = std::min(1.0, o_.max_grad_norm / (st.grad_norm + 1e-6));
  at::Tensor* params[6] = {&W_encT, &b_enc, &W_dec, &b_dec, &threshold, &W_skip};
  ++step_;
  for (int i = 0; i < 6; ++i) {
    if (!grads[i].defined() || grads[i].numel() == 0) continue;
    adam_update(*params[i], grads[i].contiguous(), m_[i], v_[i], clip, st.lr, o_.adam_beta1, o_.adam_beta2, o_.adam_eps,
                step_);
  }
  st.step = step_;
  return st;
}

}  // namespace flex
