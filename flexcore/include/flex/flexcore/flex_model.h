#pragma once
// FlexModel: wraps a flex::Module without changing it, attaches HookFunctions
// by module name, organises them in groups, and collects what they capture.
//
//   auto out = std::make_shared<flex::OutputMap>();
//   flex::FlexModel fm(model, out);
//   fm.register_forward_hook(std::make_shared<flex::HookFunction>("transformer.h.0.mlp"));
//   fm.forward(inputs);            // (*out)["transformer.h.0.mlp"] now holds one tensor
//
// Hook groups: every hook is in "all". forward(inputs, groups, complement)
// enables the hooks in the union of `groups` (or those outside it), disables
// the rest, and runs the model; that selection stays until the next forward,
// so a backward pass after it sees the same hooks. Naming a group that was
// never created is an error (a typo would otherwise silently disable hooks).
//
// Training trainable modules over a mesh (set_mesh): every rank registers the
// same trainable modules in the same order (registration is collective and
// copies rank 0's parameters and buffers everywhere), and every rank runs
//
//   torch::optim::SGD opt(fm.trainable_modules().parameters(), lr);
//   opt.zero_grad();
//   fm.forward(ids);                  // editing functions apply the modules to whole activations
//   loss.backward();                  // loss from what the editing functions computed
//   fm.sync_trainable_gradients();    // collective: the single-process gradients everywhere
//   opt.step();                       // parameters stay identical on every rank
//
// Under a mesh of more than one rank an editing function sees a detached
// whole activation: a loss on what it computes trains the trainable modules
// but does not reach the model below the hook, and a backward from the
// model's outputs (e.g. a loss on the logits) into an edit raises
// UnsupportedError.
//
// Gradients under a mesh: with tensor parallelism only (pp == 1, dp == 1) a
// loss computed identically on every rank from the whole logits
// backpropagates to every rank's parameter shards with the single-process
// gradient slices (the parallel model's collectives are autograd-aware,
// flex/parallel/tp_autograd.h), and gradient hooks (backward, backward-pre,
// tensor) are allowed: they see (and may edit) the whole single-process
// gradient, rank 0 keeps the captures; the backward is collective (every
// rank must run it). With pp > 1 or dp > 1 there is no autograd across
// pipeline stages or data-parallel gathers, so gradient hooks are refused
// (UnsupportedError naming the axis) and parameter gradients are not the
// single-process ones.
#include <flex/flexcore/activation_router.h>
#include <flex/flexcore/activation_sink.h>
#include <flex/flexcore/hook_function.h>
#include <flex/flexcore/parallel_router.h>

#include <map>
#include <functional>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace flex {

struct TokenRows;

class FlexModel {
 public:
  /// `output` receives captures (created when null); see output().
  explicit FlexModel(std::shared_ptr<Module> module, std::shared_ptr<OutputMap> output = nullptr);
  /// Removes every hook this FlexModel added.
  ~FlexModel();
  FlexModel(const FlexModel&) = delete;
  FlexModel& operator=(const FlexModel&) = delete;

  /// Runs the wrapped module with the hooks of `groups` (or, with `complement`, all others).
  Value forward(Inputs inputs, const std::vector<std::string>& groups = {"all"}, bool complement = false);
  at::Tensor forward(const at::Tensor& x, const std::vector<std::string>& groups = {"all"},
                     bool complement = false);

  // --- registration: each returns a handle whose remove() detaches that hook ---------
  /// Unknown module (or parameter) names fail here, naming the closest ones.
  /// Gradient hooks (backward, backward-pre, tensor) under a mesh with
  /// pp > 1 or dp > 1: UnsupportedError (see the top of this file).
  HookHandle register_forward_hook(const HookFunctionPtr& hook);
  HookHandle register_forward_pre_hook(const HookFunctionPtr& hook);
  HookHandle register_full_backward_hook(const HookFunctionPtr& hook);
  HookHandle register_full_backward_pre_hook(const HookFunctionPtr& hook);
  /// Gradient hook on the parameter or buffer named hook->module_name().
  HookHandle register_hook(const HookFunctionPtr& hook);
  HookHandle register_hook_function(const HookFunctionPtr& hook, HookType type);

  // --- groups --------------------------------------------------------------------------
  /// One HookFunction per module (or, for HookType::Tensor, per parameter) whose
  /// name contains `substring`, all sharing `options`, tagged `group`. Throws
  /// NotFoundError when nothing matches.
  std::vector<HookFunctionPtr> create_hook_group(const std::string& group, const std::string& substring,
                                                 const HookFunctionOptions& options = {},
                                                 HookType type = HookType::Forward);
  /// The same, selecting names that fully match `pattern`.
  std::vector<HookFunctionPtr> create_hook_group(const std::string& group, const std::regex& pattern,
                                                 const HookFunctionOptions& options = {},
                                                 HookType type = HookType::Forward);
  /// Adds the tag `group` to the given hooks / to hooks whose module name contains `substring`.
  void update_hook_groups(const std::vector<HookFunctionPtr>& hooks, const std::string& group);
  void update_hook_groups(const std::string& substring, const std::string& group);
  /// Removes the tag (never "all": ConfigError).
  void remove_hook_groups(const std::vector<HookFunctionPtr>& hooks, const std::string& group);
  void remove_hook_groups(const std::string& substring, const std::string& group);
  std::set<std::string> get_hook_function_groups(const HookFunctionPtr& hook) const;
  std::vector<HookFunctionPtr> get_group_hook_functions(const std::string& group) const;
  /// Every registered hook, in registration order.
  std::vector<HookFunctionPtr> hook_functions() const;

  // --- state shared with editing functions ---------------------------------------------
  SaveContext& save_ctx() { return save_ctx_; }
  /// Makes `module` visible to editing functions as `name`. With a mesh this
  /// is collective: every rank must register the same modules (same names,
  /// parameter names and shapes; ConfigError naming the ranks otherwise) in
  /// the same order, and each gets mesh rank 0's parameters and buffers.
  void register_trainable_module(const std::string& name, std::shared_ptr<torch::nn::Module> module);
  /// Collective over the mesh (no-op without one): after loss.backward() on
  /// every rank, sets every trainable parameter's gradient to the
  /// single-process one. The ranks of a pipeline stage ran the same editing
  /// functions on the same whole activations, so their gradients must agree
  /// (ConfigError naming the ranks and parameters otherwise: the loss must be
  /// computed the same way on every rank); the stage's gradient is taken from
  /// its leader. Each stage only ran its own modules' hooks, so the stages'
  /// gradients are summed (the loss must be a sum of per-stage terms). A
  /// parameter no rank got a gradient for keeps an undefined gradient.
  void sync_trainable_gradients();
  TrainableModules& trainable_modules() { return trainable_; }
  /// Sets requires_grad on every parameter of the wrapped module.
  void wrapped_module_requires_grad(bool requires_grad);

  // --- introspection ---------------------------------------------------------------------
  /// The whole parameter (gathered under tensor parallelism), detached.
  at::Tensor get_module_parameter(const std::string& name, const std::vector<int64_t>& expected_shape = {});
  std::vector<std::string> wrapped_module_names() const;
  std::vector<std::string> trainable_modules_names() const { return trainable_.names(); }
  std::vector<std::string> all_modules_names() const;

  // --- captures ------------------------------------------------------------------------
  /// Module name -> one tensor per capturing call (CPU, detached; rank 0 only).
  /// Gradient captures use keys "<name>#grad_input", "<name>#grad_output",
  /// "<param>#grad"; forward-pre captures "<name>#input". A mixture-of-experts
  /// expert's capture comes with "<name>#token_index": the flattened token
  /// index b*T + t of each captured row (flex/models/moe.h).
  OutputMap& output() { return *output_; }
  const std::shared_ptr<OutputMap>& output_ptr() const { return output_; }
  void clear() { output_->clear(); }
  /// Forward and forward-pre captures of CPU tensors are kept by reference,
  /// not copied: a hook's first capture is also copied, and if the model
  /// changed the tensor in place before the forward ended (libtorch's version
  /// counter says so) that copy is kept and the hook's captures are copied
  /// from then on; otherwise later captures are references. A tensor changed
  /// in place after the first forward had shown it unchanged is a
  /// ConfigError naming the module, never a silently wrong capture. false:
  /// copy every capture (as under a mesh, on a GPU, or with an editing function).
  void set_capture_by_reference(bool on) { by_reference_on_ = on; }
  /// Sends captures to `sink` instead of the output map (null restores the map).
  void set_sink(std::shared_ptr<ActivationSink> sink);
  /// Installs the router (null: single process). A ParallelRouter makes the
  /// trainable modules already registered identical on every rank
  /// (collective) and refuses gradient hooks when pp > 1 or dp > 1
  /// (UnsupportedError), as set_mesh.
  void set_router(std::shared_ptr<ActivationRouter> router);
  /// Runs over `mesh` (every mesh rank wraps the same model and calls the same
  /// methods): installs a ParallelRouter using `layout` (the model's declared
  /// sharding, e.g. ParallelCausalLM::layout()). Each forward then checks that
  /// every rank enabled the same hooks (ConfigError naming the ranks otherwise)
  /// and, under pipeline parallelism, brings the later stages' captures to rank 0.
  void set_mesh(const DeviceMesh& mesh, std::shared_ptr<const ActivationLayout> layout = nullptr) {
    set_router(std::make_shared<ParallelRouter>(mesh, std::move(layout)));
  }
  int64_t forward_count() const { return forward_count_; }

  /// Removes every hook this FlexModel added and returns the module, whose
  /// outputs are then bitwise those before wrapping.
  std::shared_ptr<Module> restore();
  /// Runs `undo` when restore() runs (or this FlexModel is destroyed), after
  /// the hooks are removed, latest first: for additions to the model that
  /// are not hooks (a dictionary registered as a child, flex/sae/splice.h).
  void on_restore(std::function<void()> undo) { undos_.push_back(std::move(undo)); }
  const std::shared_ptr<Module>& module() const { return module_; }

  /// Runs one hook's capture/edit logic on `local` (used by the registered
  /// hooks; public for tests and custom hook points).
  at::Tensor process(const HookFunction& hook, Module& module, const at::Tensor& local);

 private:
  struct Entry;
  Entry& entry_for(const HookFunctionPtr& hook);
  const Entry* find_entry(const HookFunction* hook) const;
  void detach(const HookFunction* hook);
  std::vector<HookFunctionPtr> match(const std::string& group, const std::function<bool(const std::string&)>& pred,
                                     const HookFunctionOptions& options, HookType type, const std::string& what);
  void capture(const HookFunction& hook, const at::Tensor& t, const std::string& suffix = "");
  // process() with the whole tensor's rows taken in `order` (undefined: as
  // gathered) for the capture and the edit, and put back before the scatter.
  at::Tensor process_ordered(const HookFunction& hook, Module& module, const at::Tensor& local, const at::Tensor& order);
  // An output whose rows are a subset of the tokens (inside a mixture-of-
  // experts expert): under data parallelism every rank's rows are gathered
  // and put in single-process order (slot, then global token);
  // "#token_index" is captured beside it.
  at::Tensor process_token_rows(const HookFunction& hook, Module& module, const at::Tensor& local,
                                const TokenRows& rows);
  // True under a ParallelRouter whose mesh has more than one rank.
  bool distributed() const;
  void broadcast_trainable(const std::string& name, torch::nn::Module& module);
  std::string capture_key(const HookFunction& hook) const;
  // Hands the captures held during a forward to the sink, after checking
  // that none of the references was changed in place.
  void flush_held_captures();

  std::shared_ptr<Module> module_;
  std::shared_ptr<OutputMap> output_;
  std::shared_ptr<ActivationSink> sink_;
  std::shared_ptr<ActivationRouter> router_;
  std::shared_ptr<ParallelRouter> parallel_;  // router_ when it is a ParallelRouter
  SaveContext save_ctx_;
  TrainableModules trainable_;
  std::vector<std::shared_ptr<Entry>> entries_;
  std::vector<std::function<void()>> undos_;  // on_restore
  std::set<std::string> known_groups_{"all"};  // every group ever named; others are typos
  int64_t forward_count_ = 0;
  // Captures by reference (set_capture_by_reference).
  struct HeldCapture;
  std::vector<HeldCapture> held_;             // this forward's, in capture order
  std::map<std::string, bool> by_reference_;  // key -> unchanged so far (absent: not seen yet)
  bool by_reference_on_ = true, in_forward_ = false;
};

}  // namespace flex
