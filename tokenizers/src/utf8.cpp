// UTF-8 decoding that never fails: ill-formed input becomes explicit invalid units.
#include <flex/tokenizers/tokenizer.h>
#include <flex/tokenizers/unicode.h>

namespace flex::unicode {

Utf8Unit decode_utf8(const std::string& s, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t b0 = byte(pos);
  if (b0 < 0x80) return {b0, 1, true};
  // Well-formed sequences (Unicode Table 3-7): the lead byte fixes the length and
  // the allowed range of the second byte; later bytes are always 80..BF.
  uint32_t need;
  uint8_t lo = 0x80, hi = 0xBF;
  uint32_t cp;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1, cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2, cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;   // no overlong forms
    if (b0 == 0xED) hi = 0x9F;   // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3, cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;   // no overlong forms
    if (b0 == 0xF4) hi = 0x8F;   // nothing above U+10FFFF
  } else {
    return {b0, 1, false};
  }
  for (uint32_t k = 1; k <= need; ++k) {
    if (pos + k >= s.size()) return {b0, k, false};
    const uint8_t b = byte(pos + k);
    const uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) return {b0, k, false};  // the maximal subpart ends before b
    cp = (cp << 6) | (b & 0x3F);
  }
  return {cp, need + 1, true};
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace flex::unicode

namespace flex {

std::string sanitize_utf8(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) {
    const unicode::Utf8Unit u = unicode::decode_utf8(s, pos);
    if (u.valid) {
      out.append(s, pos, u.len);
    } else {
      out += "\xEF\xBF\xBD";
    }
    pos += u.len;
  }
  return out;
}

}  // namespace flex
