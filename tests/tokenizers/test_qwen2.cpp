// Qwen2 / Qwen2.5's byte-level BPE from the hand-made tests/data/tokenizers/qwen2:
// NFC, Split(Qwen2's regex, Isolated) + ByteLevel(use_regex false), the ByteLevel
// post-processor and decoder, ChatML added tokens. Expected ids are worked out by
// hand from the file's vocabulary and merge ranks (each comment shows how; the
// README has the table) and agree with Hugging Face tokenizers 0.23.2.
#include <flex/hooks/errors.h>
#include <flex/tokenizers/tokenizer.h>
#include <gtest/gtest.h>

#include <random>

#include "data_util.h"

using Ids = std::vector<int64_t>;

namespace {

// Ids: byte b's GPT-2 character = b (so 'a' = 97, ' ' = 32, '\n' = 10), then
// 256 he 257 ll 258 hell 259 hello 260 Ġhello 261 Ã© 262 ca 263 caf 264 cafÃ©
// 265 's 266 'S 267 12 268 ok 269 ĊĊ 270 ĠĠ 271 el; added: 272 <|endoftext|>
// 273 <|im_start|> 274 <|im_end|> (special), 275 <tool_call> (not special).
// Merge ranks: h+e, l+l, he+ll, hell+o, Ġ+hello, Ã+©, c+a, ca+f, caf+Ã©, '+s, '+S,
// 1+2, o+k, Ċ+Ċ, Ġ+Ġ, e+l.
const flex::Tokenizer& qwen2() {
  static const auto tok = flex::load_tokenizer(flex_test::data_path("tokenizers/qwen2"));
  return *tok;
}

}  // namespace

TEST(TokenizerQwen2, SpecialTokensFromTheConfig) {
  const flex::Tokenizer& tok = qwen2();
  EXPECT_EQ(tok.vocab_size(), 276);
  EXPECT_FALSE(tok.bos_id());  // tokenizer_config.json: "bos_token": null
  EXPECT_EQ(tok.eos_id(), 272);
  EXPECT_EQ(tok.pad_id(), 272);
  EXPECT_FALSE(tok.unk_id());
  EXPECT_TRUE(tok.is_special(273));
  EXPECT_FALSE(tok.is_special(275));
}

TEST(TokenizerQwen2, MergesByRank) {
  const flex::Tokenizer& tok = qwen2();
  // h+e (rank 0) is taken before e+l (rank 15), then l+l, he+ll, hell+o.
  EXPECT_EQ(tok.encode("hello", false), (Ids{259}));
  // "ell": l+l (rank 1) beats e+l (rank 15) although e+l is further left.
  EXPECT_EQ(tok.encode("ell", false), (Ids{101, 257}));
  // " hello" is one piece (a non-letter prefixes a word): Ġ+hello (rank 4).
  EXPECT_EQ(tok.encode(" hello", false), (Ids{260}));
  EXPECT_EQ(tok.encode("hello hello", false), (Ids{259, 260}));
  // The ByteLevel post-processor adds nothing.
  EXPECT_EQ(tok.encode("hello", true), (Ids{259}));
}

TEST(TokenizerQwen2, DigitsSplitOneByOne) {
  // \p{N} takes one digit, so merge 1+2 never applies; the space before a digit
  // is a piece of its own (\s+(?!\S) fails before '2', \s+ takes it).
  EXPECT_EQ(qwen2().encode("12 2024", false), (Ids{'1', '2', ' ', '2', '0', '2', '4'}));
}

TEST(TokenizerQwen2, ContractionsIgnoreCase) {
  // (?i:'s|...): "'S" is the contraction (266 by merge '+S), then "ok" (268).
  EXPECT_EQ(qwen2().encode("IT'Sok", false), (Ids{'I', 'T', 266, 268}));
  EXPECT_EQ(qwen2().encode("IT'S", false), (Ids{'I', 'T', 266}));
  EXPECT_EQ(qwen2().encode("it's", false), (Ids{'i', 't', 265}));
}

TEST(TokenizerQwen2, NfcComposesFirst) {
  // "cafe" + U+0301 becomes "café"; é = C3 A9 -> Ã ©, merged Ã+©, then c+a, ca+f,
  // caf+Ã© -> one token. Without NFC the mark would be a piece of its own.
  EXPECT_EQ(qwen2().encode("cafe\xCC\x81", false), (Ids{264}));
  EXPECT_EQ(qwen2().encode("caf\xC3\xA9", false), (Ids{264}));
  EXPECT_EQ(qwen2().decode({264}), "caf\xC3\xA9");  // the composed form comes back
}

TEST(TokenizerQwen2, SpacesAndNewlines) {
  const flex::Tokenizer& tok = qwen2();
  // "  hello": \s+(?!\S) gives the first space alone; the second prefixes the word.
  EXPECT_EQ(tok.encode("  hello", false), (Ids{' ', 260}));
  // \s*[\r\n]+ takes "\n\n" (Ċ+Ċ = 269).
  EXPECT_EQ(tok.encode("hello\n\nok", false), (Ids{259, 269, 268}));
  // Punctuation takes the newlines after it: "!\n\n" = ! + ĊĊ.
  EXPECT_EQ(tok.encode("ok!\n\nhi", false), (Ids{268, '!', 269, 'h', 'i'}));
  // "a   b": "a", "  " (Ġ+Ġ = 270), " b" (no merge Ġ+b).
  EXPECT_EQ(tok.encode("a   b", false), (Ids{'a', 270, ' ', 'b'}));
  // Trailing spaces: \s+(?!\S) takes the whole run at the end.
  EXPECT_EQ(tok.encode("ok  ", false), (Ids{268, 270}));
}

TEST(TokenizerQwen2, BytesOfCharactersOutsideTheVocabulary) {
  // Byte-level BPE needs no fallback: 😀 = F0 9F 98 80 is four byte tokens.
  EXPECT_EQ(qwen2().encode("ok\xF0\x9F\x98\x80", false), (Ids{268, 0xF0, 0x9F, 0x98, 0x80}));
  EXPECT_EQ(qwen2().decode({0xF0, 0x9F, 0x98, 0x80}), "\xF0\x9F\x98\x80");
}

TEST(TokenizerQwen2, ChatMarkupAndSkippingSpecialTokens) {
  const flex::Tokenizer& tok = qwen2();
  // Added tokens are cut out before NFC and the split; "user\nhello" splits as
  // "user", "\n", "hello".
  EXPECT_EQ(tok.encode("<|im_start|>user\nhello<|im_end|>"), (Ids{273, 'u', 's', 'e', 'r', '\n', 259, 274}));
  EXPECT_EQ(tok.encode("<|endoftext|>"), (Ids{272}));
  EXPECT_EQ(tok.encode("<tool_call>ok"), (Ids{275, 268}));
  EXPECT_EQ(tok.decode({273, 259, 274}), "<|im_start|>hello<|im_end|>");
  EXPECT_EQ(tok.decode({273, 259, 274}, /*skip_special_tokens=*/true), "hello");
  // <tool_call> is an added token but not a special one: it stays.
  EXPECT_EQ(tok.decode({275, 268}, true), "<tool_call>ok");
  EXPECT_THROW(tok.decode({276}), flex::NotFoundError);
}

TEST(TokenizerQwen2, RoundTrips) {
  const flex::Tokenizer& tok = qwen2();
  for (const std::string s : {"hello world", "  two  spaces ", "IT'S 2024!\n\n\tok", "\xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x98\x80",
                              "<|im_start|>system\nyou are<|im_end|>\n", "caf\xC3\xA9 x\xD9\xA3\xC2\xBD"}) {
    EXPECT_EQ(tok.decode(tok.encode(s)), s);
  }
  // Random ASCII (NFC leaves it alone, so the round trip is exact).
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    std::string s(rng() % 40, '\0');
    for (char& ch : s) ch = static_cast<char>(1 + rng() % 127);
    EXPECT_EQ(tok.decode(tok.encode(s)), s);
  }
}
