#pragma once
// The input token embedding stored quantized (design decision 52): the
// Embedding keeps its module name, class name and hooks; its `weight`
// becomes the stored codes and a lookup dequantizes only the gathered rows
// (Embedding::float_weight() gives the whole table in float).
//
//  - ggml blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K): weight
//    uint8 [rows, row bytes]; a GGUF token_embd stays in its file's blocks,
//    and --quantize-embeddings q8_0 / q6_k writes them (ggml_quantize.h).
//    Rows have the bits gguf-py's dequantizer gives.
//  - int8: bitsandbytes' row-wise LLM.int8() quantization (Embedding8bit):
//    weight int8 [rows, dim], buffer "SCB" float32 [rows].
//  - nf4: bitsandbytes' NF4 in blocks of 64 along each row (EmbeddingNF4):
//    weight uint8 [rows, dim / 2], buffer "absmax" float32 [rows, dim / 64].
// In every format a gathered row equals the same row of float_weight() bit
// for bit.
#include <flex/hooks/nn.h>
#include <flex/models/causal_lm.h>

#include <cstdint>
#include <string>

namespace flex {

/// ConfigError naming quantize_embeddings (--quantize-embeddings) and the
/// allowed formats unless `format` is none, int8, nf4, q8_0 or q6_k.
void check_quantize_embeddings(const std::string& format);

/// Stores `model`'s input embedding as `format` (a no-op for "none"). A
/// tied output head keeps its float table. ConfigError when the embedding
/// is quantized already; UnsupportedError when it is not loaded on the CPU;
/// ShapeError naming the format when the embedding width is not whole
/// blocks (q8_0: 32, q6_k: 256, nf4: 64).
void quantize_input_embeddings(CausalLM& model, const std::string& format);

/// Keeps `bytes` (uint8, e.num_embeddings rows of ggml_row_bytes(type,
/// e.embedding_dim)) as `e`'s table in ggml `type`; lookups return `dtype`.
/// ShapeError naming the sizes when the bytes are not that many.
void store_ggml_embedding(Embedding& e, uint32_t type, const at::Tensor& bytes, at::ScalarType dtype);

}  // namespace flex
