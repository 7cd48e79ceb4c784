#pragma once
// The vector exp of the kernels (masked_softmax, silu_mul): x = k ln2 + f,
// |f| <= ln2 / 2, exp(f) by Cephes' degree-6 polynomial, times 2^k.
namespace flex::detail {

struct ExpConstants {
  static constexpr float log2e = 1.44269504088896341f, ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
  static constexpr float p0 = 1.9875691500e-4f, p1 = 1.3981999507e-3f, p2 = 8.3334519073e-3f,
                         p3 = 4.1665795894e-2f, p4 = 1.6666665459e-1f, p5 = 5.0000001201e-1f;
};

}  // namespace flex::detail
