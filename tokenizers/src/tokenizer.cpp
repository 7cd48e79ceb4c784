// The Tokenizer interface's default methods.
#include <flex/tokenizers/tokenizer.h>

namespace flex {

std::string Tokenizer::decode_text(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  // A tokenizer without byte-fallback runs: only the invalid bytes decode() kept.
  return sanitize_utf8(decode(ids, skip_special_tokens));
}

}  // namespace flex
