#pragma once
// Hugging Face's Split pre-tokenizer: a pattern (a literal string, or a regex as
// tokenizer.json writes it) finds delimiters, and a behavior says what becomes of
// them. Regexes run on PCRE2 (UTF, Unicode properties, JIT), so GPT-2's, Llama 3's,
// Qwen2's or any other model's split pattern goes through the same code.
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace flex {

/// What a Split does with the matches of its pattern (Hugging Face's
/// SplitDelimiterBehavior). Splitting "the-final--countdown" on "-":
///   Removed             the | final | countdown
///   Isolated            the | - | final | - | - | countdown
///   MergedWithPrevious  the- | final- | - | countdown
///   MergedWithNext      the | -final | - | -countdown
///   Contiguous          the | - | final | -- | countdown
enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

/// A byte range of a text, and whether the pattern matched it.
struct SplitSpan {
  size_t off = 0, len = 0;
  bool match = false;
};

/// The pattern of a Split: a literal string or a regex. Copies share one compiled
/// regex; using it from several threads at once is safe.
class SplitPattern {
 public:
  /// Matches nothing.
  SplitPattern() = default;

  /// Every occurrence of `s`, left to right, not overlapping; "" matches nothing.
  static SplitPattern literal(std::string s);

  /// A regex in the Oniguruma (Ruby) syntax of tokenizer.json files, which Hugging
  /// Face runs with Oniguruma: \s, \w and \h keep Oniguruma's meanings (Unicode
  /// White_Space; letters, marks, numbers and connectors; hex digits) and ^ $ match
  /// at line breaks. `where` ("FILE: KEY") starts every error message. A pattern
  /// PCRE2 cannot compile throws flex::UnsupportedError.
  static SplitPattern regex(const std::string& pattern, const std::string& where);

  /// Hugging Face's find_matches: spans that cover `text` in order, the matches and
  /// the gaps between them (an empty match is an empty span). Invalid UTF-8 bytes
  /// never match, so they always land in gaps.
  std::vector<SplitSpan> find_matches(const std::string& text) const;

  /// The same spans, handed to `visit` one at a time (no vector of them).
  void for_each_span(const std::string& text, const std::function<void(const SplitSpan&)>& visit) const;

 private:
  struct Regex;
  void regex_spans(const std::string& text, const std::function<void(const SplitSpan&)>& visit) const;

  std::string literal_;
  std::shared_ptr<const Regex> regex_;
};

/// (byte offset, byte length) of the pieces that Split(pattern, behavior, invert)
/// cuts `text` into. Empty pieces are dropped, as Hugging Face does.
std::vector<std::pair<size_t, size_t>> split_pieces(const std::string& text, const SplitPattern& pattern,
                                                    SplitBehavior behavior, bool invert = false);

/// GPT-2's pre-tokenization regex; ByteLevel(use_regex = true) splits with it.
extern const char* const kGpt2SplitRegex;

/// The GPT-2 regex compiled once (ByteLevel's built-in split).
const SplitPattern& gpt2_split_pattern();

}  // namespace flex
