#pragma once
// A row gather from a table stored in ggml blocks (a GGUF token_embd kept
// quantized): only the rows looked up are dequantized, each by
// dequantize_ggml_reference (flex/kernels/ggml_dequant.h), so a row has the
// bits gguf-py's dequantizer gives for it.
#include <cstdint>

namespace flex {

/// Rows ids[0..n) of a [rows, cols] table stored as `type` blocks (each row
/// `cols` elements, a whole number of blocks, rows back to back) as float32
/// into dst [n, cols]. Split over rows with at::parallel_for: any thread
/// count gives the same bits. ShapeError naming the id and the row count
/// for an id outside [0, rows), or when cols is not whole blocks;
/// UnsupportedError naming the type for one ggml_can_dequantize refuses.
void dequantize_ggml_rows(uint32_t type, const uint8_t* table, int64_t rows, int64_t cols, const int64_t* ids,
                          int64_t n, float* dst);

}  // namespace flex
