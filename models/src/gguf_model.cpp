// GGUF files as flexmodel models: the tensors placed where
// gguf_architectures.h says, matrices kept in their blocks where the dense
// layer computes on them, the rest dequantized.
#include <flex/models/gguf_model.h>

#include "gguf_architectures.h"

#include <flex/dispatch/gguf.h>
#include <flex/hooks/empty_init.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/module.h>
#include <flex/hooks/nn.h>
#include <flex/kernels/ggml_linear.h>
#include <flex/models/auto_model.h>
#include <flex/models/config.h>
#include <flex/models/quantized_embedding.h>
#include <flex/quant/ggml_format.h>

#include <ATen/ATen.h>

#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <sys/stat.h>

namespace flex {

using gguf_detail::GgufLayout;
using gguf_detail::GgufPiece;

bool is_gguf_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

std::vector<std::pair<std::string, at::Tensor>> gguf_state_dict(const GgufFile& f) {
  const GgufLayout layout(f);
  std::vector<std::pair<std::string, at::Tensor>> out;
  std::map<std::string, at::Tensor> joined;  // parts of tensors join_pieces assembles
  std::map<std::string, std::string> stored;
  for (const auto& g : f.tensor_names()) {
    const std::vector<GgufPiece> pieces = layout.pieces(f, g);
    const at::Tensor t = f.dequantize(g);
    for (const auto& p : pieces) {
      at::Tensor x = layout.apply(f, g, p, t, /*is_float=*/true).contiguous();
      if (p.joined) joined[p.name] = x, stored[p.name] = g;
      else out.emplace_back(p.name, x);
    }
  }
  layout.join_pieces(f, joined, stored);
  for (auto& [name, t] : joined) out.emplace_back(name, t);
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
  const GgufLayout layout(*f);
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, uint32_t> quantized;  // model name -> ggml type, for tensors kept as bytes
  std::map<std::string, std::string> stored;  // model name -> GGUF name, for messages
  std::map<std::string, std::vector<int64_t>> stored_shape;  // model name -> its logical shape in the file
  for (const auto& g : f->tensor_names()) {
    const GgufTensorInfo& info = f->tensor(g);
    at::Tensor whole;  // dequantized once for all of its pieces
    for (const GgufPiece& piece : layout.pieces(*f, g)) {
      const std::string& name = piece.name;
      stored[name] = g;
      std::vector<int64_t> shape = info.shape;
      if (piece.expert >= 0) shape.erase(shape.begin());
      stored_shape[name] = shape;
      DenseLayer* dense = nullptr;
      Embedding* embedding = nullptr;  // the token embedding: its rows are dequantized as they are looked up
      const size_t dot = name.rfind('.');
      if (o.gguf_quantized && ggml_linear_supports(info.type) && shape.size() == 2 && piece.keeps_blocks() &&
          name.compare(dot, std::string::npos, ".weight") == 0) {
        try {
          auto m = model->get_submodule(name.substr(0, dot));
          dense = dynamic_cast<DenseLayer*>(m.get());
          embedding = dynamic_cast<Embedding*>(m.get());
        } catch (const NotFoundError&) {
          dense = nullptr;  // no such module: the checks below name the tensor
        }
      }
      if ((dense && !dynamic_cast<Conv1D*>(dense)) || embedding) {
        std::vector<int64_t> rows(info.shape.begin(), info.shape.end() - 1);
        rows.push_back(-1);  // [.., rows, row bytes]
        tensors.emplace(name, layout.apply(*f, g, piece, f->raw(g).view(rows), /*is_float=*/false));
        quantized.emplace(name, info.type);
      } else {
        if (!whole.defined()) whole = f->dequantize(g);
        tensors.emplace(name, layout.apply(*f, g, piece, whole, /*is_float=*/true));
      }
    }
  }
  layout.join_pieces(*f, tensors, stored);
  const GgmlActivations activations = o.fast_activations ? GgmlActivations::Q8 : GgmlActivations::Float;

  std::set<std::string> tied_out;
  const std::string prefix = model->base_model_prefix() + ".";
  for (const auto& group : model->tied_parameters())
    for (const auto& name : group)
      if (name.rfind(prefix, 0) != 0) tied_out.insert(name);
  std::vector<std::string> missing;
  std::map<const Embedding*, uint32_t> embedding_types;  // embeddings kept in blocks (token, GPT-2's position)
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
        auto m = model->get_submodule(name.substr(0, name.rfind('.')));
        auto* dense = dynamic_cast<DenseLayer*>(m.get());
        if (t.size(0) != current.size(0) || stored_shape[name] != current.sizes().vec()) {
          std::ostringstream m;
          m << "GGUF file " << path << ": tensor '" << stored[name] << "' has shape "
            << at::IntArrayRef(stored_shape[name]) << " but " << model->class_name()
            << " built from its metadata expects " << current.sizes() << " for '" << name << "'";
          throw ShapeError(m.str());
        }
        // Views of the mapping unless the rows were reordered (q/k) or mmap is off.
        if (!o.mmap) t = t.clone();
        if (auto* embedding = dynamic_cast<Embedding*>(m.get())) {
          store_ggml_embedding(*embedding, q->second, t, dtype);
          embedding_types[embedding] = q->second;
        } else {
          store_ggml(*dense, q->second, t, activations, dtype);
        }
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
  // A head tied to a token embedding kept in blocks computes on those same
  // blocks, as an untied quantized output does (llama.cpp's tied head too).
  const std::shared_ptr<Embedding> token_embedding = model->input_embeddings();
  if (auto kept = embedding_types.find(token_embedding.get());
      kept != embedding_types.end() && model->config().tie_word_embeddings)
    store_ggml(*model->output_embeddings(), kept->second, token_embedding->weight, activations, dtype);
  model->reset_computed_buffers(at::Device(at::kCPU));
  for (const auto& [name, t] : state_dict(*model))
    if (t.is_meta()) throw NotFoundError("after loading GGUF file " + path + ", '" + name + "' is still on the meta device");
  model->eval();
  return model;
}

}  // namespace flex
