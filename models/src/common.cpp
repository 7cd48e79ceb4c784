#include "common.h"

#include "attention.h"

#include <flex/hooks/empty_init.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/shape_text.h>
#include <flex/kernels/fused_elementwise.h>
#include <flex/kernels/softmax.h>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>

#include <limits>

namespace flex::detail {

namespace {
at::Tensor named_tensor(const Inputs& in, const std::string& key, const std::string& who) {
  const Value* v = in.find(key);
  if (!v || v->isNone()) return {};
  if (!v->isTensor()) throw ConfigError(who + ": argument '" + key + "' must be a tensor, got " + v->tagKind());
  return v->toTensor();
}
}  // namespace

ModelCall read_call(const Inputs& inputs, const ModelConfig& cfg, const std::string& who) {
  ModelCall c;
  if (!inputs.args.empty() && inputs.args[0].isTensor())
    c.input_ids = inputs.args[0].toTensor();
  else
    c.input_ids = named_tensor(inputs, "input_ids", who);
  if (!c.input_ids.defined()) throw NotFoundError(who + ": input_ids is required (argument 0 or keyword)");
  if (c.input_ids.dim() != 2)
    throw ShapeError(who + ": input_ids must be [batch, seq], got shape " + shape_text(c.input_ids.sizes()));
  if (at::isFloatingType(c.input_ids.scalar_type()) || c.input_ids.scalar_type() == at::kBool)
    throw ShapeError(who + ": input_ids must hold integer token ids, got " +
                     std::string(c10::toString(c.input_ids.scalar_type())));
  if (c.input_ids.scalar_type() != at::kLong) c.input_ids = c.input_ids.to(at::kLong);
  const int64_t batch = c.input_ids.size(0), t = c.input_ids.size(1);
  if (t == 0 || batch == 0) throw ShapeError(who + ": input_ids is empty, shape " + shape_text(c.input_ids.sizes()));
  if (const Value* v = inputs.find("past_key_values")) c.cache = KVCache::from_value(*v);
  // A static cache (generate's static decode step, decision 51): no value is
  // read back to the host (a CUDA graph cannot), so the checks on values go;
  // the step's caller checked its inputs once.
  const bool static_step = c.cache && c.cache->is_static();
  if (!c.input_ids.is_meta() && !static_step) {
    const int64_t lo = c.input_ids.min().item<int64_t>(), hi = c.input_ids.max().item<int64_t>();
    if (lo < 0 || hi >= cfg.vocab_size)
      throw ShapeError(who + ": token id " + std::to_string(lo < 0 ? lo : hi) + " is outside the vocabulary [0, " +
                       std::to_string(cfg.vocab_size) + ")");
  }

  // Static: the query's slot is taken to be the last ones, so the causal part
  // of the mask allows every slot and the attention mask alone hides the
  // unwritten ones.
  c.past = !c.cache ? 0 : static_step ? c.cache->capacity() - t : c.cache->seq_length(0);

  c.attention_mask = named_tensor(inputs, "attention_mask", who);
  if (c.attention_mask.defined()) {
    if (c.attention_mask.dim() != 2 || c.attention_mask.size(0) != batch || c.attention_mask.size(1) != c.past + t)
      throw ShapeError(who + ": attention_mask must be [batch, past + seq] = [" + std::to_string(batch) + ", " +
                       std::to_string(c.past + t) + "], got " + shape_text(c.attention_mask.sizes()));
    c.attention_mask = c.attention_mask.ne(0);
    // An all-ones mask masks nothing: drop it so the unpadded path is taken
    // (a mask on meta has no values to look at: it is kept).
    if (!c.attention_mask.is_meta() && !static_step && c.attention_mask.all().item<bool>()) c.attention_mask = at::Tensor();
  }

  c.position_ids = named_tensor(inputs, "position_ids", who);
  if (c.position_ids.defined()) {
    if (c.position_ids.dim() == 1) c.position_ids = c.position_ids.unsqueeze(0);
    if (c.position_ids.dim() != 2 || c.position_ids.size(1) != t ||
        (c.position_ids.size(0) != 1 && c.position_ids.size(0) != batch))
      throw ShapeError(who + ": position_ids must be [batch or 1, " + std::to_string(t) + "], got " +
                       shape_text(c.position_ids.sizes()));
    c.position_ids = c.position_ids.to(c.input_ids.device(), at::kLong);
  } else {
    c.position_ids = at::arange(c.past, c.past + t, c.input_ids.options()).unsqueeze(0);
  }

  if (const Value* v = inputs.find("output_hidden_states")) {
    if (!v->isBool()) throw ConfigError(who + ": output_hidden_states must be a bool");
    c.output_hidden_states = v->toBool();
  }
  return c;
}

at::Tensor causal_bias(int64_t n, const c10::Device& device) {
  return at::ones({n, n}, at::TensorOptions().dtype(at::kBool).device(device)).tril().view({1, 1, n, n});
}

namespace {
// The last plain causal mask allowed_mask made on this thread and its version
// counter (bumped by in-place edits). Weak: the memo keeps no mask alive, and
// a dead mask's address cannot be reused while the weak reference exists.
struct PlainCausalMemo {
  c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> impl{at::Tensor().getIntrusivePtr()};
  int64_t version = -1;
};
thread_local PlainCausalMemo plain_causal_memo;
}  // namespace

at::Tensor allowed_mask(const at::Tensor& attention_mask, int64_t batch, int64_t t, int64_t past,
                        const c10::Device& device) {
  if (!attention_mask.defined() && t == 1) return {};
  // A normal tensor even under torch.inference_mode(): the plain-causal memo
  // below needs its version counter (inference tensors have none).
  c10::InferenceMode normal_tensors(false);
  const int64_t s = past + t;
  auto opts = at::TensorOptions().dtype(at::kLong).device(device);
  at::Tensor q = at::arange(past, s, opts).unsqueeze(1);
  at::Tensor k = at::arange(0, s, opts).unsqueeze(0);
  at::Tensor m = k.le(q).view({1, 1, t, s});
  if (attention_mask.defined()) {
    m = m.logical_and(attention_mask.to(device).view({batch, 1, 1, s}));
  } else if (past == 0) {
    plain_causal_memo.impl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(m.getIntrusivePtr());
    plain_causal_memo.version = m._version();
  }
  return m;
}

bool is_plain_causal(const at::Tensor& mask) {
  if (!mask.defined()) return false;
  const auto known = plain_causal_memo.impl.lock();
  return known.get() == mask.unsafeGetTensorImpl() && mask._version() == plain_causal_memo.version;
}

Inputs block_inputs(const at::Tensor& hidden, const at::Tensor& mask, const c10::intrusive_ptr<KVCache>& cache,
                    const Value& position_embeddings, const at::Tensor& position_ids) {
  Inputs in{Value(hidden)};
  in.kwargs.emplace_back("attention_mask", mask.defined() ? Value(mask) : Value());
  in.kwargs.emplace_back("past_key_value", KVCache::as_value(cache));
  if (position_ids.defined()) in.kwargs.emplace_back("position_ids", position_ids);
  if (!position_embeddings.isNone()) in.kwargs.emplace_back("position_embeddings", position_embeddings);
  return in;
}

BlockCall read_block_call(const Inputs& inputs, const std::string& who) {
  BlockCall c;
  c.hidden = inputs.tensor(0);
  c.mask = named_tensor(inputs, "attention_mask", who);
  c.mask_given = inputs.find("attention_mask") != nullptr;
  if (const Value* v = inputs.find("past_key_value")) c.cache = KVCache::from_value(*v);
  c.position_ids = named_tensor(inputs, "position_ids", who);
  if (const Value* v = inputs.find("position_embeddings"); v && !v->isNone()) {
    if (!v->isTuple() || v->toTupleRef().elements().size() != 2)
      throw ConfigError(who + ": position_embeddings must be the tuple (cos, sin)");
    c.cos = v->toTupleRef().elements()[0].toTensor();
    c.sin = v->toTupleRef().elements()[1].toTensor();
  }
  return c;
}

Inputs attention_inputs(const at::Tensor& x, const BlockCall& call) {
  Value pe;
  if (call.cos.defined()) pe = c10::ivalue::Tuple::create({call.cos, call.sin});
  return block_inputs(x, call.mask, call.cache, pe, call.position_ids);
}

at::Tensor effective_mask(const BlockCall& call, int64_t q_len, int64_t k_len) {
  if (call.mask_given) return call.mask;
  return allowed_mask(at::Tensor(), 1, q_len, k_len - q_len, call.hidden.device());
}

at::Tensor first_tensor(const Value& v, const std::string& who) {
  if (v.isTensor()) return v.toTensor();
  if (v.isTuple() && !v.toTupleRef().elements().empty() && v.toTupleRef().elements()[0].isTensor())
    return v.toTupleRef().elements()[0].toTensor();
  throw ConfigError(who + " returned " + v.tagKind() + " where a tensor or a tuple starting with one was expected");
}

double lowest_value(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return std::numeric_limits<double>::lowest();
    case at::kHalf: return -65504.0;
    case at::kBFloat16: return -3.3895313892515355e38;
    default: return std::numeric_limits<float>::lowest();
  }
}

at::Tensor masked_softmax(at::Tensor scores, const at::Tensor& allowed, bool upcast) {
  // In place where no graph is recorded: a fresh score-sized tensor per step
  // is a pass over cold memory, which cost more than the softmax itself.
  if (flex::masked_softmax_applies(scores, allowed)) {  // float32: both steps in one pass per row
    flex::masked_softmax_(scores, allowed, static_cast<float>(lowest_value(at::kFloat)));
    return scores;
  }
  const bool in_place = !(at::GradMode::is_enabled() && scores.requires_grad()) && scores.is_contiguous();
  if (allowed.defined()) {
    const at::Tensor hidden = allowed.logical_not();
    const double lowest = lowest_value(scores.scalar_type());
    scores = in_place ? scores.masked_fill_(hidden, lowest) : scores.masked_fill(hidden, lowest);
  }
  if (upcast && scores.scalar_type() != at::kFloat)
    return at::softmax(scores, -1, at::kFloat).to(scores.scalar_type());
  // ATen's last-dim softmax finishes each row's reads before it writes the row.
  if (in_place) return at::_softmax_out(scores, scores, -1, /*half_to_float=*/false);
  return at::softmax(scores, -1);
}

at::Tensor repeat_kv(const at::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const int64_t b = x.size(0), h = x.size(1), s = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({b, h, n_rep, s, d}).reshape({b, h * n_rep, s, d});
}

Value tuple_of(std::vector<Value> items) { return c10::ivalue::Tuple::create(std::move(items)); }

Value hidden_states_value(const std::vector<at::Tensor>& hs) {
  std::vector<Value> v(hs.begin(), hs.end());
  return c10::ivalue::Tuple::create(std::move(v));
}

at::Tensor call_child(Module& parent, const std::string& name, const at::Tensor& x) {
  return first_tensor((*parent.get_submodule(name))(Inputs{Value(x)}), name);
}

Value run_all_stages(StagedModel& model, const ModelCall& call) {
  StageCall s;
  s.input_ids = call.input_ids;
  s.attention_mask = call.attention_mask;
  s.position_ids = call.position_ids;
  s.cache = call.cache;
  s.past = call.past;
  std::vector<at::Tensor> states;
  if (call.output_hidden_states) s.hidden_states = &states;
  const at::Tensor hidden = model.run_stage(s);
  return tuple_of({hidden, KVCache::as_value(call.cache), call.output_hidden_states ? hidden_states_value(states) : Value()});
}

double raw_number(const ModelConfig& cfg, const char* key, double dflt) {
  auto it = cfg.raw.find(key);
  if (it == cfg.raw.end() || !it->is_number()) return dflt;
  return it->get<double>();
}

at::Tensor act_times(Activation& act, const at::Tensor& gate, const at::Tensor& up) {
  if ((act.kind == "silu" || act.kind == "swish") && !has_hook(act) && silu_mul_applies(gate, up))
    return silu_mul(gate, up);
  return act(gate) * up;
}

std::shared_ptr<Identity> hook_point() { return std::make_shared<Identity>("HookPoint"); }

at::Tensor init_parameter(at::IntArrayRef shape, const at::TensorOptions& opts) {
  at::Tensor t = new_parameter(shape, opts);
  if (!t.is_meta()) {
    at::NoGradGuard guard;
    t.normal_(0.0, 0.02);
  }
  return t;
}

}  // namespace flex::detail
