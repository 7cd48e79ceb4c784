#pragma once
// BPE tokenizers as Hugging Face `tokenizers` runs them: added tokens are cut out
// first, then normalizer -> pre-tokenizer -> BPE model -> post-processor; decode
// runs the decoder steps. The components GPT-2, GPT-NeoX, Llama, Mistral, Qwen2 and
// Gemma use are implemented; BpeSpec lists them. Most users call load_tokenizer() instead.
#include <flex/tokenizers/tokenizer.h>
#include <flex/tokenizers/split.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace flex {

/// One entry of tokenizer.json "added_tokens": matched in the text before BPE.
struct AddedToken {
  std::string content;
  int64_t id = 0;
  bool special = false;      // dropped by decode(skip_special_tokens=true)
  bool lstrip = false;       // the match swallows whitespace on its left
  bool rstrip = false;       // ... and on its right
  bool single_word = false;  // only matches when not inside a word
  bool normalized = false;   // matched in the normalized text rather than the raw text
};

/// Everything a BpeTokenizer needs, read from tokenizer.json or vocab.json + merges.txt.
struct BpeSpec {
  /// Where it came from; every error message names it.
  std::string source;

  // --- normalizer: steps applied in order to each piece of text between added tokens.
  struct NormalizeStep {
    enum class Kind { Prepend, Replace, NFC } kind;
    std::string a;  // Prepend: the prefix; Replace: the pattern
    std::string b;  // Replace: the replacement
  };
  std::vector<NormalizeStep> normalizer;

  // --- pre-tokenizer: steps applied in order, each cutting every piece of the
  // normalized text further (Hugging Face's Sequence of pre-tokenizers). With no
  // steps the whole piece is one word.
  enum class PrependScheme { Always, First, Never };
  struct PreTokenizeStep {
    enum class Kind { Split, ByteLevel, Metaspace } kind = Kind::Split;
    // Split: cut at the pattern's matches.
    SplitPattern pattern;
    SplitBehavior behavior = SplitBehavior::Isolated;
    bool invert = false;
    // ByteLevel: a leading space when the piece has none, GPT-2's split when
    // use_regex, then bytes -> GPT-2's byte characters.
    bool add_prefix_space = false;
    bool use_regex = true;
    // Metaspace: spaces -> replacement, prepended per the scheme ("first": only to
    // the piece at the start of the input), and a new word at each replacement.
    std::string replacement = "\xE2\x96\x81";  // U+2581 "▁"
    PrependScheme prepend_scheme = PrependScheme::Always;
    bool split = true;

    static PreTokenizeStep split_on(SplitPattern pattern, SplitBehavior behavior, bool invert = false);
    static PreTokenizeStep byte_level(bool add_prefix_space, bool use_regex);
    static PreTokenizeStep metaspace(std::string replacement, PrependScheme scheme, bool split);
  };
  std::vector<PreTokenizeStep> pre_tokenizer;

  // --- model.
  std::vector<std::pair<std::string, int64_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;  // rank = index
  std::optional<std::string> unk_token;
  bool byte_fallback = false;  // characters outside the vocabulary become <0xNN> tokens
  bool fuse_unk = false;       // consecutive unknowns give one unk token
  bool ignore_merges = false;  // a word that is itself in the vocabulary is one token

  // --- post-processor: ids put around the sequence when add_special_tokens.
  std::vector<int64_t> prefix_ids, suffix_ids;

  // --- decoder: steps applied in order to the token strings (absent: join with " ").
  struct DecodeStep {
    enum class Kind { ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace } kind;
    std::string a, b;  // Replace: pattern, content; Strip: the character; Metaspace: replacement
    int start = 0, stop = 0;  // Strip: how many to remove at each end
    PrependScheme prepend_scheme = PrependScheme::Always;  // Metaspace
  };
  std::optional<std::vector<DecodeStep>> decoder;

  std::vector<AddedToken> added_tokens;
};

/// The BPE model alone: one pre-tokenized word -> token ids.
class BpeModel {
 public:
  /// Builds the lookup tables; a merge whose parts or result are not in the
  /// vocabulary throws flex::FileFormatError naming spec.source and the merge.
  explicit BpeModel(const BpeSpec& spec);

  /// Appends the ids of `word` (UTF-8; invalid bytes allowed) to `out`.
  void encode_word(const std::string& word, std::vector<int64_t>& out) const;

  std::optional<int64_t> token_to_id(const std::string& token) const;
  /// nullptr when the model has no token with this id.
  const std::string* id_to_token(int64_t id) const;
  /// One more than the largest id.
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }

 private:
  void initial_symbols(const std::string& word, std::vector<int32_t>& syms) const;
  void merge(std::vector<int32_t>& syms) const;

  std::string source_;
  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> tokens_;   // by id ("" for an unused id)
  std::vector<bool> has_token_;
  std::unordered_map<uint32_t, int32_t> char_ids_;  // single-character tokens
  int32_t byte_ids_[256];                          // <0xNN> tokens, -1 if absent
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (a,b) -> (rank, merged)
  std::optional<int32_t> unk_id_;
  bool byte_fallback_, fuse_unk_, ignore_merges_;

  // Words repeat a lot; remember recent results (bounded, thread-safe).
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

/// A Tokenizer running a BpeSpec pipeline.
class BpeTokenizer : public Tokenizer {
 public:
  /// Validates the spec; errors throw flex::FileFormatError naming spec.source.
  explicit BpeTokenizer(BpeSpec spec);

  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens = true) const override;
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const override;
  std::string decode_text(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const override;
  int64_t vocab_size() const override;
  std::optional<int64_t> token_to_id(const std::string& token) const override;
  std::optional<std::string> id_to_token(int64_t id) const override;
  bool is_special(int64_t id) const override;

  const BpeSpec& spec() const { return spec_; }

 private:
  struct Piece {
    std::string text;
    int64_t id = -1;        // an added token's id, or -1 for text
    bool at_start = false;  // begins at byte 0 of the input (Metaspace "first")
  };
  std::vector<Piece> split_added(const std::string& text, bool normalized, bool at_start) const;
  std::string normalize(const std::string& text) const;
  void encode_text(const std::string& text, bool at_start, std::vector<int64_t>& out) const;
  // `hf_text`: a byte-fallback run that is not valid UTF-8 becomes U+FFFD per token.
  std::string run_decoder(const std::vector<int64_t>& ids, bool skip_special_tokens, bool hf_text) const;

  BpeSpec spec_;
  BpeModel model_;
  // Added tokens matched before / after normalizing, longest first, and the bytes
  // they start with (so most positions of a text need no comparison at all).
  struct AddedList {
    std::vector<AddedToken> tokens;
    bool starts[256] = {};
    bool starts_mid_char = false;  // a token begins with a UTF-8 continuation byte
  };
  AddedList raw_added_, norm_added_;
  std::unordered_map<std::string, int64_t> added_by_content_;
  std::unordered_map<int64_t, const AddedToken*> added_by_id_;
};

/// Reads a tokenizer.json (model type BPE). Throws flex::IOError if it cannot be read,
/// flex::FileFormatError if malformed, flex::UnsupportedError for components not
/// implemented here; messages name the file and the JSON key.
BpeSpec read_tokenizer_json(const std::string& path);

/// Builds the GPT-2 pipeline (byte-level pre-tokenizer and decoder, no normalizer)
/// from vocab.json + merges.txt. `<|endoftext|>`, when in the vocabulary, becomes a
/// special added token as in GPT-2's tokenizer files.
BpeSpec read_vocab_merges(const std::string& vocab_path, const std::string& merges_path);

/// GPT-2's byte -> character table: printable bytes map to themselves, the others
/// to U+0100 onwards in byte order. Returned as UTF-8 strings, indexed by byte.
const std::vector<std::string>& byte_level_chars();

}  // namespace flex
