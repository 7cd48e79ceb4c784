// The tokenizer of a GGUF file: reads the metadata key/values (not the tensors)
// and turns llama.cpp's tokenizer.ggml.* keys into a BpeSpec. This library is
// torch-free, so it cannot use flex/dispatch/gguf.h (which hands out at::Tensor);
// it parses only the metadata section, which is all a tokenizer needs.
#include <flex/hooks/errors.h>
#include <flex/tokenizers/bpe.h>
#include <flex/tokenizers/gguf_vocab.h>

#include "gguf_spm.h"
#include "message.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

namespace flex {
// Named (not anonymous): the library builds as a unity build, beside json.cpp's Reader.
namespace gguf_vocab_impl {

// GGUF value types (gguf.md in llama.cpp).
enum : uint32_t { U8 = 0, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 };

// One metadata value, as much of it as the tokenizer needs.
struct Value {
  uint32_t type = 0, elem = 0;
  int64_t i = 0;
  double d = 0;
  std::string s;
  std::vector<std::string> strs;
  std::vector<int64_t> ints;
  std::vector<double> reals;  // arrays of floats (sentencepiece scores)
};

class Reader {
 public:
  explicit Reader(const std::string& path) : path_(path), in_(path, std::ios::binary) {
    if (!in_) throw IOError(cat("cannot open GGUF file ", path));
    std::error_code ec;
    size_ = std::filesystem::file_size(path, ec);
  }

  void bytes(void* out, uint64_t n, const char* what) {
    if (n > size_ || !in_.read(static_cast<char*>(out), static_cast<std::streamsize>(n)))
      throw FileFormatError(cat(path_, ": truncated GGUF metadata (reading ", what, ")"));
  }
  template <class T>
  T pod(const char* what) {
    T v;
    bytes(&v, sizeof v, what);
    return v;
  }
  std::string str(const char* what) {
    const uint64_t n = pod<uint64_t>(what);
    if (n > size_) throw FileFormatError(cat(path_, ": string of ", n, " bytes in a ", size_, "-byte file (", what, ")"));
    std::string s(n, '\0');
    if (n) bytes(&s[0], n, what);
    return s;
  }
  uint64_t count(uint64_t n, const std::string& key) const {
    if (n > size_) throw FileFormatError(cat(path_, ": ", key, ": array of ", n, " elements in a ", size_, "-byte file"));
    return n;
  }

  // A scalar of `type`; integers in v.i, floats in v.d, strings in v.s.
  void scalar(uint32_t type, Value& v, const std::string& key) {
    const char* k = key.c_str();
    switch (type) {
      case U8: v.i = pod<uint8_t>(k); break;
      case I8: v.i = pod<int8_t>(k); break;
      case U16: v.i = pod<uint16_t>(k); break;
      case I16: v.i = pod<int16_t>(k); break;
      case U32: v.i = pod<uint32_t>(k); break;
      case I32: v.i = pod<int32_t>(k); break;
      case BOOL: v.i = pod<uint8_t>(k) != 0; break;
      case U64: v.i = static_cast<int64_t>(pod<uint64_t>(k)); break;
      case I64: v.i = pod<int64_t>(k); break;
      case F32: v.d = pod<float>(k); break;
      case F64: v.d = pod<double>(k); break;
      case STRING: v.s = str(k); break;
      default: throw FileFormatError(cat(path_, ": ", key, ": unknown GGUF value type ", type));
    }
  }

  // A value; arrays of strings / integers are kept when `keep`, else skipped.
  Value value(uint32_t type, const std::string& key, bool keep, int depth = 0) {
    Value v;
    v.type = type;
    if (type != ARRAY) {
      scalar(type, v, key);
      return v;
    }
    if (depth > 8) throw FileFormatError(cat(path_, ": ", key, ": arrays nested too deep"));
    v.elem = pod<uint32_t>(key.c_str());
    const uint64_t n = count(pod<uint64_t>(key.c_str()), key);
    for (uint64_t j = 0; j < n; ++j) {
      if (v.elem == ARRAY) {
        value(ARRAY, key, false, depth + 1);
        continue;
      }
      Value e;
      scalar(v.elem, e, key);
      if (!keep) continue;
      if (v.elem == STRING) v.strs.push_back(std::move(e.s));
      else if (v.elem == F32 || v.elem == F64) v.reals.push_back(e.d);
      else v.ints.push_back(e.i);
    }
    return v;
  }

  // The tokenizer.* and general.* keys of the file.
  std::map<std::string, Value> metadata() {
    char magic[4];
    bytes(magic, 4, "magic");
    if (std::memcmp(magic, "GGUF", 4) != 0) throw FileFormatError(cat(path_, ": not a GGUF file (no GGUF magic)"));
    const uint32_t version = pod<uint32_t>("version");
    if (version < 2 || version > 3) throw UnsupportedError(cat(path_, ": GGUF version ", version, " (2 and 3 are read)"));
    pod<uint64_t>("tensor count");
    const uint64_t n_kv = count(pod<uint64_t>("metadata count"), "metadata count");
    std::map<std::string, Value> out;
    for (uint64_t j = 0; j < n_kv; ++j) {
      std::string key = str("metadata key");
      const uint32_t type = pod<uint32_t>(key.c_str());
      const bool keep = key.rfind("tokenizer.", 0) == 0 || key == "general.architecture";
      Value v = value(type, key, keep);
      if (keep) out[key] = std::move(v);
    }
    return out;
  }

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ifstream in_;
  uint64_t size_ = 0;
};

// llama.cpp's token types.
enum : int64_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

// Pre-tokenizer regexes of the tokenizer.json files these families come from.
const char* const kLlama3Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* const kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

bool is_gguf_file_impl(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

std::unique_ptr<Tokenizer> load_impl(const std::string& path) {
  Reader r(path);
  auto md = r.metadata();
  const auto need = [&](const char* key, uint32_t type) -> const Value& {
    auto it = md.find(key);
    if (it == md.end()) throw FileFormatError(cat(path, ": no ", key, " (the file has no tokenizer)"));
    if (it->second.type != type) throw FileFormatError(cat(path, ": ", key, ": GGUF value type ", it->second.type, ", expected ", type));
    return it->second;
  };
  const auto opt_int = [&](const char* key) -> std::optional<int64_t> {
    auto it = md.find(key);
    if (it == md.end() || it->second.type == ARRAY || it->second.type == STRING || it->second.type == F32 ||
        it->second.type == F64)
      return std::nullopt;
    return it->second.i;
  };

  // No tokenizer at all is an IOError, as for a model folder without tokenizer
  // files: callers that can do without one (--input-ids) catch exactly that.
  if (!md.count("tokenizer.ggml.model"))
    throw IOError(cat(path, ": the GGUF file has no tokenizer (no tokenizer.ggml.model key)"));
  const std::string model = need("tokenizer.ggml.model", STRING).s;
  if (model != "gpt2" && model != "llama")
    throw UnsupportedError(cat(path, ": tokenizer.ggml.model '", model,
                               "' is not supported (read from GGUF: 'gpt2', byte-level BPE with merges, and 'llama', "
                               "sentencepiece pieces with scores; put the model's tokenizer.json beside it instead)"));
  const bool spm = model == "llama";
  auto arch_it = md.find("general.architecture");
  const std::string arch = arch_it != md.end() && arch_it->second.type == STRING ? arch_it->second.s : "";
  // Transformers builds Gemma's sentencepiece vocabularies its own way
  // (GemmaTokenizer: spaces respelled, merges in file order, no prefix).
  const bool gemma = spm && (arch == "gemma" || arch == "gemma2" || arch == "gemma3");
  // Phi-3's: the prefix comes from a normalizer, so every piece between added
  // tokens gets one (Transformers' phi3_tokenizer for GGUF).
  const bool phi3 = spm && arch == "phi3";

  BpeSpec spec;
  spec.source = path;
  // add_space_prefix (sentencepiece only, default true): llama.cpp honours it;
  // Transformers always prepends, which is the same for files that say true.
  const bool space_prefix = opt_int("tokenizer.ggml.add_space_prefix").value_or(1) != 0;
  using K = BpeSpec::DecodeStep::Kind;
  if (gemma) {
    // Transformers' GemmaTokenizer: spaces -> "▁" by the normalizer, no prefix,
    // byte fallback; its Split(" ") pre-tokenizer finds no space after that.
    spec.normalizer = {{BpeSpec::NormalizeStep::Kind::Replace, " ", "\xE2\x96\x81"}};
    spec.decoder = std::vector<BpeSpec::DecodeStep>{
        {K::Replace, "\xE2\x96\x81", " ", 0, 0, BpeSpec::PrependScheme::Always},
        {K::ByteFallback, "", "", 0, 0, BpeSpec::PrependScheme::Always},
        {K::Fuse, "", "", 0, 0, BpeSpec::PrependScheme::Always}};
    spec.byte_fallback = true;
    spec.fuse_unk = true;
  } else if (spm) {
    // Transformers' LlamaTokenizer over the file (decision 47): Metaspace with
    // the prefix on the first piece only, byte fallback, merges from the scores.
    if (phi3) {
      if (space_prefix) spec.normalizer.push_back({BpeSpec::NormalizeStep::Kind::Prepend, "\xE2\x96\x81", ""});
      spec.normalizer.push_back({BpeSpec::NormalizeStep::Kind::Replace, " ", "\xE2\x96\x81"});
    } else {
      spec.pre_tokenizer = {BpeSpec::PreTokenizeStep::metaspace(
          "\xE2\x96\x81", space_prefix ? BpeSpec::PrependScheme::First : BpeSpec::PrependScheme::Never, false)};
    }
    std::vector<BpeSpec::DecodeStep> steps = {{K::Replace, "\xE2\x96\x81", " ", 0, 0, BpeSpec::PrependScheme::Always},
                                              {K::ByteFallback, "", "", 0, 0, BpeSpec::PrependScheme::Always},
                                              {K::Fuse, "", "", 0, 0, BpeSpec::PrependScheme::Always}};
    if (space_prefix) steps.push_back({K::Strip, " ", "", 1, 0, BpeSpec::PrependScheme::Always});
    spec.decoder = steps;
    spec.byte_fallback = true;
    spec.fuse_unk = true;
  } else {
    const auto pre_it = md.find("tokenizer.ggml.pre");
    const std::string pre = pre_it == md.end() ? std::string("(absent)") : pre_it->second.s;
    const std::string where = cat(path, ": tokenizer.ggml.pre");
    if (pre == "gpt-2") {
      spec.pre_tokenizer = {BpeSpec::PreTokenizeStep::byte_level(false, true)};
    } else if (pre == "llama-bpe" || pre == "llama3" || pre == "qwen2") {
      spec.pre_tokenizer = {
          BpeSpec::PreTokenizeStep::split_on(SplitPattern::regex(pre == "qwen2" ? kQwen2Regex : kLlama3Regex, where),
                                             SplitBehavior::Isolated),
          BpeSpec::PreTokenizeStep::byte_level(false, false)};
    } else if (pre == "smollm") {
      // SmolLM's tokenizer.json: Digits(individual_digits) then GPT-2's ByteLevel split.
      spec.pre_tokenizer = {BpeSpec::PreTokenizeStep::split_on(SplitPattern::regex("\\p{N}", where),
                                                               SplitBehavior::Isolated),
                            BpeSpec::PreTokenizeStep::byte_level(false, true)};
    } else {
      throw UnsupportedError(cat(where, " '", pre,
                                 "' is not supported (known: 'gpt-2', 'llama-bpe', 'llama3', 'qwen2', 'smollm')"));
    }
    spec.decoder = std::vector<BpeSpec::DecodeStep>{
        {BpeSpec::DecodeStep::Kind::ByteLevel, "", "", 0, 0, BpeSpec::PrependScheme::Always}};
  }

  const Value& tokens = need("tokenizer.ggml.tokens", ARRAY);
  if (tokens.elem != STRING) throw FileFormatError(cat(path, ": tokenizer.ggml.tokens: expected an array of strings"));
  std::vector<int64_t> types(tokens.strs.size(), kNormal);
  if (md.count("tokenizer.ggml.token_type")) {
    types = need("tokenizer.ggml.token_type", ARRAY).ints;
    if (types.size() != tokens.strs.size())
      throw FileFormatError(cat(path, ": tokenizer.ggml.token_type has ", types.size(), " entries for ",
                                tokens.strs.size(), " tokens"));
  }
  const auto id_of = [&](const char* key) -> std::optional<int64_t> {
    auto v = opt_int(key);
    if (v && (*v < 0 || *v >= static_cast<int64_t>(tokens.strs.size())))
      throw FileFormatError(cat(path, ": ", key, " ", *v, " is outside the ", tokens.strs.size(), " tokens"));
    return v;
  };
  SpecialTokenIds ids;
  ids.bos = id_of("tokenizer.ggml.bos_token_id");
  ids.eos = id_of("tokenizer.ggml.eos_token_id");
  ids.unk = id_of("tokenizer.ggml.unknown_token_id");
  ids.pad = id_of("tokenizer.ggml.padding_token_id");
  // The pieces as the BPE sees them: Gemma's whitespace tokens holding a space
  // are spelled with "▁" (its normalizer's spelling), one per character.
  std::vector<std::string> pieces = tokens.strs;
  if (gemma)
    for (std::string& t : pieces)
      if (t.find(' ') != std::string::npos && t.find_first_not_of(" \t\n\r\v\f") == std::string::npos) {
        const size_t n = t.size();
        t.clear();
        for (size_t k = 0; k < n; ++k) t += "\xE2\x96\x81";
      }
  // Transformers' vocabulary is a dict: a repeated piece keeps its last id.
  std::map<std::string, size_t> last_id;
  if (spm)
    for (size_t id = 0; id < pieces.size(); ++id) last_id[pieces[id]] = id;
  for (size_t id = 0; id < tokens.strs.size(); ++id) {
    const std::string& t = tokens.strs[id];
    const int64_t i = static_cast<int64_t>(id);
    const bool in_vocab = spm && last_id[pieces[id]] == id;
    // Sentencepiece: bos/eos/unk/pad are special too (Transformers adds them as such).
    const bool named = spm && (ids.bos == i || ids.eos == i || ids.unk == i || ids.pad == i);
    // Transformers adds a user-defined piece only when its spelling is in the vocabulary.
    const bool user = types[id] == kUserDefined && (!gemma || last_id.count(t));
    if (types[id] == kControl || user || named) {
      AddedToken a;
      a.content = t;
      a.id = i;
      // GemmaTokenizer also names "<mask>" as its mask token, so it is special there.
      a.special = types[id] != kUserDefined || named || (gemma && t == "<mask>");
      a.normalized = !spm && !a.special;
      spec.added_tokens.push_back(a);
      if (in_vocab) spec.vocab.emplace_back(pieces[id], i);  // a sentencepiece BPE keeps every piece
    } else if (in_vocab || (!spm && types[id] != kUnused)) {
      spec.vocab.emplace_back(spm ? pieces[id] : t, i);
    }
  }
  if (gemma && last_id.count("<unk>")) spec.unk_token = "<unk>";  // GemmaTokenizer's BPE names it

  if (spm) {
    const Value& scores = need("tokenizer.ggml.scores", ARRAY);
    if (scores.reals.size() != tokens.strs.size() || (scores.elem != F32 && scores.elem != F64))
      throw FileFormatError(cat(path, ": tokenizer.ggml.scores has ", scores.reals.size(), " float entries for ",
                                tokens.strs.size(), " tokens"));
    for (size_t j = 0; j < scores.reals.size(); ++j)
      if (scores.reals[j] != scores.reals[j])
        throw FileFormatError(cat(path, ": tokenizer.ggml.scores[", j, "] is NaN"));
    // Gemma's scores do not follow its merge order; Transformers ranks by file position.
    std::vector<double> rank(scores.reals.size());
    for (size_t j = 0; j < rank.size(); ++j) rank[j] = -static_cast<double>(j);
    spec.merges = spm_merges(pieces, gemma ? rank : scores.reals);
  } else {
    const Value& merges = need("tokenizer.ggml.merges", ARRAY);
    if (merges.elem != STRING) throw FileFormatError(cat(path, ": tokenizer.ggml.merges: expected an array of strings"));
    spec.merges.reserve(merges.strs.size());
    for (size_t j = 0; j < merges.strs.size(); ++j) {
      const std::string& m = merges.strs[j];
      const size_t sp = m.find(' ');
      if (sp == std::string::npos || m.find(' ', sp + 1) != std::string::npos)
        throw FileFormatError(cat(path, ": tokenizer.ggml.merges[", j, "] '", m, "' is not two tokens joined by one space"));
      spec.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
    }
  }

  // llama.cpp adds bos to a sentencepiece vocabulary that does not say otherwise.
  if (opt_int("tokenizer.ggml.add_bos_token").value_or(spm ? 1 : 0)) {
    if (!ids.bos) throw FileFormatError(cat(path, ": tokenizer.ggml.add_bos_token is true but there is no bos_token_id"));
    spec.prefix_ids = {*ids.bos};
  }
  if (opt_int("tokenizer.ggml.add_eos_token").value_or(0)) {
    if (!ids.eos) throw FileFormatError(cat(path, ": tokenizer.ggml.add_eos_token is true but there is no eos_token_id"));
    spec.suffix_ids = {*ids.eos};
  }
  auto tok = std::make_unique<BpeTokenizer>(std::move(spec));
  tok->set_special_ids(ids);
  return tok;
}

}  // namespace gguf_vocab_impl

bool is_gguf_tokenizer_file(const std::string& path) { return gguf_vocab_impl::is_gguf_file_impl(path); }

std::unique_ptr<Tokenizer> load_gguf_tokenizer(const std::string& path) { return gguf_vocab_impl::load_impl(path); }

}  // namespace flex
