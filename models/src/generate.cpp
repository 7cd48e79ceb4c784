#include <flex/dispatch/big_modeling.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/shape_text.h>
#include <flex/models/generate.h>
#include <flex/models/static_decode.h>

#include "generate_taps.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <limits>

namespace flex {

namespace {
void check_options(const GenerateOptions& o) {
  if (o.max_new_tokens < 0) throw ConfigError("generate: max_new_tokens must be >= 0, got " + std::to_string(o.max_new_tokens));
  if (o.do_sample && !(o.temperature > 0.0))
    throw ConfigError("generate: temperature must be > 0 when sampling, got " + std::to_string(o.temperature));
  if (o.top_k < 0) throw ConfigError("generate: top_k must be >= 0, got " + std::to_string(o.top_k));
  if (!(o.top_p > 0.0 && o.top_p <= 1.0)) throw ConfigError("generate: top_p must be in (0, 1], got " + std::to_string(o.top_p));
}

}  // namespace

at::Generator make_cpu_generator(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

at::Tensor choose_next_tokens(const at::Tensor& logits_in, const GenerateOptions& opts, at::Generator& gen) {
  if (logits_in.dim() != 2) throw ShapeError("choose_next_tokens: logits must be [batch, vocab], got " + shape_text(logits_in.sizes()));
  if (!opts.do_sample) return logits_in.argmax(-1);
  check_options(opts);
  const double neg_inf = -std::numeric_limits<double>::infinity();
  at::Tensor logits = logits_in.to(at::kCPU, at::kFloat);
  if (opts.temperature != 1.0) logits = logits / opts.temperature;
  if (opts.top_k > 0 && opts.top_k < logits.size(-1)) {
    at::Tensor kth = std::get<0>(logits.topk(opts.top_k, -1)).narrow(-1, opts.top_k - 1, 1);
    logits = logits.masked_fill(logits < kth, neg_inf);
  }
  if (opts.top_p < 1.0) {
    // Drop the least likely tokens whose total mass stays within 1 - top_p,
    // always keeping the most likely one.
    auto sorted = logits.sort(-1, /*descending=*/false);
    at::Tensor cum = at::softmax(std::get<0>(sorted), -1).cumsum(-1);
    at::Tensor remove = cum <= (1.0 - opts.top_p);
    remove.narrow(-1, remove.size(-1) - 1, 1).fill_(false);
    at::Tensor remove_orig = at::zeros_like(remove).scatter(-1, std::get<1>(sorted), remove);
    logits = logits.masked_fill(remove_orig, neg_inf);
  }
  at::Tensor probs = at::softmax(logits, -1);
  return at::multinomial(probs, 1, /*replacement=*/false, gen).squeeze(-1).to(logits_in.device());
}

std::vector<int64_t> GenerateOutput::new_tokens(int64_t row) const {
  at::Tensor r = sequences[row].narrow(0, prompt_length, num_generated.at(row)).to(at::kCPU).contiguous();
  return std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
}

std::pair<at::Tensor, at::Tensor> pad_left(const std::vector<std::vector<int64_t>>& prompts, int64_t pad_id) {
  if (prompts.empty()) throw ShapeError("pad_left: no prompts");
  size_t len = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) throw ShapeError("pad_left: prompt " + std::to_string(i) + " is empty");
    len = std::max(len, prompts[i].size());
  }
  const auto n = static_cast<int64_t>(prompts.size()), l = static_cast<int64_t>(len);
  at::Tensor ids = at::full({n, l}, pad_id, at::kLong);
  at::Tensor mask = at::zeros({n, l}, at::kLong);
  for (int64_t i = 0; i < n; ++i) {
    const auto& p = prompts[i];
    const int64_t off = l - static_cast<int64_t>(p.size());
    for (size_t j = 0; j < p.size(); ++j) {
      ids[i][off + static_cast<int64_t>(j)] = p[j];
      mask[i][off + static_cast<int64_t>(j)] = 1;
    }
  }
  return {ids, mask};
}

GenerateOutput generate(CausalLM& model, const at::Tensor& input_ids, const at::Tensor& attention_mask,
                        const GenerateOptions& opts) {
  if (opts.static_step || opts.cuda_graph) return generate_static(model, input_ids, attention_mask, opts);
  detail::GenerateTaps taps(model, opts.taps);
  // The prompt goes to the device of the module that consumes it; the tokens
  // come back on the prompt's own device.
  const c10::Device device = input_device(model);
  const c10::Device caller = input_ids.defined() ? input_ids.device() : device;
  GenerateOutput out = generate([&model](const LMInputs& in) { return model.run(in).logits; }, model.config(),
                                input_ids.defined() ? input_ids.to(device) : input_ids,
                                attention_mask.defined() ? attention_mask.to(device) : attention_mask, opts);
  out.sequences = out.sequences.to(caller);
  out.attention_mask = out.attention_mask.to(caller);
  out.taps = taps.take();
  return out;
}

GenerateOutput generate(const LogitsFn& model_step, const ModelConfig& cfg, const at::Tensor& input_ids,
                        const at::Tensor& attention_mask, const GenerateOptions& opts) {
  check_options(opts);
  if (!input_ids.defined() || input_ids.dim() != 2 || input_ids.size(1) == 0)
    throw ShapeError("generate: input_ids must be a non-empty [batch, seq] tensor, got " +
                     (input_ids.defined() ? shape_text(input_ids.sizes()) : std::string("undefined")));
  if (attention_mask.defined() && attention_mask.sizes() != input_ids.sizes())
    throw ShapeError("generate: attention_mask " + shape_text(attention_mask.sizes()) + " must match input_ids " +
                     shape_text(input_ids.sizes()));
  at::NoGradGuard no_grad;
  const std::vector<int64_t> stops = opts.stop_tokens ? *opts.stop_tokens : cfg.eos_token_ids;
  const int64_t pad = opts.pad_token_id ? *opts.pad_token_id
                                        : (cfg.pad_token_id ? *cfg.pad_token_id : (stops.empty() ? 0 : stops[0]));
  const int64_t batch = input_ids.size(0);
  at::Tensor ids = input_ids.to(at::kLong);
  at::Tensor mask = attention_mask.defined() ? attention_mask.ne(0).to(at::kLong).to(ids.device()) : at::ones_like(ids);
  at::Tensor stop_t = at::tensor(stops.empty() ? std::vector<int64_t>{-1} : stops, at::kLong).to(ids.device());
  at::Tensor finished = at::zeros({batch}, ids.options().dtype(at::kBool));
  at::Generator gen = make_cpu_generator(opts.seed);
  c10::intrusive_ptr<KVCache> cache;
  if (opts.use_cache) cache = c10::make_intrusive<KVCache>();

  GenerateOutput out;
  out.prompt_length = ids.size(1);
  out.num_generated.assign(batch, 0);
  for (int64_t step = 0; step < opts.max_new_tokens; ++step) {
    // Positions count real tokens only, so left padding does not shift them.
    at::Tensor pos = (mask.cumsum(-1) - 1).masked_fill(mask.eq(0), 1);
    LMInputs in;
    in.attention_mask = mask;
    in.past_key_values = cache;
    if (cache && step > 0) {
      in.input_ids = ids.narrow(1, ids.size(1) - 1, 1);
      in.position_ids = pos.narrow(1, pos.size(1) - 1, 1);
    } else {
      in.input_ids = ids;
      in.position_ids = pos;
    }
    const at::Tensor logits = model_step(in);
    at::Tensor last = logits.select(1, logits.size(1) - 1);
    at::Tensor next = choose_next_tokens(last, opts, gen).to(ids.device());
    next = at::where(finished, at::full_like(next, pad), next);
    at::Tensor active = finished.logical_not().to(at::kCPU);
    for (int64_t b = 0; b < batch; ++b)
      if (active[b].item<bool>()) ++out.num_generated[b];
    ids = at::cat({ids, next.unsqueeze(1)}, 1);
    mask = at::cat({mask, at::ones({batch, 1}, mask.options())}, 1);
    if (!stops.empty()) finished = finished.logical_or(at::isin(next, stop_t));
    if (finished.all().item<bool>()) break;
  }
  out.sequences = ids;
  out.attention_mask = mask;
  return out;
}

}  // namespace flex
