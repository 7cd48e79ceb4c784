// libFuzzer target: Accelerate's offload index.json (OffloadIndex::parse), its
// re-serialisation, and reading the entries it names from a real offload folder.
#include "fuzz_util.h"

#include <flex/dispatch/offload_folder.h>

#include <ATen/ATen.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace flex_fuzz;
  const std::string text(reinterpret_cast<const char*>(data), size);
  guarded([&] {
    flex::OffloadIndex idx = flex::OffloadIndex::parse(text, "index.json");
    // What parses must serialise to text that parses to the same index.
    const std::string again = idx.to_json();
    check(flex::OffloadIndex::parse(again, "again").to_json() == again, "to_json/parse round trip");
    static const std::string folder = data_path("fixtures/offload/llama");
    size_t n = 0;
    for (const auto& kv : idx.entries()) {
      const std::string& name = kv.first;
      const flex::OffloadEntry& entry = kv.second;
      if (entry.in_safetensors()) continue;  // would open arbitrary paths the input names
      guarded([&] {
        at::Tensor t = flex::load_offloaded_weight(folder, name, entry);
        check(t.sizes().vec() == entry.shape || (entry.shape.empty() && t.dim() == 0), "view has the indexed shape");
      });
      if (++n == 8) break;
    }
  });
  return 0;
}
