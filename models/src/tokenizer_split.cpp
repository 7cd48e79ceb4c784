// The GPT-2 pre-tokenisation pattern as a hand-written scanner. The regex
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// tries its alternatives in order at each position; every character class run is
// greedy and no alternative needs deep backtracking, so each one reduces to
// "measure a run of one class" plus the one-step backtrack of \s+(?!\S).
#include <flex/models/tokenizer_unicode.h>

#include <cstring>

namespace flex::unicode {
namespace {

enum class Cls { Letter, Number, Space, Other };

Cls classify(const Utf8Unit& u) {
  if (!u.valid) return Cls::Other;
  if (is_letter(u.cp)) return Cls::Letter;
  if (is_number(u.cp)) return Cls::Number;
  if (is_whitespace(u.cp)) return Cls::Space;
  return Cls::Other;
}

// Decoded view of the text: one entry per unit, so lookahead is cheap.
struct Unit {
  size_t off;
  uint32_t cp;
  Cls cls;
};

}  // namespace

std::vector<std::pair<size_t, size_t>> split_gpt2(const std::string& text) {
  std::vector<Unit> units;
  units.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const Utf8Unit u = decode_utf8(text, pos);
    units.push_back({pos, u.valid ? u.cp : 0xFFFFFFFFu, classify(u)});
    pos += u.len;
  }
  const size_t n = units.size();
  const auto offset = [&](size_t i) { return i < n ? units[i].off : text.size(); };
  // End (unit index) of the run of class c starting at i.
  const auto run_end = [&](size_t i, Cls c) {
    while (i < n && units[i].cls == c) ++i;
    return i;
  };

  std::vector<std::pair<size_t, size_t>> pieces;
  size_t i = 0;
  while (i < n) {
    size_t end = i;
    // 's|'t|'re|'ve|'m|'ll|'d  (case-sensitive, ASCII)
    if (units[i].cp == '\'') {
      static const char* const kSuffixes[] = {"s", "t", "re", "ve", "m", "ll", "d"};
      for (const char* suf : kSuffixes) {
        const size_t len = std::strlen(suf);
        if (i + len < n && text.compare(units[i].off + 1, len, suf) == 0 &&
            offset(i + 1 + len) == units[i].off + 1 + len) {
          end = i + 1 + len;
          break;
        }
      }
    }
    if (end == i) {
      // ` ?X+` for X = letter, number, other: an optional U+0020, then a run of X.
      const size_t j = units[i].cp == ' ' && i + 1 < n ? i + 1 : i;
      for (Cls c : {Cls::Letter, Cls::Number, Cls::Other}) {
        if (units[j].cls == c) {
          end = run_end(j, c);
          break;
        }
        // Without the optional space the run must start at i itself.
        if (j != i && units[i].cls == c) {
          end = run_end(i, c);
          break;
        }
      }
    }
    if (end == i) {
      // \s+(?!\S): the whitespace run, minus its last unit when a non-space follows
      // (that unit then prefixes the next word); \s+ when the run is one unit long.
      const size_t e = run_end(i, Cls::Space);
      end = (e < n && e - i > 1) ? e - 1 : e;
    }
    pieces.emplace_back(units[i].off, offset(end) - units[i].off);
    i = end;
  }
  return pieces;
}

}  // namespace flex::unicode
