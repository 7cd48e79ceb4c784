// Tokenizers read from GGUF metadata (tokenizer.ggml.*) against the `tokenizers`
// package: scripts/golden/make_gguf.py writes tests/data/gguf/vocab-*.gguf the way
// llama.cpp's convert_hf_to_gguf does from a tokenizer.json, and records that
// tokenizer's ids and decoding in vocab.expected.json.
#include <flex/hooks/errors.h>
#include <flex/tokenizers/gguf_vocab.h>
#include <flex/tokenizers/tokenizer.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data_util.h"

using nlohmann::json;

namespace {

json read_json(const std::string& name) {
  std::ifstream in(flex_test::data_path("gguf/" + name));
  return json::parse(in);
}

const json& expected() {
  static const json doc = read_json("vocab.expected.json");
  return doc;
}

void check_file(const std::string& name, const json& e) {
  const std::string path = flex_test::data_path("gguf/" + name);
  ASSERT_TRUE(flex::is_gguf_tokenizer_file(path));
  const auto tok = flex::load_tokenizer(path);  // a GGUF file instead of a folder
  for (size_t i = 0; i < e["strings"].size(); ++i) {
    const std::string s = e["strings"][i];
    const std::vector<int64_t> want = e["ids"][i];
    const std::vector<int64_t> got = tok->encode(s);
    EXPECT_EQ(got, want) << name << ": string " << i << " '" << s << "'";
    EXPECT_EQ(tok->decode_text(want), e["decoded"][i].get<std::string>()) << name << ": decoding string " << i;
    if (e.contains("decoded_skip_special"))
      EXPECT_EQ(tok->decode_text(want, /*skip_special_tokens=*/true), e["decoded_skip_special"][i].get<std::string>())
          << name << ": decoding string " << i << " without special tokens";
  }
}

void check_file(const std::string& name) { check_file(name, expected().at(name)); }

TEST(GgufVocab, Qwen2FixtureMatchesTokenizersPackage) {
  check_file("vocab-qwen2.gguf");
  const auto tok = flex::load_tokenizer(flex_test::data_path("gguf/vocab-qwen2.gguf"));
  EXPECT_EQ(tok->eos_id(), 272);
  EXPECT_EQ(tok->pad_id(), 272);
  EXPECT_FALSE(tok->bos_id().has_value());
  EXPECT_TRUE(tok->is_special(272));   // CONTROL
  EXPECT_FALSE(tok->is_special(275));  // USER_DEFINED <tool_call>
  EXPECT_EQ(tok->vocab_size(), 276);
}

TEST(GgufVocab, Gpt2PrefixMatchesTokenizersPackage) { check_file("vocab-gpt2.gguf"); }

TEST(GgufVocab, LlamaBpeWithBosMatchesTokenizersPackage) { check_file("vocab-llama-bpe.gguf"); }

// SmolLM's pre-tokenizer ("smollm"): digits one by one, then GPT-2's split.
TEST(GgufVocab, SmollmDigitsMatchTokenizersPackage) { check_file("vocab-smollm.gguf"); }

// A sentencepiece vocabulary (tokenizer.ggml.model "llama": pieces, scores,
// token types, <0xNN> byte tokens, no merges) against Transformers 5.23's
// tokenizer for the same file (scripts/golden/make_gguf_spm.py): merges rebuilt
// from the scores, the prefix space, byte fallback for characters outside the
// vocabulary (z, q, 本, the emoji), special and user-defined tokens, bos added.
TEST(GgufVocab, SentencepieceMatchesTransformersGgufTokenizer) {
  check_file("vocab-spm.gguf", read_json("vocab-spm.expected.json"));
  const auto tok = flex::load_tokenizer(flex_test::data_path("gguf/vocab-spm.gguf"));
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_TRUE(tok->is_special(1));     // CONTROL <s>
  EXPECT_TRUE(tok->is_special(0));     // <unk>, named by unknown_token_id
  EXPECT_FALSE(tok->is_special(259));  // USER_DEFINED <mask>
  EXPECT_FALSE(tok->is_special(3));    // BYTE <0x00>
}

// Phi-3's sentencepiece files: Transformers prepends "▁" by a normalizer, so
// to every piece between added tokens and before a leading space too.
TEST(GgufVocab, Phi3SentencepieceMatchesTransformersGgufTokenizer) {
  check_file("vocab-phi3-spm.gguf", read_json("vocab-phi3-spm.expected.json"));
}

// Gemma's sentencepiece files (general.architecture gemma3), which
// Transformers builds as GemmaTokenizer: no "▁" prefix, spaces replaced by
// "▁", whitespace tokens written with real spaces ("  " -> "▁▁"), merges
// ranked by file position though the scores run the other way.
TEST(GgufVocab, GemmaSentencepieceMatchesTransformersGgufTokenizer) {
  check_file("vocab-gemma-spm.gguf", read_json("vocab-gemma-spm.expected.json"));
  const auto tok = flex::load_tokenizer(flex_test::data_path("gguf/vocab-gemma-spm.gguf"));
  EXPECT_EQ(tok->bos_id(), 2);
  EXPECT_EQ(tok->pad_id(), 0);
  EXPECT_EQ(tok->encode("  x").at(1), 5);  // the two-space token
}

// A GGUF holding only string metadata, for the error cases.
std::string write_gguf(const std::string& name, const std::vector<std::pair<std::string, std::string>>& kv) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream out(path, std::ios::binary);
  const auto u32 = [&](uint32_t v) { out.write(reinterpret_cast<const char*>(&v), 4); };
  const auto u64 = [&](uint64_t v) { out.write(reinterpret_cast<const char*>(&v), 8); };
  const auto str = [&](const std::string& s) { u64(s.size()), out.write(s.data(), static_cast<std::streamsize>(s.size())); };
  out.write("GGUF", 4);
  u32(3), u64(0), u64(kv.size());
  for (const auto& [k, v] : kv) str(k), u32(8), str(v);
  return path;
}

template <class E>
void expect_error(const std::string& path, const std::vector<std::string>& parts, bool direct = false) {
  try {
    if (direct) flex::load_gguf_tokenizer(path);
    else flex::load_tokenizer(path);
    ADD_FAILURE() << "no error for " << path;
  } catch (const E& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << " lacks " << p;
  }
}

TEST(GgufVocab, UnsupportedModelsAndPreTokenizersNameFileKeyValue) {
  const auto t5 = write_gguf("t5.gguf", {{"tokenizer.ggml.model", "t5"}});
  expect_error<flex::UnsupportedError>(t5, {t5, "tokenizer.ggml.model", "'t5'"}, /*direct=*/true);
  // load_tokenizer: an IOError (no readable tokenizer), as for a folder without one.
  expect_error<flex::IOError>(t5, {t5, "tokenizer.ggml.model", "'t5'"});
  // A sentencepiece vocabulary needs its tokens and scores.
  const auto spm = write_gguf("spm.gguf", {{"tokenizer.ggml.model", "llama"}});
  expect_error<flex::FileFormatError>(spm, {spm, "tokenizer.ggml.tokens"}, /*direct=*/true);

  const auto pre = write_gguf("pre.gguf", {{"tokenizer.ggml.model", "gpt2"}, {"tokenizer.ggml.pre", "deepseek-llm"}});
  expect_error<flex::UnsupportedError>(pre, {pre, "tokenizer.ggml.pre", "'deepseek-llm'"}, /*direct=*/true);
  const auto none = write_gguf("none.gguf", {{"general.name", "x"}});
  expect_error<flex::IOError>(none, {none, "no tokenizer", "tokenizer.ggml.model"});
}

TEST(GgufVocab, TruncatedMetadataIsAFileFormatError) {
  const std::string src = flex_test::data_path("gguf/vocab-gpt2.gguf");
  std::ifstream in(src, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  const std::string path = ::testing::TempDir() + "truncated.gguf";
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  expect_error<flex::FileFormatError>(path, {path, "truncated"});
}

}  // namespace
