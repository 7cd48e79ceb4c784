#include <flex/flexcore/hook_function.h>
#include <flex/flexcore/parallel_router.h>
#include <flex/hooks/errors.h>

#include "alias_in_flight.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <iterator>

namespace flex {

namespace {
constexpr int kCaptureTag = 7301;
constexpr int kParamTag = 7302;

at::Tensor bytes_of(const std::string& s) {
  // One leading byte so that an empty key ("" = the root module) is not an empty message.
  at::Tensor t = at::empty({static_cast<int64_t>(s.size()) + 1}, at::kByte);
  t.data_ptr<uint8_t>()[0] = '#';
  if (!s.empty()) std::memcpy(t.data_ptr<uint8_t>() + 1, s.data(), s.size());
  return t;
}

std::string string_of(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  const auto* p = reinterpret_cast<const char*>(c.data_ptr<uint8_t>());
  return std::string(p + 1, p + c.numel());
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}
}  // namespace

ParallelRouter::ParallelRouter(DeviceMesh mesh, std::shared_ptr<const ActivationLayout> layout)
    : mesh_(std::move(mesh)), layout_(std::move(layout)) {
  if (!mesh_.member()) throw ConfigError("ParallelRouter: this rank is not part of " + mesh_.describe());
}

ShardSpec ParallelRouter::output_spec(const Module& m) const {
  if (layout_) return layout_->output_spec(m);
  if (auto* s = dynamic_cast<const ShardedModule*>(&m)) return s->sharding().output;
  return ShardSpec::replicated();
}

std::optional<ModuleSharding> ParallelRouter::sharding(const Module& m) const {
  if (layout_) return layout_->sharding_of(m);
  if (auto* s = dynamic_cast<const ShardedModule*>(&m)) return s->sharding();
  return std::nullopt;
}

bool ParallelRouter::batchless(const HookFunction& hook, const Module& m) const {
  if (!layout_) return false;
  return flex_model_detail::installed_type(hook) == HookType::ForwardPre ? layout_->batchless_input(m) : layout_->batchless(m);
}

ShardSpec ParallelRouter::hook_spec(const HookFunction& hook, const Module& m) const {
  switch (flex_model_detail::installed_type(hook)) {
    case HookType::Forward: return output_spec(m);
    case HookType::ForwardPre: {
      const auto s = sharding(m);
      return s ? s->input : ShardSpec::replicated();
    }
    case HookType::FullBackwardPre: {
      // The gradient of a partial sum is the whole output's gradient, on every rank.
      const ShardSpec out = output_spec(m);
      return out.is_partial_sum() ? ShardSpec::replicated() : out;
    }
    case HookType::FullBackward: {
      const auto s = sharding(m);
      if (!s) return ShardSpec::replicated();
      return s->input_grad ? *s->input_grad : s->input;
    }
    case HookType::Tensor: {
      const auto s = sharding(m);
      const std::string& name = hook.module_name();
      const size_t dot = name.rfind('.');
      const std::string local = dot == std::string::npos ? name : name.substr(dot + 1);
      if (!s || !s->params.count(local)) return ShardSpec::replicated();
      // A PartialSum parameter (row-parallel bias on rank 0) gets the whole gradient on every rank.
      const ShardSpec p = s->params.at(local);
      return p.is_partial_sum() ? ShardSpec::replicated() : p;
    }
  }
  return output_spec(m);
}

at::Tensor ParallelRouter::gather(const HookFunction& hook, Module& module, const at::Tensor& local) {
  // Detached with more than one rank, whatever the sharding, so a loss on an
  // editing function's result trains trainable modules alike on every mesh.
  at::Tensor t = mesh_.shape().size() > 1 ? local.detach() : local;
  if (mesh_.tp_size() > 1) {
    const ShardSpec spec = hook_spec(hook, module);
    if (!spec.is_replicated()) {
      try {
        t = all_gather_whole(spec, local.detach(), *mesh_.tp_group());
      } catch (const ShapeError& e) {
        throw ShapeError(hook.describe() + ": gathering the tensor-parallel pieces (" + spec.describe() +
                         ") failed: " + e.what());
      }
    }
  }
  if (mesh_.dp_size() > 1 && !batchless(hook, module)) {
    if (t.dim() == 0) throw ShapeError(hook.describe() + ": a data-parallel activation needs a batch dim, got a scalar");
    auto pieces = mesh_.dp_group()->all_gather(t.detach().contiguous());
    std::vector<int64_t> rows;
    for (const auto& p : pieces) rows.push_back(p.size(0));
    dp_rows_[&hook] = rows;
    t = at::cat(pieces, 0);
  }
  return t;
}

at::Tensor ParallelRouter::scatter(const HookFunction& hook, Module& module, const at::Tensor& whole) {
  at::Tensor t = whole;
  if (mesh_.dp_size() > 1 && !batchless(hook, module)) {
    auto it = dp_rows_.find(&hook);
    if (it == dp_rows_.end()) throw ConfigError(hook.describe() + ": scatter without a preceding gather");
    int64_t start = 0;
    const int r = mesh_.dp_rank();
    for (int i = 0; i < r; ++i) start += it->second[i];
    t = t.narrow(0, start, it->second[r]);
  }
  if (mesh_.tp_size() > 1) {
    const ShardSpec spec = hook_spec(hook, module);
    if (!spec.is_replicated()) t = shard_of(spec, t, mesh_.tp_rank(), mesh_.tp_size());
  }
  return t.contiguous();
}

at::Tensor ParallelRouter::gather_parameter(Module& module, const std::string& local_name, const at::Tensor& local) {
  const bool held = !local.is_meta();
  at::Tensor whole = local;
  if (held && mesh_.tp_size() > 1) {
    const ShardSpec spec = layout_ ? layout_->param_spec(module, local_name)
                                   : (dynamic_cast<ShardedModule*>(&module)
                                          ? dynamic_cast<ShardedModule&>(module).sharding().params[local_name]
                                          : ShardSpec::replicated());
    if (!spec.is_replicated()) whole = all_gather_whole(spec, local, *mesh_.tp_group());
  }
  if (mesh_.pp_size() == 1) {
    if (!held) throw NotFoundError("parameter '" + local_name + "' of " + module.class_name() + " is on the meta device");
    return whole;
  }
  // Pipeline: the stage holding the parameter sends it to stage 0 (along each pp column).
  auto& pp = *mesh_.pp_group();
  auto flags = pp.all_gather(at::tensor({held ? 1 : 0}, at::kInt));
  int owner = -1;
  for (size_t s = 0; s < flags.size() && owner < 0; ++s)
    if (flags[s].item<int>()) owner = static_cast<int>(s);
  if (owner < 0)
    throw NotFoundError("parameter '" + local_name + "' of " + module.class_name() +
                        " is on the meta device on every pipeline stage");
  if (owner == 0) return whole;
  if (pp.rank() == owner) pp.send(whole.contiguous(), 0, kParamTag);
  if (pp.rank() == 0) return pp.recv(owner, kParamTag);
  return whole;
}

bool ParallelRouter::stores_captures() const {
  const MeshCoord c = mesh_.coord();
  return c.tp == 0 && c.dp == 0 && (c.pp == 0 || mesh_.pp_size() > 1);
}

bool ParallelRouter::forwards_captures() const {
  const MeshCoord c = mesh_.coord();
  return mesh_.pp_size() > 1 && c.tp == 0 && c.dp == 0 && c.pp > 0;
}

void ParallelRouter::forward_captures(const PendingCaptures& pending, ActivationSink& sink) {
  const MeshCoord c = mesh_.coord();
  if (mesh_.pp_size() == 1 || c.tp != 0 || c.dp != 0) return;
  auto& pp = *mesh_.pp_group();  // the stage leaders, stage order
  if (c.pp > 0) {
    pp.send(at::tensor({static_cast<int64_t>(pending.items.size())}, at::kLong), 0, kCaptureTag);
    for (const auto& [key, index, t] : pending.items) {
      pp.send(bytes_of(key), 0, kCaptureTag);
      pp.send(at::tensor({index}, at::kLong), 0, kCaptureTag);
      pp.send(t.contiguous(), 0, kCaptureTag);
    }
    return;
  }
  for (int s = 1; s < mesh_.pp_size(); ++s) {
    const int64_t n = pp.recv(s, kCaptureTag).item<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      const std::string key = string_of(pp.recv(s, kCaptureTag));
      const int64_t index = pp.recv(s, kCaptureTag).item<int64_t>();
      sink.write(key, index, pp.recv(s, kCaptureTag));
    }
  }
}

void ParallelRouter::check_consistent(const std::vector<std::string>& hooks, const std::string& what) {
  auto& comm = *mesh_.comm();
  if (comm.size() == 1) return;
  std::string joined;
  for (const auto& h : hooks) joined += h + "\n";
  const uint64_t hash = fnv1a(joined);
  int64_t signed_hash;
  std::memcpy(&signed_hash, &hash, sizeof hash);
  auto all = comm.all_gather(at::tensor({signed_hash, static_cast<int64_t>(hooks.size())}, at::kLong));
  bool same = true;
  for (const auto& a : all) same = same && at::equal(a, all[0]);
  if (same) return;
  // Every rank saw the mismatch: exchange the lists to say what differs.
  auto lists = comm.all_gather(bytes_of(joined));
  auto split = [](const std::string& s) {
    std::vector<std::string> out;
    size_t start = 0;
    for (size_t p; (p = s.find('\n', start)) != std::string::npos; start = p + 1) out.push_back(s.substr(start, p - start));
    return out;
  };
  const auto ref = split(string_of(lists[0]));
  std::string msg = what + " are registered differently on different ranks of " + mesh_.describe() +
                    " (rank 0 has " + std::to_string(ref.size()) + " enabled):";
  for (size_t r = 1; r < lists.size(); ++r) {
    const auto mine = split(string_of(lists[r]));
    if (mine == ref) continue;
    std::vector<std::string> extra, missing;
    std::set_difference(mine.begin(), mine.end(), ref.begin(), ref.end(), std::back_inserter(extra));
    std::set_difference(ref.begin(), ref.end(), mine.begin(), mine.end(), std::back_inserter(missing));
    msg += " rank " + std::to_string(r) + " differs";
    if (!missing.empty()) msg += " (lacks " + c10::Join(", ", missing) + ")";
    if (!extra.empty()) msg += " (has extra " + c10::Join(", ", extra) + ")";
    msg += ";";
  }
  throw ConfigError(msg);
}

}  // namespace flex
