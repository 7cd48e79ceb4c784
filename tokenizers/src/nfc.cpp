// Unicode Normalization Form C (canonical decomposition, canonical ordering,
// canonical composition), needed by GPT-NeoX's tokenizer.json normalizer.
//
// The tables (combining classes, canonical decompositions) are generated from
// Python's unicodedata by scripts/gen_unicode_tables.py into unicode_data.h.
#include <flex/tokenizers/unicode.h>

#include <algorithm>
#include <iterator>
#include <unordered_map>
#include <vector>

#include "unicode_data.h"

namespace flex::unicode {
namespace {

using data::CccRange;
using data::Decomp;
using data::kCombiningClass;
using data::kDecomposition;

// Hangul syllables decompose and compose arithmetically (Unicode section 3.12).
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

// Invalid input bytes travel through as this marker | byte: class 0, never composed.
constexpr uint32_t kRawByte = 0x80000000u;

uint8_t combining_class(uint32_t cp) {
  if (cp < 0x300 || (cp & kRawByte)) return 0;
  auto it = std::lower_bound(std::begin(kCombiningClass), std::end(kCombiningClass), cp,
                             [](const CccRange& r, uint32_t v) { return r.hi < v; });
  return it != std::end(kCombiningClass) && it->lo <= cp ? it->ccc : 0;
}

const Decomp* find_decomp(uint32_t cp) {
  auto it = std::lower_bound(std::begin(kDecomposition), std::end(kDecomposition), cp,
                             [](const Decomp& d, uint32_t v) { return d.cp < v; });
  return it != std::end(kDecomposition) && it->cp == cp ? &*it : nullptr;
}

void decompose(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  if (cp >= 0xC0 && !(cp & kRawByte)) {
    if (const Decomp* d = find_decomp(cp)) {
      decompose(d->first, out);
      if (d->second) decompose(d->second, out);
      return;
    }
  }
  out.push_back(cp);
}

// Primary composite of (a, b), or 0.
uint32_t compose(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  static const std::unordered_map<uint64_t, uint32_t> pairs = [] {
    std::unordered_map<uint64_t, uint32_t> m;
    for (const Decomp& d : kDecomposition) {
      if (d.compose) m[(static_cast<uint64_t>(d.first) << 32) | d.second] = d.cp;
    }
    return m;
  }();
  auto it = pairs.find((static_cast<uint64_t>(a) << 32) | b);
  return it == pairs.end() ? 0 : it->second;
}

}  // namespace

std::string nfc(const std::string& text) {
  // Fast path: text below U+0300 (ASCII, Latin-1, Latin Extended) is already NFC;
  // nothing there decomposes into something that composes differently.
  bool simple = true;
  for (size_t pos = 0; pos < text.size() && simple;) {
    const Utf8Unit u = decode_utf8(text, pos);
    simple = u.valid && u.cp < 0x300;
    pos += u.len;
  }
  if (simple) return text;

  std::vector<uint32_t> cps;
  cps.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const Utf8Unit u = decode_utf8(text, pos);
    if (u.valid) {
      decompose(u.cp, cps);
    } else {
      for (size_t k = 0; k < u.len; ++k) cps.push_back(kRawByte | static_cast<uint8_t>(text[pos + k]));
    }
    pos += u.len;
  }
  // Canonical ordering: stable sort of each run of non-starters by class.
  for (size_t i = 0; i < cps.size();) {
    if (combining_class(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && combining_class(cps[j]) != 0) ++j;
    std::stable_sort(cps.begin() + i, cps.begin() + j,
                     [](uint32_t a, uint32_t b) { return combining_class(a) < combining_class(b); });
    i = j;
  }
  // Canonical composition: each character joins the last starter unless a
  // character of the same or higher class (or a starter) stands between them.
  std::vector<uint32_t> out;
  out.reserve(cps.size());
  size_t starter = SIZE_MAX;
  int last_class = -1;
  for (uint32_t cp : cps) {
    const int cls = combining_class(cp);
    if (starter != SIZE_MAX && !(cp & kRawByte) && !(out[starter] & kRawByte) &&
        (last_class < cls || last_class == 0)) {
      // last_class == 0 here means the starter is the previous character.
      if (const uint32_t c = compose(out[starter], cp)) {
        out[starter] = c;
        continue;
      }
    }
    if (cls == 0) starter = out.size();
    last_class = cls;
    out.push_back(cp);
  }
  std::string s;
  s.reserve(text.size());
  for (uint32_t cp : out) {
    if (cp & kRawByte) {
      s += static_cast<char>(cp & 0xFF);
    } else {
      append_utf8(s, cp);
    }
  }
  return s;
}

}  // namespace flex::unicode
