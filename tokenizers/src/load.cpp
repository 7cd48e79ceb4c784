// load_tokenizer: pick the tokenizer files of a model folder and name its special tokens.
#include <flex/hooks/errors.h>
#include <flex/tokenizers/tokenizer.h>
#include <flex/tokenizers/bpe.h>
#include <flex/tokenizers/gguf_vocab.h>

#include "message.h"
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace flex {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The special-token names a config file declares ("bos_token": "<s>" or
// "bos_token": {"content": "<s>", ...}).
struct Names {
  std::optional<std::string> bos, eos, pad, unk;
};

void read_names(const fs::path& file, Names& names) {
  if (!fs::exists(file)) return;
  std::ifstream in(file, std::ios::binary);
  if (!in) throw IOError(cat("cannot open ", file.string()));
  json doc;
  try {
    doc = json::parse(in);
  } catch (const json::exception& e) {
    throw FileFormatError(cat(file.string(), ": not valid JSON: ", e.what()));
  }
  if (!doc.is_object()) throw FileFormatError(cat(file.string(), ": expected a JSON object"));
  const auto take = [&](const char* key, std::optional<std::string>& slot) {
    auto it = doc.find(key);
    if (it == doc.end() || it->is_null() || slot) return;  // the first file that names it wins
    if (it->is_string()) {
      slot = it->get<std::string>();
    } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
      slot = (*it)["content"].get<std::string>();
    } else {
      throw FileFormatError(cat(file.string(), ": ", key, ": expected a string or {\"content\": ...}"));
    }
  };
  take("bos_token", names.bos);
  take("eos_token", names.eos);
  take("pad_token", names.pad);
  take("unk_token", names.unk);
}

std::optional<int64_t> resolve(const Tokenizer& tok, const std::optional<std::string>& name, const char* key,
                               const std::string& where) {
  if (!name) return std::nullopt;
  auto id = tok.token_to_id(*name);
  if (!id) throw FileFormatError(cat(where, ": ", key, " '", *name, "' is not a token of the tokenizer"));
  return id;
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& model_dir) {
  const fs::path dir(model_dir);
  // A GGUF file carries its vocabulary in its metadata (docs/gguf.md).
  // One it cannot read (SentencePiece "llama" vocabularies, other pre-tokenizer
  // families) is an IOError like a folder without tokenizer files, so the tools
  // that take --input-ids instead (they catch IOError) still run on the file.
  if (is_gguf_tokenizer_file(model_dir)) {
    try {
      return load_gguf_tokenizer(model_dir);
    } catch (const UnsupportedError& e) {
      throw IOError(cat(e.what(), " (no tokenizer flexmodel can read in this GGUF file)"));
    }
  }
  if (!fs::is_directory(dir)) throw IOError(cat("tokenizer folder ", model_dir, " does not exist"));
  std::unique_ptr<BpeTokenizer> tok;
  if (fs::exists(dir / "tokenizer.json")) {
    tok = std::make_unique<BpeTokenizer>(read_tokenizer_json((dir / "tokenizer.json").string()));
  } else if (fs::exists(dir / "vocab.json") && fs::exists(dir / "merges.txt")) {
    tok = std::make_unique<BpeTokenizer>(read_vocab_merges((dir / "vocab.json").string(), (dir / "merges.txt").string()));
  } else {
    throw IOError(cat(model_dir, ": no tokenizer.json and no vocab.json + merges.txt"));
  }

  // special_tokens_map.json overrides tokenizer_config.json, as in transformers.
  Names names;
  const fs::path map_file = dir / "special_tokens_map.json", config_file = dir / "tokenizer_config.json";
  read_names(map_file, names);
  read_names(config_file, names);
  const std::string where = cat(model_dir, " (special_tokens_map.json / tokenizer_config.json)");
  if (!names.bos && !names.eos && !names.pad && !names.unk) {
    // No config names them: use the conventional names the vocabulary has.
    const auto has = [&](const char* t) { return tok->token_to_id(t) ? std::optional<std::string>(t) : std::nullopt; };
    if (has("<|endoftext|>")) {
      names.bos = names.eos = names.unk = "<|endoftext|>";
    } else {
      names.bos = has("<s>"), names.eos = has("</s>"), names.unk = has("<unk>");
    }
    if (tok->spec().unk_token) names.unk = tok->spec().unk_token;
  }
  SpecialTokenIds ids;
  ids.bos = resolve(*tok, names.bos, "bos_token", where);
  ids.eos = resolve(*tok, names.eos, "eos_token", where);
  ids.pad = resolve(*tok, names.pad, "pad_token", where);
  ids.unk = resolve(*tok, names.unk, "unk_token", where);
  tok->set_special_ids(ids);
  return tok;
}

}  // namespace flex
