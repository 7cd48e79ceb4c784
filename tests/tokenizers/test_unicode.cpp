// UTF-8 decoding, character classes and NFC, each checked against facts from the
// Unicode standard worked out by hand (see the comments). The split patterns are
// tested in test_split.cpp.
#include <flex/tokenizers/tokenizer.h>
#include <flex/tokenizers/unicode.h>
#include <gtest/gtest.h>

#include <string>

namespace u = flex::unicode;

TEST(TokenizerUnicode, DecodesWellFormedUtf8) {
  const std::string s = "a\xC3\xA9\xE4\xB8\x96\xF0\x9F\x98\x80";  // a é 世 😀
  const uint32_t cps[] = {0x61, 0xE9, 0x4E16, 0x1F600};
  const uint32_t lens[] = {1, 2, 3, 4};
  size_t pos = 0;
  for (int k = 0; k < 4; ++k) {
    const u::Utf8Unit unit = u::decode_utf8(s, pos);
    EXPECT_TRUE(unit.valid);
    EXPECT_EQ(unit.cp, cps[k]);
    EXPECT_EQ(unit.len, lens[k]);
    pos += unit.len;
  }
  std::string back;
  for (uint32_t cp : cps) u::append_utf8(back, cp);
  EXPECT_EQ(back, s);
}

TEST(TokenizerUnicode, InvalidSequencesGiveMaximalSubparts) {
  // E2 82 is a truncated 3-byte sequence: one unit of 2 bytes; then 'A'.
  EXPECT_EQ(u::decode_utf8("\xE2\x82" "A", 0).len, 2u);
  EXPECT_FALSE(u::decode_utf8("\xE2\x82" "A", 0).valid);
  // C0 can never start a sequence (overlong): 1 byte.
  EXPECT_EQ(u::decode_utf8("\xC0\xAF", 0).len, 1u);
  // ED A0 80 would be a surrogate: ED alone is the maximal subpart.
  EXPECT_EQ(u::decode_utf8("\xED\xA0\x80", 0).len, 1u);
  // F4 90 is above U+10FFFF; a lone continuation byte; a truncated end of string.
  EXPECT_EQ(u::decode_utf8("\xF4\x90\x80\x80", 0).len, 1u);
  EXPECT_FALSE(u::decode_utf8("\x80", 0).valid);
  EXPECT_EQ(u::decode_utf8("\xF0\x9F\x98", 0).len, 3u);
  // Hence U+FFFD counts per the Unicode "best practice": 2 + 1 + 3 + 1.
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(flex::sanitize_utf8("x\xE2\x82" "A"), "x" + fffd + "A");
  EXPECT_EQ(flex::sanitize_utf8("\xED\xA0\x80"), fffd + fffd + fffd);
  EXPECT_EQ(flex::sanitize_utf8("\xF0\x9F\x98"), fffd);
  EXPECT_EQ(flex::sanitize_utf8("ok \xC3\xA9"), "ok \xC3\xA9");
}

TEST(TokenizerUnicode, CharacterClasses) {
  for (uint32_t cp : {0x41u, 0x7Au, 0xE9u, 0x3B1u, 0x436u, 0x5D0u, 0x627u, 0x939u, 0x4E16u, 0x3042u, 0xD55Cu, 0x2C6u})
    EXPECT_TRUE(u::is_letter(cp)) << std::hex << cp;
  // Marks (U+0301 Mn, U+093F Mc), symbols, punctuation and digits are not letters.
  for (uint32_t cp : {0x301u, 0x93Fu, 0x30u, 0x20u, 0x21u, 0x2211u, 0x1F600u, 0xD7u})
    EXPECT_FALSE(u::is_letter(cp)) << std::hex << cp;
  // Nd (0-9, Arabic-Indic 3), Nl (Roman numeral twelve), No (½, ²).
  for (uint32_t cp : {0x30u, 0x39u, 0x663u, 0x216Bu, 0xBDu, 0xB2u}) EXPECT_TRUE(u::is_number(cp)) << std::hex << cp;
  for (uint32_t cp : {0x41u, 0x2Eu, 0x4E00u}) EXPECT_FALSE(u::is_number(cp)) << std::hex << cp;
  for (uint32_t cp : {0x9u, 0xAu, 0xDu, 0x20u, 0x85u, 0xA0u, 0x2003u, 0x2028u, 0x3000u})
    EXPECT_TRUE(u::is_whitespace(cp)) << std::hex << cp;
  for (uint32_t cp : {0x200Bu, 0xFEFFu, 0x41u, 0x1Cu}) EXPECT_FALSE(u::is_whitespace(cp)) << std::hex << cp;
}

TEST(TokenizerUnicode, NfcComposes) {
  // e + COMBINING ACUTE -> é.
  EXPECT_EQ(u::nfc("cafe\xCC\x81"), "caf\xC3\xA9");
  // UAX #15: d + dot below + dot above is already ordered; NFC gives ḍ + dot above.
  EXPECT_EQ(u::nfc("d\xCC\x87\xCC\xA3"), "\xE1\xB8\x8D\xCC\x87");
  // Conjoining jamo compose arithmetically: ᄀ ᅡ ᆨ -> 각 (U+AC01).
  EXPECT_EQ(u::nfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"), "\xEA\xB0\x81");
  // Singletons and composition exclusions decompose for good:
  // ANGSTROM SIGN -> Å (U+00C5); DEVANAGARI QA (U+0958) -> क + nukta.
  EXPECT_EQ(u::nfc("\xE2\x84\xAB"), "\xC3\x85");
  EXPECT_EQ(u::nfc("\xE0\xA5\x98"), "\xE0\xA4\x95\xE0\xA4\xBC");
  // Already-composed text and invalid bytes pass through.
  EXPECT_EQ(u::nfc("Stra\xC3\x9F" "e \xE4\xB8\x96"), "Stra\xC3\x9F" "e \xE4\xB8\x96");
  EXPECT_EQ(u::nfc("e\xFF\xCC\x81"), "e\xFF\xCC\x81");
}
