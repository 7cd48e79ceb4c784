#include <flex/hooks/errors.h>
#include <flex/kernels/cpu_isa.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>

namespace flex {

namespace {
std::atomic<int> g_scoped_cap{-1};  // -1: no ScopedIsa

Isa env_cap() {
  static const Isa cap = [] {
    const char* v = std::getenv("FLEX_CPU_ISA");
    if (!v || !*v) return Isa::Avx512Bf16;
    const std::string s(v);
    if (s == "scalar") return Isa::Scalar;
    if (s == "avx2") return Isa::Avx2;
    if (s == "avx512") return Isa::Avx512;
    if (s == "avx512bf16") return Isa::Avx512Bf16;
    throw ConfigError("FLEX_CPU_ISA must be scalar, avx2, avx512 or avx512bf16, got '" + s + "'");
  }();
  return cap;
}
}  // namespace

std::string to_string(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
    case Isa::Avx512Bf16: return "avx512bf16";
  }
  return "?";
}

Isa cpu_isa_supported() {
  static const Isa isa = [] {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
      return __builtin_cpu_supports("avx512bf16") ? Isa::Avx512Bf16 : Isa::Avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::Avx2;
#endif
    return Isa::Scalar;
  }();
  return isa;
}

Isa cpu_isa() {
  int level = std::min(static_cast<int>(cpu_isa_supported()), static_cast<int>(env_cap()));
  const int scoped = g_scoped_cap.load(std::memory_order_relaxed);
  if (scoped >= 0) level = std::min(level, scoped);
  return static_cast<Isa>(level);
}

ScopedIsa::ScopedIsa(Isa cap) : previous_(g_scoped_cap.exchange(static_cast<int>(cap))) {}
ScopedIsa::~ScopedIsa() { g_scoped_cap.store(previous_); }

}  // namespace flex
