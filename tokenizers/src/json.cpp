// Reading tokenizer.json (Hugging Face tokenizers) and vocab.json + merges.txt.
#include <flex/hooks/errors.h>
#include <flex/tokenizers/bpe.h>

#include "message.h"
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

namespace flex {
namespace {

using nlohmann::json;
using NormStep = BpeSpec::NormalizeStep;
using DStep = BpeSpec::DecodeStep;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IOError(cat("cannot open tokenizer file ", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw IOError(cat("cannot read tokenizer file ", path));
  return ss.str();
}

json parse_json(const std::string& path) {
  try {
    return json::parse(read_text(path));
  } catch (const json::exception& e) {
    throw FileFormatError(cat(path, ": not valid JSON: ", e.what()));
  }
}

// Typed access that names the file and key on failure.
struct Reader {
  std::string path;

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw FileFormatError(cat(path, ": ", key, ": ", what));
  }
  [[noreturn]] void unsupported(const std::string& key, const std::string& what) const {
    throw UnsupportedError(cat(path, ": ", key, ": ", what));
  }
  const json& field(const json& obj, const char* name, const std::string& key) const {
    if (!obj.is_object()) fail(key, "expected a JSON object");
    auto it = obj.find(name);
    if (it == obj.end()) fail(key + "." + name, "missing");
    return *it;
  }
  std::string str(const json& obj, const char* name, const std::string& key) const {
    const json& v = field(obj, name, key);
    if (!v.is_string()) fail(key + "." + name, "expected a string");
    return v.get<std::string>();
  }
  // Optional field: absent or null -> fallback.
  bool flag(const json& obj, const char* name, const std::string& key, bool fallback) const {
    auto it = obj.find(name);
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) fail(key + "." + name, "expected true or false");
    return it->get<bool>();
  }
  int64_t integer(const json& v, const std::string& key) const {
    if (!v.is_number_integer()) fail(key, "expected an integer");
    return v.get<int64_t>();
  }
  std::string type(const json& obj, const std::string& key) const { return str(obj, "type", key); }

  // Replace's pattern: {"String": "x"}; regex patterns are not implemented.
  std::string pattern(const json& obj, const std::string& key) const {
    const json& p = field(obj, "pattern", key);
    if (p.is_object() && p.contains("String") && p["String"].is_string()) return p["String"].get<std::string>();
    if (p.is_object() && p.contains("Regex")) unsupported(key + ".pattern", "Regex patterns are not supported");
    fail(key + ".pattern", "expected {\"String\": ...}");
  }

  BpeSpec::PrependScheme prepend_scheme(const json& obj, const std::string& key) const {
    auto it = obj.find("prepend_scheme");
    if (it != obj.end() && !it->is_null()) {
      const std::string s = it->is_string() ? it->get<std::string>() : "";
      if (s == "always") return BpeSpec::PrependScheme::Always;
      if (s == "first") return BpeSpec::PrependScheme::First;
      if (s == "never") return BpeSpec::PrependScheme::Never;
      fail(key + ".prepend_scheme", "expected \"always\", \"first\" or \"never\"");
    }
    // Older files: add_prefix_space true/false.
    return flag(obj, "add_prefix_space", key, true) ? BpeSpec::PrependScheme::Always : BpeSpec::PrependScheme::Never;
  }

  void normalizer(const json& n, const std::string& key, BpeSpec& spec) const {
    if (n.is_null()) return;
    const std::string t = type(n, key);
    if (t == "Sequence") {
      const json& list = field(n, "normalizers", key);
      if (!list.is_array()) fail(key + ".normalizers", "expected an array");
      for (size_t i = 0; i < list.size(); ++i) normalizer(list[i], cat(key, ".normalizers[", i, "]"), spec);
    } else if (t == "Prepend") {
      spec.normalizer.push_back({NormStep::Kind::Prepend, str(n, "prepend", key), ""});
    } else if (t == "Replace") {
      spec.normalizer.push_back({NormStep::Kind::Replace, pattern(n, key), str(n, "content", key)});
    } else if (t == "NFC") {
      spec.normalizer.push_back({NormStep::Kind::NFC, "", ""});
    } else {
      unsupported(key + ".type", cat("normalizer '", t, "' is not supported (Sequence, Prepend, Replace, NFC are)"));
    }
  }

  void pre_tokenizer(const json& p, const std::string& key, BpeSpec& spec) const {
    using PStep = BpeSpec::PreTokenizeStep;
    if (p.is_null()) return;
    const std::string t = type(p, key);
    if (t == "Sequence") {
      const json& list = field(p, "pretokenizers", key);
      if (!list.is_array()) fail(key + ".pretokenizers", "expected an array");
      for (size_t i = 0; i < list.size(); ++i) pre_tokenizer(list[i], cat(key, ".pretokenizers[", i, "]"), spec);
    } else if (t == "Split") {
      spec.pre_tokenizer.push_back(
          PStep::split_on(split_pattern(p, key), split_behavior(p, key), flag(p, "invert", key, false)));
    } else if (t == "ByteLevel") {
      spec.pre_tokenizer.push_back(PStep::byte_level(flag(p, "add_prefix_space", key, false), flag(p, "use_regex", key, true)));
    } else if (t == "Metaspace") {
      spec.pre_tokenizer.push_back(
          PStep::metaspace(str(p, "replacement", key), prepend_scheme(p, key), flag(p, "split", key, true)));
    } else {
      unsupported(key + ".type",
                  cat("pre-tokenizer '", t, "' is not supported (Sequence, Split, ByteLevel, Metaspace are)"));
    }
  }

  // Split's pattern: {"String": literal} or {"Regex": Oniguruma-syntax regex, run on PCRE2}.
  SplitPattern split_pattern(const json& p, const std::string& key) const {
    const json& pat = field(p, "pattern", key);
    if (pat.is_object() && pat.contains("String") && pat["String"].is_string()) {
      return SplitPattern::literal(pat["String"].get<std::string>());
    }
    if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
      return SplitPattern::regex(pat["Regex"].get<std::string>(), cat(path, ": ", key, ".pattern.Regex"));
    }
    fail(key + ".pattern", "expected {\"String\": ...} or {\"Regex\": ...}");
  }

  SplitBehavior split_behavior(const json& p, const std::string& key) const {
    const std::string b = str(p, "behavior", key);
    if (b == "Removed") return SplitBehavior::Removed;
    if (b == "Isolated") return SplitBehavior::Isolated;
    if (b == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
    if (b == "MergedWithNext") return SplitBehavior::MergedWithNext;
    if (b == "Contiguous") return SplitBehavior::Contiguous;
    fail(key + ".behavior", cat("'", b, "' is not Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous"));
  }

  void post_processor(const json& p, const std::string& key, BpeSpec& spec) const {
    if (p.is_null()) return;
    const std::string t = type(p, key);
    if (t == "ByteLevel") return;  // only adjusts offsets
    if (t == "Sequence") {
      const json& list = field(p, "processors", key);
      if (!list.is_array()) fail(key + ".processors", "expected an array");
      for (size_t i = 0; i < list.size(); ++i) post_processor(list[i], cat(key, ".processors[", i, "]"), spec);
      return;
    }
    if (t != "TemplateProcessing") {
      unsupported(key + ".type", cat("post-processor '", t, "' is not supported (TemplateProcessing, ByteLevel are)"));
    }
    const json& single = field(p, "single", key);
    const json& specials = field(p, "special_tokens", key);
    if (!single.is_array()) fail(key + ".single", "expected an array");
    bool seen_sequence = false;
    for (size_t i = 0; i < single.size(); ++i) {
      const std::string k = cat(key, ".single[", i, "]");
      const json& item = single[i];
      if (item.is_object() && item.contains("Sequence")) {
        if (seen_sequence) fail(k, "the single template has two sequences");
        seen_sequence = true;
        continue;
      }
      if (!item.is_object() || !item.contains("SpecialToken")) fail(k, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
      const std::string name = str(item["SpecialToken"], "id", k + ".SpecialToken");
      const std::string sk = key + ".special_tokens." + name;
      const json& ids = field(field(specials, name.c_str(), key + ".special_tokens"), "ids", sk);
      if (!ids.is_array()) fail(sk + ".ids", "expected an array");
      for (const json& id : ids) (seen_sequence ? spec.suffix_ids : spec.prefix_ids).push_back(integer(id, sk + ".ids"));
    }
    if (!seen_sequence) fail(key + ".single", "the template has no {\"Sequence\": ...} item");
  }

  void decoder(const json& d, const std::string& key, std::vector<DStep>& steps) const {
    const std::string t = type(d, key);
    DStep s{DStep::Kind::Fuse, "", "", 0, 0, BpeSpec::PrependScheme::Always};
    if (t == "Sequence") {
      const json& list = field(d, "decoders", key);
      if (!list.is_array()) fail(key + ".decoders", "expected an array");
      for (size_t i = 0; i < list.size(); ++i) decoder(list[i], cat(key, ".decoders[", i, "]"), steps);
      return;
    } else if (t == "ByteLevel") {
      s.kind = DStep::Kind::ByteLevel;
    } else if (t == "Replace") {
      s.kind = DStep::Kind::Replace, s.a = pattern(d, key), s.b = str(d, "content", key);
    } else if (t == "ByteFallback") {
      s.kind = DStep::Kind::ByteFallback;
    } else if (t == "Fuse") {
      s.kind = DStep::Kind::Fuse;
    } else if (t == "Strip") {
      s.kind = DStep::Kind::Strip, s.a = str(d, "content", key);
      s.start = static_cast<int>(integer(field(d, "start", key), key + ".start"));
      s.stop = static_cast<int>(integer(field(d, "stop", key), key + ".stop"));
    } else if (t == "Metaspace") {
      s.kind = DStep::Kind::Metaspace, s.a = str(d, "replacement", key), s.prepend_scheme = prepend_scheme(d, key);
    } else {
      unsupported(key + ".type",
                  cat("decoder '", t, "' is not supported (ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace are)"));
    }
    steps.push_back(s);
  }

  void model(const json& m, BpeSpec& spec) const {
    const std::string t = m.is_object() && m.contains("type") ? type(m, "model") : "BPE";
    if (t != "BPE") unsupported("model.type", cat("model '", t, "' is not supported (only BPE)"));
    const json& vocab = field(m, "vocab", "model");
    if (!vocab.is_object()) fail("model.vocab", "expected an object of token -> id");
    spec.vocab.reserve(vocab.size());
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      spec.vocab.emplace_back(it.key(), integer(it.value(), "model.vocab." + it.key()));
    }
    const json& merges = field(m, "merges", "model");
    if (!merges.is_array()) fail("model.merges", "expected an array");
    spec.merges.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
      const json& e = merges[i];
      const std::string k = cat("model.merges[", i, "]");
      if (e.is_string()) {
        // "a b": the tokens themselves contain no spaces (spaces are byte-mapped or ▁).
        const std::string s = e.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || sp == 0 || sp + 1 == s.size() || s.find(' ', sp + 1) != std::string::npos) {
          fail(k, cat("'", s, "' is not two tokens separated by one space"));
        }
        spec.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        spec.merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
      } else {
        fail(k, "expected \"a b\" or [\"a\", \"b\"]");
      }
    }
    auto unk = m.find("unk_token");
    if (unk != m.end() && !unk->is_null()) {
      if (!unk->is_string()) fail("model.unk_token", "expected a string or null");
      spec.unk_token = unk->get<std::string>();
    }
    auto dropout = m.find("dropout");
    if (dropout != m.end() && !dropout->is_null() && !(dropout->is_number() && dropout->get<double>() == 0.0)) {
      unsupported("model.dropout", "BPE dropout is not supported (inference needs it null)");
    }
    for (const char* name : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      auto it = m.find(name);
      if (it != m.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty())) {
        unsupported(std::string("model.") + name, "subword prefixes/suffixes are not supported");
      }
    }
    spec.byte_fallback = flag(m, "byte_fallback", "model", false);
    spec.fuse_unk = flag(m, "fuse_unk", "model", false);
    spec.ignore_merges = flag(m, "ignore_merges", "model", false);
  }

  void added_tokens(const json& list, BpeSpec& spec) const {
    if (list.is_null()) return;
    if (!list.is_array()) fail("added_tokens", "expected an array");
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string k = cat("added_tokens[", i, "]");
      const json& e = list[i];
      AddedToken t;
      t.content = str(e, "content", k);
      t.id = integer(field(e, "id", k), k + ".id");
      t.special = flag(e, "special", k, false);
      t.lstrip = flag(e, "lstrip", k, false);
      t.rstrip = flag(e, "rstrip", k, false);
      t.single_word = flag(e, "single_word", k, false);
      t.normalized = flag(e, "normalized", k, !t.special);
      spec.added_tokens.push_back(std::move(t));
    }
  }
};

const json& member_or_null(const json& obj, const char* name) {
  static const json null_value;
  auto it = obj.find(name);
  return it == obj.end() ? null_value : *it;
}

}  // namespace

BpeSpec read_tokenizer_json(const std::string& path) {
  const json doc = parse_json(path);
  const Reader r{path};
  if (!doc.is_object()) r.fail("(top level)", "expected a JSON object");
  BpeSpec spec;
  spec.source = path;
  r.model(r.field(doc, "model", "(top level)"), spec);
  r.added_tokens(member_or_null(doc, "added_tokens"), spec);
  r.normalizer(member_or_null(doc, "normalizer"), "normalizer", spec);
  r.pre_tokenizer(member_or_null(doc, "pre_tokenizer"), "pre_tokenizer", spec);
  r.post_processor(member_or_null(doc, "post_processor"), "post_processor", spec);
  const json& dec = member_or_null(doc, "decoder");
  if (!dec.is_null()) {
    spec.decoder.emplace();
    r.decoder(dec, "decoder", *spec.decoder);
  }
  return spec;
}

BpeSpec read_vocab_merges(const std::string& vocab_path, const std::string& merges_path) {
  BpeSpec spec;
  spec.source = vocab_path + " + " + merges_path;
  const json vocab = parse_json(vocab_path);
  const Reader rv{vocab_path};
  if (!vocab.is_object()) rv.fail("(top level)", "expected an object of token -> id");
  for (auto it = vocab.begin(); it != vocab.end(); ++it) spec.vocab.emplace_back(it.key(), rv.integer(it.value(), it.key()));

  std::istringstream lines(read_text(merges_path));
  std::string line;
  for (size_t no = 1; std::getline(lines, line); ++no) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (no == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == line.size() || line.find(' ', sp + 1) != std::string::npos) {
      throw FileFormatError(cat(merges_path, ": line ", no, ": '", line, "' is not two tokens separated by one space"));
    }
    spec.merges.emplace_back(line.substr(0, sp), line.substr(sp + 1));
  }

  spec.pre_tokenizer = {BpeSpec::PreTokenizeStep::byte_level(/*add_prefix_space=*/false, /*use_regex=*/true)};
  spec.decoder = std::vector<BpeSpec::DecodeStep>{{BpeSpec::DecodeStep::Kind::ByteLevel, "", "", 0, 0, BpeSpec::PrependScheme::Always}};
  const std::string eot = "<|endoftext|>";
  if (vocab.contains(eot)) {
    AddedToken t;
    t.content = eot;
    t.id = vocab[eot].get<int64_t>();
    t.special = true;
    spec.added_tokens.push_back(t);
  }
  return spec;
}

}  // namespace flex
