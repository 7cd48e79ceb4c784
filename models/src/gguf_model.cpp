// GGUF files as flexmodel models: llama.cpp's metadata keys back to a
// Transformers config, its tensor names back to Transformers' module names,
// and the q/k row order of its converter undone.
#include <flex/models/gguf_model.h>

#include <flex/dispatch/gguf.h>
#include <flex/hooks/empty_init.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/module.h>
#include <flex/hooks/nn.h>
#include <flex/kernels/ggml_linear.h>
#include <flex/models/auto_model.h>
#include <flex/models/config.h>
#include <flex/quant/ggml_format.h>

#include <ATen/ATen.h>

#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <sys/stat.h>

namespace flex {

namespace {

// llama.cpp's per-block tensor names -> Transformers' (Llama, Qwen2).
const std::map<std::string, std::string>& llama_block_names() {
  static const std::map<std::string, std::string> m = {
      {"attn_norm", "input_layernorm"},   {"attn_q", "self_attn.q_proj"},      {"attn_k", "self_attn.k_proj"},
      {"attn_v", "self_attn.v_proj"},     {"attn_output", "self_attn.o_proj"}, {"ffn_norm", "post_attention_layernorm"},
      {"ffn_gate", "mlp.gate_proj"},      {"ffn_up", "mlp.up_proj"},           {"ffn_down", "mlp.down_proj"},
      {"attn_q_norm", "self_attn.q_norm"}, {"attn_k_norm", "self_attn.k_norm"},  // Qwen3's per-head norms
  };
  return m;
}

// Phi-3's fused projections: llama.cpp keeps Transformers' fused tensors
// (qkv rows q | k | v, gate_up rows gate | up) under these names.
const std::map<std::string, std::string>& phi3_block_names() {
  static const std::map<std::string, std::string> m = {
      {"attn_qkv", "self_attn.qkv_proj"},
      {"ffn_up", "mlp.gate_up_proj"},
  };
  return m;
}

// Gemma 2's four norms per block (its ffn_norm is the pre-feedforward one).
const std::map<std::string, std::string>& gemma2_block_names() {
  static const std::map<std::string, std::string> m = {
      {"post_attention_norm", "post_attention_layernorm"},
      {"ffn_norm", "pre_feedforward_layernorm"},
      {"post_ffw_norm", "post_feedforward_layernorm"},
  };
  return m;
}

// "blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight"; "" when unknown.
std::string llama_name(const std::string& g, const std::string& arch) {
  if (g == "token_embd.weight") return "model.embed_tokens.weight";
  if (g == "output_norm.weight") return "model.norm.weight";
  if (g == "output.weight") return "lm_head.weight";
  if (g.rfind("blk.", 0) != 0) return "";
  const size_t dot = g.find('.', 4);
  if (dot == std::string::npos) return "";
  const std::string layer = g.substr(4, dot - 4);
  if (layer.empty() || layer.find_first_not_of("0123456789") != std::string::npos) return "";
  const size_t last = g.rfind('.');
  if (last <= dot) return "";
  const std::string part = g.substr(dot + 1, last - dot - 1), suffix = g.substr(last);  // ".weight" / ".bias"
  if (suffix != ".weight" && suffix != ".bias") return "";
  if (arch == "gemma2")
    if (auto p = gemma2_block_names().find(part); p != gemma2_block_names().end())
      return "model.layers." + layer + "." + p->second + suffix;
  if (arch == "phi3") {
    if (auto p = phi3_block_names().find(part); p != phi3_block_names().end())
      return "model.layers." + layer + "." + p->second + suffix;
    if (part == "attn_q" || part == "attn_k" || part == "attn_v" || part == "ffn_gate") return "";
  }
  auto it = llama_block_names().find(part);
  if (it == llama_block_names().end()) return "";
  return "model.layers." + layer + "." + it->second + suffix;
}

// llama.cpp's converter stores each head's rows [first half | second half]
// (Transformers' rotate-half pairs i, i + d/2) as interleaved pairs: row
// 2i + j of a head is its row i + j * d/2. This puts them back.
at::Tensor unpermute_rows(const at::Tensor& w, int64_t n_head, const std::string& path, const std::string& name) {
  const int64_t rows = w.size(0);
  if (n_head <= 0 || rows % (2 * n_head) != 0)
    throw FileFormatError("GGUF file " + path + ": tensor '" + name + "' has " + std::to_string(rows) +
                          " rows, which do not split into " + std::to_string(n_head) + " heads of pairs");
  std::vector<int64_t> s = {n_head, rows / n_head / 2, 2};
  for (int64_t d = 1; d < w.dim(); ++d) s.push_back(w.size(d));
  return w.reshape(s).transpose(1, 2).reshape(w.sizes()).contiguous();
}

int64_t int_or(const GgufFile& f, const std::string& key, int64_t fallback) {
  return f.has(key) ? f.get_int(key) : fallback;
}

// What differs between the llama.cpp architectures read: the Transformers
// model, and whether the converter permuted q/k rows (LlamaModel does, for
// llama.cpp's GPT-J-style rope; Qwen2Model keeps the rotate-half layout, run
// with NEOX rope).
struct GgufArch {
  const char* model_type;
  const char* causal_lm_class;
  bool permuted_qk;
  bool norms_plus_one = false;  // Gemma: the converter stored 1 + w for every RMSNorm weight (scaled by (1 + w))
};

const GgufArch* gguf_arch(const std::string& arch) {
  static const std::map<std::string, GgufArch> m = {
      {"llama", {"llama", "LlamaForCausalLM", true}},
      {"qwen2", {"qwen2", "Qwen2ForCausalLM", false}},
      {"qwen3", {"qwen3", "Qwen3ForCausalLM", false}},  // Qwen2's layout with q/k norms (NEOX rope: no permutation)
      {"phi3", {"phi3", "Phi3ForCausalLM", false}},     // fused qkv / gate_up, NEOX rope
      {"gemma2", {"gemma2", "Gemma2ForCausalLM", false, true}},
  };
  auto it = m.find(arch);
  return it == m.end() ? nullptr : &it->second;
}

}  // namespace

bool is_gguf_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

nlohmann::json gguf_config_json(const GgufFile& f) {
  const std::string arch = f.get_string("general.architecture");
  const GgufArch* a = gguf_arch(arch);
  if (!a)
    throw UnsupportedError("GGUF file " + f.path() + ": general.architecture is '" + arch +
                           "'; flexmodel reads GGUF models of architecture 'llama' (Llama, Mistral), 'qwen2', 'qwen3', 'phi3' and 'gemma2' so far");
  const std::string p = arch + ".";
  nlohmann::json c;
  c["model_type"] = a->model_type;
  c["architectures"] = {a->causal_lm_class};
  const int64_t hidden = f.get_int(p + "embedding_length");
  const int64_t heads = f.get_int(p + "attention.head_count");
  c["hidden_size"] = hidden;
  c["intermediate_size"] = f.get_int(p + "feed_forward_length");
  c["num_hidden_layers"] = f.get_int(p + "block_count");
  c["num_attention_heads"] = heads;
  c["num_key_value_heads"] = int_or(f, p + "attention.head_count_kv", heads);
  c["max_position_embeddings"] = f.get_int(p + "context_length");
  c["rms_norm_eps"] = f.get_double(p + "attention.layer_norm_rms_epsilon");
  c["rope_theta"] = f.has(p + "rope.freq_base") ? f.get_double(p + "rope.freq_base") : 10000.0;
  if (heads > 0 && arch != "phi3")  // Phi-3's config has no head_dim (hidden / heads)
    c["head_dim"] = int_or(f, p + "attention.key_length", int_or(f, p + "rope.dimension_count", hidden / heads));
  if (f.has(p + "rope.scaling.type")) {
    const std::string kind = f.get_string(p + "rope.scaling.type");
    if (kind == "linear") {
      c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", f.get_double(p + "rope.scaling.factor")}};
    } else if (kind != "none") {
      throw UnsupportedError("GGUF file " + f.path() + ": metadata key '" + p + "rope.scaling.type' is '" + kind +
                             "'; only 'linear' and 'none' are read so far");
    }
  }
  if (f.has(p + "vocab_size")) {
    c["vocab_size"] = f.get_int(p + "vocab_size");
  } else if (f.has("tokenizer.ggml.tokens")) {
    c["vocab_size"] = static_cast<int64_t>(f.value("tokenizer.ggml.tokens").size());
  } else {
    c["vocab_size"] = f.tensor("token_embd.weight").shape.at(0);
  }
  c["tie_word_embeddings"] = !f.contains("output.weight");
  if (arch == "qwen3") c["attention_bias"] = f.contains("blk.0.attn_q.bias");
  if (arch == "phi3" && f.has(p + "attention.sliding_window"))
    c["sliding_window"] = f.get_int(p + "attention.sliding_window");
  if (arch == "llama") {  // Qwen2's q/k/v biases are part of its architecture
    c["attention_bias"] = f.contains("blk.0.attn_q.bias");
    c["mlp_bias"] = f.contains("blk.0.ffn_up.bias");
  }
  c["hidden_act"] = "silu";
  if (arch == "gemma2") {
    c["hidden_act"] = c["hidden_activation"] = "gelu_pytorch_tanh";
    const int64_t head_dim = c.value("head_dim", int64_t{256});
    // Not in the file: llama.cpp scales queries by 1/sqrt(head_dim), or for the 46-layer 27B by 1/sqrt(hidden / heads).
    c["query_pre_attn_scalar"] = c["num_hidden_layers"] == 46 && heads > 0 ? hidden / heads : head_dim;
    c["attn_logit_softcapping"] = f.get_double(p + "attn_logit_softcapping");
    c["final_logit_softcapping"] = f.get_double(p + "final_logit_softcapping");
    c["sliding_window"] = f.get_int(p + "attention.sliding_window");
  }
  c["torch_dtype"] = "float32";
  if (f.has("tokenizer.ggml.bos_token_id")) c["bos_token_id"] = f.get_int("tokenizer.ggml.bos_token_id");
  if (f.has("tokenizer.ggml.eos_token_id")) c["eos_token_id"] = f.get_int("tokenizer.ggml.eos_token_id");
  return c;
}

namespace {

// How a model's tensors come out of the file: names, and the q/k rows to un-permute.
struct GgufTensorPlan {
  int64_t heads, kv_heads;
  bool permuted, norms_plus_one;
  std::string arch;
  explicit GgufTensorPlan(const GgufFile& f) : arch(f.get_string("general.architecture")) {
    const nlohmann::json c = gguf_config_json(f);
    heads = c["num_attention_heads"];
    kv_heads = c["num_key_value_heads"];
    permuted = gguf_arch(arch)->permuted_qk;
    norms_plus_one = gguf_arch(arch)->norms_plus_one;
  }
  // Transformers' name of GGUF tensor g; UnsupportedError when it has none.
  std::string name(const GgufFile& f, const std::string& g) const {
    const std::string n = llama_name(g, arch);
    if (n.empty())
      throw UnsupportedError("GGUF file " + f.path() + ": tensor '" + g +
                             "' has no counterpart in the Transformers model that flexmodel knows");
    return n;
  }
  // A dequantized tensor as Transformers holds it: Gemma's norms back from 1 + w.
  at::Tensor float_tensor(const GgufFile& f, const std::string& g, const std::string& n) const {
    at::Tensor t = rows_in_order(f, g, n, f.dequantize(g));
    if (norms_plus_one && n.size() > 11 && n.compare(n.size() - 11, 11, "norm.weight") == 0) t = t - 1.0;
    return t;
  }
  // t (float, or the stored bytes as [rows, row bytes]) in Transformers' row order.
  at::Tensor rows_in_order(const GgufFile& f, const std::string& g, const std::string& n, at::Tensor t) const {
    if (permuted && n.find(".q_proj.") != std::string::npos) return unpermute_rows(t, heads, f.path(), g);
    if (permuted && n.find(".k_proj.") != std::string::npos) return unpermute_rows(t, kv_heads, f.path(), g);
    return t;
  }
};

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> gguf_state_dict(const GgufFile& f) {
  const GgufTensorPlan plan(f);
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& g : f.tensor_names()) {
    const std::string name = plan.name(f, g);
    out.emplace_back(name, plan.float_tensor(f, g, name));
  }
  return out;
}

std::shared_ptr<CausalLM> gguf_from_pretrained(const std::string& path, const PretrainedOptions& o) {
  if (o.device_map || !o.device_map_strategy.empty() || o.max_memory || o.offload_folder || o.quantization)
    throw UnsupportedError("GGUF file " + path +
                           ": device maps, memory budgets, offloading and quantization options are not taken for "
                           "GGUF models yet; load it on the CPU");
  auto f = GgufFile::open(path);
  const ModelConfig cfg = parse_config(gguf_config_json(*f), path);
  const at::ScalarType dtype = o.torch_dtype == "auto" ? at::kFloat : parse_torch_dtype(o.torch_dtype);
  std::shared_ptr<CausalLM> model;
  {
    EmptyInit scope;
    model = build_causal_lm(cfg, at::TensorOptions().dtype(dtype));
  }
  // Matrices of dense layers in a type ggml_linear computes on stay as their
  // stored bytes (o.gguf_quantized); everything else is dequantized.
  const GgufTensorPlan plan(*f);
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, uint32_t> quantized;  // model name -> ggml type, for tensors kept as bytes
  std::map<std::string, std::string> stored;  // model name -> GGUF name, for messages
  for (const auto& g : f->tensor_names()) {
    const std::string name = plan.name(*f, g);
    stored[name] = g;
    const GgufTensorInfo& info = f->tensor(g);
    DenseLayer* dense = nullptr;
    const size_t dot = name.rfind('.');
    if (o.gguf_quantized && ggml_linear_supports(info.type) && info.shape.size() == 2 &&
        name.compare(dot, std::string::npos, ".weight") == 0) {
      try {
        dense = dynamic_cast<DenseLayer*>(model->get_submodule(name.substr(0, dot)).get());
      } catch (const NotFoundError&) {
        dense = nullptr;  // no such module: the checks below name the tensor
      }
    }
    if (dense && !dynamic_cast<Conv1D*>(dense)) {
      const at::Tensor raw = f->raw(g).view({info.shape[0], -1});
      tensors.emplace(name, plan.rows_in_order(*f, g, name, raw));
      quantized.emplace(name, info.type);
    } else {
      tensors.emplace(name, plan.float_tensor(*f, g, name));
    }
  }
  const GgmlActivations activations = o.fast_activations ? GgmlActivations::Q8 : GgmlActivations::Float;

  std::set<std::string> tied_out;
  const std::string prefix = model->base_model_prefix() + ".";
  for (const auto& group : model->tied_parameters())
    for (const auto& name : group)
      if (name.rfind(prefix, 0) != 0) tied_out.insert(name);
  std::vector<std::string> missing;
  {
    at::NoGradGuard no_grad;
    for (const auto& [name, current] : state_dict(*model)) {
      auto it = tensors.find(name);
      if (it == tensors.end()) {
        if (!tied_out.count(name)) missing.push_back(name);
        continue;
      }
      at::Tensor t = it->second;
      if (auto q = quantized.find(name); q != quantized.end()) {
        auto* dense = dynamic_cast<DenseLayer*>(model->get_submodule(name.substr(0, name.rfind('.'))).get());
        if (t.size(0) != current.size(0) || f->tensor(stored[name]).shape != current.sizes().vec()) {
          std::ostringstream m;
          m << "GGUF file " << path << ": tensor '" << stored[name] << "' has shape "
            << at::IntArrayRef(f->tensor(stored[name]).shape) << " but " << model->class_name()
            << " built from its metadata expects " << current.sizes() << " for '" << name << "'";
          throw ShapeError(m.str());
        }
        // Views of the mapping unless the rows were reordered (q/k) or mmap is off.
        if (!o.mmap && t.data_ptr() == f->raw(stored[name]).data_ptr()) t = t.clone();
        store_ggml(*dense, q->second, t, activations, dtype);
        tensors.erase(it);
        continue;
      }
      if (t.sizes() != current.sizes()) {
        std::ostringstream m;
        m << "GGUF file " << path << ": tensor '" << stored[name] << "' has shape " << t.sizes() << " but "
          << model->class_name() << " built from its metadata expects " << current.sizes() << " for '" << name << "'";
        throw ShapeError(m.str());
      }
      if (t.scalar_type() != dtype) t = t.to(dtype);
      // F32 tensors are views of the mapping; copy unless mmap is wanted.
      if (!o.mmap && t.data_ptr() == it->second.data_ptr()) t = t.clone();
      set_module_tensor(*model, name, t);
      tensors.erase(it);
    }
  }
  if (!missing.empty()) {
    std::string list;
    for (size_t i = 0; i < missing.size() && i < 8; ++i) list += (i ? ", '" : "'") + missing[i] + "'";
    throw NotFoundError("GGUF file " + path + " lacks " + std::to_string(missing.size()) +
                        " tensor(s) that the model needs: " + list);
  }
  if (!tensors.empty())
    throw FileFormatError("GGUF file " + path + ": tensor '" + stored[tensors.begin()->first] +
                          "' is not part of the model its metadata describes (" + std::to_string(tensors.size()) +
                          " such tensor(s))");
  model->tie_weights();
  model->reset_computed_buffers(at::Device(at::kCPU));
  for (const auto& [name, t] : state_dict(*model))
    if (t.is_meta()) throw NotFoundError("after loading GGUF file " + path + ", '" + name + "' is still on the meta device");
  model->eval();
  return model;
}

}  // namespace flex
