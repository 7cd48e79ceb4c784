#pragma once
// The Unicode pieces the tokenizers need besides the split regexes (PCRE2, see
// split.h): UTF-8 decoding that tolerates invalid bytes, the letter /
// number / whitespace classes that added tokens' single_word / lstrip / rstrip
// test, and NFC normalisation.
#include <cstddef>
#include <cstdint>
#include <string>

namespace flex::unicode {

/// One decoded unit of a UTF-8 string. An ill-formed sequence gives valid=false,
/// cp = its first byte and len = the length of its maximal ill-formed subpart
/// (Unicode 15, section 3.9), so scanning never stalls and never skips bytes.
struct Utf8Unit {
  uint32_t cp = 0;
  uint32_t len = 1;
  bool valid = true;
};

/// Decodes the unit starting at byte `pos` (< s.size()).
Utf8Unit decode_utf8(const std::string& s, size_t pos);

/// Appends the UTF-8 encoding of code point `cp` (<= 0x10FFFF, not a surrogate).
void append_utf8(std::string& out, uint32_t cp);

/// General category L* (letters), in the Unicode version of the generated
/// tables (unicode_data.h: Python 3.11's unicodedata, Unicode 14, the version of
/// PCRE2 10.42's \p{L} that the split regexes use).
bool is_letter(uint32_t cp);
/// General category N* (numbers), same tables.
bool is_number(uint32_t cp);
/// The Unicode White_Space property (what \s means in Oniguruma, which Hugging Face
/// tokenizers use). It differs from JavaScript's \s only at U+0085 (space here)
/// and U+FEFF (not space here).
bool is_whitespace(uint32_t cp);

/// Unicode Normalization Form C of `text` (the same Unicode 14 tables). Invalid UTF-8 bytes
/// pass through unchanged and block composition across them.
std::string nfc(const std::string& text);

}  // namespace flex::unicode
