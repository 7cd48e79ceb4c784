#pragma once
// Building error messages. This library must not depend on libtorch, so it
// cannot use the {fmt} that ships inside libtorch's include tree; a stream does
// the little formatting the messages need.
#include <cstdint>
#include <sstream>
#include <string>

namespace flex {

/// The arguments written one after another, as `std::ostream <<` prints them.
template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

/// `v` in upper-case hexadecimal, zero-padded to at least `digits` digits.
inline std::string hex(uint32_t v, int digits) {
  static const char kDigits[] = "0123456789ABCDEF";
  std::string s;
  do {
    s.insert(s.begin(), kDigits[v & 0xF]);
    v >>= 4;
  } while (v != 0);
  if (static_cast<int>(s.size()) < digits) s.insert(0, static_cast<size_t>(digits) - s.size(), '0');
  return s;
}

}  // namespace flex
