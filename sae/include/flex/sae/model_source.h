#pragma once
// Training rows straight from a model's forward (train-sae --model), and the
// next-token loss with a dictionary spliced in; the shard source is
// flex::shard_source (flex/sae/trainer.h).
#include <flex/models/causal_lm.h>
#include <flex/sae/trainer.h>
#include <flex/tokenizers/tokenizer.h>

#include <memory>
#include <string>

namespace flex {

struct ModelSourceOptions {
  std::string model_dir, dataset, text_field;
  int64_t context_len = 128, batch_size = 8;
  /// Activations gathered, then shuffled, per block (memory: this many rows).
  int64_t buffer_tokens = 65536;
  /// The corpus's first contexts covering this many tokens are never trained on.
  int64_t held_out_tokens = 8192;
  std::string hook, hook_out;
  uint64_t seed = 0;
};

/// Rows from the model's forward over the corpus (see the .cpp); `held_out_ids`
/// receives the held-out contexts' token ids [n, context_len].
std::unique_ptr<ActivationSource> model_source(std::shared_ptr<CausalLM> model, std::shared_ptr<const Tokenizer> tok,
                                               ModelSourceOptions options, at::Tensor* held_out_ids);

/// Mean next-token loss of `ids` [n, T]: the model as it is, with the
/// dictionary spliced in (replace mode), and with its place zeroed.
struct NextTokenLosses {
  double clean = 0, with_sae = 0, zeroed = 0;
  /// SAELens's "CE loss recovered": (zeroed - with_sae) / (zeroed - clean).
  double recovered() const { return (zeroed - with_sae) / (zeroed - clean); }
};
NextTokenLosses next_token_losses(const std::shared_ptr<CausalLM>& model, const at::Tensor& ids,
                                  const std::shared_ptr<SparseDictionary>& sae, const std::string& hook,
                                  const std::string& hook_out);

}  // namespace flex
