// Quantized input embeddings (quantized_embedding.h): three EmbeddingFormats
// that gather the stored rows first and dequantize only those.
#include <flex/models/quantized_embedding.h>

#include <flex/hooks/errors.h>
#include <flex/kernels/ggml_dequant.h>
#include <flex/kernels/ggml_gather.h>
#include <flex/kernels/ggml_linear.h>
#include <flex/quant/ggml_quantize.h>
#include <flex/quant/quantize.h>

#include <ATen/ATen.h>

namespace flex {

namespace {
constexpr const char* kEmbeddingFormats = "none, int8, nf4, q8_0, q6_k";  // as --quantize-head's
constexpr int64_t kNf4Block = 64;  // bitsandbytes' default 4-bit blocksize

// The ids as contiguous int64 on the CPU, each checked against the table:
// a typed error instead of libtorch's index error.
at::Tensor checked_ids(const Embedding& e, const at::Tensor& ids) {
  if (at::isFloatingType(ids.scalar_type()) || ids.scalar_type() == at::kBool)
    throw ShapeError(e.class_name() + ": input_ids must be integers, got " + std::string(c10::toString(ids.scalar_type())));
  at::Tensor flat = ids.reshape({-1}).to(at::kLong).contiguous();
  if (flat.numel() > 0) {
    const int64_t lo = flat.min().item<int64_t>(), hi = flat.max().item<int64_t>();
    if (lo < 0 || hi >= e.num_embeddings)
      throw ShapeError(e.class_name() + ": token id " + std::to_string(lo < 0 ? lo : hi) +
                       " is out of range for an embedding of " + std::to_string(e.num_embeddings) + " rows");
  }
  return flat;
}

at::Tensor shaped(const at::Tensor& rows, const at::Tensor& ids, int64_t dim, at::ScalarType dtype) {
  std::vector<int64_t> shape = ids.sizes().vec();
  shape.push_back(dim);
  return rows.view(shape).to(dtype);
}

class GgmlEmbedding : public EmbeddingFormat {
 public:
  GgmlEmbedding(uint32_t type, at::ScalarType dtype) : type_(type), dtype_(dtype) {}
  std::string name() const override { return ggml_type_name(type_); }
  at::Tensor rows(const Embedding& e, const at::Tensor& ids) const override {
    const at::Tensor flat = checked_ids(e, ids);
    at::Tensor out = at::empty({flat.numel(), e.embedding_dim}, at::kFloat);
    dequantize_ggml_rows(type_, e.weight.data_ptr<uint8_t>(), e.num_embeddings, e.embedding_dim,
                         flat.data_ptr<int64_t>(), flat.numel(), out.data_ptr<float>());
    return shaped(out, ids, e.embedding_dim, dtype_);
  }
  at::Tensor dequantize(const Embedding& e) const override {
    at::Tensor w = at::empty({e.num_embeddings, e.embedding_dim}, at::kFloat);
    dequantize_ggml(type_, e.weight.data_ptr<uint8_t>(), w.data_ptr<float>(), w.numel());
    return w.to(dtype_);
  }

 private:
  uint32_t type_;
  at::ScalarType dtype_;
};

class Int8Embedding : public EmbeddingFormat {
 public:
  explicit Int8Embedding(at::ScalarType dtype) : dtype_(dtype) {}
  std::string name() const override { return "int8"; }
  at::Tensor rows(const Embedding& e, const at::Tensor& ids) const override {
    const at::Tensor flat = checked_ids(e, ids);
    const at::Tensor r = dequantize_int8_rowwise(e.weight.index_select(0, flat), e.format_tensor("SCB").index_select(0, flat));
    return shaped(r, ids, e.embedding_dim, dtype_);
  }
  at::Tensor dequantize(const Embedding& e) const override {
    return dequantize_int8_rowwise(e.weight, e.format_tensor("SCB")).to(dtype_);
  }

 private:
  at::ScalarType dtype_;
};

class Nf4Embedding : public EmbeddingFormat {
 public:
  explicit Nf4Embedding(at::ScalarType dtype) : dtype_(dtype) {}
  std::string name() const override { return "nf4"; }
  at::Tensor rows(const Embedding& e, const at::Tensor& ids) const override {
    const at::Tensor flat = checked_ids(e, ids);
    return shaped(decode(e, e.weight.index_select(0, flat), e.format_tensor("absmax").index_select(0, flat), flat.numel()),
                  ids, e.embedding_dim, dtype_);
  }
  at::Tensor dequantize(const Embedding& e) const override {
    return decode(e, e.weight, e.format_tensor("absmax"), e.num_embeddings).to(dtype_);
  }

 private:
  // n whole rows of packed codes [n, dim / 2] and their absmaxes [n, dim / 64].
  at::Tensor decode(const Embedding& e, const at::Tensor& packed, const at::Tensor& absmax, int64_t n) const {
    FourBitWeight w;
    w.packed = packed.reshape({-1, 1});
    w.absmax = absmax.reshape({-1});
    w.type = FourBitType::NF4;
    w.blocksize = kNf4Block;
    w.shape = {n, e.embedding_dim};
    return dequantize_4bit(w);
  }
  at::ScalarType dtype_;
};

void check_width(const Embedding& e, const std::string& name, const std::string& format, int64_t block) {
  if (e.embedding_dim % block != 0)
    throw ShapeError("quantize_embeddings (--quantize-embeddings " + format + "): the embedding '" + name + "' is " +
                     std::to_string(e.embedding_dim) + " wide, not a multiple of " + format + "'s block of " +
                     std::to_string(block));
}
}  // namespace

void check_quantize_embeddings(const std::string& f) {
  if (f != "none" && f != "int8" && f != "nf4" && f != "q8_0" && f != "q6_k")
    throw ConfigError("quantize_embeddings (--quantize-embeddings): unknown format '" + f + "'; allowed: " + kEmbeddingFormats);
}

void store_ggml_embedding(Embedding& e, uint32_t type, const at::Tensor& bytes, at::ScalarType dtype) {
  const int64_t row = ggml_row_bytes(type, e.embedding_dim);
  if (bytes.scalar_type() != at::kByte || bytes.numel() != e.num_embeddings * row)
    throw ShapeError(e.class_name() + " [" + std::to_string(e.num_embeddings) + ", " + std::to_string(e.embedding_dim) +
                     "] in " + ggml_type_name(type) + " needs " + std::to_string(e.num_embeddings * row) +
                     " bytes; got " + std::to_string(bytes.numel()));
  e.set_weight_format(std::make_shared<GgmlEmbedding>(type, dtype), bytes.contiguous().view({e.num_embeddings, row}), {});
}

void quantize_input_embeddings(CausalLM& model, const std::string& f) {
  check_quantize_embeddings(f);
  if (f == "none") return;
  const std::shared_ptr<Embedding> e = model.input_embeddings();
  std::string name = "the input embedding";
  for (auto& [n, m] : model.named_flex_modules())
    if (m == e) name = n;
  if (e->weight_format())
    throw ConfigError("quantize_embeddings: the input embedding '" + name + "' is quantized already (" +
                      e->weight_format()->name() + ")");
  if (e->weight.is_meta() || !e->weight.device().is_cpu())
    throw UnsupportedError("quantize_embeddings: the input embedding '" + name + "' must be on the CPU with its weights loaded");
  at::NoGradGuard no_grad;
  const at::Tensor w = e->weight.detach();
  const at::ScalarType dtype = w.scalar_type();
  // set_weight_format replaces the embedding's own tensor only: a tied head
  // keeps referring to the float table.
  if (f == "q8_0" || f == "q6_k") {
    check_width(*e, name, f, f == "q8_0" ? 32 : 256);
    const uint32_t type = f == "q8_0" ? 8u : 14u;
    store_ggml_embedding(*e, type, ggml_quantize(type, w), dtype);
  } else if (f == "int8") {
    Int8Weight q = quantize_int8_rowwise(w);
    e->set_weight_format(std::make_shared<Int8Embedding>(dtype), q.cb, {{"SCB", q.scb}});
  } else {
    check_width(*e, name, f, kNf4Block);
    FourBitWeight q = quantize_4bit(w, FourBitType::NF4, /*double_quant=*/false, kNf4Block);
    e->set_weight_format(std::make_shared<Nf4Embedding>(dtype), q.packed.view({e->num_embeddings, -1}),
                         {{"absmax", q.absmax.view({e->num_embeddings, -1})}});
  }
}

}  // namespace flex
