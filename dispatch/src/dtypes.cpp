#include "flex/dispatch/dtypes.h"

#include <flex/hooks/errors.h>

#include <array>
#include <utility>

namespace flex {
namespace {

struct StDtype {
  const char* name;
  int bits;
  at::ScalarType type;  // Undefined: valid in safetensors, not mapped here
};

// Every dtype string safetensors 0.4/0.5 defines. The upstream writer sorts
// by the rank in kAlignmentOrder below, not by this table.
const std::array<StDtype, 22> kSafetensorsDtypes = {{
    {"BOOL", 8, at::kBool},        {"F4", 4, at::ScalarType::Undefined},
    {"F6_E2M3", 6, at::ScalarType::Undefined}, {"F6_E3M2", 6, at::ScalarType::Undefined},
    {"U8", 8, at::kByte},          {"I8", 8, at::kChar},
    {"F8_E5M2", 8, at::kFloat8_e5m2}, {"F8_E4M3", 8, at::kFloat8_e4m3fn},
    {"F8_E8M0", 8, at::kFloat8_e8m0fnu}, {"F8_E4M3FNUZ", 8, at::ScalarType::Undefined},
    {"F8_E5M2FNUZ", 8, at::ScalarType::Undefined},
    {"I16", 16, at::kShort},       {"U16", 16, at::ScalarType::Undefined},
    {"F16", 16, at::kHalf},        {"BF16", 16, at::kBFloat16},
    {"I32", 32, at::kInt},         {"U32", 32, at::ScalarType::Undefined},
    {"F32", 32, at::kFloat},       {"C64", 64, at::ScalarType::Undefined},
    {"F64", 64, at::kDouble},      {"I64", 64, at::kLong},
    {"U64", 64, at::ScalarType::Undefined},
}};

const std::array<const char*, 15> kAlignmentOrder = {
    {"U64", "I64", "F64", "F32", "U32", "I32", "BF16", "F16", "U16", "I16", "F8_E4M3", "F8_E5M2",
     "I8", "U8", "BOOL"}};

const std::array<std::pair<const char*, at::ScalarType>, 10> kNumpy = {{
    {"float64", at::kDouble}, {"float32", at::kFloat}, {"float16", at::kHalf},
    {"bfloat16", at::kBFloat16}, {"int64", at::kLong}, {"int32", at::kInt},
    {"int16", at::kShort}, {"int8", at::kChar}, {"uint8", at::kByte}, {"bool", at::kBool},
}};

const StDtype* find_st(const std::string& name) {
  for (const auto& d : kSafetensorsDtypes)
    if (name == d.name) return &d;
  return nullptr;
}

}  // namespace

int safetensors_dtype_bits(const std::string& name) {
  const StDtype* d = find_st(name);
  return d ? d->bits : 0;
}

at::ScalarType safetensors_to_scalar_type(const std::string& name, const std::string& what) {
  const StDtype* d = find_st(name);
  if (!d) throw FileFormatError(what + ": unknown safetensors dtype \"" + name + "\"");
  if (d->type == at::ScalarType::Undefined)
    throw UnsupportedError(what + ": safetensors dtype " + name +
                           " is not supported (supported: F64 F32 F16 BF16 F8_E4M3 F8_E5M2 F8_E8M0 I64 I32 I16 I8 U8 BOOL)");
  return d->type;
}

std::string safetensors_dtype_name(at::ScalarType dtype, const std::string& what) {
  for (const auto& d : kSafetensorsDtypes)
    if (d.type == dtype && dtype != at::ScalarType::Undefined) return d.name;
  throw UnsupportedError(what + ": dtype " + std::string(c10::toString(dtype)) +
                         " cannot be stored in safetensors by this project");
}

int safetensors_alignment_rank(const std::string& name) {
  for (size_t i = 0; i < kAlignmentOrder.size(); ++i)
    if (name == kAlignmentOrder[i]) return static_cast<int>(i);
  return static_cast<int>(kAlignmentOrder.size());
}

std::string numpy_dtype_name(at::ScalarType dtype, const std::string& what) {
  for (const auto& [n, t] : kNumpy)
    if (t == dtype) return n;
  throw UnsupportedError(what + ": dtype " + std::string(c10::toString(dtype)) +
                         " has no offload-folder (numpy) name");
}

at::ScalarType numpy_to_scalar_type(const std::string& name, const std::string& what) {
  for (const auto& [n, t] : kNumpy)
    if (name == n) return t;
  throw UnsupportedError(what + ": numpy dtype \"" + name + "\" is not supported");
}

size_t dtype_item_size(at::ScalarType dtype) { return c10::elementSize(dtype); }

}  // namespace flex
