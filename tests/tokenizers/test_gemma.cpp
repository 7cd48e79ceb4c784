// Gemma / Gemma 2's SentencePiece-style BPE from the hand-made
// tests/data/tokenizers/gemma: normalizer Replace(" " -> "▁") with no prefix,
// no pre-tokenizer (or Split(" ", MergedWithPrevious), which newer converters
// write), byte fallback, <bos> from the TemplateProcessing, and the decoder
// Replace("▁" -> " "), ByteFallback, Fuse (no Strip). Expected ids are worked out
// by hand from the file's vocabulary and merge ranks (README has the table) and
// agree with Hugging Face tokenizers 0.23.2.
#include <flex/hooks/errors.h>
#include <flex/tokenizers/tokenizer.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "data_util.h"
#include "sentencepiece_round_trip.h"

using Ids = std::vector<int64_t>;

namespace {

const std::string kDir = flex_test::data_path("tokenizers/gemma");

// Ids: 0 <pad> 1 <eos> 2 <bos> 3 <unk> 4 <mask> 5 <start_of_turn> 6 <end_of_turn>
// (special added tokens), 7 + b = <0xBB>, then 263 ▁ 264 \n 265 h 266 e 267 l 268 o
// 269 w 270 r 271 d 272 ll 273 he 274 hell 275 hello 276 ▁▁ 277 ▁hello 278 ▁w 279 or
// 280 ▁wor 281 ld 282 ▁world 283 rl.
// Merge ranks: l+l, h+e, he+ll, hell+o, ▁+▁, ▁+hello, ▁+w, o+r, ▁w+or, l+d, ▁wor+ld, r+l.
const flex::Tokenizer& gemma() {
  static const auto tok = flex::load_tokenizer(kDir);
  return *tok;
}

constexpr int64_t kByte0 = 7;  // id of <0x00>

}  // namespace

TEST(TokenizerGemma, SpecialTokensFromTheConfig) {
  const flex::Tokenizer& tok = gemma();
  EXPECT_EQ(tok.pad_id(), 0);
  EXPECT_EQ(tok.eos_id(), 1);
  EXPECT_EQ(tok.bos_id(), 2);
  EXPECT_EQ(tok.unk_id(), 3);
  EXPECT_EQ(tok.vocab_size(), 284);
}

TEST(TokenizerGemma, NoPrefixSpaceAndMergesByRank) {
  const flex::Tokenizer& tok = gemma();
  // "hello world" -> "hello▁world", one word (no pre-tokenizer): hello from l+l,
  // h+e, he+ll, hell+o; then ▁+w, o+r, ▁w+or, l+d, ▁wor+ld. No ▁ in front: Gemma
  // has no Prepend, so "hello" at the start is 275, not ▁hello.
  EXPECT_EQ(tok.encode("hello world"), (Ids{2, 275, 282}));
  EXPECT_EQ(tok.encode("hello world", false), (Ids{275, 282}));
  EXPECT_EQ(tok.encode(""), (Ids{2}));
  // A leading space is a ▁: ▁+hello (rank 5).
  EXPECT_EQ(tok.encode(" hello", false), (Ids{277}));
  // "▁▁hello": ▁+▁ (rank 4) is taken before ▁+hello (rank 5).
  EXPECT_EQ(tok.encode("  hello", false), (Ids{276, 275}));
  EXPECT_EQ(tok.encode("hello ", false), (Ids{275, 263}));
  // "rld": l+d (rank 9) beats r+l (rank 11) although r+l is further left.
  EXPECT_EQ(tok.encode("rld", false), (Ids{270, 281}));
}

TEST(TokenizerGemma, ByteFallback) {
  const flex::Tokenizer& tok = gemma();
  // é = C3 A9 and 😀 = F0 9F 98 80 are no tokens: their bytes are.
  EXPECT_EQ(tok.encode("h\xC3\xA9", false), (Ids{265, kByte0 + 0xC3, kByte0 + 0xA9}));
  EXPECT_EQ(tok.encode("\xF0\x9F\x98\x80", false), (Ids{kByte0 + 0xF0, kByte0 + 0x9F, kByte0 + 0x98, kByte0 + 0x80}));
  EXPECT_EQ(tok.encode(" \xF0\x9F\x98\x80", false), (Ids{263, kByte0 + 0xF0, kByte0 + 0x9F, kByte0 + 0x98, kByte0 + 0x80}));
  // ByteFallback joins byte tokens back into characters when decoding.
  EXPECT_EQ(tok.decode({263, kByte0 + 0xF0, kByte0 + 0x9F, kByte0 + 0x98, kByte0 + 0x80}), " \xF0\x9F\x98\x80");
}

TEST(TokenizerGemma, TurnMarkupAndDecoding) {
  const flex::Tokenizer& tok = gemma();
  // The turn tokens are cut out first; "hello\nworld" has no ▁ before "world", so
  // it is w, or (o+r), ld (l+d).
  EXPECT_EQ(tok.encode("<start_of_turn>hello\nworld<end_of_turn>"), (Ids{2, 5, 275, 264, 269, 279, 281, 6}));
  EXPECT_EQ(tok.encode("<bos>hello", false), (Ids{2, 275}));
  EXPECT_EQ(tok.decode({2, 275, 282}), "<bos>hello world");
  EXPECT_EQ(tok.decode({2, 275, 282}, /*skip_special_tokens=*/true), "hello world");
  EXPECT_EQ(tok.decode({5, 275, 6}, true), "hello");
  // No Strip step: leading spaces come back.
  EXPECT_EQ(tok.decode({276, 275}), "  hello");
}

TEST(TokenizerGemma, SplitOnSpacePreTokenizerGivesTheSameIds) {
  // Newer conversions write pre_tokenizer Split(" ", MergedWithPrevious). It runs
  // after the normalizer has turned every space into ▁, so it never splits.
  std::ifstream in(kDir + "/tokenizer.json");
  nlohmann::json doc = nlohmann::json::parse(in);
  doc["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "MergedWithPrevious"}, {"invert", false}};
  flex_test::TempDir dir;
  std::ofstream(dir.str("tokenizer.json")) << doc.dump();
  const auto split = flex::load_tokenizer(dir.str());
  for (const std::string s : {"hello world", "  hello ", "rld h\xC3\xA9", "<start_of_turn>hello\nworld<end_of_turn>"}) {
    EXPECT_EQ(split->encode(s), gemma().encode(s)) << s;
  }
}

TEST(TokenizerGemma, RoundTrips) {
  const flex::Tokenizer& tok = gemma();
  for (const std::string s : {"hello world", "  two leading spaces", "trailing  ", "h\xC3\xA9 \xE4\xB8\x96\xE7\x95\x8C!",
                              "new\nline\ttab", "\xF0\x9F\x98\x80 \xFF\xFE broken"}) {
    EXPECT_EQ(tok.decode(tok.encode(s), true), s);
  }
  tokenizer_test::expect_random_bytes_round_trip(tok, 5);
}
