// Load-time dequantization of FP8-block and MXFP4 checkpoints
// (flex/quant/stored_formats.h), with Transformers 5.23's arithmetic.
#include <flex/hooks/errors.h>
#include <flex/hooks/shape_text.h>
#include <flex/quant/stored_formats.h>

#include <ATen/ATen.h>

namespace flex {

at::Tensor dequantize_fp8_blocks(const at::Tensor& weight, const at::Tensor& scale_inv, int64_t bm, int64_t bn,
                                 at::ScalarType out, const std::string& what) {
  if (weight.dim() != 2 || scale_inv.dim() != 2 || bm <= 0 || bn <= 0)
    throw ShapeError(what + ": FP8 block weights need a 2-D weight and a 2-D weight_scale_inv, got " +
                     shape_text(weight.sizes()) + " and " + shape_text(scale_inv.sizes()));
  const int64_t rows = weight.size(0), cols = weight.size(1);
  if (scale_inv.size(0) != (rows + bm - 1) / bm || scale_inv.size(1) != (cols + bn - 1) / bn)
    throw ShapeError(what + ": weight_scale_inv " + shape_text(scale_inv.sizes()) + " is not the " +
                     std::to_string(bm) + "x" + std::to_string(bn) + " block grid of weight " +
                     shape_text(weight.sizes()));
  // Each block's scale spread over its (possibly partial, at the edges) block.
  const at::Tensor s = scale_inv.to(at::kFloat)
                           .repeat_interleave(bm, 0)
                           .repeat_interleave(bn, 1)
                           .narrow(0, 0, rows)
                           .narrow(1, 0, cols);
  return (weight.to(at::kFloat) * s).to(out);
}

at::Tensor dequantize_mxfp4(const at::Tensor& blocks, const at::Tensor& scales, at::ScalarType out,
                            const std::string& what) {
  if (blocks.dim() < 3 || blocks.scalar_type() != at::kByte || scales.scalar_type() != at::kByte ||
      blocks.sizes().slice(0, blocks.dim() - 1) != scales.sizes())
    throw ShapeError(what + ": MXFP4 needs uint8 blocks [..., R, G, B] and uint8 scales [..., R, G], got " +
                     shape_text(blocks.sizes()) + " and " + shape_text(scales.sizes()));
  static const float kE2M1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  const at::Tensor lut = at::from_blob(const_cast<float*>(kE2M1), {16}, at::kFloat).clone();
  const at::Tensor b = blocks.to(at::kLong);
  const at::Tensor lo = lut.index({at::bitwise_and(b, 0x0F)}), hi = lut.index({at::bitwise_right_shift(b, 4)});
  at::Tensor values = at::stack({lo, hi}, -1).flatten(-2);  // [..., R, G, 2B]: low nibble first
  values = at::ldexp(values, (scales.to(at::kInt) - 127).unsqueeze(-1));
  values = values.flatten(-2);  // [..., R, G * 2B]
  return values.transpose(-1, -2).contiguous().to(out);
}

}  // namespace flex
