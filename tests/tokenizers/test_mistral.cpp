// Mistral 7B (v0.1 / v0.3) tokenizer.json in its two Llama-2-style layouts, from
// the hand-made tests/data/tokenizers/mistral: the "legacy" file (normalizer
// Prepend("▁") + Replace(" " -> "▁"), decoder Replace, ByteFallback, Fuse,
// Strip), and the newer one (no normalizer, Metaspace pre-tokenizer with
// prepend_scheme "first" and split false; decoder as before or Metaspace).
// Expected ids are worked out by hand from the file's vocabulary and merge ranks
// (README has the table) and agree with Hugging Face tokenizers 0.23.2.
#include <flex/hooks/errors.h>
#include <flex/tokenizers/tokenizer.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "data_util.h"

using Ids = std::vector<int64_t>;
using nlohmann::json;

namespace {

const std::string kDir = flex_test::data_path("tokenizers/mistral");

// Ids: 0 <unk> 1 <s> 2 </s> 3 [INST] 4 [/INST] (special added tokens), 5 + b =
// <0xBB>, then 261 ▁ 262 h 263 e 264 l 265 o 266 w 267 r 268 d 269 ll 270 he
// 271 hell 272 hello 273 ▁hello 274 ▁w 275 or 276 ▁wor 277 ld 278 ▁world.
// Merge ranks: l+l, h+e, he+ll, hell+o, ▁+hello, ▁+w, o+r, ▁w+or, l+d, ▁wor+ld.
const flex::Tokenizer& legacy() {
  static const auto tok = flex::load_tokenizer(kDir);
  return *tok;
}

constexpr int64_t kByte0 = 5;  // id of <0x00>

json metaspace(const char* scheme) {
  return {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", scheme}, {"split", false}};
}

// The same vocabulary in the newer layout, with the Sequence or the Metaspace decoder.
std::unique_ptr<flex::Tokenizer> newer(bool metaspace_decoder) {
  std::ifstream in(kDir + "/tokenizer.json");
  json doc = json::parse(in);
  doc["normalizer"] = nullptr;
  doc["pre_tokenizer"] = metaspace("first");
  if (metaspace_decoder) doc["decoder"] = metaspace("first");
  flex_test::TempDir dir;
  std::ofstream(dir.str("tokenizer.json")) << doc.dump();
  std::ifstream config(kDir + "/tokenizer_config.json");
  std::ofstream(dir.str("tokenizer_config.json")) << config.rdbuf();
  return flex::load_tokenizer(dir.str());
}

}  // namespace

TEST(TokenizerMistral, SpecialTokensFromTheConfig) {
  const flex::Tokenizer& tok = legacy();
  EXPECT_EQ(tok.unk_id(), 0);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_FALSE(tok.pad_id());  // "pad_token": null
  EXPECT_EQ(tok.vocab_size(), 279);
  EXPECT_TRUE(tok.is_special(3));
}

TEST(TokenizerMistral, LegacyNormalizerPrefixesEveryPiece) {
  const flex::Tokenizer& tok = legacy();
  // "hello world" -> "▁hello▁world": hello (l+l, h+e, he+ll, hell+o), ▁+hello,
  // then ▁+w, o+r, ▁w+or, l+d, ▁wor+ld.
  EXPECT_EQ(tok.encode("hello world"), (Ids{1, 273, 278}));
  EXPECT_EQ(tok.encode("hello world", false), (Ids{273, 278}));
  EXPECT_EQ(tok.encode(""), (Ids{1}));
  // " hello" -> "▁▁hello": no ▁+▁ merge, so ▁ then ▁hello.
  EXPECT_EQ(tok.encode(" hello", false), (Ids{261, 273}));
  // Control tokens split the text before normalizing, so each piece gets its own
  // ▁: "[INST] hello [/INST]" has the piece " hello " -> "▁▁hello▁".
  EXPECT_EQ(tok.encode("[INST] hello [/INST]"), (Ids{1, 3, 261, 273, 261, 4}));
  EXPECT_EQ(tok.encode("[INST]hello[/INST]"), (Ids{1, 3, 273, 4}));
}

TEST(TokenizerMistral, ByteFallback) {
  const flex::Tokenizer& tok = legacy();
  // "▁hé": no ▁+h merge here; é = C3 A9 falls back to bytes.
  EXPECT_EQ(tok.encode("h\xC3\xA9", false), (Ids{261, 262, kByte0 + 0xC3, kByte0 + 0xA9}));
  EXPECT_EQ(tok.encode("\xF0\x9F\x98\x80", false), (Ids{261, kByte0 + 0xF0, kByte0 + 0x9F, kByte0 + 0x98, kByte0 + 0x80}));
}

TEST(TokenizerMistral, LegacyDecoderStripsOneLeadingSpace) {
  const flex::Tokenizer& tok = legacy();
  EXPECT_EQ(tok.decode({1, 273, 278}), "<s> hello world");
  EXPECT_EQ(tok.decode({1, 273, 278}, /*skip_special_tokens=*/true), "hello world");
  EXPECT_EQ(tok.decode({261, 273}), " hello");
  EXPECT_EQ(tok.decode({261, kByte0 + 0xF0, kByte0 + 0x9F, kByte0 + 0x98, kByte0 + 0x80}), "\xF0\x9F\x98\x80");
  for (const std::string s : {"hello world", " two  spaces", "h\xC3\xA9 \xF0\x9F\x98\x80\n"}) {
    EXPECT_EQ(tok.decode(tok.encode(s), true), s);
  }
}

TEST(TokenizerMistral, MetaspaceLayoutPrependsOnlyAtTheStart) {
  for (bool metaspace_decoder : {false, true}) {
    SCOPED_TRACE(metaspace_decoder ? "Metaspace decoder" : "Sequence decoder");
    const auto tok = newer(metaspace_decoder);
    EXPECT_EQ(tok->bos_id(), 1);
    // Same ids as the legacy file at the start of the text...
    EXPECT_EQ(tok->encode("hello world"), (Ids{1, 273, 278}));
    EXPECT_EQ(tok->encode("\xF0\x9F\x98\x80", false), legacy().encode("\xF0\x9F\x98\x80", false));
    // ...but "first" adds no ▁ after a control token, and a text that already
    // starts with a space gets none either.
    EXPECT_EQ(tok->encode("[INST]hello[/INST]"), (Ids{1, 3, 272, 4}));
    EXPECT_EQ(tok->encode("[INST] hello [/INST]"), (Ids{1, 3, 273, 261, 4}));
    EXPECT_EQ(tok->encode(" hello", false), (Ids{273}));
    // Both decoders drop the ▁ that was prepended.
    EXPECT_EQ(tok->decode({273, 278}), "hello world");
    EXPECT_EQ(tok->decode({1, 273, 278}), "<s> hello world");
    EXPECT_EQ(tok->decode({1, 273, 278}, true), "hello world");
    EXPECT_EQ(tok->decode({261, 273}), " hello");
  }
}

TEST(TokenizerMistral, MetaspaceDecoderDropsEveryReplacementOfTheFirstToken) {
  // Hugging Face's Metaspace decoder removes all ▁ of token 0 (not only the first
  // one) unless prepend_scheme is "never"; later tokens turn ▁ into spaces. It
  // does not join byte tokens (only ByteFallback does).
  const auto tok = newer(true);
  EXPECT_EQ(tok->decode({261, 261, 273}), "  hello");
  EXPECT_EQ(tok->decode({kByte0 + 0x41}), "<0x41>");
}
