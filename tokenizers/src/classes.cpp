// Letter / number / whitespace classes, for the added-token tests (single_word,
// lstrip, rstrip); the split regexes use PCRE2's own classes. The letter and
// number ranges are generated (unicode_data.h, scripts/gen_unicode_tables.py).
#include <flex/tokenizers/unicode.h>

#include <algorithm>
#include <iterator>

#include "unicode_data.h"

namespace flex::unicode {
namespace {

using data::CodeRange;
using data::kLetter;
using data::kNumber;

template <size_t N>
bool in_ranges(const CodeRange (&table)[N], uint32_t cp) {
  // First range whose upper end is >= cp; cp is in the table iff that range starts at or before it.
  auto it = std::lower_bound(std::begin(table), std::end(table), cp,
                             [](const CodeRange& r, uint32_t v) { return r.hi < v; });
  return it != std::end(table) && it->lo <= cp;
}

}  // namespace

bool is_letter(uint32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return in_ranges(kLetter, cp);
}

bool is_number(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return in_ranges(kNumber, cp);
}

// White_Space is not in Python's unicodedata (str.isspace() is another set), and
// its 25 code points have not changed since Unicode 6.3, so they are listed here.
bool is_whitespace(uint32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20:
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029:
    case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

}  // namespace flex::unicode
