// libFuzzer target: device-map JSON (DeviceMap::from_json), memory budgets
// (MaxMemory::from_json) and size strings, each with a to_json round trip.
#include "fuzz_util.h"

#include <flex/dispatch/device_map.h>
#include <flex/dispatch/memory.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace flex_fuzz;
  const std::string text(reinterpret_cast<const char*>(data), size);
  guarded([&] {
    flex::DeviceMap m = flex::DeviceMap::from_json(text, "fuzz.json");
    check(flex::DeviceMap::from_json(m.to_json()) == m, "device map round trip");
    check(flex::DeviceMap::from_json(m.to_json(2)) == m, "indented device map round trip");
    for (const auto& [name, dev] : m) check(m.at(name) == dev && m.device_of(name) == dev, "lookups agree");
    (void)flex::clean_device_map(m);
  });
  guarded([&] {
    flex::MaxMemory mm = flex::MaxMemory::from_json(text, "fuzz.json");
    check(flex::MaxMemory::from_json(mm.to_json()) == mm, "max memory round trip");
  });
  guarded([&] {
    int64_t n = flex::convert_file_size_to_int(text);
    check(n >= 0, "sizes are non-negative");
  });
  return 0;
}
