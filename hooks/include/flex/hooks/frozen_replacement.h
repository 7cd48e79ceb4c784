#pragma once
// The frozen (local) replacement of a transformer, as attribution graphs use
// it (design decision 39): while a FreezeNonlinearities guard lives on a
// thread, the model's own forward computes its usual values but autograd
// sees the attention probabilities and the normalisation denominators
// (LayerNorm's 1/std, RMSNorm's 1/rms) as constants. The residual stream is
// then linear in whatever the caller makes differentiable (token embeddings,
// MLP outputs), so one backward pass gives direct effects. The attention
// runs its eager path meanwhile (the fused kernel has no probabilities to
// detach), and norms compute in at least float32 (a float64 model stays in
// float64, which the attribution tests rely on).
//
//   { flex::FreezeNonlinearities frozen; at::Tensor y = (*model)(ids); ... }
//
// batch_replicas: the caller promises every batch row holds the same input
// (attribution replicates one prompt to seed a different gradient per row):
// the attention then computes the pattern once, from row 0, and applies it to
// every row's values ([1, H, T, S] instead of [B, H, T, S], in time and in
// what the backward keeps); a hook on hook_attn_probs sees that one row.
namespace flex {

class FreezeNonlinearities {
 public:
  explicit FreezeNonlinearities(bool batch_replicas = false);
  ~FreezeNonlinearities();
  FreezeNonlinearities(const FreezeNonlinearities&) = delete;
  FreezeNonlinearities& operator=(const FreezeNonlinearities&) = delete;

 private:
  bool previous_, previous_replicas_;
};

/// True while a FreezeNonlinearities guard lives on this thread.
bool nonlinearities_frozen();
/// True while the innermost guard was made with batch_replicas.
bool frozen_batch_replicas();

}  // namespace flex
