#pragma once
// One forward per family, by stage. A base model (GPT2Model, GPTNeoXModel,
// DecoderModel) runs embed -> blocks -> final norm in run_stage(); its own
// forward runs every stage at once, and each pipeline / tensor-parallel
// stage (ParallelCausalLM) runs its share through the same code, so the
// embedding scale, the position modules, the blocks' inputs and the final
// norm mean one thing in every layout. (The head and the final soft-cap are
// the causal LM's: CausalLM::finish_logits.)
#include <flex/hooks/module.h>
#include <flex/models/kv_cache.h>

#include <ATen/ATen.h>

#include <vector>

namespace flex {

/// What one stage runs, and on what.
struct StageCall {
  /// The first stage's tokens [B, T] (embeds); later stages pass `hidden`.
  at::Tensor input_ids;
  at::Tensor hidden;          // [B, T, C] from the previous stage
  at::Tensor attention_mask;  // [B, past + T] bool (true: a real token), or undefined
  at::Tensor position_ids;    // [1 or B, T]
  c10::intrusive_ptr<KVCache> cache;
  int64_t past = 0;  // tokens already in the cache
  /// Blocks [first_block, last_block) (last_block < 0: to the end).
  int64_t first_block = 0, last_block = -1;
  bool embeds = true;    // runs the embedding (and, with hooks, the position modules)
  bool finishes = true;  // runs the final norm
  /// Collects each block's input and the final output (output_hidden_states).
  std::vector<at::Tensor>* hidden_states = nullptr;
};

/// A base model whose forward is run_stage over all of it.
class StagedModel : public Module {
 public:
  using Module::Module;
  /// The hidden state after this stage. The embedding and the position
  /// modules are called through their registered names, so a stage whose
  /// embedding was replaced (tensor parallelism's vocab-parallel one) runs
  /// the replacement; position modules run their hooks on the embedding
  /// stage only (later stages recompute the same tables silently).
  virtual at::Tensor run_stage(const StageCall& call) = 0;
};

}  // namespace flex
