// The tokenizer.json layouts of Gemma 3, gpt-oss (o200k_harmony), DeepSeek-V3 and
// OLMo 3, on small stand-ins (tests/data/tokenizers/<name>/README.md): every id,
// with and without the post-processor's tokens, and every decode must equal what
// Hugging Face tokenizers gave (expected.json, made by
// scripts/golden/make_tokenizers.py).
#include <flex/tokenizers/tokenizer.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data_util.h"

namespace {

using nlohmann::json;

json read_expected(const std::string& name) {
  std::ifstream in(flex_test::data_path("tokenizers/" + name + "/expected.json"), std::ios::binary);
  EXPECT_TRUE(in) << name;
  return json::parse(in);
}

// Printable form of a text for failure messages (escapes control bytes).
std::string shown(const std::string& text) { return json(text).dump(); }

class Zoo3Tokenizer : public ::testing::TestWithParam<std::string> {};

TEST_P(Zoo3Tokenizer, IdsMatchHuggingFace) {
  const std::string name = GetParam();
  const json expected = read_expected(name);
  const auto tok = flex::load_tokenizer(flex_test::data_path("tokenizers/" + name));
  ASSERT_GT(expected["cases"].size(), 20u);
  for (const json& c : expected["cases"]) {
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ(tok->encode(text, true), c["ids"].get<std::vector<int64_t>>()) << name << ": " << shown(text);
    EXPECT_EQ(tok->encode(text, false), c["ids_no_special"].get<std::vector<int64_t>>())
        << name << " (no special tokens): " << shown(text);
  }
}

TEST_P(Zoo3Tokenizer, DecodeMatchesHuggingFace) {
  const std::string name = GetParam();
  const json expected = read_expected(name);
  const auto tok = flex::load_tokenizer(flex_test::data_path("tokenizers/" + name));
  for (const json& c : expected["cases"]) {
    const auto ids = c["ids"].get<std::vector<int64_t>>();
    const std::string text = c["text"].get<std::string>();
    // Encoded text decodes to valid UTF-8, so decode() and decode_text() agree.
    for (const bool hf_text : {false, true}) {
      const auto dec = [&](bool skip) { return hf_text ? tok->decode_text(ids, skip) : tok->decode(ids, skip); };
      EXPECT_EQ(dec(false), c["decoded"].get<std::string>()) << name << ": " << shown(text);
      EXPECT_EQ(dec(true), c["decoded_skip_special"].get<std::string>()) << name << " (skip special): " << shown(text);
    }
  }
}

// Any id list, as a model may generate: Hugging Face writes U+FFFD for each token
// of a byte-fallback run that is not valid UTF-8, and decode_text() must too.
TEST_P(Zoo3Tokenizer, DecodeTextOfAnyIdsMatchesHuggingFace) {
  const std::string name = GetParam();
  const json expected = read_expected(name);
  const auto tok = flex::load_tokenizer(flex_test::data_path("tokenizers/" + name));
  ASSERT_GE(expected["decode_cases"].size(), 40u);
  for (const json& c : expected["decode_cases"]) {
    const auto ids = c["ids"].get<std::vector<int64_t>>();
    EXPECT_EQ(tok->decode_text(ids, false), c["decoded"].get<std::string>()) << name << ": " << c["ids"].dump();
    EXPECT_EQ(tok->decode_text(ids, true), c["decoded_skip_special"].get<std::string>())
        << name << " (skip special): " << c["ids"].dump();
  }
}

TEST_P(Zoo3Tokenizer, SpecialIdsAndSizeMatchHuggingFace) {
  const std::string name = GetParam();
  const json expected = read_expected(name);
  const auto tok = flex::load_tokenizer(flex_test::data_path("tokenizers/" + name));
  EXPECT_EQ(tok->vocab_size(), expected["vocab_size"].get<int64_t>());
  const json& ids = expected["special_ids"];
  const auto check = [&](const char* key, std::optional<int64_t> got) {
    if (ids.contains(key)) {
      EXPECT_EQ(got, std::optional<int64_t>(ids[key].get<int64_t>())) << name << " " << key;
    } else {
      EXPECT_EQ(got, std::nullopt) << name << " " << key;
    }
  };
  check("bos", tok->bos_id());
  check("eos", tok->eos_id());
  check("pad", tok->pad_id());
  check("unk", tok->unk_id());
}

INSTANTIATE_TEST_SUITE_P(Published, Zoo3Tokenizer, ::testing::Values("gemma3", "gpt_oss", "deepseek_v3", "olmo3"));

}  // namespace
