// The Split pre-tokenizer's behaviors, over the spans a pattern finds. The rules
// are Hugging Face's NormalizedString::split, applied while the spans stream in
// (a long text has about one span per 4 bytes, so no list of them is kept), and
// give the same pieces in the corner cases: empty matches, adjacent delimiters.
#include <flex/tokenizers/split.h>

namespace flex {

const char* const kGpt2SplitRegex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

const SplitPattern& gpt2_split_pattern() {
  static const SplitPattern pattern = SplitPattern::regex(kGpt2SplitRegex, "ByteLevel pre-tokenizer: GPT-2 pattern");
  return pattern;
}

SplitPattern SplitPattern::literal(std::string s) {
  SplitPattern p;
  p.literal_ = std::move(s);
  return p;
}

void SplitPattern::for_each_span(const std::string& text, const std::function<void(const SplitSpan&)>& visit) const {
  if (regex_) {
    regex_spans(text, visit);
    return;
  }
  if (text.empty()) return;
  size_t prev = 0;
  if (!literal_.empty()) {
    for (size_t hit; (hit = text.find(literal_, prev)) != std::string::npos; prev = hit + literal_.size()) {
      if (hit > prev) visit({prev, hit - prev, false});
      visit({hit, literal_.size(), true});
    }
  }
  if (prev < text.size()) visit({prev, text.size() - prev, false});
}

std::vector<SplitSpan> SplitPattern::find_matches(const std::string& text) const {
  std::vector<SplitSpan> spans;
  for_each_span(text, [&](const SplitSpan& s) { spans.push_back(s); });
  return spans;
}

std::vector<std::pair<size_t, size_t>> split_pieces(const std::string& text, const SplitPattern& pattern,
                                                    SplitBehavior behavior, bool invert) {
  std::vector<std::pair<size_t, size_t>> pieces;
  // The piece being built: kept back while a later span may still join it.
  bool open = false;
  size_t open_off = 0, open_end = 0;
  const auto close = [&] {
    if (open && open_end > open_off) pieces.emplace_back(open_off, open_end - open_off);  // empty pieces are dropped
    open = false;
  };
  const auto start = [&](const SplitSpan& s) {
    close();
    open = true, open_off = s.off, open_end = s.off + s.len;
  };
  bool prev_match = false;  // whether the span before this one matched
  pattern.for_each_span(text, [&](const SplitSpan& span) {
    const bool match = span.match != invert;
    switch (behavior) {
      case SplitBehavior::Removed:
        if (!match) start(span);
        break;
      case SplitBehavior::Isolated:
        start(span);
        break;
      case SplitBehavior::MergedWithPrevious:
        // A match joins the piece before it, unless that piece was a match too.
        if (match && !prev_match && open) {
          open_end = span.off + span.len;
        } else {
          start(span);
        }
        break;
      case SplitBehavior::MergedWithNext:
        // A match waits for the next span: a non-match joins it, a match does not.
        if (open && prev_match && !match) {
          open_end = span.off + span.len;
          prev_match = false;
          return;  // this piece is complete only when the next span starts one
        }
        start(span);
        break;
      case SplitBehavior::Contiguous:
        if (match == prev_match && open) {
          open_end = span.off + span.len;
        } else {
          start(span);
        }
        break;
    }
    prev_match = match;
  });
  close();
  return pieces;
}

}  // namespace flex
