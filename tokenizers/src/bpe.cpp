// The BPE tokenizer pipeline: added tokens, normalizer, pre-tokenizer (see
// pretokenize.cpp), model, post-processor on the way in; decoder steps
// on the way out.
#include <flex/hooks/errors.h>
#include <flex/tokenizers/bpe.h>
#include <flex/tokenizers/unicode.h>

#include "message.h"

#include <algorithm>

namespace flex {
namespace {

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size()) {
    out.append(s, pos, hit - pos);
    out += to;
  }
  out.append(s, pos, std::string::npos);
  s.swap(out);
}

bool space_at(const std::string& s, size_t pos, size_t* len) {
  const unicode::Utf8Unit u = unicode::decode_utf8(s, pos);
  *len = u.len;
  return u.valid && unicode::is_whitespace(u.cp);
}

// Byte offset after the leading whitespace of s[from, to).
size_t skip_space(const std::string& s, size_t from, size_t to) {
  size_t len;
  while (from < to && space_at(s, from, &len)) from += len;
  return from;
}

// Byte offset where the trailing whitespace of s[from, to) begins.
size_t trim_space_end(const std::string& s, size_t from, size_t to) {
  size_t keep = from, len;
  for (size_t pos = from; pos < to; pos += len) {
    if (!space_at(s, pos, &len)) keep = pos + len;
  }
  return keep;
}

bool is_word_char(const std::string& s, size_t pos) {
  const unicode::Utf8Unit u = unicode::decode_utf8(s, pos);
  return u.valid && (unicode::is_letter(u.cp) || unicode::is_number(u.cp) || u.cp == '_');
}

// Whether the character ending at byte `end` (exclusive) is a word character.
bool word_char_before(const std::string& s, size_t end) {
  if (end == 0) return false;
  size_t start = end - 1;
  while (start > 0 && end - start < 4 && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
  return is_word_char(s, start);
}

// "<0xNN>" -> NN, or -1.
int parse_byte_token(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  int v = 0;
  for (int k = 3; k < 5; ++k) {
    const char c = t[k];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

constexpr const char* kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

bool valid_utf8(const std::string& s) {
  for (size_t pos = 0; pos < s.size();) {
    const unicode::Utf8Unit u = unicode::decode_utf8(s, pos);
    if (!u.valid) return false;
    pos += u.len;
  }
  return true;
}

// U+0100.. back to bytes for the byte-level decoder; -1 for other characters.
const std::vector<int>& byte_level_inverse() {
  static const std::vector<int> inv = [] {
    std::vector<int> v(0x200, -1);
    const auto& chars = byte_level_chars();
    for (int b = 0; b < 256; ++b) v[unicode::decode_utf8(chars[b], 0).cp] = b;
    return v;
  }();
  return inv;
}

}  // namespace

const std::vector<std::string>& byte_level_chars() {
  static const std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      // Printable ASCII and Latin-1 (except the soft hyphen) stand for themselves.
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      unicode::append_utf8(t[b], printable ? static_cast<uint32_t>(b) : next++);
    }
    return t;
  }();
  return table;
}

BpeTokenizer::BpeTokenizer(BpeSpec spec) : spec_(std::move(spec)), model_(spec_) {
  for (const AddedToken& t : spec_.added_tokens) {
    if (t.content.empty()) throw FileFormatError(cat(spec_.source, ": added token ", t.id, " has empty content"));
    if (t.id < 0) throw FileFormatError(cat(spec_.source, ": added token '", t.content, "' has negative id ", t.id));
    if (!added_by_content_.emplace(t.content, t.id).second) {
      throw FileFormatError(cat(spec_.source, ": added token '", t.content, "' appears twice"));
    }
  }
  for (const AddedToken& t : spec_.added_tokens) {
    added_by_id_[t.id] = &t;
    if (t.normalized && !spec_.normalizer.empty()) {
      // Matched in normalized text, so its pattern is its normalized content.
      AddedToken n = t;
      n.content = normalize(t.content);
      norm_added_.tokens.push_back(std::move(n));
    } else {
      raw_added_.tokens.push_back(t);
    }
  }
  for (AddedList* list : {&raw_added_, &norm_added_}) {
    // Longest first, so the first match at a position is the longest one.
    std::stable_sort(list->tokens.begin(), list->tokens.end(),
                     [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
    for (const AddedToken& t : list->tokens) {
      if (t.content.empty()) continue;  // a normalizer may empty a content
      const auto b = static_cast<uint8_t>(t.content[0]);
      list->starts[b] = true;
      list->starts_mid_char = list->starts_mid_char || (b & 0xC0) == 0x80;
    }
  }
  const auto check = [&](const std::vector<int64_t>& ids, const char* what) {
    for (int64_t id : ids) {
      if (!id_to_token(id)) throw FileFormatError(cat(spec_.source, ": post_processor ", what, " id ", id, " is not a token"));
    }
  };
  check(spec_.prefix_ids, "prefix");
  check(spec_.suffix_ids, "suffix");
}

std::vector<BpeTokenizer::Piece> BpeTokenizer::split_added(const std::string& text, bool normalized,
                                                           bool at_start) const {
  const AddedList& list = normalized ? norm_added_ : raw_added_;
  std::vector<Piece> pieces;
  if (list.tokens.empty()) {
    if (!text.empty()) pieces.push_back({text, -1, at_start});
    return pieces;
  }
  size_t seg = 0;  // start of the text not yet emitted
  size_t pos = 0;
  while (pos < text.size()) {
    // A token can only start at a character boundary. Every byte that is not a
    // continuation byte begins a unit (decode_utf8 never lets an ill-formed unit
    // swallow one), so unless a token begins with a continuation byte, stepping
    // byte by byte and trying only the bytes tokens start with finds the same hits.
    if (!list.starts[static_cast<uint8_t>(text[pos])]) {
      pos += list.starts_mid_char ? unicode::decode_utf8(text, pos).len : 1;
      continue;
    }
    const AddedToken* hit = nullptr;
    for (const AddedToken& t : list.tokens) {
      if (t.content.empty() || text.compare(pos, t.content.size(), t.content) != 0) continue;
      const size_t end = pos + t.content.size();
      if (t.single_word && (word_char_before(text, pos) || (end < text.size() && is_word_char(text, end)))) continue;
      hit = &t;
      break;
    }
    if (!hit) {
      pos += unicode::decode_utf8(text, pos).len;
      continue;
    }
    size_t before_end = hit->lstrip ? trim_space_end(text, seg, pos) : pos;
    if (before_end > seg) pieces.push_back({text.substr(seg, before_end - seg), -1, at_start && seg == 0});
    pieces.push_back({hit->content, hit->id, false});
    pos += hit->content.size();
    if (hit->rstrip) pos = skip_space(text, pos, text.size());
    seg = pos;
  }
  if (seg < text.size()) pieces.push_back({text.substr(seg), -1, at_start && seg == 0});
  return pieces;
}

std::string BpeTokenizer::normalize(const std::string& text) const {
  std::string s = text;
  for (const auto& step : spec_.normalizer) {
    switch (step.kind) {
      case BpeSpec::NormalizeStep::Kind::Prepend:
        if (!s.empty()) s.insert(0, step.a);
        break;
      case BpeSpec::NormalizeStep::Kind::Replace:
        replace_all(s, step.a, step.b);
        break;
      case BpeSpec::NormalizeStep::Kind::NFC:
        s = unicode::nfc(s);
        break;
    }
  }
  return s;
}

std::vector<int64_t> BpeTokenizer::encode(const std::string& text, bool add_special_tokens) const {
  std::vector<int64_t> out;
  if (add_special_tokens) out = spec_.prefix_ids;
  for (const Piece& raw : split_added(text, false, true)) {
    if (raw.id >= 0) {
      out.push_back(raw.id);
      continue;
    }
    const std::string norm = normalize(raw.text);
    for (const Piece& p : split_added(norm, true, raw.at_start)) {
      if (p.id >= 0) {
        out.push_back(p.id);
      } else {
        encode_text(p.text, p.at_start, out);
      }
    }
  }
  if (add_special_tokens) out.insert(out.end(), spec_.suffix_ids.begin(), spec_.suffix_ids.end());
  return out;
}

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  return run_decoder(ids, skip_special_tokens, false);
}

std::string BpeTokenizer::decode_text(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  // What the byte-level decoder leaves invalid, Hugging Face replaces per maximal
  // subsequence (Rust's from_utf8_lossy), as sanitize_utf8 does.
  return sanitize_utf8(run_decoder(ids, skip_special_tokens, true));
}

std::string BpeTokenizer::run_decoder(const std::vector<int64_t>& ids, bool skip_special_tokens, bool hf_text) const {
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (int64_t id : ids) {
    auto t = id_to_token(id);
    if (!t) {
      throw NotFoundError(cat(spec_.source, ": token id ", id, " is not in the vocabulary (ids 0..", vocab_size() - 1, ")"));
    }
    if (skip_special_tokens && is_special(id)) continue;
    toks.push_back(std::move(*t));
  }
  if (!spec_.decoder) {
    std::string out;
    for (size_t k = 0; k < toks.size(); ++k) out += (k ? " " : "") + toks[k];
    return out;
  }
  using K = BpeSpec::DecodeStep::Kind;
  for (const auto& step : *spec_.decoder) {
    switch (step.kind) {
      case K::ByteLevel: {
        // Each token maps back to bytes; a token with a character outside the table
        // (an added token such as "<|endoftext|>" is fine either way) keeps its text.
        const auto& inv = byte_level_inverse();
        for (std::string& t : toks) {
          std::string bytes;
          bool ok = true;
          for (size_t pos = 0; pos < t.size() && ok;) {
            const unicode::Utf8Unit u = unicode::decode_utf8(t, pos);
            ok = u.valid && u.cp < inv.size() && inv[u.cp] >= 0;
            if (ok) bytes += static_cast<char>(inv[u.cp]);
            pos += u.len;
          }
          if (ok) t.swap(bytes);
        }
        break;
      }
      case K::Replace:
        for (std::string& t : toks) replace_all(t, step.a, step.b);
        break;
      case K::ByteFallback: {
        // Runs of <0xNN> tokens become their bytes. decode() keeps them as they
        // are, even when they are not valid UTF-8 (so invalid input round-trips);
        // Hugging Face puts one U+FFFD per token of such a run instead.
        std::vector<std::string> merged;
        size_t run_tokens = 0;  // byte tokens in the run that merged.back() holds
        const auto close_run = [&] {
          if (hf_text && run_tokens > 0 && !valid_utf8(merged.back())) {
            merged.back().clear();
            for (size_t k = 0; k < run_tokens; ++k) merged.back() += kReplacementChar;
          }
          run_tokens = 0;
        };
        for (std::string& t : toks) {
          const int b = parse_byte_token(t);
          if (b >= 0) {
            if (run_tokens == 0) merged.emplace_back();
            merged.back() += static_cast<char>(b);
            ++run_tokens;
          } else {
            close_run();
            merged.push_back(std::move(t));
          }
        }
        close_run();
        toks.swap(merged);
        break;
      }
      case K::Fuse: {
        std::string all;
        for (const std::string& t : toks) all += t;
        toks.assign(1, std::move(all));
        break;
      }
      case K::Strip:
        for (std::string& t : toks) {
          size_t from = 0, to = t.size();
          for (int k = 0; k < step.start && to - from >= step.a.size() && t.compare(from, step.a.size(), step.a) == 0; ++k)
            from += step.a.size();
          for (int k = 0; k < step.stop && to - from >= step.a.size() && t.compare(to - step.a.size(), step.a.size(), step.a) == 0; ++k)
            to -= step.a.size();
          t = t.substr(from, to - from);
        }
        break;
      case K::Metaspace:
        // Hugging Face drops every replacement character of the first token (the
        // prepended one, and any others with it) unless the scheme is "never".
        for (size_t k = 0; k < toks.size(); ++k) {
          const bool first = k == 0 && step.prepend_scheme != BpeSpec::PrependScheme::Never;
          replace_all(toks[k], step.a, first ? "" : " ");
        }
        break;
    }
  }
  std::string out;
  for (const std::string& t : toks) out += t;
  return out;
}

int64_t BpeTokenizer::vocab_size() const {
  int64_t n = model_.size();
  for (const AddedToken& t : spec_.added_tokens) n = std::max(n, t.id + 1);
  return n;
}

std::optional<int64_t> BpeTokenizer::token_to_id(const std::string& token) const {
  auto it = added_by_content_.find(token);
  if (it != added_by_content_.end()) return it->second;
  return model_.token_to_id(token);
}

std::optional<std::string> BpeTokenizer::id_to_token(int64_t id) const {
  auto it = added_by_id_.find(id);
  if (it != added_by_id_.end()) return it->second->content;
  if (const std::string* t = model_.id_to_token(id)) return *t;
  return std::nullopt;
}

bool BpeTokenizer::is_special(int64_t id) const {
  auto it = added_by_id_.find(id);
  return it != added_by_id_.end() && it->second->special;
}

}  // namespace flex
