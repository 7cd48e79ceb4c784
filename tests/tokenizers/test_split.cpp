// The Split pre-tokenizer: its five behaviors, the Oniguruma meaning of \s \w \h
// and ^ on PCRE2, empty matches, and the GPT-2 / Llama 3 / Qwen2 patterns. Every
// expected list below was worked out by hand from the pattern; the behavior,
// escape and empty-match cases were also checked against Hugging Face tokenizers
// 0.23.2 (see tests/data/tokenizers/README.md).
#include <flex/hooks/errors.h>
#include <flex/tokenizers/split.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

using V = std::vector<std::string>;

namespace {

const char* const kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

V pieces(const std::string& s, const flex::SplitPattern& p, flex::SplitBehavior b = flex::SplitBehavior::Isolated,
         bool invert = false) {
  V out;
  for (const auto& [off, len] : flex::split_pieces(s, p, b, invert)) out.push_back(s.substr(off, len));
  return out;
}

V regex_pieces(const std::string& s, const std::string& re, flex::SplitBehavior b = flex::SplitBehavior::Isolated) {
  return pieces(s, flex::SplitPattern::regex(re, "test"), b);
}

// Isolated pieces of the GPT-2 pattern, checking that they tile the text.
V gpt2(const std::string& s) {
  V out;
  size_t covered = 0;
  for (const auto& [off, len] : flex::split_pieces(s, flex::gpt2_split_pattern(), flex::SplitBehavior::Isolated)) {
    EXPECT_EQ(off, covered) << "pieces must tile the text";
    covered = off + len;
    out.push_back(s.substr(off, len));
  }
  EXPECT_EQ(covered, s.size());
  return out;
}

}  // namespace

TEST(TokenizerSplit, BehaviorsOnALiteralDelimiter) {
  // Hugging Face's own documentation example.
  using B = flex::SplitBehavior;
  const auto dash = flex::SplitPattern::literal("-");
  const std::string s = "the-final--countdown";
  EXPECT_EQ(pieces(s, dash, B::Removed), (V{"the", "final", "countdown"}));
  EXPECT_EQ(pieces(s, dash, B::Isolated), (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(pieces(s, dash, B::MergedWithPrevious), (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(pieces(s, dash, B::MergedWithNext), (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(pieces(s, dash, B::Contiguous), (V{"the", "-", "final", "--", "countdown"}));
  // invert swaps what counts as a match: Removed keeps only the dashes, and
  // MergedWithPrevious now merges each word into the dash before it.
  EXPECT_EQ(pieces(s, dash, B::Removed, true), (V{"-", "-", "-"}));
  EXPECT_EQ(pieces(s, dash, B::MergedWithPrevious, true), (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(pieces(s, dash, B::MergedWithNext, true), (V{"the-", "final-", "-", "countdown"}));
  // No match, an empty text, an empty literal.
  EXPECT_EQ(pieces("abc", dash, B::Removed), (V{"abc"}));
  EXPECT_TRUE(pieces("", dash).empty());
  EXPECT_EQ(pieces("a-b", flex::SplitPattern::literal("")), (V{"a-b"}));
  // Gemma's Split(" ", MergedWithPrevious): the space stays with the word before it.
  EXPECT_EQ(pieces("a b  c", flex::SplitPattern::literal(" "), B::MergedWithPrevious), (V{"a ", "b ", " ", "c"}));
}

TEST(TokenizerSplit, EmptyMatchesFollowOniguruma) {
  // x* matches the empty string between letters; an empty match right after a
  // match is skipped, as in the Rust onig crate. Empty pieces are dropped.
  using B = flex::SplitBehavior;
  EXPECT_EQ(regex_pieces("abxxc", "x*", B::Isolated), (V{"a", "b", "xx", "c"}));
  EXPECT_EQ(regex_pieces("abxxc", "x*", B::MergedWithPrevious), (V{"a", "bxx", "c"}));
  EXPECT_EQ(regex_pieces("abxxc", "x*", B::Removed), (V{"a", "b", "c"}));
}

TEST(TokenizerSplit, OnigurumaEscapesAndAnchors) {
  using B = flex::SplitBehavior;
  // ^ matches after every line break (Ruby syntax), not only at the start.
  EXPECT_EQ(regex_pieces("  a\n  b", R"(^\s+)"), (V{"  ", "a\n", "  ", "b"}));
  // \w: letters, marks, numbers and connector punctuation.
  EXPECT_EQ(regex_pieces("\xC3\xA9_x1 ab", R"(\w+)"), (V{"\xC3\xA9_x1", " ", "ab"}));
  // \h is a hex digit in Oniguruma (PCRE2 would read horizontal space).
  EXPECT_EQ(regex_pieces("0xfF9g", R"(\h+)"), (V{"0", "x", "fF9", "g"}));
  // \s is Unicode White_Space: U+0085 is a space, U+180E (a format character
  // since Unicode 6.3, still in PCRE2's \h) is not.
  EXPECT_EQ(regex_pieces("a\xE1\xA0\x8E" "b\xC2\x85" "c", R"(\s)", B::Removed), (V{"a\xE1\xA0\x8E" "b", "c"}));
  EXPECT_EQ(regex_pieces("a\xE1\xA0\x8E" "b c", R"(\S+)"), (V{"a\xE1\xA0\x8E" "b", " ", "c"}));
  // A ']' first in a class is a literal, as is everything in a nested class.
  EXPECT_EQ(regex_pieces("a]b", R"([]]+)"), (V{"a", "]", "b"}));
  EXPECT_EQ(regex_pieces("a b\tc", R"([^\s])"), (V{"a", " ", "b", "\t", "c"}));
}

TEST(TokenizerSplit, PatternsPcre2CannotRunAreUnsupported) {
  try {
    flex::SplitPattern::regex(R"(\p{NotAProperty})", "f.json: pre_tokenizer.pattern.Regex");
    FAIL() << "expected UnsupportedError";
  } catch (const flex::UnsupportedError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("f.json: pre_tokenizer.pattern.Regex"), std::string::npos) << m;
    EXPECT_NE(m.find("NotAProperty"), std::string::npos) << m;
  }
  // A negated escape inside brackets has no explicit Oniguruma-equivalent class.
  EXPECT_THROW(flex::SplitPattern::regex(R"([^\S])", "test"), flex::UnsupportedError);
}

TEST(TokenizerSplit, Gpt2Pattern) {
  // Words keep one leading space; the last space of a run before a word joins it.
  EXPECT_EQ(gpt2("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(gpt2("a  b"), (V{"a", " ", " b"}));
  EXPECT_EQ(gpt2("   x"), (V{"  ", " x"}));
  // \s+(?!\S) takes a whole run at the end; a lone tab before a word stands alone.
  EXPECT_EQ(gpt2("x \n\n"), (V{"x", " \n\n"}));
  EXPECT_EQ(gpt2("\tx"), (V{"\t", "x"}));
  // Contractions are lower-case only; "'S" is punctuation + letters.
  EXPECT_EQ(gpt2("it's we'll I'M"), (V{"it", "'s", " we", "'ll", " I", "'", "M"}));
  // Numbers, letters and other characters form separate runs; " ?" prefixes each.
  EXPECT_EQ(gpt2("abc123def 45!?"), (V{"abc", "123", "def", " 45", "!?"}));
  EXPECT_EQ(gpt2("e\xCC\x81"), (V{"e", "\xCC\x81"}));  // a combining mark is not a letter
  EXPECT_EQ(gpt2(" \xF0\x9F\x98\x80!"), (V{" \xF0\x9F\x98\x80!"}));
  // Invalid bytes never match: they form pieces of their own and never get lost
  // (a space before them is then a piece too).
  EXPECT_EQ(gpt2("a\xFF\xFE b"), (V{"a", "\xFF\xFE", " b"}));
  EXPECT_EQ(gpt2("x \xFF"), (V{"x", " ", "\xFF"}));
  EXPECT_TRUE(gpt2("").empty());
}

TEST(TokenizerSplit, Llama3Pattern) {
  // Case-insensitive contractions; numbers in groups of at most three; a lone space
  // before a digit is its own piece; punctuation takes the newlines after it; the
  // last space of a run joins the next word.
  EXPECT_EQ(regex_pieces("I'M 12345 hi!\n\n  x", kLlama3), (V{"I", "'M", " ", "123", "45", " hi", "!\n\n", " ", " x"}));
  // Any one non-letter, non-digit, non-newline character (a tab here) prefixes a
  // word; a whitespace run ends at its last newline.
  EXPECT_EQ(regex_pieces("\tword a\n\n b", kLlama3), (V{"\tword", " a", "\n\n", " b"}));
  EXPECT_EQ(regex_pieces("x \r\n y", kLlama3), (V{"x", " \r\n", " y"}));
  // (?i) folds case as Unicode does: LONG S (U+017F) is an 's'.
  EXPECT_EQ(regex_pieces("'\xC5\xBF" "a", kLlama3), (V{"'\xC5\xBF", "a"}));
}

TEST(TokenizerSplit, Qwen2PatternSplitsDigitsOneByOne) {
  // Qwen2's pattern is Llama 3's with \p{N} in place of \p{N}{1,3}.
  EXPECT_EQ(regex_pieces("I'M 12345 hi", kQwen2), (V{"I", "'M", " ", "1", "2", "3", "4", "5", " hi"}));
  // Any Unicode number, one at a time: Arabic-Indic 3, VULGAR FRACTION ONE HALF.
  EXPECT_EQ(regex_pieces("x\xD9\xA3\xC2\xBD", kQwen2), (V{"x", "\xD9\xA3", "\xC2\xBD"}));
  // "'S" is the contraction even in capitals: "'S" then "ok", not "'Sok".
  EXPECT_EQ(regex_pieces("IT'Sok", kQwen2), (V{"IT", "'S", "ok"}));
}

TEST(TokenizerSplit, LongRunsNeedNoBacktrackingStack) {
  // A megabyte of one class (spaces, newlines, letters, digits) splits without
  // hitting PCRE2's JIT stack or match limits.
  const std::string spaces(1 << 20, ' ');
  EXPECT_EQ(gpt2(spaces + "x"), (V{std::string((1 << 20) - 1, ' '), " x"}));
  const auto newlines = flex::split_pieces(std::string(1 << 20, '\n') + "x", flex::SplitPattern::regex(kQwen2, "test"),
                                           flex::SplitBehavior::Isolated);
  ASSERT_EQ(newlines.size(), 2u);
  EXPECT_EQ(newlines[0].second, 1u << 20);
  const std::string letters(1 << 20, 'a');
  EXPECT_EQ(regex_pieces(letters, kLlama3), (V{letters}));
  EXPECT_EQ(regex_pieces(std::string(3000, '7'), kQwen2).size(), 3000u);
}
