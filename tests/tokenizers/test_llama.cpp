// Llama-style BPE with byte fallback and NeoX-style byte-level BPE with NFC, from the
// small hand-made tokenizer.json files in tests/data/tokenizers/{llama,neox}. The
// expected ids are worked out by hand from those files' vocabularies and merge ranks
// (see tests/data/tokenizers/README.md for the id tables); each comment shows how.
#include <flex/hooks/errors.h>
#include <flex/tokenizers/tokenizer.h>
#include <flex/tokenizers/bpe.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "data_util.h"
#include "sentencepiece_round_trip.h"

using Ids = std::vector<int64_t>;

namespace {

// Llama fixture ids: 0 <unk>, 1 <s>, 2 </s>, 3 + b for <0xbb>, then
// 259 ▁ 260 h 261 e 262 l 263 o 264 w 265 r 266 d 267 世 268 ll 269 ▁h 270 ell
// 271 ▁hell 272 ▁hello 273 ▁w 274 or 275 ▁wor 276 ld 277 ▁world 278 rl.
// Merge ranks: l+l, ▁+h, e+ll, ▁h+ell, ▁hell+o, ▁+w, o+r, ▁w+or, l+d, ▁wor+ld, r+l.
const flex::Tokenizer& llama() {
  static const auto tok = flex::load_tokenizer(flex_test::data_path("tokenizers/llama"));
  return *tok;
}

// NeoX fixture ids: 0 <|endoftext|>, 1 <|padding|>, 2 + b for the byte-level
// character of byte b, then 258 Ġt 259 he 260 Ġthe 261 Ã© 262 ca 263 caf 264 cafÃ©
// 265 Ġcaf 266 ĠcafÃ©, and the added (non-special, normalized) token "   " = 267.
// Merge ranks: Ġ+t, h+e, Ġt+he, Ã+©, c+a, ca+f, caf+Ã©, Ġ+caf, Ġcaf+Ã©.
const flex::Tokenizer& neox() {
  static const auto tok = flex::load_tokenizer(flex_test::data_path("tokenizers/neox"));
  return *tok;
}

}  // namespace

TEST(TokenizerLlama, MergesByRankAfterSentencePieceNormalization) {
  // "hello world" -> "▁hello▁world" (Prepend ▁, spaces -> ▁), one word (no
  // pre-tokenizer); merges in rank order build ▁hello (272) and ▁world (277).
  EXPECT_EQ(llama().encode("hello world"), (Ids{1, 272, 277}));
  EXPECT_EQ(llama().encode("hello world", false), (Ids{272, 277}));
  // "▁rld": l+d (rank 8) beats r+l (rank 10) although r+l is further left.
  EXPECT_EQ(llama().encode("rld", false), (Ids{259, 265, 276}));
  // "▁lll": equal ranks merge left to right -> ▁ ll l.
  EXPECT_EQ(llama().encode("lll", false), (Ids{259, 268, 262}));
  // A leading space stays as an extra ▁: "▁▁hello".
  EXPECT_EQ(llama().encode(" hello", false), (Ids{259, 272}));
  // Empty text gets nothing prepended: only <s>.
  EXPECT_EQ(llama().encode(""), (Ids{1}));
}

TEST(TokenizerLlama, ByteFallbackForCharactersOutsideTheVocabulary) {
  // é = C3 A9 is not a token -> <0xC3> <0xA9> = 3+0xC3, 3+0xA9; 世 is a token (267).
  EXPECT_EQ(llama().encode("h\xC3\xA9", false), (Ids{269, 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(llama().encode("\xE4\xB8\x96", false), (Ids{259, 267}));
  // 😀 = F0 9F 98 80, and an invalid byte FF, fall back byte by byte.
  EXPECT_EQ(llama().encode("\xF0\x9F\x98\x80\xFF", false), (Ids{259, 3 + 0xF0, 3 + 0x9F, 3 + 0x98, 3 + 0x80, 3 + 0xFF}));
}

TEST(TokenizerLlama, SpecialTokensAndDecoding) {
  const flex::Tokenizer& tok = llama();
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.unk_id(), 0);
  EXPECT_FALSE(tok.pad_id());  // tokenizer_config.json sets pad_token null
  EXPECT_EQ(tok.vocab_size(), 279);
  // Special tokens split the text before normalization, so each piece gets its own ▁
  // (Hugging Face's "legacy" Llama behaviour): "<s>" "▁hello" "</s>".
  EXPECT_EQ(tok.encode("<s>hello</s>"), (Ids{1, 1, 272, 2}));
  EXPECT_EQ(tok.encode("hello</s> world", false), (Ids{272, 2, 259, 277}));
  // Decoder: ▁ -> space, bytes fused, one leading space stripped.
  EXPECT_EQ(tok.decode({1, 272, 277}), "<s> hello world");
  EXPECT_EQ(tok.decode({1, 272, 277}, true), "hello world");
  EXPECT_EQ(tok.decode({269, 3 + 0xC3, 3 + 0xA9, 277}), "h\xC3\xA9 world");
  EXPECT_THROW(tok.decode({279}), flex::NotFoundError);
}

TEST(TokenizerLlama, RoundTrips) {
  const flex::Tokenizer& tok = llama();
  for (const std::string s : {"hello world", "  two leading spaces", "trailing ", "h\xC3\xA9 \xE4\xB8\x96\xE7\x95\x8C!",
                              "new\nline\ttab", "\xF0\x9F\x98\x80 \xFF\xFE broken"}) {
    EXPECT_EQ(tok.decode(tok.encode(s), true), s);
  }
  tokenizer_test::expect_random_bytes_round_trip(tok, 11);
}

TEST(TokenizerNeox, ByteLevelMergesAndNfc) {
  // "the café": pieces "the", " café". t=2+0x74; h+e -> 259. " café" is Ġ c a f Ã ©:
  // Ã© (rank 3), ca, caf, then caf+Ã© (rank 6) beats Ġ+caf (rank 7): Ġ(2+0x20) cafÃ©(264).
  EXPECT_EQ(neox().encode("the caf\xC3\xA9"), (Ids{2 + 0x74, 259, 2 + 0x20, 264}));
  EXPECT_EQ(neox().encode(" the"), (Ids{260}));
  // NFC first: "cafe" + U+0301 becomes "café" = one token. Without NFC it would be
  // caf e Ì(CC) ģ(81).
  EXPECT_EQ(neox().encode("cafe\xCC\x81"), (Ids{264}));
  EXPECT_EQ(neox().decode({264}), "caf\xC3\xA9");
  // No post-processor tokens for byte-level BPE.
  EXPECT_EQ(neox().encode("the", true), neox().encode("the", false));
}

TEST(TokenizerNeox, AddedTokens) {
  const flex::Tokenizer& tok = neox();
  EXPECT_EQ(tok.vocab_size(), 268);
  // No config file: <|endoftext|> is bos, eos and unk.
  EXPECT_EQ(tok.eos_id(), 0);
  EXPECT_EQ(tok.bos_id(), 0);
  EXPECT_EQ(tok.token_to_id("<|padding|>"), 1);
  EXPECT_EQ(tok.encode("<|endoftext|>the<|padding|>"), (Ids{0, 2 + 0x74, 259, 1}));
  // The 3-space added token is cut out before the GPT-2 split: a, "   ", b.
  EXPECT_EQ(tok.encode("a   b"), (Ids{2 + 'a', 267, 2 + 'b'}));
  // Two spaces are no added token: "a", " ", " b" by the split pattern.
  EXPECT_EQ(tok.encode("a  b"), (Ids{2 + 'a', 2 + 0x20, 2 + 0x20, 2 + 'b'}));
  EXPECT_EQ(tok.decode({0, 2 + 0x74, 259, 267}), "<|endoftext|>the   ");
  EXPECT_EQ(tok.decode({0, 2 + 0x74, 259, 267}, true), "the   ");  // "   " is not special
  EXPECT_TRUE(tok.is_special(1));
  EXPECT_FALSE(tok.is_special(267));
}

TEST(TokenizerBpeSpec, UnknownTokensAndStripFlags) {
  // A tiny model built in code: no byte tokens, so unknown characters need <unk>.
  flex::BpeSpec spec;
  spec.source = "in-test spec";
  spec.vocab = {{"<unk>", 0}, {"a", 1}, {"b", 2}, {"ab", 3}, {"[M]", 4}};
  spec.merges = {{"a", "b"}};
  spec.unk_token = "<unk>";
  spec.fuse_unk = true;
  spec.added_tokens = {{"[M]", 4, true, /*lstrip=*/true, /*rstrip=*/true, false, false}};
  {
    const flex::BpeTokenizer tok(spec);
    // x y z are unknown; fuse_unk gives one <unk> for the run.
    EXPECT_EQ(tok.encode("abxyzab"), (Ids{3, 0, 3}));
    // lstrip/rstrip: the spaces around [M] belong to it.
    EXPECT_EQ(tok.encode("ab  [M]  ab"), (Ids{3, 4, 3}));
  }
  spec.fuse_unk = false;
  spec.added_tokens.clear();
  {
    const flex::BpeTokenizer tok(spec);
    EXPECT_EQ(tok.encode("abxyzab"), (Ids{3, 0, 0, 0, 3}));
    // With no added token, "[M]" is three unknown characters.
    EXPECT_EQ(tok.encode("[M]"), (Ids{0, 0, 0}));
  }
  spec.unk_token.reset();
  {
    const flex::BpeTokenizer tok(spec);
    try {
      tok.encode("abx");
      FAIL() << "expected NotFoundError";
    } catch (const flex::NotFoundError& e) {
      EXPECT_NE(std::string(e.what()).find("U+0078"), std::string::npos) << e.what();
    }
  }
}

TEST(TokenizerBpeSpec, ByteLevelPrefixSpaceAndMetaspace) {
  // ByteLevel add_prefix_space: "hi" is encoded as " hi".
  flex::BpeSpec spec;
  spec.source = "in-test spec";
  const auto& chars = flex::byte_level_chars();
  for (int b = 0; b < 256; ++b) spec.vocab.emplace_back(chars[b], b);
  spec.vocab.emplace_back(chars[' '] + "h", 256);
  spec.merges = {{chars[' '], "h"}};
  using Step = flex::BpeSpec::PreTokenizeStep;
  spec.pre_tokenizer = {Step::byte_level(/*add_prefix_space=*/true, /*use_regex=*/true)};
  EXPECT_EQ(flex::BpeTokenizer(spec).encode("hi"), (Ids{256, 'i'}));
  spec.pre_tokenizer = {Step::byte_level(/*add_prefix_space=*/false, /*use_regex=*/true)};
  EXPECT_EQ(flex::BpeTokenizer(spec).encode("hi"), (Ids{'h', 'i'}));

  // Metaspace (newer Llama files): ▁ replaces spaces, is prepended to the first
  // piece only ("first"), and each ▁ starts a new word.
  flex::BpeSpec ms;
  ms.source = "in-test metaspace";
  const std::string S = "\xE2\x96\x81";
  ms.vocab = {{"<s>", 0}, {S, 1}, {"a", 2}, {"b", 3}, {S + "a", 4}, {S + "b", 5}, {"ab", 6}};
  ms.merges = {{S, "a"}, {S, "b"}, {"a", "b"}};
  ms.pre_tokenizer = {Step::metaspace(S, flex::BpeSpec::PrependScheme::First, /*split=*/true)};
  ms.added_tokens = {{"<s>", 0, true, false, false, false, false}};
  using K = flex::BpeSpec::DecodeStep::Kind;
  ms.decoder = std::vector<flex::BpeSpec::DecodeStep>{{K::Metaspace, S, "", 0, 0, flex::BpeSpec::PrependScheme::First}};
  const flex::BpeTokenizer tok(ms);
  // "ab b" -> "▁ab▁b" -> words "▁ab" (▁a + b: ▁+a ranks first) and "▁b".
  EXPECT_EQ(tok.encode("ab b"), (Ids{4, 3, 5}));
  // After a special token the piece does not start the text: no ▁ prepended.
  EXPECT_EQ(tok.encode("<s>ab"), (Ids{0, 6}));
  EXPECT_EQ(tok.decode({4, 3, 5}), "ab b");
}

TEST(TokenizerLlama3, SplitPatternIgnoreMergesAndTemplate) {
  // A Llama 3 layout: Split(Llama 3 pattern) + ByteLevel(use_regex=false), BPE with
  // ignore_merges, post-processor Sequence[ByteLevel, TemplateProcessing].
  using nlohmann::json;
  const auto& chars = flex::byte_level_chars();
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[chars[b]] = b;
  const std::string G = chars[' '];
  vocab[G + "hello"] = 256;  // reachable only through ignore_merges: no merges build it
  vocab["12"] = 257;
  vocab["123"] = 258;
  const std::string pattern =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  json doc = json::parse(R"({
    "added_tokens": [{"id": 300, "content": "<|begin_of_text|>", "special": true}],
    "normalizer": null,
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "PATTERN"}, "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]},
    "post_processor": {"type": "Sequence", "processors": [
      {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
      {"type": "TemplateProcessing",
       "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
       "pair": [],
       "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [300], "tokens": ["<|begin_of_text|>"]}}}]},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "ignore_merges": true, "merges": ["1 2", "12 3"]}})");
  doc["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = pattern;
  doc["model"]["vocab"] = vocab;
  flex_test::TempDir dir;
  std::ofstream(dir.str("tokenizer.json")) << doc.dump();
  const auto tok = flex::load_tokenizer(dir.str());
  // " hello" is one vocabulary entry -> 256 although no merge makes it. "12345"
  // splits as "123" "45" (groups of three): 123 via merges 1+2, 12+3; then 4, 5.
  // "I'M": "I" then the case-insensitive contraction "'M".
  EXPECT_EQ(tok->encode("I'M hello 12345"),
            (Ids{300, 'I', '\'', 'M', 256, ' ', 258, '4', '5'}));
  EXPECT_EQ(tok->decode(tok->encode("I'M hello 12345"), true), "I'M hello 12345");
  EXPECT_EQ(tok->bos_id(), std::nullopt);  // no config and no conventional name
}
