// Bad tokenizer files give typed errors that name the file and what is wrong.
#include <flex/hooks/errors.h>
#include <flex/tokenizers/tokenizer.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "data_util.h"

namespace {

void write(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// Expects load_tokenizer(dir) to throw E with every `parts` string in the message.
template <class E>
void expect_error(const std::string& dir, std::initializer_list<std::string> parts) {
  try {
    flex::load_tokenizer(dir);
    ADD_FAILURE() << "no error for " << dir;
  } catch (const E& e) {
    for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << " lacks " << p;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong error type: " << e.what();
  }
}

const std::string kMinimalModel =
    R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]})";

}  // namespace

TEST(TokenizerErrors, MissingFiles) {
  flex_test::TempDir dir;
  expect_error<flex::IOError>(dir.str("nope"), {"nope", "does not exist"});
  expect_error<flex::IOError>(dir.str(), {"no tokenizer.json"});
  write(dir.str("vocab.json"), "{}");  // merges.txt still missing
  expect_error<flex::IOError>(dir.str(), {"no tokenizer.json"});
}

TEST(TokenizerErrors, MalformedTokenizerJson) {
  flex_test::TempDir dir;
  const std::string file = dir.str("tokenizer.json");
  write(file, "{\"model\": ");
  expect_error<flex::FileFormatError>(dir.str(), {file, "not valid JSON"});
  write(file, "{}");
  expect_error<flex::FileFormatError>(dir.str(), {file, "model", "missing"});
  write(file, R"({"model": {"type": "BPE", "vocab": {"a": "zero"}, "merges": []}})");
  expect_error<flex::FileFormatError>(dir.str(), {file, "model.vocab.a", "integer"});
  write(file, R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]}})");
  expect_error<flex::FileFormatError>(dir.str(), {file, "merge #0", "'ab' is not in the vocabulary"});
  write(file, R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 0}, "merges": []}})");
  expect_error<flex::FileFormatError>(dir.str(), {file, "id 0"});
  write(file, R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a"]}})");
  expect_error<flex::FileFormatError>(dir.str(), {file, "model.merges[0]"});
  write(file, R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [], "unk_token": "<unk>"}})");
  expect_error<flex::FileFormatError>(dir.str(), {file, "unk_token '<unk>'"});
  write(file, "{" + kMinimalModel + R"(, "added_tokens": [{"content": "x"}]})");
  expect_error<flex::FileFormatError>(dir.str(), {file, "added_tokens[0].id", "missing"});
  write(file, "{" + kMinimalModel + R"(, "post_processor": {"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}], "special_tokens": {}}})");
  expect_error<flex::FileFormatError>(dir.str(), {file, "post_processor.special_tokens.<s>", "missing"});
}

TEST(TokenizerErrors, UnsupportedComponents) {
  flex_test::TempDir dir;
  const std::string file = dir.str("tokenizer.json");
  write(file, R"({"model": {"type": "WordPiece", "vocab": {}}})");
  expect_error<flex::UnsupportedError>(dir.str(), {file, "model.type", "WordPiece"});
  write(file, "{" + kMinimalModel + R"(, "normalizer": {"type": "Sequence", "normalizers": [{"type": "Lowercase"}]}})");
  expect_error<flex::UnsupportedError>(dir.str(), {file, "normalizer.normalizers[0].type", "Lowercase"});
  write(file, "{" + kMinimalModel + R"(, "pre_tokenizer": {"type": "Whitespace"}})");
  expect_error<flex::UnsupportedError>(dir.str(), {file, "pre_tokenizer.type", "Whitespace"});
  write(file, "{" + kMinimalModel + R"(, "decoder": {"type": "WordPiece"}})");
  expect_error<flex::UnsupportedError>(dir.str(), {file, "decoder.type"});
  write(file, "{" + kMinimalModel + R"(, "normalizer": {"type": "Replace", "pattern": {"Regex": " +"}, "content": " "}})");
  expect_error<flex::UnsupportedError>(dir.str(), {file, "normalizer.pattern", "Regex"});
}

TEST(TokenizerErrors, SplitPreTokenizers) {
  flex_test::TempDir dir;
  const std::string file = dir.str("tokenizer.json");
  const auto split = [&](const std::string& fields) {
    write(file, "{" + kMinimalModel + R"(, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", )" +
                    fields + R"(}, {"type": "ByteLevel", "use_regex": false}]}})");
  };
  // A regex PCRE2 cannot compile, and one that needs a construct with no PCRE2
  // equivalent, are unsupported; the message names the file and the key.
  split(R"("pattern": {"Regex": "\\p{NotAProperty}+"}, "behavior": "Isolated", "invert": false)");
  expect_error<flex::UnsupportedError>(dir.str(), {file, "pre_tokenizer.pretokenizers[0].pattern.Regex", "NotAProperty"});
  split(R"("pattern": {"Regex": "[^\\S]"}, "behavior": "Isolated", "invert": false)");
  expect_error<flex::UnsupportedError>(dir.str(), {file, "pre_tokenizer.pretokenizers[0].pattern.Regex", "inside [...]"});
  // Malformed fields are format errors.
  split(R"("pattern": {"Regex": "a"}, "behavior": "Sideways", "invert": false)");
  expect_error<flex::FileFormatError>(dir.str(), {file, "pre_tokenizer.pretokenizers[0].behavior", "Sideways"});
  split(R"("pattern": {"Glob": "*"}, "behavior": "Isolated")");
  expect_error<flex::FileFormatError>(dir.str(), {file, "pre_tokenizer.pretokenizers[0].pattern"});
  // Pre-tokenizers other than Split, ByteLevel and Metaspace are unsupported.
  write(file, "{" + kMinimalModel + R"(, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "ByteLevel"}, {"type": "Digits", "individual_digits": true}]}})");
  expect_error<flex::UnsupportedError>(dir.str(), {file, "pre_tokenizer.pretokenizers[1].type", "Digits"});
  // A well-formed Split loads and runs: Removed drops the space, so "a b" is the
  // words "a" and "b" (the merge a+b cannot join them), and "ab" is one token.
  split(R"("pattern": {"String": " "}, "behavior": "Removed", "invert": false)");
  EXPECT_EQ(flex::load_tokenizer(dir.str())->encode("a b"), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(flex::load_tokenizer(dir.str())->encode("ab"), (std::vector<int64_t>{2}));
}

TEST(TokenizerErrors, BadVocabAndMergesFiles) {
  flex_test::TempDir dir;
  write(dir.str("vocab.json"), R"({"a": 0, "b": 1, "ab": 2})");
  write(dir.str("merges.txt"), "#version: 0.2\na b\nab\n");
  expect_error<flex::FileFormatError>(dir.str(), {dir.str("merges.txt"), "line 3", "'ab'"});
  write(dir.str("merges.txt"), "#version: 0.2\na c\n");
  expect_error<flex::FileFormatError>(dir.str(), {"merges.txt", "merge #0", "'c'"});
  write(dir.str("vocab.json"), "[1, 2]");
  expect_error<flex::FileFormatError>(dir.str(), {dir.str("vocab.json"), "expected an object"});
  // A well-formed pair works, and a config naming an absent special token is an error.
  write(dir.str("vocab.json"), R"({"a": 0, "b": 1, "ab": 2})");
  write(dir.str("merges.txt"), "#version: 0.2\na b\n");
  EXPECT_EQ(flex::load_tokenizer(dir.str())->encode("ab"), (std::vector<int64_t>{2}));
  write(dir.str("tokenizer_config.json"), R"({"eos_token": {"content": "</s>"}})");
  expect_error<flex::FileFormatError>(dir.str(), {"eos_token", "'</s>'"});
  write(dir.str("tokenizer_config.json"), R"({"eos_token": 5})");
  expect_error<flex::FileFormatError>(dir.str(), {"tokenizer_config.json", "eos_token"});
}
