// Row gather with dequantization from ggml blocks (ggml_gather.h).
#include <flex/hooks/errors.h>
#include <flex/kernels/ggml_dequant.h>
#include <flex/kernels/ggml_gather.h>

#include <ATen/Parallel.h>

namespace flex {

void dequantize_ggml_rows(uint32_t type, const uint8_t* table, int64_t rows, int64_t cols, const int64_t* ids,
                          int64_t n, float* dst) {
  const GgmlTypeInfo* info = ggml_type_info(type);
  if (!info || !info->dequantizable)
    throw UnsupportedError("ggml row gather: type " + ggml_type_name(type) + " cannot be dequantized");
  if (cols <= 0 || cols % info->block != 0)
    throw ShapeError("ggml row gather: rows of " + std::to_string(cols) + " values are not whole " + info->name +
                     " blocks of " + std::to_string(info->block));
  // Ids are checked before any thread starts: an error names the first bad one.
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= rows)
      throw ShapeError("ggml row gather: token id " + std::to_string(ids[i]) + " is out of range for a table of " +
                       std::to_string(rows) + " rows");
  const int64_t row_bytes = cols / info->block * info->block_bytes;
  // A grain of a few rows: one row is a few KB of work, threads pay off from ~16.
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      dequantize_ggml_reference(type, table + ids[i] * row_bytes, dst + i * cols, cols);
  });
}

}  // namespace flex
