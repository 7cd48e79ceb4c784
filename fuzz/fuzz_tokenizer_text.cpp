// libFuzzer target: encoding and decoding arbitrary bytes with the real GPT-2
// tokenizer (round trip must be exact: byte-level BPE has no normalizer) and
// the NeoX / Llama test tokenizers (no crash, ids in range); decoding
// arbitrary ids; sanitize_utf8.
#include "fuzz_util.h"

#include <flex/tokenizers/tokenizer.h>

#include <cstring>

namespace {

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = s[i];
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k < n; ++k) {
      unsigned char d = s[i + k];
      if ((d >> 6) != 2) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace flex_fuzz;
  static const auto gpt2 = flex::load_tokenizer(data_path("tokenizers/gpt2"));
  static const auto neox = flex::load_tokenizer(data_path("tokenizers/neox"));
  static const auto llama = flex::load_tokenizer(data_path("tokenizers/llama"));
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  guarded([&] {
    switch (data[0] % 4) {
      case 0: {
        std::vector<int64_t> ids = gpt2->encode(text);
        for (int64_t id : ids) check(id >= 0 && id < gpt2->vocab_size(), "gpt2 ids in range");
        check(gpt2->decode(ids) == text, "gpt2 decode(encode(x)) == x");
        break;
      }
      case 1: {
        for (const auto* tok : {neox.get(), llama.get()}) {
          std::vector<int64_t> ids = tok->encode(text);
          for (int64_t id : ids) check(id >= 0 && id < tok->vocab_size(), "ids in range");
          (void)tok->decode(ids, true);
        }
        break;
      }
      case 2: {  // arbitrary ids (out-of-range ones must give NotFoundError)
        std::vector<int64_t> ids(text.size() / 4);
        for (size_t i = 0; i < ids.size(); ++i) {
          int32_t v;
          std::memcpy(&v, text.data() + 4 * i, 4);
          ids[i] = v % 60000;
        }
        for (const auto* tok : {gpt2.get(), neox.get(), llama.get()}) guarded([&] { (void)tok->decode(ids); });
        break;
      }
      default: {
        std::string s = flex::sanitize_utf8(text);
        check(valid_utf8(s), "sanitize_utf8 gives valid UTF-8");
        check(flex::sanitize_utf8(s) == s, "sanitize_utf8 is idempotent");
        if (valid_utf8(text)) check(s == text, "sanitize_utf8 keeps valid text");
      }
    }
  });
  return 0;
}
