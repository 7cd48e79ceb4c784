// The command line's sparse dictionaries: --sae PATH[@HOOK] loaded and
// spliced through FlexModel hooks, --sae-mode, and the recorder of each
// forward's strongest features that capture and features share.
#include "cli.h"

#include <flex/flexcore/flex_model.h>
#include <flex/hooks/errors.h>
#include <flex/sae/load_sae.h>

#include <ATen/ATen.h>

#include <filesystem>

namespace fs = std::filesystem;

namespace flex::cli {

std::vector<Flag> sae_flags(const std::string& default_mode) {
  return {
      {"--sae", "PATH[@HOOK]", "splice a sparse dictionary: a SAELens folder (cfg.json + sae_weights.safetensors) or "
                               "Gemma Scope params.npz (or its folder), at the TransformerLens hook it names or HOOK "
                               "(a TransformerLens hook name or a module name)", true},
      {"--sae-mode", "MODE", "observe (features computed, the model unchanged), replace (the reconstruction flows on) "
                             "or replace-with-error (reconstruction + error: unchanged unless a feature is edited); "
                             "default " + default_mode},
  };
}

SpliceMode parse_splice_mode(const std::string& text) {
  if (text == "observe") return SpliceMode::Observe;
  if (text == "replace") return SpliceMode::Replace;
  if (text == "replace-with-error" || text == "error") return SpliceMode::ReplaceWithError;
  throw UsageError("option --sae-mode: '" + text + "' is not observe, replace or replace-with-error");
}

Splice splice_sae_spec(FlexModel& fm, const std::string& spec, SpliceMode mode) {
  std::string path = spec, hook;
  // PATH@HOOK, unless the whole text is an existing path (one may hold '@').
  if (const auto at = spec.rfind('@'); at != std::string::npos && !fs::exists(spec)) {
    path = spec.substr(0, at);
    hook = spec.substr(at + 1);
    if (path.empty() || hook.empty()) throw UsageError("option --sae: '" + spec + "' is not PATH or PATH@HOOK");
  }
  if (!fs::exists(path)) throw IOError("dictionary '" + path + "' does not exist (--sae)");
  SpliceOptions o;
  o.mode = mode;
  o.hook_name = hook;
  return splice_sae(fm, load_sae(path), o);
}

std::vector<Splice> splice_saes(FlexModel& fm, const Args& args, SpliceMode fallback) {
  const SpliceMode mode = args.get("--sae-mode") ? parse_splice_mode(*args.get("--sae-mode")) : fallback;
  if (args.has("--sae-mode") && !args.has("--sae")) throw UsageError("--sae-mode goes with --sae");
  std::vector<Splice> splices;
  for (const auto& spec : args.all("--sae")) splices.push_back(splice_sae_spec(fm, spec, mode));
  return splices;
}

int64_t parse_feature_width(const std::string& text) {
  if (text == "active") return 0;
  if (text.rfind("top:", 0) == 0) {
    try {
      size_t used = 0;
      const long long k = std::stoll(text.substr(4), &used);
      if (used == text.size() - 4 && k >= 1) return k;
    } catch (const std::exception&) {
    }
  }
  throw UsageError("option --sae-features: '" + text + "' is not 'active' or 'top:K' with K >= 1");
}

FeatureRecorder::FeatureRecorder(const Splice& splice, int64_t width, std::shared_ptr<const DeviceMesh> mesh)
    : module_(splice.module),
      width_(width),
      dtype_(splice.sae->config().dtype),
      mesh_(mesh && mesh->shape().size() > 1 ? std::move(mesh) : nullptr),
      got_(std::make_shared<std::deque<SparseCode>>()) {
  auto got = got_;
  handle_ = splice.sae->on_features([got](const SparseCode& code) { got->push_back(code); });
}

FeatureRecorder::~FeatureRecorder() { handle_.remove(); }

std::vector<SparseCode> FeatureRecorder::take_codes() {
  std::vector<SparseCode> out(got_->begin(), got_->end());
  got_->clear();
  return out;
}

std::vector<StrongestFeatures> FeatureRecorder::take() {
  std::vector<StrongestFeatures> out;
  for (const auto& code : take_codes()) out.push_back(strongest_features(code, width_));
  return out;
}

std::vector<StrongestFeatures> FeatureRecorder::take_gathered() {
  std::vector<StrongestFeatures> local = take();
  if (!mesh_) return local;
  const std::shared_ptr<Communicator>& comm = mesh_->comm();
  // The dictionary sees the whole activation, as every hook does, on every
  // tensor- and data-parallel rank of the stage that runs it: one sends.
  const bool sends = mesh_->tp_rank() == 0 && mesh_->dp_rank() == 0;
  at::Tensor calls = at::full({1}, sends ? static_cast<int64_t>(local.size()) : 0, at::kLong);
  comm->all_reduce(calls, ReduceOp::Max);
  std::vector<StrongestFeatures> whole;
  for (int64_t c = 0; c < calls.item<int64_t>(); ++c) {
    StrongestFeatures mine;
    if (sends && c < static_cast<int64_t>(local.size())) {
      mine = local[c];
    } else {  // nothing: a [0, 0] placeholder of the right dtypes
      mine.indices = at::empty({0, 0}, at::kInt);
      mine.values = at::empty({0, 0}, dtype_);
      mine.l0 = at::empty({0}, at::kInt);
    }
    const std::vector<at::Tensor> idx = comm->gather(mine.indices, 0), val = comm->gather(mine.values, 0),
                                  l0 = comm->gather(mine.l0, 0);
    if (comm->rank() != 0) continue;
    StrongestFeatures f;
    for (size_t r = 0; r < idx.size(); ++r) {
      if (idx[r].numel() == 0 && l0[r].numel() == 0) continue;
      if (f.indices.defined())
        throw ConfigError("dictionary at '" + module_ + "': features of one forward came from two pipeline stages");
      f.indices = idx[r];
      f.values = val[r];
      f.l0 = l0[r];
    }
    if (!f.indices.defined()) f = mine;
    whole.push_back(std::move(f));
  }
  return whole;
}

}  // namespace flex::cli
