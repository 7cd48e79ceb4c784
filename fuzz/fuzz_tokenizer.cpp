// libFuzzer target: load_tokenizer on a folder whose tokenizer.json is the
// input; a tokenizer that loads must encode and decode a fixed text.
#include "fuzz_util.h"

#include <flex/tokenizers/tokenizer.h>

#include <filesystem>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace flex_fuzz;
  static const std::string dir = [] {
    std::string d = scratch() + "/tok";
    std::filesystem::create_directories(d);
    return d;
  }();
  write_bytes(dir + "/tokenizer.json", data, size);
  guarded([&] {
    auto tok = flex::load_tokenizer(dir);
    std::vector<int64_t> ids = tok->encode("Hello wörld, <s> 12345 \xF0\x9F\x98\x80 \xff");
    for (int64_t id : ids) check(id >= 0 && id < tok->vocab_size(), "ids inside the vocabulary");
    (void)tok->decode(ids);
    (void)tok->decode(ids, true);
  });
  return 0;
}
