// libFuzzer target: Checkpoint::open on a folder whose
// model.safetensors.index.json is the input, next to the three real shards of
// the llama-sharded fixture.
#include "fuzz_util.h"

#include <flex/dispatch/checkpoint.h>

#include <ATen/ATen.h>

#include <filesystem>

namespace fs = std::filesystem;

namespace {

const std::string& folder() {
  static const std::string dir = [] {
    std::string d = flex_fuzz::scratch() + "/ckpt";
    fs::create_directories(d);
    for (const char* shard : {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                              "model-00003-of-00003.safetensors"})
      fs::create_symlink(flex_fuzz::data_path(std::string("fixtures/models/llama-sharded/") + shard),
                         d + "/" + shard);
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace flex_fuzz;
  write_bytes(folder() + "/model.safetensors.index.json", data, size);
  guarded([&] {
    flex::Checkpoint ck = flex::Checkpoint::open(folder());
    size_t n = 0;
    for (const std::string& key : ck.keys()) {
      check(ck.contains(key), "every listed key is contained");
      const std::string file = ck.file_of(key);
      check(!file.empty(), "every key has a shard");
      at::Tensor t = ck.get(key);
      check(t.sizes().vec() == ck.shape(key) && t.scalar_type() == ck.dtype(key), "get matches shape/dtype");
      if (++n == 8) break;  // enough to exercise the lookups
    }
  });
  return 0;
}
