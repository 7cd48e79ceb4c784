#pragma once
// Private to the datasets layer: what the shard writer and reader share
// about the on-disk format (names, metadata, error text).
#include <flex/dispatch/safetensors.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/shape_text.h>

#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace flex::activation_shards {

inline constexpr const char* kFormat = "flexmodel-activations";

inline std::string shard_file_name(int64_t i) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "shard-%05lld.safetensors", static_cast<long long>(i));
  return buf;
}

/// A shard's metadata value; FileFormatError naming the file when absent.
inline std::string meta(const SafetensorsFile& f, const char* key) {
  auto it = f.metadata().find(key);
  if (it == f.metadata().end()) throw FileFormatError(f.path() + ": shard lacks metadata '" + key + "'");
  return it->second;
}

inline int64_t meta_int(const SafetensorsFile& f, const char* key) {
  const std::string v = meta(f, key);
  try {
    return std::stoll(v);
  } catch (const std::exception&) {
    throw FileFormatError(f.path() + ": metadata '" + key + "' is not a number: " + v);
  }
}

}  // namespace flex::activation_shards
