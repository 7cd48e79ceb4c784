// attribute(): a recording pass (activations, errors, logits), then one
// forward of the frozen replacement at the batch size, replicated over the
// batch, whose graph every backward pass reuses: target b of a batch seeds
// batch row b, so one torch::autograd::grad call gives every target's
// gradient at every layer's MLP output place and at the embeddings.
#include "attribution_coders.h"
#include "attribution_influence.h"
#include "attribution_memory.h"
#include "attribution_places.h"
#include "attribution_ranks.h"
#include "attribution_stream.h"

#include <flex/hooks/errors.h>
#include <flex/hooks/frozen_replacement.h>
#include <flex/sae/attribution.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>

namespace flex {

namespace {

using detail::AttributionPlaces;
using detail::LayerCoder;

// The model's device: its token embedding's (on a later pipeline stage the
// embedding is on meta, never called: its own blocks' then).
at::Device first_device(const AttributionPlaces& p) {
  for (const auto& t : p.embed->parameters())
    if (!t.is_meta()) return t.device();
  for (const auto& m : p.mlps)
    for (const auto& t : m->parameters())
      if (!t.is_meta()) return t.device();
  return at::kCPU;
}

// ... and every other parameter's: a model split over devices (a device map
// with GPU and CPU layers) is refused, since the transcoders and per-node
// vectors live on one. Meta parameters (offloaded at rest, another stage's) do not count.
at::Device model_device(Module& model, const AttributionPlaces& p) {
  const at::Device dev = first_device(p);
  for (const auto& item : model.named_parameters(/*recurse=*/true))
    if (!item.value().is_meta() && item.value().device() != dev)
      throw UnsupportedError("attribution: the model's parameters are on " + dev.str() + " and " +
                             item.value().device().str() + " (" + item.key() +
                             "): attribution runs a model that lives on one device");
  return dev;
}

struct HookHandles {
  std::vector<HookHandle> handles;
  ~HookHandles() {
    for (auto& h : handles) h.remove();
  }
};

// The model's parameters as constants for the duration (restored after):
// no graph is recorded through the weights.
struct ParametersWithoutGrad {
  std::vector<std::pair<at::Tensor, bool>> saved;
  explicit ParametersWithoutGrad(Module& m) {
    for (auto& p : m.parameters()) {
      saved.emplace_back(p, p.requires_grad());
      if (p.requires_grad()) p.set_requires_grad(false);
    }
  }
  ~ParametersWithoutGrad() {
    for (auto& [p, rg] : saved)
      if (rg) p.set_requires_grad(true);
  }
};

// What the recording pass saw, batch row 0.
struct Recorded {
  std::vector<at::Tensor> x, out;  // per layer [T, d]: MLP input and output
  std::vector<at::Tensor> enc_in;  // per layer [T, d]: what the encoder reads (x, or the residual before the norm)
  at::Tensor embed;                // [T, d] token embeddings
  at::Tensor logits;               // [V] at the last position
};

Recorded record_attribution_pass(const AttributionPlaces& p, const at::Tensor& ids,
                                 bool reads_residual) {
  at::NoGradGuard no_grad;
  FreezeNonlinearities frozen;  // the same arithmetic as the replicated pass
  Recorded r;
  const size_t n = p.mlps.size();
  r.x.resize(n);
  r.out.resize(n);
  r.enc_in.resize(n);
  HookHandles hooks;
  hooks.handles.push_back(p.embed->register_forward_hook(
      [&](Module&, const Inputs&, Value& out) { r.embed = find_first_tensor(out)[0]; }));
  for (size_t l = 0; l < n; ++l) {
    hooks.handles.push_back(p.mlps[l]->register_forward_hook(
        [&r, l](Module&, const Inputs& in, Value&) { r.x[l] = in.tensor(0)[0]; }));
    hooks.handles.push_back(p.outs[l]->register_forward_hook(
        [&r, l](Module&, const Inputs&, Value& out) { r.out[l] = find_first_tensor(out)[0]; }));
    if (reads_residual)
      hooks.handles.push_back(p.norms[l]->register_forward_hook(
          [&r, l](Module&, const Inputs& in, Value&) { r.enc_in[l] = in.tensor(0)[0]; }));
  }
  const at::Tensor hidden = p.run(ids, nullptr, nullptr);
  // The probabilities are the model's (after a final soft cap, Gemma 2's);
  // a pipeline stage that does not finish has none (the last stage shares them).
  if (hidden.defined()) r.logits = p.logits(hidden.select(1, hidden.size(1) - 1))[0];
  if (!reads_residual) r.enc_in = r.x;
  return r;
}

// The frozen replacement's graph at batch size B: the leaves and places
// every backward pass reads.
struct ReplacementPass {
  at::Tensor embed_leaf;           // [B, T, d]
  std::vector<at::Tensor> x, y;    // per layer [B, T, d]: encoder input (target place), MLP output (source place)
  at::Tensor final_hidden;         // [B, T, d] after the final norm (pipeline: the last stage's)
  at::Tensor stage_in, stage_out;  // pipeline: the leaf received from the previous stage, what goes to the next
};

ReplacementPass replacement_pass(const AttributionPlaces& p, const std::vector<LayerCoder>& tw,
                                 const at::Tensor& ids, int64_t batch) {
  const bool residual = !tw.empty() && tw[0].reads_residual;
  at::AutoGradMode grad(true);
  FreezeNonlinearities frozen(/*batch_replicas=*/true);  // every row is the prompt: one pattern per layer
  ReplacementPass r;
  const size_t n = p.mlps.size();
  r.x.resize(n);
  r.y.resize(n);
  HookHandles hooks;
  hooks.handles.push_back(p.embed->register_forward_hook([&](Module&, const Inputs&, Value& out) {
    r.embed_leaf = find_first_tensor(out).detach().clone().requires_grad_(true);
    out = Value(r.embed_leaf);
  }));
  for (size_t l = 0; l < n; ++l) {
    // The MLP runs on one detached batch row of its input (the rows are the
    // same prompt; no graph through it); its output becomes a constant,
    // broadcast over the batch, plus the skip path where there is one.
    // The target place is the MLP input, or (a CLT at hook_resid_mid) the
    // norm's input; a skip path (per-layer transcoders only) reads the MLP input.
    if (residual)
      hooks.handles.push_back(p.norms[l]->register_forward_pre_hook([&r, l](Module&, Inputs& in) { r.x[l] = in.tensor(0); }));
    hooks.handles.push_back(p.mlps[l]->register_forward_pre_hook([&r, l, residual](Module&, Inputs& in) {
      const at::Tensor x = in.tensor(0);
      if (!residual) r.x[l] = x;
      in.args[0] = Value(x.detach().narrow(0, 0, 1));
    }));
    hooks.handles.push_back(p.outs[l]->register_forward_hook([&r, &tw, l](Module&, const Inputs&, Value& out) {
      const at::Tensor o = find_first_tensor(out);  // [1, T, d]
      if (tw[l].W_skip.defined()) {
        const at::Tensor skip = tw[l].skip(r.x[l]);
        r.y[l] = (o - tw[l].skip(r.x[l].detach().narrow(0, 0, 1))).detach() + skip;
      } else {
        r.y[l] = o.detach().expand(r.x[l].sizes()).clone().requires_grad_(true);
      }
      out = Value(r.y[l]);
    }));
  }
  r.final_hidden = p.run(ids.expand({batch, ids.size(1)}).contiguous(), &r.stage_in, &r.stage_out);
  return r;
}

// One target: where its gradient is seeded (layer, or n_layers for the
// final norm's output), at which position, with which vector.
struct Target {
  int64_t layer, pos;
  at::Tensor vec;
};

}  // namespace

namespace detail {

// What one group of active features writes into one layer's MLP output
// place: their columns (indices into the active features) and their decoder
// rows there times their activations. Per-layer transcoders: one group per
// layer; a CLT: one per (source layer, output layer >= it).
struct DecoderWrites {
  int64_t out_layer;
  at::Tensor columns;  // [n] int64
  at::Tensor rows;     // [n, d]
};

// Rows of direct effects for up to B targets: [n, F + L*T + T] over every
// active feature, error node and token (the caller selects feature columns).
class RowComputer {
 public:
  RowComputer(ReplacementPass pass, const at::Tensor& positions, const std::vector<DecoderWrites>& writes,
              std::vector<at::Tensor> errors, at::Tensor embed, int64_t n_features, const AttributionPipeline* pipeline)
      : pass_(std::move(pass)), errors_(std::move(errors)), embed_(std::move(embed)), n_features_(n_features),
        pipeline_(pipeline) {
    // Per group, the scaled decoder rows laid out by position, [T, d, slots]
    // (zero-padded to the busiest position): one batched product per group
    // gives every feature's edge into n targets.
    const int64_t T = embed_.size(0), d = embed_.size(1);
    const at::Tensor pos = positions.contiguous();
    const int64_t* p = pos.data_ptr<int64_t>();
    for (const DecoderWrites& w : writes) {
      if (pipeline_ && !pipeline_->owns(w.out_layer)) continue;  // another stage's place
      const at::Tensor cols = w.columns.contiguous();
      const int64_t* c = cols.data_ptr<int64_t>();
      std::vector<std::vector<int64_t>> by(T);  // row indices within the group, by position
      for (int64_t i = 0; i < cols.size(0); ++i) by[p[c[i]]].push_back(i);
      size_t slots = 0;
      for (const auto& at_t : by) slots = std::max(slots, at_t.size());
      if (slots == 0) continue;
      GroupDecoders ld;
      ld.out_layer = w.out_layer;
      std::vector<int64_t> columns, rows, flat;
      for (int64_t t = 0; t < T; ++t)
        for (size_t k = 0; k < by[t].size(); ++k) {
          columns.push_back(c[by[t][k]]);
          rows.push_back(by[t][k]);
          flat.push_back(t * static_cast<int64_t>(slots) + static_cast<int64_t>(k));
        }
      // Index lists on the decoders' device (the model's: a GPU's kernels take no CPU index).
      const at::Device dev = w.rows.device();
      ld.columns = at::tensor(columns, at::kLong).to(dev);
      ld.flat = at::tensor(flat, at::kLong).to(dev);
      at::Tensor padded = at::zeros({T * static_cast<int64_t>(slots), d}, w.rows.options());
      padded.index_copy_(0, ld.flat, w.rows.index_select(0, at::tensor(rows, at::kLong).to(dev)));
      ld.decoders = padded.view({T, static_cast<int64_t>(slots), d}).transpose(1, 2).contiguous();  // [T, d, slots]
      groups_.push_back(std::move(ld));
    }
  }

  /// Off: rows() runs the backward pass only (a tensor-parallel rank that
  /// keeps no rows) and returns an undefined tensor.
  void set_contract(bool on) { contract_ = on; }

  at::Tensor rows(const std::vector<Target>& targets) {
    const int64_t n = static_cast<int64_t>(targets.size());
    const int64_t L = static_cast<int64_t>(errors_.size()), T = embed_.size(0);
    const auto opts = embed_.options();
    // This process's layers [a, b) (a pipeline stage's; else every one),
    // whether it finishes (logit targets) and embeds (token sources).
    const AttributionPipeline* pl = pipeline_;
    const int64_t a = pl ? pl->first_layer : 0, b_end = pl ? pl->last_layer : L;
    const bool finishes = !pl || pl->last(), embeds = !pl || pl->first();
    std::vector<at::Tensor> outputs, seeds;
    for (int64_t l = 0; l <= L; ++l) {
      if (l < L ? (l < a || l >= b_end) : !finishes) continue;
      at::Tensor seed;
      for (int64_t b = 0; b < n; ++b) {
        if (targets[b].layer != l) continue;
        if (!seed.defined()) seed = at::zeros_like(l < L ? pass_.x[l] : pass_.final_hidden);
        seed[b][targets[b].pos].copy_(targets[b].vec);
      }
      if (!seed.defined()) continue;
      outputs.push_back(l < L ? pass_.x[l] : pass_.final_hidden);
      seeds.push_back(seed);
    }
    if (pl && !pl->last()) {  // the gradient of the later stages' targets at this stage's output
      outputs.push_back(pass_.stage_out);
      seeds.push_back(pl->pp->recv(pl->stage + 1, kStageGradTag));
    }
    std::vector<at::Tensor> inputs(pass_.y.begin() + a, pass_.y.begin() + b_end);
    if (embeds) inputs.push_back(pass_.embed_leaf);
    if (!embeds) inputs.push_back(pass_.stage_in);
    std::vector<at::Tensor> grads(inputs.size());
    if (!outputs.empty())
      grads = torch::autograd::grad(outputs, inputs, seeds, /*retain_graph=*/true, /*create_graph=*/false,
                                    /*allow_unused=*/true);
    if (!embeds) {
      const at::Tensor& gin = grads.back();
      pl->pp->send(gin.defined() ? gin.contiguous() : at::zeros_like(pass_.stage_in), pl->stage - 1, kStageGradTag);
    }
    if (!contract_) return at::Tensor();
    at::Tensor out = at::zeros({n, n_features_ + L * T + T}, opts);
    for (const GroupDecoders& ld : groups_) {
      if (ld.out_layer < a || ld.out_layer >= b_end) continue;
      const at::Tensor& g = grads[ld.out_layer - a];
      if (!g.defined()) continue;
      // [T, n, d] x [T, d, slots] -> [n, T * slots], then each feature's slot;
      // a CLT feature sums its groups (one per layer it writes into).
      const at::Tensor e = at::bmm(g.narrow(0, 0, n).transpose(0, 1), ld.decoders).transpose(0, 1).reshape({n, -1});
      out.index_add_(1, ld.columns, e.index_select(1, ld.flat));
    }
    for (int64_t l = a; l < b_end; ++l) {
      const at::Tensor& g = grads[l - a];
      if (g.defined())
        out.narrow(1, n_features_ + l * T, T).copy_((g.narrow(0, 0, n) * errors_[l]).sum(-1));
    }
    if (embeds) {
      const at::Tensor& ge = grads[b_end - a];
      if (ge.defined()) out.narrow(1, n_features_ + L * T, T).copy_((ge.narrow(0, 0, n) * embed_).sum(-1));
    }
    if (pl) {  // each stage's columns: their sum on rank 0
      out = pl->pp->reduce(out, 0);
      if (!pl->first()) return at::Tensor();
    }
    return out;
  }

 private:
  ReplacementPass pass_;
  std::vector<at::Tensor> errors_;
  at::Tensor embed_;
  int64_t n_features_;
  const AttributionPipeline* pipeline_;
  bool contract_ = true;
  static constexpr int kStageGradTag = 7481;
  struct GroupDecoders {
    int64_t out_layer = 0;
    at::Tensor decoders;  // [T, d, slots]
    at::Tensor columns;   // the features' columns, in slot order
    at::Tensor flat;      // their t * slots + slot
  };
  std::vector<GroupDecoders> groups_;
};

}  // namespace detail

AttributionGraph attribute(CausalLM& model, const Transcoders& transcoders, const at::Tensor& input_ids,
                           const AttributionOptions& o) {
  return detail::attribute_on(model, model.config().max_position_embeddings, detail::attribution_places(model),
                              transcoders, input_ids, o, nullptr);
}

namespace detail {

AttributionGraph attribute_on(Module& model, int64_t context, const AttributionPlaces& places,
                              const Transcoders& transcoders, const at::Tensor& input_ids, const AttributionOptions& o,
                              const AttributionRanks* ranks) {
  if (o.max_n_logits < 1) throw ConfigError("attribution: max_n_logits must be at least 1, not " + std::to_string(o.max_n_logits));
  if (!(o.desired_logit_prob > 0.0 && o.desired_logit_prob <= 1.0))
    throw ConfigError("attribution: desired_logit_prob must be in (0, 1], not " + std::to_string(o.desired_logit_prob));
  if (o.batch_size < 1) throw ConfigError("attribution: batch_size must be at least 1, not " + std::to_string(o.batch_size));
  if (o.max_feature_nodes < -1 || o.max_feature_nodes == 0)
    throw ConfigError("attribution: max_feature_nodes must be positive (or -1 for all), not " +
                      std::to_string(o.max_feature_nodes));
  if (o.update_interval < 1) throw ConfigError("attribution: update_interval must be at least 1");
  if (o.max_memory_bytes < 0)
    throw ConfigError("attribution: max_memory_bytes must be 0 (in memory) or a positive bound, not " +
                      std::to_string(o.max_memory_bytes));
  at::Tensor ids = input_ids;
  if (ids.dim() == 2 && ids.size(0) == 1) ids = ids[0];
  if (ids.dim() != 1 || ids.size(0) == 0)
    throw ShapeError("attribution: input_ids must be one non-empty prompt ([T] or [1, T]), not " +
                     std::string(ids.sizes().vec().empty() ? "a scalar" : "of shape " + c10::str(ids.sizes())));
  const int64_t T = ids.size(0);
  if (context > 0 && T > context)
    throw ShapeError("attribution: the prompt's " + std::to_string(T) + " tokens are longer than the model's context of " +
                     std::to_string(context));
  ids = ids.to(at::kCPU, at::kLong).unsqueeze(0);
  // A model on a GPU (decision 49): the passes, transcoders and per-node
  // vectors on its device; the nodes, rows and adjacency delivered on the CPU.
  const at::Device dev = model_device(model, places);
  const at::Tensor model_ids = ids.to(dev);
  const bool streamed = o.max_memory_bytes > 0;
  if (!dev.is_cpu() && (streamed || ranks))
    throw UnsupportedError(std::string("attribution: a model on ") + dev.str() + " runs in one process with its rows in memory: " +
                           (streamed ? "max_memory_bytes (--max-memory) bounds what the CPU allocator counts, not device memory"
                                     : "the parallel passes exchange CPU tensors"));
  // Streamed (decision 45): what this call allocates is measured from here.
  std::optional<detail::CpuAllocationMeter> meter;
  if (streamed) meter.emplace();

  // Under tensor parallelism rank 0 alone contracts and keeps rows.
  const bool keeps = ranks == nullptr || ranks->keeps_rows();
  ParametersWithoutGrad constants(model);

  Recorded rec = record_attribution_pass(places, model_ids, detail::reads_residual(transcoders));
  const AttributionPipeline* pipeline = ranks ? ranks->pipeline.get() : nullptr;
  if (pipeline) {  // every stage gets every layer's recording (the nodes are computed everywhere)
    pipeline->share_layers(rec.x);
    pipeline->share_layers(rec.out);
    if (detail::reads_residual(transcoders)) pipeline->share_layers(rec.enc_in);
    else rec.enc_in = rec.x;
    pipeline->share(rec.embed, 0);
    pipeline->share(rec.logits, pipeline->n_stages - 1);
  }
  const at::ScalarType dt = rec.embed.scalar_type();
  // Checked against the model and converted to its dtype.
  const std::vector<LayerCoder> tw = [&] {
    std::vector<LayerCoder> c = detail::layer_coders(model, places, transcoders, dt);
    detail::move_coders(c, dev);
    return c;
  }();
  const int64_t L = static_cast<int64_t>(places.mlps.size());

  // Active features, what they write (decoder rows times activation, per
  // layer written), error vectors (MLP output minus the reconstruction).
  std::vector<at::Tensor> f_layer, f_pos, f_idx, f_act, f_pre, encoders, acts, errors;
  std::vector<detail::DecoderWrites> writes;
  {
    at::NoGradGuard no_grad;
    int64_t first = 0;  // this layer's first active feature
    for (int64_t l = 0; l < L; ++l) {
      const at::Tensor pre = tw[l].pre(rec.enc_in[l]);
      at::Tensor act = tw[l].act(pre);
      if (o.zero_first_position) act[0].zero_();
      acts.push_back(act);
      const at::Tensor nz = act.nonzero();  // [n, 2] (pos, feature), row-major: sorted
      const at::Tensor pos = nz.select(1, 0), feat = nz.select(1, 1);
      f_layer.push_back(at::full_like(pos, l));
      f_pos.push_back(pos);
      f_idx.push_back(feat);
      const at::Tensor a = act.index({pos, feat});
      f_act.push_back(a);
      f_pre.push_back(pre.index({pos, feat}));
      encoders.push_back(tw[l].W_enc.index_select(1, feat).t());
      const at::Tensor columns = at::arange(first, first + a.size(0), at::kLong);
      for (size_t k = 0; k < tw[l].W_dec.size(); ++k)
        writes.push_back({l + static_cast<int64_t>(k), columns, tw[l].W_dec[k].index_select(0, feat.to(tw[l].W_dec[k].device())).to(a.options()) * a.unsqueeze(1)});
      first += a.size(0);
    }
    for (int64_t l = 0; l < L; ++l) {
      at::Tensor err = rec.out[l] - detail::reconstruction(tw, acts, l, rec.x[l]);
      if (o.zero_first_position) err[0].zero_();
      errors.push_back(err);
    }
  }
  AttributionGraph g;
  g.n_layers = L;
  g.n_pos = T;
  g.input_ids = ids[0].clone();
  // Node lists on the CPU (read element by element below; what the graph delivers).
  const at::Tensor layers = at::cat(f_layer).cpu(), positions = at::cat(f_pos).cpu();
  g.active_features = at::stack({layers, positions, at::cat(f_idx)}, 1);
  g.activations = at::cat(f_act).cpu();
  g.pre_activations = at::cat(f_pre).cpu();
  const at::Tensor encoder_vecs = at::cat(encoders);
  // One copy of the encoder rows, and no [T, d_sae] activations, through
  // the passes (at 4096 tokens, 4 x d_sae 4096: ~0.7 GB; decision 45).
  encoders.clear();
  acts.clear();
  const int64_t F = g.activations.size(0);

  // Logit targets: circuit-tracer's salient logits.
  const at::ScalarType prob_dt = at::promote_types(at::kFloat, dt);
  const at::Tensor probs = at::softmax(rec.logits.to(prob_dt), -1);
  auto [top_p, top_idx] = at::topk(probs, std::min<int64_t>(o.max_n_logits, probs.size(0)));
  const at::Tensor cum = at::cumsum(top_p, 0);
  const int64_t cutoff = std::min<int64_t>(
      at::searchsorted(cum, at::scalar_tensor(o.desired_logit_prob, cum.options())).item<int64_t>() + 1, top_p.size(0));
  g.logit_tokens = top_idx.narrow(0, 0, cutoff).cpu().clone();
  g.logit_probabilities = top_p.narrow(0, 0, cutoff).cpu().clone();
  const int64_t K = cutoff;
  const at::Tensor W_U = places.unembedding().to(dt);
  const at::Tensor logit_vecs = W_U.index_select(0, top_idx.narrow(0, 0, cutoff)) - W_U.mean(0, /*keepdim=*/true);

  const int64_t n_visit = o.max_feature_nodes < 0 ? F : std::min(o.max_feature_nodes, F);
  const int64_t B = std::max<int64_t>(1, std::min(o.batch_size, std::max(n_visit, K)));
  auto make_rows = [&](int64_t batch) {
    // A pipeline stage contracts its own places; a rank that contracts
    // nothing lays out no decoders.
    const bool contracts = keeps || (pipeline && pipeline->contracts);
    auto computer = std::make_unique<detail::RowComputer>(replacement_pass(places, tw, model_ids, batch), positions,
                                                          contracts ? writes : std::vector<detail::DecoderWrites>{},
                                                          errors, rec.embed, F, pipeline);
    computer->set_contract(contracts);
    return computer;
  };
  const at::ScalarType adj_dt = prob_dt;
  const int64_t cols = F + L * T + T;
  // Targets per backward pass: batch_size, or what the bound leaves.
  int64_t step = o.batch_size, pass_batch = B, block_rows = 1, peak_seen = 0;
  if (streamed) {
    // The working memory of a replicated pass and one batch of rows, at
    // batch 1 and 2 (their difference: one more target row).
    auto probe = [&](int64_t batch) {
      const int64_t before = meter->live();
      peak_seen = std::max(peak_seen, meter->peak());
      meter->reset_peak();
      {
        auto probe_rows = make_rows(batch);
        const at::Tensor r = probe_rows->rows(std::vector<Target>(batch, Target{L, T - 1, logit_vecs[0]}));
        if (r.defined()) (void)r.to(adj_dt);
      }
      return meter->peak() - before;
    };
    const int64_t held = meter->live(), earlier_peak = meter->peak();
    const int64_t one = probe(1), two = probe(2);
    // A batch's targets can sit in every layer: per layer a seed [batch, T,
    // d], and the sum where its gradient joins the residual's from above
    // (measured at 4096 tokens: the probe's logit targets alone missed ~6%).
    const int64_t seed_row_bytes = 2 * L * T * rec.embed.size(1) * static_cast<int64_t>(c10::elementSize(dt));
    std::optional<detail::StreamPlan> plan;
    std::string refused;
    try {
      plan = detail::plan_stream(o.max_memory_bytes, earlier_peak, held, one, two, seed_row_bytes, cols,
                                 n_visit + L * T + T + K, static_cast<int64_t>(c10::elementSize(adj_dt)), o.batch_size);
    } catch (const ConfigError& e) {
      if (!ranks) throw;
      refused = e.what();
    }
    if (ranks) {
      // Every rank runs rank 0's passes (the collectives inside must pair),
      // and every rank fails when rank 0's bound is too small (none waits).
      std::vector<int64_t> mine;
      if (keeps) mine = plan ? std::vector<int64_t>{1, plan->batch, std::min(B, plan->batch), plan->block_rows} : std::vector<int64_t>{0};
      const std::vector<int64_t> shared = ranks->broadcast(mine);
      if (shared[0] == 0)
        throw ConfigError(keeps ? refused : "attribution: the memory bound cannot hold one batch of rows on rank 0 (its error names the size needed)");
      step = shared[1], pass_batch = shared[2], block_rows = shared[3];
    } else {
      step = plan->batch;
      pass_batch = std::min(B, plan->batch);
      block_rows = plan->block_rows;
    }
  }
  std::unique_ptr<detail::RowComputer> row_computer = make_rows(pass_batch);
  detail::RowComputer& rows = *row_computer;

  // Rows: logits first, then features (all, or the most influential first).
  // In memory, or (streamed) appended to a file in visit order.
  at::Tensor edge;
  std::unique_ptr<detail::RowFile> edge_file;
  if (keeps && streamed) {
    edge_file = std::make_unique<detail::RowFile>(detail::attribution_temp_parent(o.temp_dir), "edges.bin", cols, adj_dt);
  } else if (keeps) {
    edge = at::zeros({n_visit + K, cols}, at::TensorOptions().dtype(adj_dt));
  }
  auto store = [&](int64_t first, const at::Tensor& r) {
    if (!keeps) return;
    if (streamed) edge_file->append(r);
    else edge.narrow(0, first, r.size(0)).copy_(r);  // from the model's device
  };
  std::vector<int64_t> row_node(n_visit + K);  // node index of each row in the unselected numbering
  for (int64_t i = 0; i < K; i += step) {
    std::vector<Target> batch;
    for (int64_t j = i; j < std::min(K, i + step); ++j) batch.push_back({L, T - 1, logit_vecs[j]});
    store(i, rows.rows(batch));
    for (int64_t j = i; j < i + static_cast<int64_t>(batch.size()); ++j) row_node[j] = cols + j;
  }
  int64_t filled = K;
  std::vector<char> visited(F, 0);
  const int64_t* lp = layers.data_ptr<int64_t>();
  const int64_t* pp = positions.data_ptr<int64_t>();
  int64_t n_done = 0;
  while (n_done < n_visit) {
    std::vector<int64_t> pending;
    if (n_visit == F) {
      for (int64_t i = 0; i < F; ++i) pending.push_back(i);
    } else if (keeps) {
      const std::vector<int64_t> done_rows(row_node.begin(), row_node.begin() + filled);
      const at::Tensor influence =
          streamed ? detail::partial_influences(*edge_file, block_rows, g.logit_probabilities, done_rows, K)
                   : detail::partial_influences(edge.narrow(0, 0, filled), g.logit_probabilities, done_rows, K);
      const at::Tensor order = at::argsort(influence.narrow(0, 0, F), /*stable=*/true, /*dim=*/0, /*descending=*/true);
      const int64_t want = std::min(o.update_interval * o.batch_size, n_visit - n_done);
      const int64_t* op = order.data_ptr<int64_t>();
      for (int64_t i = 0; i < F && static_cast<int64_t>(pending.size()) < want; ++i)
        if (!visited[op[i]]) pending.push_back(op[i]);
    }
    if (ranks && n_visit != F) pending = ranks->broadcast(pending);
    for (size_t s = 0; s < pending.size(); s += static_cast<size_t>(step)) {
      std::vector<Target> batch;
      const size_t e = std::min(pending.size(), s + static_cast<size_t>(step));
      for (size_t i = s; i < e; ++i) batch.push_back({lp[pending[i]], pp[pending[i]], encoder_vecs[pending[i]]});
      store(filled, rows.rows(batch));
      for (size_t i = s; i < e; ++i) {
        row_node[filled++] = pending[i];
        visited[pending[i]] = 1;
      }
    }
    n_done += static_cast<int64_t>(pending.size());
  }

  // The dense adjacency over the selected features.
  std::vector<int64_t> selected;
  for (int64_t i = 0; i < F; ++i)
    if (visited[i]) selected.push_back(i);
  g.selected_features = at::tensor(selected, at::kLong).view({-1});
  const int64_t S = g.selected_features.size(0);
  if (!keeps) return g;  // the nodes only: rank 0 holds the rows
  if (streamed) {
    // The rows in node order to a second file; the visit-order file goes
    // with edge_file. Nothing [N, N] is held.
    row_computer.reset();
    auto adjacency = detail::streamed_adjacency(*edge_file, row_node, selected, F, K, block_rows,
                                                detail::attribution_temp_parent(o.temp_dir), o.max_memory_bytes);
    adjacency->set_targets_per_pass(step);
    adjacency->record_peak(std::max(peak_seen, meter->peak()));
    g.streamed = adjacency;
    return g;
  }
  at::Tensor col_index = at::cat({g.selected_features, at::arange(F, cols, at::kLong)});
  const at::Tensor edge_cols = edge.index_select(1, col_index);  // [n_visit + K, S + L*T + T]
  // Feature rows in feature order, then the logit rows, in a [N, N] matrix.
  std::vector<int64_t> feature_row(F, -1);
  for (int64_t r = K; r < filled; ++r) feature_row[row_node[r]] = r;
  const int64_t N = S + L * T + T + K;
  g.adjacency = at::zeros({N, N}, edge.options());
  std::vector<int64_t> src_rows;
  for (int64_t i : selected) src_rows.push_back(feature_row[i]);
  if (S > 0) g.adjacency.narrow(0, 0, S).narrow(1, 0, S + L * T + T).copy_(edge_cols.index_select(0, at::tensor(src_rows, at::kLong)));
  g.adjacency.narrow(0, N - K, K).narrow(1, 0, S + L * T + T).copy_(edge_cols.narrow(0, 0, K));
  return g;
}

}  // namespace detail

}  // namespace flex
