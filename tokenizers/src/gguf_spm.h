#pragma once
// A sentencepiece ("llama") vocabulary from GGUF as a BPE: GGUF files carry
// its pieces and scores but no merges, so the merges are rebuilt from the
// vocabulary exactly as Transformers does for such a file (every split of a
// piece into two pieces of the vocabulary, best score first); with byte
// fallback and Metaspace this tokenizes as Transformers' GGUF tokenizer does.
#include <flex/tokenizers/bpe.h>

#include <string>
#include <utility>
#include <vector>

namespace flex {
namespace gguf_vocab_impl {

/// The merges `tokens` (ids in order) with `scores` imply: for each distinct
/// piece (first occurrence order, last occurrence's score), its splits at
/// character boundaries into two pieces of the vocabulary, ordered by their
/// ids; then all of them stably by (score, left length, right length), highest first.
std::vector<std::pair<std::string, std::string>> spm_merges(const std::vector<std::string>& tokens,
                                                            const std::vector<double>& scores);

}  // namespace gguf_vocab_impl
}  // namespace flex
