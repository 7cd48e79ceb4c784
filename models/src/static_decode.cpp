// The static decode step (design decision 51). generate()'s own loop chooses
// the tokens; this file only replaces its model step: the prompt runs as
// usual into a normal KV cache, which then becomes static (capacity slots),
// and every later step runs on static device buffers (token ids, positions,
// cache position, attention mask over all slots), eagerly or as a replayed
// CUDA graph.
#include <flex/models/static_decode.h>

#include "generate_taps.h"

#include <flex/dispatch/big_modeling.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/graph_recording.h>
#include <flex/hooks/shape_text.h>

#include <ATen/ATen.h>

#ifdef FLEX_TORCH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <memory>

namespace flex {

namespace {

std::string architecture_of(CausalLM& model) {
  return model.class_name() + " (model_type " + model.config().model_type + ")";
}

// Every parameter and buffer on `device` (a CUDA graph reads no other memory).
void check_graph_device(CausalLM& model, const c10::Device& device) {
  if (!device.is_cuda())
    throw UnsupportedError("generate(cuda_graph): the model's inputs go to " + device.str() +
                           "; CUDA-graph decode needs a model on one CUDA device (static_step runs the same step "
                           "eagerly on any device)");
  if (!cuda_graph_compiled())
    throw UnsupportedError("generate(cuda_graph): this flexmodel was built against a CPU-only libtorch");
  for (const auto& p : model.named_parameters(true))
    if (p.value().device() != device)
      throw UnsupportedError("generate(cuda_graph): parameter " + p.key() + " is on " + p.value().device().str() +
                             ", not " + device.str() + " (offloaded weights cannot be read by a replayed graph)");
}

// The model step generate() calls, static after the prompt.
class StaticStep {
 public:
  StaticStep(CausalLM& model, int64_t capacity, bool graph, detail::GenerateTaps& taps)
      : model_(model), capacity_(capacity), graph_(graph), taps_(taps) {}

  at::Tensor operator()(const LMInputs& in) {
    if (!in.past_key_values) throw ConfigError("generate(static_step): needs use_cache");
    if (!cache_) return prompt(in);
    ids_.copy_(in.input_ids);
    pos_.copy_(in.position_ids.expand({ids_.size(0), 1}));
    cache_position_.fill_(slot_);
    mask_.narrow(1, slot_, 1).fill_(1);
    at::Tensor logits = graph_ ? replay() : run();
    taps_.collect();
    ++slot_;
    return logits.clone();
  }

 private:
  at::Tensor prompt(const LMInputs& in) {
    const at::Tensor logits = model_.run(in).logits;
    cache_ = in.past_key_values;
    const int64_t b = in.input_ids.size(0), t = in.input_ids.size(1);
    const auto longs = in.input_ids.options().dtype(at::kLong);
    cache_position_ = at::zeros({1}, longs);
    cache_->make_static(capacity_, cache_position_);
    mask_ = at::zeros({b, capacity_}, longs);
    if (in.attention_mask.defined())
      mask_.narrow(1, 0, t).copy_(in.attention_mask.ne(0));
    else
      mask_.narrow(1, 0, t).fill_(1);
    ids_ = at::zeros({b, 1}, longs);
    pos_ = at::zeros({b, 1}, longs);
    slot_ = t;
    taps_.set_static(true);
    return logits;
  }

  // The step itself: everything a graph records.
  at::Tensor run() {
    LMInputs x;
    x.input_ids = ids_;
    x.attention_mask = mask_;
    x.position_ids = pos_;
    x.past_key_values = cache_;
    return model_.run(x).logits;
  }

  at::Tensor replay();

  CausalLM& model_;
  const int64_t capacity_;
  const bool graph_;
  detail::GenerateTaps& taps_;
  c10::intrusive_ptr<KVCache> cache_;
  at::Tensor ids_, pos_, cache_position_, mask_;
  int64_t slot_ = 0;
#ifdef FLEX_TORCH_CUDA
  std::unique_ptr<at::cuda::CUDAGraph> cuda_graph_;
  at::Tensor graph_logits_;
#endif
};

#ifdef FLEX_TORCH_CUDA
// One memory pool for every graph this process records (the buckets share it).
at::cuda::MempoolId_t shared_graph_pool() {
  static const at::cuda::MempoolId_t pool = at::cuda::graph_pool_handle();
  return pool;
}

at::Tensor StaticStep::replay() {
  if (!cuda_graph_) {
    // Warm up on a side stream (lazy initialisations, cuBLAS handles and
    // workspaces happen outside the capture), then record on it. The warm-up
    // writes this step's keys into their slot, as the replay below does again.
    const c10::Device device = ids_.device();
    c10::cuda::CUDAGuard guard(device);
    c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device.index());
    c10::cuda::CUDAStream main = c10::cuda::getCurrentCUDAStream(device.index());
    main.synchronize();
    {
      c10::cuda::CUDAStreamGuard on_side(side);
      // Hooks whose work is on the host (a FlexModel capture) refuse here,
      // in the warm-up, before any capture has begun.
      GraphRecordingScope recording;
      for (int i = 0; i < 2; ++i) run();
      side.synchronize();
      cuda_graph_ = std::make_unique<at::cuda::CUDAGraph>();
      cuda_graph_->capture_begin(shared_graph_pool());
      try {
        graph_logits_ = run();
      } catch (const c10::Error& e) {
        // Typically a value read back to the host (.item(), a data-dependent
        // shape) in a hook or module: the capture cannot hold it.
        try {
          cuda_graph_->capture_end();
        } catch (const c10::Error&) {
        }
        cuda_graph_.reset();
        throw UnsupportedError(std::string("generate(cuda_graph): the decode step cannot be recorded as a CUDA graph "
                                           "(a hook or module reads a value back to the host or changes shape; "
                                           "static_step runs it eagerly): ") +
                               e.what_without_backtrace());
      }
      cuda_graph_->capture_end();
      side.synchronize();
    }
  }
  cuda_graph_->replay();
  return graph_logits_;
}
#else
at::Tensor StaticStep::replay() {
  throw UnsupportedError("generate(cuda_graph): this flexmodel was built against a CPU-only libtorch");
}
#endif

}  // namespace

bool cuda_graph_compiled() {
#ifdef FLEX_TORCH_CUDA
  return true;
#else
  return false;
#endif
}

int64_t static_capacity_bucket(int64_t tokens) {
  int64_t c = 256;
  while (c < tokens) c *= 2;
  return c;
}

void check_static_decode(CausalLM& model, int64_t capacity) {
  const ModelConfig& cfg = model.config();
  const std::string arch = architecture_of(model);
  auto refuse = [&](const std::string& why) {
    throw UnsupportedError("generate(static_step / cuda_graph): " + arch + " has no static decode step: " + why);
  };
  for (const auto& [name, m] : model.named_flex_modules()) {
    const auto dot = name.rfind('.');
    const std::string last = dot == std::string::npos ? name : name.substr(dot + 1);
    if (last == "hook_selected_experts")
      refuse("its mixture-of-experts routing (" + name +
             ") sends each token to experts chosen at run time, so the expert calls have data-dependent shapes");
    if (m->class_name().find("MLA") != std::string::npos || m->class_name().find("Deepseek") != std::string::npos)
      refuse("latent attention (" + m->class_name() + ") is not validated for the static cache");
  }
  const std::string rope = cfg.rope_scaling.rope_type;
  if (rope == "dynamic" || rope == "longrope")
    refuse("its " + rope + " RoPE chooses frequencies from the largest position, a value read back on the host");
}

GenerateOutput generate_static(CausalLM& model, const at::Tensor& input_ids, const at::Tensor& attention_mask,
                               const GenerateOptions& opts) {
  if (!opts.use_cache) throw ConfigError("generate: static_step / cuda_graph need use_cache");
  if (!input_ids.defined() || input_ids.dim() != 2 || input_ids.size(1) == 0)
    throw ShapeError("generate: input_ids must be a non-empty [batch, seq] tensor, got " +
                     (input_ids.defined() ? shape_text(input_ids.sizes()) : std::string("undefined")));
  const c10::Device device = input_device(model);
  if (opts.cuda_graph) check_graph_device(model, device);
  const int64_t need = input_ids.size(1) + opts.max_new_tokens;
  const int64_t capacity = opts.static_capacity > 0 ? opts.static_capacity : static_capacity_bucket(need);
  if (capacity < need)
    throw ConfigError("generate: static_capacity " + std::to_string(capacity) + " cannot hold the prompt (" +
                      std::to_string(input_ids.size(1)) + ") and max_new_tokens (" +
                      std::to_string(opts.max_new_tokens) + ")");
  if (model.config().model_type == "gpt2" && capacity > model.config().max_position_embeddings)
    throw ConfigError("generate: " + std::to_string(capacity) + " static cache slots exceed GPT-2's n_positions " +
                      std::to_string(model.config().max_position_embeddings) + "; pass a smaller static_capacity");
  check_static_decode(model, capacity);

  detail::GenerateTaps taps(model, opts.taps);
  StaticStep step(model, capacity, opts.cuda_graph, taps);
  GenerateOptions inner = opts;
  inner.static_step = inner.cuda_graph = false;
  inner.taps.clear();
  const c10::Device caller = input_ids.device();
  GenerateOutput out = generate([&step](const LMInputs& in) { return step(in); }, model.config(), input_ids.to(device),
                                attention_mask.defined() ? attention_mask.to(device) : attention_mask, inner);
  out.sequences = out.sequences.to(caller);
  out.attention_mask = out.attention_mask.to(caller);
  out.taps = taps.take();
  return out;
}

}  // namespace flex
