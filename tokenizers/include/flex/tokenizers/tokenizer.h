#pragma once
// Tokenizers that work offline from the files of a Hugging Face model folder.
//
//   auto tok = flex::load_tokenizer("models/gpt2");
//   std::vector<int64_t> ids = tok->encode("Hello world");
//   std::string text = tok->decode(ids);
//
// Text is UTF-8 in std::string. Invalid UTF-8 is accepted: the bytes are encoded
// as they are (byte-level BPE or byte fallback) and decode() gives the same bytes
// back, so encode/decode round-trips any byte string that the normalizer does not
// change. Hugging Face renders invalid sequences as U+FFFD when it decodes;
// decode_text() gives its text exactly.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace flex {

/// Ids of the special tokens a tokenizer declares (absent when it has none).
struct SpecialTokenIds {
  std::optional<int64_t> bos;
  std::optional<int64_t> eos;
  std::optional<int64_t> pad;
  std::optional<int64_t> unk;
};

/// Text <-> token ids.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  /// Token ids of `text`. add_special_tokens adds what the tokenizer's
  /// post-processor adds (Llama: <s> in front; GPT-2 / NeoX: nothing).
  /// Special-token strings inside the text (e.g. "<|endoftext|>") always map to
  /// their ids.
  virtual std::vector<int64_t> encode(const std::string& text, bool add_special_tokens = true) const = 0;

  /// Text of `ids`; skip_special_tokens drops special tokens. An id outside the
  /// vocabulary throws flex::NotFoundError.
  virtual std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const = 0;

  /// Hugging Face's decode: the text of `ids` as valid UTF-8. Where decode()
  /// keeps invalid bytes, this has U+FFFD as Hugging Face puts it: one per token
  /// of a byte-fallback run (<0xNN> tokens in a row) that is not valid UTF-8, its
  /// valid bytes included; one per maximal invalid subsequence elsewhere (the
  /// byte-level decoder). The default is sanitize_utf8(decode(...)).
  virtual std::string decode_text(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const;

  /// Size of the id space: one more than the largest id of the vocabulary and the
  /// added tokens (Hugging Face's len(tokenizer)).
  virtual int64_t vocab_size() const = 0;

  /// Id of a token string (vocabulary or added token), if it has one.
  virtual std::optional<int64_t> token_to_id(const std::string& token) const = 0;

  /// Token string of an id, if the id exists.
  virtual std::optional<std::string> id_to_token(int64_t id) const = 0;

  /// Whether `id` is a special added token (dropped by skip_special_tokens).
  virtual bool is_special(int64_t id) const = 0;

  const SpecialTokenIds& special_ids() const { return special_; }
  std::optional<int64_t> bos_id() const { return special_.bos; }
  std::optional<int64_t> eos_id() const { return special_.eos; }
  std::optional<int64_t> pad_id() const { return special_.pad; }
  std::optional<int64_t> unk_id() const { return special_.unk; }
  void set_special_ids(const SpecialTokenIds& ids) { special_ = ids; }

 private:
  SpecialTokenIds special_;
};

/// Loads the tokenizer of a Hugging Face model folder, choosing by the files present:
/// `tokenizer.json` (byte-level BPE as in GPT-2, GPT-NeoX, Llama 3 and Qwen2, with any
/// Split regex; or SentencePiece-style BPE with byte fallback as in Llama 2, Mistral
/// and Gemma), otherwise `vocab.json` + `merges.txt` (GPT-2 byte-level BPE).
/// bos/eos/pad/unk come from tokenizer_config.json or special_tokens_map.json when
/// present. Missing files throw flex::IOError, malformed ones flex::FileFormatError,
/// components this library does not implement flex::UnsupportedError; each names the
/// file and the part at fault.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& model_dir);

/// `s` with every invalid UTF-8 sequence replaced by U+FFFD (one per maximal
/// invalid subsequence, as the WHATWG / Unicode "best practice" decoders do).
std::string sanitize_utf8(const std::string& s);

}  // namespace flex
