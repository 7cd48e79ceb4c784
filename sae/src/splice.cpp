#include <flex/sae/splice.h>

#include <flex/hooks/errors.h>
#include <flex/hooks/nn.h>
#include <flex/hooks/shape_text.h>

#include <ATen/ATen.h>

namespace flex {

namespace {

// The dictionary computes where the activation is: moved (once, its tensors
// with it) to the activation's device the first time it sees one elsewhere,
// so a dictionary loaded on the CPU splices into a model on a GPU or split
// over devices without the caller placing it.
void follow_device(SparseDictionary& sae, const at::Tensor& x) {
  for (const auto& p : sae.parameters()) {
    if (p.device() != x.device()) sae.to(x.device());
    return;
  }
}

}  // namespace

HookHandle attach_at(FlexModel& fm, const HookPointRef& at, EditFn edit) {
  HookFunctionOptions o;
  o.save = false;
  if (has_view(at)) {
    // The edit sees what the name stands for (a normalised value is read only: the module's value flows on as it was).
    o.editing_function = [edit, at](Module& m, const at::Tensor& x, SaveContext& c, TrainableModules& t) {
      const at::Tensor seen = view_at(at, m, x);
      const at::Tensor edited = edit(m, seen, c, t);
      if (at.normalized || edited.is_same(seen)) return x;
      return unview_at(at, edited, x);
    };
  } else {
    o.editing_function = std::move(edit);
  }
  return fm.register_hook_function(std::make_shared<HookFunction>(at.module, o),
                                   at.input ? HookType::ForwardPre : HookType::Forward);
}

namespace {

// Unregisters `sae` from `parent` if it is still its child "sae" (idempotent:
// Splice::remove and the FlexModel's restore both call it).
void detach(const std::shared_ptr<Module>& parent, const std::shared_ptr<SparseDictionary>& sae) {
  if (!parent) return;
  for (const auto& [name, child] : parent->named_flex_children())
    if (name == "sae" && child == sae) {
      parent->unregister_module("sae");
      return;
    }
}

}  // namespace

void Splice::remove() {
  for (auto& h : handles) h.remove();
  handles.clear();
  detach(parent, sae);
  parent.reset();
}

namespace {

// Registers `sae` as the child "sae" of `module` (where its hook points are found by name).
std::shared_ptr<Module> adopt(Module& model, const std::string& module, const std::shared_ptr<SparseDictionary>& sae) {
  auto parent = model.get_submodule(module);
  for (const auto& [name, _] : parent->named_flex_children())
    if (name == "sae") throw ConfigError("a dictionary is already spliced at '" + module + "'");
  parent->register_module("sae", sae);
  return parent;
}

// The child goes when the FlexModel restores the model, with the hooks.
void undo_on_restore(FlexModel& fm, const Splice& s) {
  std::weak_ptr<Module> parent = s.parent;
  std::weak_ptr<SparseDictionary> sae = s.sae;
  fm.on_restore([parent, sae] { detach(parent.lock(), sae.lock()); });
}

std::string describe(const HookPointRef& at) {
  return at.module + (at.normalized ? " (its input, normalised)" : at.input ? " (input)" : "");
}

// The dictionary's d_in against the activation's width at `place` (a hook_z
// dictionary reads [..., heads, d_head] flattened), before any arithmetic.
void check_width(const SaeConfig& cfg, const at::Tensor& x, const std::string& place) {
  const int64_t width = cfg.hook_z && x.dim() >= 2 ? x.size(-1) * x.size(-2) : (x.dim() >= 1 ? x.size(-1) : 0);
  if (width != cfg.d_in)
    throw ShapeError("dictionary " + (cfg.source.empty() ? cfg.class_name() : "'" + cfg.source + "'") + " has d_in " +
                     std::to_string(cfg.d_in) + ", but '" + place + "' gives activations of width " +
                     std::to_string(width) + " (shape " + shape_text(x.sizes()) + ")");
}


}  // namespace

Splice splice_sae(FlexModel& fm, std::shared_ptr<SparseDictionary> sae, const SpliceOptions& o) {
  Module& model = *fm.module();
  const SaeConfig& cfg = sae->config();
  const HookPointRef in = resolve_hook_name(model, o.hook_name.empty() ? cfg.hook_name : o.hook_name);
  const SpliceMode mode = o.mode;
  Splice s;
  s.sae = sae;
  if (!cfg.transcoder()) {
    s.module = in.module;
    s.place = in;
    s.parent = adopt(model, in.module, sae);
    undo_on_restore(fm, s);
    const std::string place = describe(in);
    if (in.normalized && mode != SpliceMode::Observe)
      throw UnsupportedError("'" + (o.hook_name.empty() ? cfg.hook_name : o.hook_name) +
                             "' is a value computed from " + place + ", not one the model passes on: a dictionary "
                             "there can observe only (SpliceMode::Observe)");
    s.handles.push_back(attach_at(fm, in, [sae, mode, place](Module&, const at::Tensor& x, SaveContext&, TrainableModules&) {
      check_width(sae->config(), x, place);
      follow_device(*sae, x);
      if (mode == SpliceMode::Observe) {
        sae->observe(x);  // features only: nothing is decoded
        return x;
      }
      sae->use_error_term = mode == SpliceMode::ReplaceWithError;
      return (*sae)(x).to(x.scalar_type());
    }));
    return s;
  }
  const std::string out_name = o.hook_name_out.empty() ? cfg.hook_name_out : o.hook_name_out;
  if (out_name.empty()) throw ConfigError("a transcoder needs the place it writes (cfg.json metadata.hook_name_out)");
  const HookPointRef out = resolve_hook_name(model, out_name);
  if (out.input) throw ConfigError("a transcoder writes a module's output; '" + out_name + "' is an input");
  s.module = out.module;
  s.place = out;
  s.parent = adopt(model, out.module, sae);
  undo_on_restore(fm, s);
  // The input place runs first (the MLP's input, then its output): keep its activation for the output hook.
  auto input = std::make_shared<at::Tensor>();
  try {
    const std::string place = describe(in);
    s.handles.push_back(attach_at(fm, in, [input, sae, place](Module&, const at::Tensor& x, SaveContext&, TrainableModules&) {
      check_width(sae->config(), x, place);
      follow_device(*sae, x);
      *input = x;
      return x;
    }));
    s.handles.push_back(attach_at(fm, out, [sae, mode, input, out_name](Module&, const at::Tensor& y, SaveContext&,
                                                                       TrainableModules&) {
      if (!input->defined())
        throw ConfigError("transcoder output place '" + out_name + "' ran before its input place");
      const at::Tensor x = *input;
      *input = at::Tensor();
      if (y.dim() < 1 || y.size(-1) != sae->config().d_out)
        throw ShapeError("transcoder " + (sae->config().source.empty() ? sae->config().class_name() : "'" + sae->config().source + "'") +
                         " has d_out " + std::to_string(sae->config().d_out) + ", but '" + out_name +
                         "' gives activations of shape " + shape_text(y.sizes()));
      if (mode == SpliceMode::Observe) {
        sae->observe(x);
        return y;
      }
      const bool edited = sae->hooked_inside();
      const at::Tensor t = (*sae)(x).to(y.scalar_type());
      if (mode == SpliceMode::Replace) return t;
      // The error of the unedited transcoder (this pass, when no hook inside could edit it).
      return t + (y - (edited ? sae->clean_output(x).to(y.scalar_type()) : t.detach()));
    }));
  } catch (...) {
    s.remove();
    throw;
  }
  return s;
}

}  // namespace flex
