// The GPT-2 and Llama 3 pre-tokenisation patterns as hand-written scanners. Each
// regex tries its alternatives in order at each position; every character-class run
// is greedy and no alternative needs deep backtracking, so each one reduces to
// "measure a run of one class" plus the short backtracks of \s+(?!\S) and
// \s*[\r\n]+.
#include <flex/models/tokenizer_unicode.h>

#include <algorithm>

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

// Decodes the text once into units.
std::vector<Unit> units_of(const std::string& text) {
  std::vector<Unit> units;
  units.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const Utf8Unit u = decode_utf8(text, pos);
    units.push_back({pos, u.valid ? u.cp : 0xFFFFFFFFu, classify(u)});
    pos += u.len;
  }
  return units;
}

// End (unit index) of the run of class c starting at i.
size_t run_end(const std::vector<Unit>& units, size_t i, Cls c) {
  while (i < units.size() && units[i].cls == c) ++i;
  return i;
}

// The contractions 's 't 're 've 'm 'll 'd at unit i (ASCII only); returns the end
// unit or i. ignore_case is Llama 3's (?i:...).
size_t contraction(const std::vector<Unit>& units, size_t i, bool ignore_case) {
  static const char* const kSuffixes[] = {"s", "t", "re", "ve", "m", "ll", "d"};
  if (units[i].cp != '\'') return i;
  for (const char* suf : kSuffixes) {
    size_t k = 0;
    for (; suf[k] && i + 1 + k < units.size(); ++k) {
      uint32_t c = units[i + 1 + k].cp;
      if (ignore_case && c >= 'A' && c <= 'Z') c += 'a' - 'A';
      if (c != static_cast<uint8_t>(suf[k])) break;
    }
    if (!suf[k]) return i + 1 + k;
  }
  return i;
}

bool is_cr_lf(const Unit& u) { return u.cp == '\r' || u.cp == '\n'; }

// \s+(?!\S) then \s+, at a whitespace unit i: the run, minus its last unit when a
// non-space follows (that unit then prefixes the next word); the whole run when it
// is one unit long.
size_t space_run(const std::vector<Unit>& units, size_t i) {
  const size_t e = run_end(units, i, Cls::Space);
  return (e < units.size() && e - i > 1) ? e - 1 : e;
}

std::vector<std::pair<size_t, size_t>> to_pieces(const std::string& text, const std::vector<Unit>& units,
                                                 const std::vector<size_t>& ends) {
  std::vector<std::pair<size_t, size_t>> pieces;
  pieces.reserve(ends.size());
  size_t start = 0;
  for (size_t e : ends) {
    const size_t a = units[start].off, b = e < units.size() ? units[e].off : text.size();
    pieces.emplace_back(a, b - a);
    start = e;
  }
  return pieces;
}

}  // namespace

std::vector<std::pair<size_t, size_t>> split_gpt2(const std::string& text) {
  const std::vector<Unit> units = units_of(text);
  const size_t n = units.size();
  std::vector<size_t> ends;
  for (size_t i = 0; i < n;) {
    size_t end = contraction(units, i, false);
    if (end == i) {
      // ` ?X+` for X = letter, number, other: an optional U+0020, then a run of X.
      const size_t j = units[i].cp == ' ' && i + 1 < n ? i + 1 : i;
      for (Cls c : {Cls::Letter, Cls::Number, Cls::Other}) {
        if (units[j].cls == c) {
          end = run_end(units, j, c);
          break;
        }
      }
    }
    if (end == i) end = space_run(units, i);  // units[i] is whitespace here
    ends.push_back(end);
    i = end;
  }
  return to_pieces(text, units, ends);
}

std::vector<std::pair<size_t, size_t>> split_llama3(const std::string& text) {
  const std::vector<Unit> units = units_of(text);
  const size_t n = units.size();
  std::vector<size_t> ends;
  for (size_t i = 0; i < n;) {
    const Unit& u = units[i];
    // (?i:'s|'t|'re|'ve|'m|'ll|'d)
    size_t end = contraction(units, i, true);
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (end == i) {
      if (u.cls == Cls::Letter) {
        end = run_end(units, i, Cls::Letter);
      } else if (u.cls != Cls::Number && !is_cr_lf(u) && i + 1 < n && units[i + 1].cls == Cls::Letter) {
        end = run_end(units, i + 1, Cls::Letter);
      }
    }
    // \p{N}{1,3}
    if (end == i && u.cls == Cls::Number) end = std::min(run_end(units, i, Cls::Number), i + 3);
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    if (end == i) {
      const size_t j = u.cp == ' ' && i + 1 < n && units[i + 1].cls == Cls::Other ? i + 1 : i;
      if (units[j].cls == Cls::Other) {
        end = run_end(units, j, Cls::Other);
        while (end < n && is_cr_lf(units[end])) ++end;
      }
    }
    if (end == i) {
      // \s*[\r\n]+: up to the last CR/LF of the whitespace run, if it has one.
      const size_t e = run_end(units, i, Cls::Space);
      for (size_t k = e; k > i; --k) {
        if (is_cr_lf(units[k - 1])) {
          end = k;
          break;
        }
      }
      if (end == i) end = space_run(units, i);
    }
    ends.push_back(end);
    i = end;
  }
  return to_pieces(text, units, ends);
}

}  // namespace flex::unicode
