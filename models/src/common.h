#pragma once
// Internal helpers shared by the architectures: reading a base-model call,
// building the attention mask, the attention core. Not installed.
#include <flex/hooks/module.h>
#include <flex/hooks/nn.h>
#include <flex/models/config.h>
#include <flex/models/kv_cache.h>
#include <flex/models/staged_model.h>

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

namespace flex::detail {

/// One base-model call, validated.
struct ModelCall {
  at::Tensor input_ids;       // [B, T]
  at::Tensor attention_mask;  // [B, S] or undefined
  at::Tensor position_ids;    // [P, T]
  c10::intrusive_ptr<KVCache> cache;
  int64_t past = 0;           // tokens already in the cache
  bool output_hidden_states = false;
};

/// Reads input_ids (args[0] or keyword), attention_mask, position_ids,
/// past_key_values and output_hidden_states; checks shapes and token ids
/// (ShapeError naming `who`, the argument and the shapes).
ModelCall read_call(const Inputs& inputs, const ModelConfig& cfg, const std::string& who);

/// The lower-triangular [1, 1, n, n] bool buffer GPT-2 and GPT-NeoX register
/// as `bias` (non-persistent), as Transformers does.
at::Tensor causal_bias(int64_t n, const c10::Device& device);

/// Boolean mask [B or 1, 1, T, past + T]: true where query t may attend key
/// s (causal, and the key is not padding). Undefined when nothing is masked.
at::Tensor allowed_mask(const at::Tensor& attention_mask, int64_t batch, int64_t t, int64_t past,
                        const c10::Device& device);

/// True when `mask` is the plain causal [1, 1, T, T] mask allowed_mask made
/// last on this thread (no padding, no past) and nobody has edited it since:
/// attention may then use the fused kernel's causal mode, which needs no mask.
/// Recognised by identity, so that blocks and hooks keep seeing the bool mask
/// they always saw; a mask replaced by a hook or copied to another device is
/// simply not recognised and is applied as a mask (same result, slower kernel).
bool is_plain_causal(const at::Tensor& mask);

/// Block kwargs: attention_mask (bool or None), past_key_value (cache or None),
/// position_embeddings (cos, sin) when rotary, position_ids when given (for
/// architectures whose attention layers compute RoPE themselves).
Inputs block_inputs(const at::Tensor& hidden, const at::Tensor& mask, const c10::intrusive_ptr<KVCache>& cache,
                    const Value& position_embeddings, const at::Tensor& position_ids = {});

/// The hidden-states argument of a block / attention call and its kwargs.
struct BlockCall {
  at::Tensor hidden;
  at::Tensor mask;          // undefined: attend everywhere (see mask_given)
  bool mask_given = false;  // false: no attention_mask keyword, so causal-only
  c10::intrusive_ptr<KVCache> cache;
  at::Tensor cos, sin;  // undefined for learned positions
  at::Tensor position_ids;  // [P, T] or undefined
};
BlockCall read_block_call(const Inputs& inputs, const std::string& who);
/// Attention kwargs forwarded from a block (same keys as block_inputs).
Inputs attention_inputs(const at::Tensor& x, const BlockCall& call);
/// The mask an attention layer applies: the caller's, or causal-only when the
/// block or attention module was called without an attention_mask keyword.
at::Tensor effective_mask(const BlockCall& call, int64_t q_len, int64_t k_len);
/// The element-0 tensor of a module output (tensor or tuple).
at::Tensor first_tensor(const Value& v, const std::string& who);

/// The dtype's lowest finite value (HF's finfo.min): what masked scores become.
double lowest_value(at::ScalarType t);

/// softmax over the last dim of `scores` with masked entries set to the
/// dtype's lowest value first (HF's finfo.min), optionally in float32.
/// Consumes `scores`: where no autograd graph is recorded it is written in
/// place (the result then shares its storage), so pass a tensor you own.
at::Tensor masked_softmax(at::Tensor scores, const at::Tensor& allowed, bool upcast);

/// repeat_kv: [B, H_kv, S, D] -> [B, H_kv * n_rep, S, D] (head h uses kv head h / n_rep).
at::Tensor repeat_kv(const at::Tensor& x, int64_t n_rep);

/// Output tuple helpers.
Value tuple_of(std::vector<Value> items);
Value hidden_states_value(const std::vector<at::Tensor>& hs);

/// The child `name` of `parent` called on `x` through its registered name
/// (a replaced child, e.g. a vocab-parallel embedding, runs instead of the
/// original); its first tensor output.
at::Tensor call_child(Module& parent, const std::string& name, const at::Tensor& x);
/// A base model's forward: every stage of it on `call`, as the tuple
/// (last_hidden_state, past_key_values, hidden_states or None).
Value run_all_stages(StagedModel& model, const ModelCall& call);

/// A number from the raw config (dropout rates), `dflt` when absent or null.
double raw_number(const ModelConfig& cfg, const char* key, double dflt);

/// act(gate) * up, the gated MLP's product: one pass (flex::silu_mul) when
/// `act` is SiLU without a hook (a hook must still see its call) and the
/// kernel takes the tensors (CPU, no graph to record); else the two ops.
at::Tensor act_times(Activation& act, const at::Tensor& gate, const at::Tensor& up);

/// A hook point: an Identity whose class name says what it is.
std::shared_ptr<Identity> hook_point();

/// A new parameter tensor of a module that is not a Linear (fused experts, a
/// router): on meta under EmptyInit (never allocated to be thrown away), else
/// N(0, 0.02) like Transformers' init.
at::Tensor init_parameter(at::IntArrayRef shape, const at::TensorOptions& opts);

}  // namespace flex::detail
