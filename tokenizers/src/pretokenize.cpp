// The pre-tokenizer steps: a normalized piece of text -> the words the BPE model
// sees. Each step cuts every word of the step before it further, as Hugging
// Face's PreTokenizedString::split does. Words stream from one step to the next
// (depth first) instead of being collected per step: a long text has about one
// word per 4 bytes, and copying them all between steps cost more than the regex.
#include <flex/tokenizers/bpe.h>

namespace flex {
namespace {

using PreStep = BpeSpec::PreTokenizeStep;

void replace_spaces(std::string& s, const std::string& rep) {
  if (s.find(' ') == std::string::npos) return;
  std::string out;
  out.reserve(s.size() + 8 * rep.size());
  for (char c : s) {
    if (c == ' ') {
      out += rep;
    } else {
      out += c;
    }
  }
  s.swap(out);
}

// Runs steps[k..] on one word, then the model on each word that comes out.
class Pipeline {
 public:
  Pipeline(const std::vector<PreStep>& steps, const BpeModel& model, std::vector<int64_t>& out)
      : steps_(steps), model_(model), out_(out), scratch_(2 * steps.size()) {}

  // `at_start`: the word begins at byte 0 of the input (Metaspace "first").
  void run(size_t k, const std::string& word, bool at_start) {
    if (k == steps_.size()) {
      model_.encode_word(word, out_);
      return;
    }
    const PreStep& step = steps_[k];
    switch (step.kind) {
      case PreStep::Kind::Split:
        emit_pieces(k, word, split_pieces(word, step.pattern, step.behavior, step.invert), at_start);
        return;
      case PreStep::Kind::ByteLevel:
        byte_level(k, word, at_start);
        return;
      case PreStep::Kind::Metaspace:
        metaspace(k, word, at_start);
        return;
    }
  }

 private:
  // Two buffers per step, reused across words: the step's rewritten text, and the
  // piece handed on (the next step may still need the text).
  std::string& text_buf(size_t k) { return scratch_[2 * k]; }
  std::string& piece_buf(size_t k) { return scratch_[2 * k + 1]; }

  void emit_pieces(size_t k, const std::string& text, const std::vector<std::pair<size_t, size_t>>& pieces,
                   bool at_start) {
    std::string& piece = piece_buf(k);
    for (const auto& [off, len] : pieces) {
      piece.assign(text, off, len);
      run(k + 1, piece, at_start && off == 0);
    }
  }

  void byte_level(size_t k, const std::string& word, bool at_start) {
    const PreStep& step = steps_[k];
    const std::string* text = &word;
    if (step.add_prefix_space && word.compare(0, 1, " ") != 0) {
      text_buf(k).assign(" ").append(word);
      text = &text_buf(k);
    }
    const auto& chars = byte_level_chars();
    std::string& mapped = piece_buf(k);
    const auto map = [&](size_t off, size_t len) {
      if (len == 0) return;
      mapped.clear();
      for (size_t i = off; i < off + len; ++i) mapped += chars[static_cast<uint8_t>((*text)[i])];
      run(k + 1, mapped, at_start && off == 0);
    };
    if (!step.use_regex) {
      map(0, text->size());
      return;
    }
    for (const auto& [off, len] : split_pieces(*text, gpt2_split_pattern(), SplitBehavior::Isolated)) map(off, len);
  }

  void metaspace(size_t k, const std::string& word, bool at_start) {
    const PreStep& step = steps_[k];
    const std::string& rep = step.replacement;
    std::string& text = text_buf(k);
    text = word;
    replace_spaces(text, rep);
    const bool prepend = step.prepend_scheme == BpeSpec::PrependScheme::Always ||
                         (step.prepend_scheme == BpeSpec::PrependScheme::First && at_start);
    if (prepend && !text.empty() && text.compare(0, rep.size(), rep) != 0) text.insert(0, rep);
    if (!step.split) {
      run(k + 1, text, at_start);
      return;
    }
    // Each replacement character starts a new word and stays at its front.
    emit_pieces(k, text, split_pieces(text, SplitPattern::literal(rep), SplitBehavior::MergedWithNext), at_start);
  }

  const std::vector<PreStep>& steps_;
  const BpeModel& model_;
  std::vector<int64_t>& out_;
  std::vector<std::string> scratch_;
};

}  // namespace

BpeSpec::PreTokenizeStep BpeSpec::PreTokenizeStep::split_on(SplitPattern pattern, SplitBehavior behavior, bool invert) {
  PreTokenizeStep s;
  s.kind = Kind::Split, s.pattern = std::move(pattern), s.behavior = behavior, s.invert = invert;
  return s;
}

BpeSpec::PreTokenizeStep BpeSpec::PreTokenizeStep::byte_level(bool add_prefix_space, bool use_regex) {
  PreTokenizeStep s;
  s.kind = Kind::ByteLevel, s.add_prefix_space = add_prefix_space, s.use_regex = use_regex;
  return s;
}

BpeSpec::PreTokenizeStep BpeSpec::PreTokenizeStep::metaspace(std::string replacement, PrependScheme scheme, bool split) {
  PreTokenizeStep s;
  s.kind = Kind::Metaspace, s.replacement = std::move(replacement), s.prepend_scheme = scheme, s.split = split;
  return s;
}

void BpeTokenizer::encode_text(const std::string& text, bool at_start, std::vector<int64_t>& out) const {
  Pipeline(spec_.pre_tokenizer, model_, out).run(0, text, at_start);
}

}  // namespace flex
