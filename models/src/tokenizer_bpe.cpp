// The BPE tokenizer pipeline: added tokens, normalizer, pre-tokenizer, model,
// post-processor on the way in; decoder steps on the way out.
#include <flex/hooks/errors.h>
#include <flex/models/tokenizer_bpe.h>
#include <flex/models/tokenizer_unicode.h>

#include <fmt/format.h>

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
    if (t.content.empty()) throw FileFormatError(fmt::format("{}: added token {} has empty content", spec_.source, t.id));
    if (t.id < 0) throw FileFormatError(fmt::format("{}: added token '{}' has negative id {}", spec_.source, t.content, t.id));
    if (!added_by_content_.emplace(t.content, t.id).second) {
      throw FileFormatError(fmt::format("{}: added token '{}' appears twice", spec_.source, t.content));
    }
  }
  for (const AddedToken& t : spec_.added_tokens) {
    added_by_id_[t.id] = &t;
    if (t.normalized && !spec_.normalizer.empty()) {
      // Matched in normalized text, so its pattern is its normalized content.
      AddedToken n = t;
      n.content = normalize(t.content);
      norm_added_.push_back(std::move(n));
    } else {
      raw_added_.push_back(t);
    }
  }
  // Longest first, so the first match at a position is the longest one.
  for (auto* list : {&raw_added_, &norm_added_}) {
    std::stable_sort(list->begin(), list->end(),
                     [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  }
  const auto check = [&](const std::vector<int64_t>& ids, const char* what) {
    for (int64_t id : ids) {
      if (!id_to_token(id)) throw FileFormatError(fmt::format("{}: post_processor {} id {} is not a token", spec_.source, what, id));
    }
  };
  check(spec_.prefix_ids, "prefix");
  check(spec_.suffix_ids, "suffix");
}

std::vector<BpeTokenizer::Piece> BpeTokenizer::split_added(const std::string& text, bool normalized,
                                                           bool at_start) const {
  const auto& tokens = normalized ? norm_added_ : raw_added_;
  std::vector<Piece> pieces;
  size_t seg = 0;  // start of the text not yet emitted
  size_t pos = 0;
  while (pos < text.size()) {
    const AddedToken* hit = nullptr;
    for (const AddedToken& t : tokens) {
      if (text.compare(pos, t.content.size(), t.content) != 0) continue;
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

void BpeTokenizer::encode_text(const std::string& text, bool at_start, std::vector<int64_t>& out) const {
  using PT = BpeSpec::PreTokenizer;
  switch (spec_.pre_tokenizer) {
    case PT::None:
      model_.encode_word(text, out);
      return;
    case PT::ByteLevel: {
      std::string s = text;
      if (spec_.add_prefix_space && s.compare(0, 1, " ") != 0) s.insert(0, " ");
      const auto& chars = byte_level_chars();
      std::string word;
      const auto run = [&](size_t off, size_t len) {
        word.clear();
        for (size_t k = off; k < off + len; ++k) word += chars[static_cast<uint8_t>(s[k])];
        model_.encode_word(word, out);
      };
      switch (spec_.split) {
        case BpeSpec::SplitPattern::None:
          run(0, s.size());
          break;
        case BpeSpec::SplitPattern::Gpt2:
          for (const auto& [off, len] : unicode::split_gpt2(s)) run(off, len);
          break;
        case BpeSpec::SplitPattern::Llama3:
          for (const auto& [off, len] : unicode::split_llama3(s)) run(off, len);
          break;
      }
      return;
    }
    case PT::Metaspace: {
      const std::string& rep = spec_.metaspace_replacement;
      std::string s = text;
      replace_all(s, " ", rep);
      const bool prepend = spec_.prepend_scheme == BpeSpec::PrependScheme::Always ||
                           (spec_.prepend_scheme == BpeSpec::PrependScheme::First && at_start);
      if (prepend && s.compare(0, rep.size(), rep) != 0) s.insert(0, rep);
      if (!spec_.metaspace_split) {
        model_.encode_word(s, out);
        return;
      }
      // Each replacement character starts a new word and stays at its front.
      size_t start = 0;
      for (size_t hit = s.find(rep, 1); hit != std::string::npos; hit = s.find(rep, hit + rep.size())) {
        if (hit > start) model_.encode_word(s.substr(start, hit - start), out);
        start = hit;
      }
      model_.encode_word(s.substr(start), out);
      return;
    }
  }
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
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (int64_t id : ids) {
    auto t = id_to_token(id);
    if (!t) {
      throw NotFoundError(fmt::format("{}: token id {} is not in the vocabulary (ids 0..{})", spec_.source, id,
                                      vocab_size() - 1));
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
        // Runs of <0xNN> tokens become their bytes (kept as they are, even when
        // they are not valid UTF-8; see sanitize_utf8).
        std::vector<std::string> merged;
        bool in_bytes = false;
        for (std::string& t : toks) {
          const int b = parse_byte_token(t);
          if (b >= 0) {
            if (!in_bytes) merged.emplace_back();
            merged.back() += static_cast<char>(b);
            in_bytes = true;
          } else {
            merged.push_back(std::move(t));
            in_bytes = false;
          }
        }
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
        for (size_t k = 0; k < toks.size(); ++k) {
          replace_all(toks[k], step.a, " ");
          if (k == 0 && step.prepend_scheme != BpeSpec::PrependScheme::Never && toks[k].compare(0, 1, " ") == 0)
            toks[k].erase(0, 1);
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
