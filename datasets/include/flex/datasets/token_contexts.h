#pragma once
// Token contexts from a corpus, for dataset-scale capture.
//
// Documents come from a text file (one document per line), JSON Lines (one
// object per line, the document in a string field), or token ids already
// made (a safetensors file whose "input_ids" is a 1-D stream, one document,
// or [documents, tokens] rows). Text documents are tokenized and framed:
// [BOS] + encode(text) when the tokenizer declares a BOS token, otherwise
// encode(text) + [EOS] when it declares an EOS, otherwise encode(text). Ids
// are taken as they are. The documents are concatenated and cut into
// contexts of `context_len` tokens; a final partial context is dropped
// (tokens_dropped()). Every token keeps its document number (counting
// non-empty lines / rows from 0) and its position inside that document.
//
// Tokenizing runs on a background thread a few batches ahead of the
// consumer, so a model forward never waits for it.
//
// A ContextCursor says where a context starts in the corpus (document, byte
// offset of its line, tokens of it already used): a resumed capture starts
// from the cursor its last shard recorded without re-reading what came before.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace flex {

class Tokenizer;

enum class DatasetFormat {
  Auto,       // from the extension: .jsonl / .json -> JsonLines, .safetensors -> TokenIds, else Text
  Text,       // one document per line (empty lines are skipped)
  JsonLines,  // one JSON object per line, the document in `text_field`
  TokenIds,   // safetensors "input_ids": [tokens] or [documents, tokens], integer
};

struct TokenContextsOptions {
  std::string path;
  DatasetFormat format = DatasetFormat::Auto;
  std::string text_field = "text";
  int64_t context_len = 128;
  /// Contexts per batch (the last batch may have fewer).
  int64_t batch_size = 8;
  /// Stop once this many contexts exist in all, counting those before the
  /// start cursor (-1: the whole corpus).
  int64_t max_contexts = -1;
  /// Batches prepared ahead on the background thread (0: prepared by next()).
  int64_t prefetch_batches = 4;
};

/// Where a context starts in the corpus.
struct ContextCursor {
  int64_t context = 0;       // number of that context
  int64_t document = 0;      // the document it starts in
  int64_t byte_offset = 0;   // of that document's line (text, JSON Lines)
  int64_t token_offset = 0;  // tokens of that document in earlier contexts
  /// Compact JSON, as a shard's metadata stores it.
  std::string to_json() const;
  /// FileFormatError naming `where` for anything else.
  static ContextCursor from_json(const std::string& text, const std::string& where);
};

/// A batch of contexts.
struct ContextBatch {
  int64_t first_context = 0;  // number of row 0
  at::Tensor input_ids;       // [B, context_len] int64
  at::Tensor document;        // [B, context_len] int64: document of each token
  at::Tensor position;        // [B, context_len] int64: position in that document
  ContextCursor next;         // where the batch after this one starts
  double corpus_fraction = 0; // share of the corpus read so far, 0..1 (for an ETA)
};

class TokenContexts {
 public:
  /// `tokenizer` is required for text formats (ConfigError otherwise).
  /// IOError / FileFormatError name the file; a cursor that does not fit the
  /// corpus (past its end, inside a line) is a ConfigError.
  TokenContexts(TokenContextsOptions options, std::shared_ptr<const Tokenizer> tokenizer, ContextCursor start = {});
  /// Stops the background thread.
  ~TokenContexts();
  TokenContexts(const TokenContexts&) = delete;
  TokenContexts& operator=(const TokenContexts&) = delete;

  /// The next batch, nullopt after the last. An error of the background
  /// thread (a malformed line, an unreadable file) is rethrown here.
  std::optional<ContextBatch> next();
  /// Tokens left over at the end (less than one context); valid after next()
  /// returned nullopt.
  int64_t tokens_dropped() const;
  /// The format `options.format` resolved to.
  DatasetFormat format() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flex
