#pragma once
// Which vector instructions the CPU kernels (bf16 GEMV, int8, 4-bit) use,
// chosen at run time from what the CPU (and the OS) supports. The levels are
// ordered, each including the one before. FLEX_CPU_ISA=scalar|avx2|avx512|
// avx512bf16 caps the choice (a benchmark or a bug report can pin one); tests
// run every level the CPU has through ScopedIsa.
#include <string>

namespace flex {

enum class Isa {
  Scalar,  // plain C++, any CPU
  Avx2,    // AVX2 + FMA (Haswell, Zen)
  Avx512,  // AVX-512 F/BW/VL with VNNI (Cascade Lake, Ice Lake, Sapphire Rapids, Zen 4)
  Avx512Bf16,  // and AVX512_BF16's vdpbf16ps (Cooper Lake, Sapphire Rapids, Zen 4)
};

std::string to_string(Isa isa);
/// The best level this CPU supports, ignoring FLEX_CPU_ISA and overrides.
Isa cpu_isa_supported();
/// The level the kernels use now: the supported one, capped by FLEX_CPU_ISA
/// (an unknown value is a ConfigError) and by an active ScopedIsa.
Isa cpu_isa();

/// Caps the level for this scope (process-wide; tests and benchmarks only).
/// Asking for more than the CPU supports gives the supported level.
class ScopedIsa {
 public:
  explicit ScopedIsa(Isa cap);
  ~ScopedIsa();
  ScopedIsa(const ScopedIsa&) = delete;
  ScopedIsa& operator=(const ScopedIsa&) = delete;

 private:
  int previous_;
};

}  // namespace flex
