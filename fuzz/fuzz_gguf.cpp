// libFuzzer target: the GGUF reader (header, metadata of every value type,
// tensor infos, offsets) and, for files it accepts, every accessor and the
// dequantization of small tensors, and the tokenizer of its tokenizer.ggml.*
// keys (a separate, torch-free metadata parser): bad input may only give a
// typed error.
#include "fuzz_util.h"

#include <flex/dispatch/gguf.h>
#include <flex/kernels/ggml_dequant.h>
#include <flex/tokenizers/gguf_vocab.h>

#include <ATen/ATen.h>

namespace {

// Reads every part of a value (arrays recursively) through the accessors.
void walk(const flex::GgufValue& v) {
  using flex_fuzz::guarded;
  if (v.type() == flex::GgufType::Array) {
    const uint64_t n = v.size();
    for (uint64_t i = 0; i < n && i < 256; ++i) walk(v.at(i));
    guarded([&] { v.to_strings(); });
    guarded([&] { v.to_ints(); });
    guarded([&] { v.to_doubles(); });
    return;
  }
  guarded([&] { v.to_int(); });
  guarded([&] { v.to_double(); });
  guarded([&] { v.to_bool(); });
  guarded([&] { v.to_string(); });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace flex_fuzz;
  const std::string path = scratch() + "/in.gguf";
  write_bytes(path, data, size);
  guarded([&] {
    auto f = flex::GgufFile::open(path);
    check(f->version() == 2 || f->version() == 3, "version 2 or 3");
    check(f->alignment() > 0 && (f->alignment() & (f->alignment() - 1)) == 0, "alignment a power of two");
    check(f->data_offset() <= size, "data offset inside the file");
    for (const auto& k : f->keys()) walk(f->value(k));
    for (const auto& name : f->tensor_names()) {
      const flex::GgufTensorInfo& t = f->tensor(name);
      check(f->data_offset() + t.offset + t.nbytes <= size, "tensor inside the file");
      at::Tensor raw = f->raw(name);
      check(static_cast<uint64_t>(raw.numel()) == t.nbytes, "raw view of nbytes bytes");
      uint64_t sum = 0;
      const uint8_t* p = raw.data_ptr<uint8_t>();
      for (int64_t i = 0; i < raw.numel(); ++i) sum += p[i];  // every byte readable
      (void)sum;
      if (t.numel() <= (1 << 16))
        guarded([&] {
          at::Tensor x = f->dequantize(name);
          check(x.numel() == t.numel(), "dequantized size");
        });
    }
  });
  guarded([&] {
    auto tok = flex::load_gguf_tokenizer(path);
    const auto ids = tok->encode("Hello world, caf\xC3\xA9 12345\n<|endoftext|>");
    tok->decode(ids);
  });
  return 0;
}
