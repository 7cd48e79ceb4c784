// libFuzzer target: the safetensors reader (header validation, offsets, views)
// and, for files it accepts, a write/read round trip through save_safetensors.
#include "fuzz_util.h"

#include <flex/dispatch/safetensors.h>

#include <ATen/ATen.h>

#include <cstring>

namespace {

// Every byte of a view, so a view reaching past the mapping faults here.
uint64_t touch(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  uint64_t s = 0;
  for (size_t i = 0; i < c.nbytes(); ++i) s += p[i];
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace flex_fuzz;
  const std::string path = scratch() + "/in.safetensors";
  write_bytes(path, data, size);
  guarded([&] {
    auto f = flex::SafetensorsFile::open(path);
    check(f->data_offset() <= f->file_size(), "data offset inside the file");
    std::vector<std::pair<std::string, at::Tensor>> loaded;
    for (const auto& name : f->names()) {
      const flex::TensorInfo& info = f->info(name);
      check(info.begin <= info.end && info.end <= f->file_size() - f->data_offset(), "entry inside the data");
      if (info.dtype == at::ScalarType::Undefined) continue;  // get() throws UnsupportedError
      at::Tensor t = f->get(name);
      check(static_cast<uint64_t>(t.nbytes()) == info.nbytes(), "view size equals the entry's byte range");
      touch(t);
      loaded.emplace_back(name, t);
    }
    if (loaded.size() != f->names().size() || loaded.size() > 64) return;
    // What we accept, we must write back and read back identically.
    const std::string out = scratch() + "/out.safetensors";
    flex::save_safetensors(out, loaded, f->metadata());
    auto g = flex::SafetensorsFile::open(out);
    check(g->names().size() == loaded.size(), "round trip keeps every tensor");
    check(g->metadata() == f->metadata(), "round trip keeps the metadata");
    for (const auto& [name, t] : loaded) {
      at::Tensor u = g->get(name);
      check(u.scalar_type() == t.scalar_type() && u.sizes() == t.sizes(), "round trip keeps dtype and shape");
      at::Tensor a = t.contiguous(), b = u.contiguous();
      check(a.nbytes() == b.nbytes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0,
            "round trip keeps the bytes");
    }
  });
  return 0;
}
