#include "flex_model_parts.h"
#include "alias_in_flight.h"

#include <flex/hooks/errors.h>
#include <flex/hooks/graph_recording.h>
#include <flex/hooks/shape_text.h>
#include <flex/hooks/token_rows.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

namespace flex {

namespace flex_model_detail {

// An expected shape, with "*" for a dimension that may be anything.
std::string expected_shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + (s[i] == kAnyDim ? std::string("*") : std::to_string(s[i]));
  return out + "]";
}

void check_expected_shape(const HookFunction& hook, const at::Tensor& t) {
  const auto& exp = hook.options().expected_shape;
  if (exp.empty()) return;
  bool ok = static_cast<int64_t>(exp.size()) == t.dim();
  for (size_t i = 0; ok && i < exp.size(); ++i) ok = exp[i] == kAnyDim || exp[i] == t.size(static_cast<int64_t>(i));
  if (!ok)
    throw ShapeError(hook.describe() + ": activation has shape " + shape_text(t.sizes()) +
                     " (the module's whole output, as Transformers gives it), expected " + expected_shape_text(exp));
}


}  // namespace flex_model_detail

namespace {


// An edited activation under a mesh: the same values, but a backward that
// reaches it (a loss on the model's outputs) raises UnsupportedError instead
// of giving trainable modules and the model below wrong gradients.
struct EditedUnderMesh : torch::autograd::Function<EditedUnderMesh> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& piece, const at::Tensor& local,
                            const std::string& what) {
    // `local` is an input only so that the output requires grad (and the
    // backward below runs) when the model below the hook does.
    (void)local;
    ctx->saved_data["what"] = what;
    return piece.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 const torch::autograd::variable_list&) {
    throw UnsupportedError(ctx->saved_data["what"].toStringRef() +
                           ": a gradient came back from the model into this edited activation (e.g. a loss on "
                           "the logits); over a parallel mesh the model's backward does not give single-process "
                           "gradients. Compute the loss from what the editing functions compute, then call "
                           "FlexModel::sync_trainable_gradients.");
  }
};

}  // namespace

at::Tensor FlexModel::process(const HookFunction& hook, Module& module, const at::Tensor& local) {
  return process_ordered(hook, module, local, at::Tensor());
}

at::Tensor FlexModel::process_ordered(const HookFunction& hook, Module& module, const at::Tensor& local,
                                      const at::Tensor& order) {
  const HookFunctionOptions& o = hook.options();
  if (o.save && graph_recording())
    throw UnsupportedError(hook.describe() +
                           ": a capture (save) runs on the host, and a CUDA-graph decode step is replayed without "
                           "it, so it would hold only the recorded steps; capture with generate's taps, or decode "
                           "without cuda_graph");
  at::Tensor whole = router_ ? router_->gather(hook, module, local) : local;
  at::Tensor back;  // the inverse of `order`
  if (order.defined()) {
    whole = whole.index_select(0, order.to(whole.device()));
    back = at::argsort(order).to(whole.device());
  }
  // An aliased view under a mesh is taken of the whole value (alias_in_flight.h).
  const flex_model_detail::AliasInFlight alias = flex_model_detail::alias_of(hook);
  const at::Tensor seen = alias.view ? (*alias.view)(module, whole) : whole;
  check_expected_shape(hook, seen);
  if (o.save && (!o.save_after_edit || !o.editing_function)) capture(hook, seen);
  if (!o.editing_function) return local;
  at::Tensor edited = o.editing_function(module, seen, save_ctx_, trainable_);
  if (!edited.defined()) throw ShapeError(hook.describe() + ": editing function returned an undefined tensor");
  if (edited.sizes() != seen.sizes())
    throw ShapeError(hook.describe() + ": editing function returned shape " + shape_text(edited.sizes()) +
                     " but the activation has shape " + shape_text(seen.sizes()));
  if (o.save && o.save_after_edit) capture(hook, edited);
  if (alias.view) {
    if (edited.is_same(seen)) return local;
    if (!alias.unview || !*alias.unview) throw flex_model_detail::read_only_view_error(hook, module);
    edited = (*alias.unview)(edited, whole);
  }
  if (back.defined()) edited = edited.index_select(0, back);
  if (!router_) return edited;
  at::Tensor piece = router_->scatter(hook, module, edited);
  if (distributed() && at::GradMode::is_enabled() && (piece.requires_grad() || local.requires_grad()))
    piece = EditedUnderMesh::apply(piece, local, hook.describe() + " under " + parallel_->mesh().describe());
  return piece;
}

at::Tensor FlexModel::process_token_rows(const HookFunction& hook, Module& module, const at::Tensor& local,
                                        const TokenRows& rows) {
  const at::Tensor& token = rows.token_index;
  if (!parallel_ || parallel_->mesh().dp_size() == 1) {
    at::Tensor out = process(hook, module, local);
    if (hook.options().save) capture(hook, token, "#token_index");
    return out;
  }
  // Each dp rank routed its own rows: rank r's token b*T + t is token
  // (rows before r) + b*T + t of the whole batch, and the single-process
  // order is by slot (first choice, second, ...), then by that global token.
  const auto& dp = parallel_->mesh().dp_group();
  const auto counts = dp->all_gather(at::full({1}, rows.token_count, at::kLong));
  int64_t offset = 0, total = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    const int64_t n = counts[r].item<int64_t>();
    if (static_cast<int>(r) < parallel_->mesh().dp_rank()) offset += n;
    total += n;
  }
  const at::Tensor global = at::cat(dp->all_gather((token.to(at::kCPU) + offset).contiguous()), 0);
  const at::Tensor slots = at::cat(dp->all_gather(rows.token_slot.to(at::kCPU).contiguous()), 0);
  const at::Tensor order = at::argsort(slots * total + global);
  at::Tensor out = process_ordered(hook, module, local, order);
  if (hook.options().save) capture(hook, global.index_select(0, order), "#token_index");
  return out;
}

}  // namespace flex
