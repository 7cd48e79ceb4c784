// GGUF reader and ggml dequantization against gguf-py 0.19.0
// (scripts/golden/make_gguf.py wrote tests/data/gguf/): metadata of every
// value type as GGUFReader reads it, tensor infos, dequantized values
// bit-equal to gguf.quants.dequantize for every type flexmodel takes, and a
// typed error naming the file and the field for each kind of bad file.
#include <flex/dispatch/atomic_file.h>
#include <flex/dispatch/gguf.h>
#include <flex/dispatch/safetensors.h>
#include <flex/hooks/errors.h>
#include <flex/kernels/ggml_dequant.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "expect_error.h"
#include "test_util.h"

using flex_test::data_path;
using json = nlohmann::json;

namespace {

using flex_test::expect_error;

std::string types_path() { return data_path("gguf/types.gguf"); }

std::string slurp(const std::string& path) { return flex::read_file(path); }

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

json metadata_json() {
  std::ifstream in(data_path("gguf/types.metadata.json"));
  return json::parse(in);
}

double from_hex(const std::string& s) { return std::strtod(s.c_str(), nullptr); }

// Bit-equality of float32 tensors; on failure: how many differ, the largest
// difference and where, with both values and their bits.
::testing::AssertionResult bit_equal(const at::Tensor& actual, const at::Tensor& expected) {
  if (actual.scalar_type() != at::kFloat || expected.scalar_type() != at::kFloat || actual.sizes() != expected.sizes()) {
    std::ostringstream o;
    o << "actual " << actual.scalar_type() << " " << actual.sizes() << " vs expected " << expected.scalar_type() << " "
      << expected.sizes();
    return ::testing::AssertionFailure() << o.str();
  }
  at::Tensor a = actual.contiguous().reshape(-1), e = expected.contiguous().reshape(-1);
  const auto* pa = static_cast<const uint32_t*>(a.data_ptr());
  const auto* pe = static_cast<const uint32_t*>(e.data_ptr());
  int64_t differ = 0, worst = -1;
  double worst_diff = -1;
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (pa[i] == pe[i]) continue;
    ++differ;
    float fa, fe;
    std::memcpy(&fa, pa + i, 4);
    std::memcpy(&fe, pe + i, 4);
    double d = std::fabs(static_cast<double>(fa) - static_cast<double>(fe));
    if (std::isnan(d)) d = INFINITY;
    if (d > worst_diff) worst_diff = d, worst = i;
  }
  if (differ == 0) return ::testing::AssertionSuccess();
  float fa, fe;
  std::memcpy(&fa, pa + worst, 4);
  std::memcpy(&fe, pe + worst, 4);
  std::ostringstream o;
  o.precision(9);
  o << differ << " of " << a.numel() << " elements differ in their bits; largest difference " << worst_diff
    << " at flat index " << worst << " (row " << worst / actual.size(-1) << ", column " << worst % actual.size(-1)
    << "): actual " << fa << " (0x" << std::hex << pa[worst] << "), expected " << fe << " (0x" << pe[worst] << ")";
  return ::testing::AssertionFailure() << o.str();
}

void put_u32(std::string& b, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
void put_u64(std::string& b, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) b[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint64_t get_u64(const std::string& b, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(b[at + i]);
  return v;
}

// The position just after the length-prefixed string `s` in the header.
size_t after_string(const std::string& file, const std::string& s) {
  std::string needle(8, '\0');
  put_u64(needle, 0, s.size());
  needle += s;
  const size_t at = file.find(needle);
  EXPECT_NE(at, std::string::npos) << s;
  return at + needle.size();
}

// A GGUF v3 file of only metadata: raw key/value bytes (already encoded).
std::string tiny_file(uint64_t n_kv, const std::string& kvs, uint64_t n_tensors = 0) {
  std::string b = "GGUF";
  b += std::string(20, '\0');
  put_u32(b, 4, 3);
  put_u64(b, 8, n_tensors);
  put_u64(b, 16, n_kv);
  return b + kvs;
}
std::string enc_str(const std::string& s) {
  std::string b(8, '\0');
  put_u64(b, 0, s.size());
  return b + s;
}
std::string enc_u32(uint32_t v) {
  std::string b(4, '\0');
  put_u32(b, 0, v);
  return b;
}
std::string enc_u64(uint64_t v) {
  std::string b(8, '\0');
  put_u64(b, 0, v);
  return b;
}

class GgufBad : public ::testing::Test {
 protected:
  void SetUp() override { good_ = slurp(types_path()); }
  // Writes `bytes` to a scratch file and returns its path.
  std::string write(const std::string& name, const std::string& bytes) {
    const std::string p = dir_.str(name);
    spit(p, bytes);
    return p;
  }
  // Opening `bytes` throws FileFormatError naming the file and each needle.
  void expect_bad(const std::string& name, const std::string& bytes, std::vector<std::string> needles) {
    const std::string p = write(name, bytes);
    needles.insert(needles.begin(), p);
    expect_error<flex::FileFormatError>([&] { flex::GgufFile::open(p); }, needles);
  }
  // The position of tensor `name`'s info fields (just after its name).
  size_t tensor_at(const std::string& name) { return after_string(good_, name); }
  flex_test::TempDir dir_;
  std::string good_;
};

}  // namespace

// Every metadata key, its type and value equal to gguf-py's GGUFReader's.
TEST(Gguf, MetadataEqualsGgufPyReader) {
  auto f = flex::GgufFile::open(types_path());
  const json meta = metadata_json();
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->data_offset(), meta["__data_offset__"].get<uint64_t>());
  size_t n_keys = 0;
  for (auto it = meta.begin(); it != meta.end(); ++it) {
    if (it.key().rfind("__", 0) == 0) continue;
    ++n_keys;
    SCOPED_TRACE(it.key());
    ASSERT_TRUE(f->has(it.key()));
    const flex::GgufValue& v = f->value(it.key());
    const std::string type = (*it)["type"];
    EXPECT_EQ(flex::gguf_type_name(v.type()), type);
    const json& want = (*it)["value"];
    if (type == "string") {
      EXPECT_EQ(v.to_string(), want.get<std::string>());
    } else if (type == "bool") {
      EXPECT_EQ(v.to_bool(), want.get<bool>());
    } else if (type == "float32" || type == "float64") {
      EXPECT_EQ(v.to_double(), from_hex(want.get<std::string>()));
    } else if (type == "uint64") {
      EXPECT_EQ(static_cast<uint64_t>(v.to_double()), std::stoull(want.get<std::string>()));
      EXPECT_THROW(v.to_int(), flex::FileFormatError);  // 1.8e19 does not fit an int64
    } else if (type == "int64") {
      EXPECT_EQ(v.to_int(), std::stoll(want.get<std::string>()));
    } else if (type == "array") {
      // GGUFReader lists the innermost elements of arrays of arrays, and
      // their chain of types: flatten ours the same way.
      const std::vector<std::string> chain = (*it)["types"];
      std::vector<flex::GgufValue> flat = {v};
      for (size_t depth = 1; depth < chain.size(); ++depth) {
        std::vector<flex::GgufValue> next;
        for (const auto& a : flat) {
          EXPECT_EQ(flex::gguf_type_name(a.element_type()), chain[depth]);
          for (uint64_t i = 0; i < a.size(); ++i) next.push_back(a.at(i));
        }
        if (depth + 1 < chain.size()) flat = std::move(next);
      }
      const std::string et = (*it)["element_type"];
      if (chain.size() > 2) {
        std::vector<int64_t> got;
        for (const auto& a : flat)
          for (int64_t x : a.to_ints()) got.push_back(x);
        EXPECT_EQ(got, want.get<std::vector<int64_t>>());
        continue;
      }
      ASSERT_EQ(v.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        SCOPED_TRACE(i);
        const flex::GgufValue e = v.at(i);
        if (et == "string") {
          EXPECT_EQ(e.to_string(), want[i].get<std::string>());
          EXPECT_EQ(v.to_strings()[i], want[i].get<std::string>());
        } else if (et == "bool") {
          EXPECT_EQ(e.to_bool(), want[i].get<bool>());
        } else if (et == "float32" || et == "float64") {
          EXPECT_EQ(e.to_double(), from_hex(want[i].get<std::string>()));
          EXPECT_EQ(v.to_doubles()[i], from_hex(want[i].get<std::string>()));
        } else if (et == "uint64") {
          EXPECT_EQ(e.to_double(), static_cast<double>(std::stoull(want[i].get<std::string>())));
        } else if (et == "int64") {
          EXPECT_EQ(e.to_int(), std::stoll(want[i].get<std::string>()));
        } else {
          EXPECT_EQ(e.to_int(), want[i].get<int64_t>());
          EXPECT_EQ(v.to_ints()[i], want[i].get<int64_t>());
        }
      }
    } else {
      EXPECT_EQ(v.to_int(), want.get<int64_t>());
    }
  }
  EXPECT_EQ(f->keys().size(), n_keys);
  EXPECT_EQ(f->get_string("general.architecture"), "flextest");
  EXPECT_EQ(f->get_int("test.i32"), -2000000000);
  EXPECT_FLOAT_EQ(static_cast<float>(f->get_double("test.f32")), 0.1f);
}

TEST(Gguf, TensorInfosEqualGgufPyReader) {
  auto f = flex::GgufFile::open(types_path());
  const json tensors = metadata_json()["__tensors__"];
  ASSERT_EQ(f->tensor_names().size(), tensors.size());
  for (auto it = tensors.begin(); it != tensors.end(); ++it) {
    SCOPED_TRACE(it.key());
    const flex::GgufTensorInfo& t = f->tensor(it.key());
    EXPECT_EQ(t.type, (*it)["type_id"].get<uint32_t>());
    EXPECT_EQ(flex::ggml_type_name(t.type), (*it)["type"].get<std::string>());
    EXPECT_EQ(t.shape, (*it)["shape"].get<std::vector<int64_t>>());
    EXPECT_EQ(t.offset, (*it)["offset"].get<uint64_t>());
    EXPECT_EQ(t.nbytes, (*it)["nbytes"].get<uint64_t>());
    EXPECT_EQ(f->raw(it.key()).numel(), static_cast<int64_t>(t.nbytes));
  }
}

// Every type flexmodel takes: bit-equal to gguf.quants.dequantize, through
// the threaded path (1 and 3 threads) and the scalar reference.
TEST(Gguf, DequantizeIsBitEqualToGgufPy) {
  auto f = flex::GgufFile::open(types_path());
  auto ref = flex::SafetensorsFile::open(data_path("gguf/types.dequant.safetensors"));
  std::set<std::string> types_seen;
  const int threads = at::get_num_threads();
  for (const auto& name : ref->names()) {
    SCOPED_TRACE(name);
    const flex::GgufTensorInfo& t = f->tensor(name);
    types_seen.insert(flex::ggml_type_name(t.type));
    const at::Tensor want = ref->get(name);
    for (int n : {1, 3}) {
      at::set_num_threads(n);
      EXPECT_TRUE(bit_equal(f->dequantize(name), want)) << name << " (" << flex::ggml_type_name(t.type) << ") with "
                                                        << n << " threads";
    }
    at::Tensor scalar = at::empty(t.shape, at::kFloat);
    const at::Tensor raw = f->raw(name);
    flex::dequantize_ggml_reference(t.type, raw.data_ptr<uint8_t>(), scalar.data_ptr<float>(), t.numel());
    EXPECT_TRUE(bit_equal(scalar, want)) << name << " through the scalar reference";
  }
  at::set_num_threads(threads);
  EXPECT_EQ(types_seen, (std::set<std::string>{"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K",
                                              "Q5_K", "Q6_K"}));
}

TEST(Gguf, OtherTypesAreUnsupportedNamingTensorAndType) {
  auto f = flex::GgufFile::open(types_path());
  expect_error<flex::UnsupportedError>([&] { f->dequantize("q2_k.unsupported"); },
                                       {types_path(), "'q2_k.unsupported'", "Q2_K", "(10)"});
  expect_error<flex::UnsupportedError>([&] { f->dequantize("q3_k.unsupported"); }, {"'q3_k.unsupported'", "Q3_K"});
  EXPECT_EQ(f->raw("q2_k.unsupported").numel(), 168);  // still readable as bytes
  expect_error<flex::UnsupportedError>(
      [&] {
        float y[32];
        uint8_t b[40] = {};
        flex::dequantize_ggml(9, b, y, 32);
      },
      {"Q8_1"});
  expect_error<flex::ShapeError>(
      [&] {
        float y[32];
        uint8_t b[34] = {};
        flex::dequantize_ggml(8, b, y, 31);
      },
      {"Q8_0", "31"});
}

TEST(Gguf, LookupErrorsNameFileAndKey) {
  auto f = flex::GgufFile::open(types_path());
  expect_error<flex::NotFoundError>([&] { f->value("test.u33"); }, {types_path(), "'test.u33'", "test.u32"});
  expect_error<flex::NotFoundError>([&] { f->tensor("q4_kk"); }, {types_path(), "'q4_kk'", "q4_k"});
  expect_error<flex::FileFormatError>([&] { f->get_int("test.string"); }, {types_path(), "'test.string'", "string", "integer"});
  expect_error<flex::FileFormatError>([&] { f->get_string("test.u8"); }, {types_path(), "'test.u8'", "uint8"});
  expect_error<flex::FileFormatError>([&] { f->get_strings("test.array_i32"); }, {"'test.array_i32'", "int32"});
  expect_error<flex::FileFormatError>([&] { f->get_int("test.u64"); }, {"'test.u64'", "int64"});
}

TEST_F(GgufBad, VersionTwoReadsTheSame) {
  std::string b = good_;
  put_u32(b, 4, 2);
  auto f = flex::GgufFile::open(write("v2.gguf", b));
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(f->tensor_names().size(), flex::GgufFile::open(types_path())->tensor_names().size());
}

TEST_F(GgufBad, Header) {
  expect_bad("empty.gguf", "", {"truncated", "0 bytes"});
  expect_bad("magic.gguf", "GGUX" + good_.substr(4), {"bad magic", "GGUX"});
  expect_bad("short.gguf", good_.substr(0, 6), {"truncated", "version"});
  expect_bad("short1.gguf", good_.substr(0, 10), {"truncated", "tensor count"});
  expect_bad("short2.gguf", good_.substr(0, 20), {"truncated", "metadata count"});
  std::string b = good_;
  put_u32(b, 4, 99);
  expect_bad("v99.gguf", b, {"unknown version 99"});
  put_u32(b, 4, 1);
  expect_bad("v1.gguf", b, {"unknown version 1"});
  put_u32(b, 4, 0x03000000);
  expect_bad("bigendian.gguf", b, {"big-endian"});
  b = good_;
  put_u64(b, 16, uint64_t(1) << 62);
  expect_bad("kvcount.gguf", b, {"metadata count", "4611686018427387904"});
  b = good_;
  put_u64(b, 8, ~uint64_t(0));
  expect_bad("tensorcount.gguf", b, {"tensor count", "18446744073709551615"});
}

TEST_F(GgufBad, Truncated) {
  const auto infos = metadata_json()["__tensors__"];
  // In the metadata (inside a key's string), in the tensor infos, in the data.
  expect_bad("t1.gguf", good_.substr(0, 40), {"truncated", "metadata count is 24"});
  const size_t ti = tensor_at("q4_k");
  expect_bad("t2.gguf", good_.substr(0, ti + 6), {"truncated", "tensor 'q4_k'"});
  const auto& last = infos["q3_k.unsupported"];
  const uint64_t end = metadata_json()["__data_offset__"].get<uint64_t>() + last["offset"].get<uint64_t>() +
                       last["nbytes"].get<uint64_t>();
  expect_bad("t3.gguf", good_.substr(0, end - 1), {"tensor 'q3_k.unsupported'", "runs out of the file"});
  const size_t arr = after_string(good_, "test.array_str");
  expect_bad("t4.gguf", good_.substr(0, arr + 4 + 4 + 8 + 8), {"truncated", "'test.array_str' (array length) is 4"});
  const size_t str = after_string(good_, "test.string");
  expect_bad("t5.gguf", good_.substr(0, str + 4 + 8 + 3),
             {"truncated", "metadata key 'test.string' is a string of 12 bytes but 3 bytes are left"});
}

TEST_F(GgufBad, Metadata) {
  std::string b = good_;
  put_u32(b, 24 + 8 + std::strlen("general.architecture"), 13);
  expect_bad("vtype.gguf", b, {"'general.architecture'", "unknown value type 13"});
  b = good_;
  put_u64(b, 24, uint64_t(1) << 60);
  expect_bad("keylen.gguf", b, {"metadata key #0", "string"});
  // test.array_i32: u32 type 9, u32 element type, u64 count.
  const size_t arr = after_string(good_, "test.array_i32");
  b = good_;
  put_u64(b, arr + 8, uint64_t(1) << 61);
  expect_bad("arraylen.gguf", b, {"'test.array_i32'", "array length", "2305843009213693952"});
  b = good_;
  put_u32(b, arr + 4, 77);
  expect_bad("elemtype.gguf", b, {"'test.array_i32'", "unknown value type 77"});
  const size_t s = after_string(good_, "test.string");
  b = good_;
  put_u64(b, s + 4, uint64_t(1) << 40);
  expect_bad("strlen.gguf", b, {"'test.string'", "string of 1099511627776 bytes"});
  const size_t bt = after_string(good_, "test.bool_true");
  b = good_;
  b[bt + 4] = 2;
  expect_bad("bool.gguf", b, {"'test.bool_true'", "bool byte is 2"});
  const size_t al = after_string(good_, "general.alignment");
  b = good_;
  put_u32(b, al + 4, 48);
  expect_bad("align.gguf", b, {"'general.alignment'", "48", "power of two"});
  b = good_;
  put_u32(b, al, 5);  // int32 instead of uint32
  expect_bad("aligntype.gguf", b, {"'general.alignment'", "int32"});
  // Duplicate key: test.u16 renamed to test.u8 would change lengths; rename test.i8 -> test.u8.
  b = good_;
  const size_t k = after_string(good_, "test.i8");
  b[k - 2] = 'u';
  expect_bad("dupkey.gguf", b, {"duplicate metadata key 'test.u8'"});
  // Arrays nested 20 deep.
  std::string nested = enc_str("deep") + enc_u32(9);
  for (int i = 0; i < 20; ++i) nested += enc_u32(9) + enc_u64(1);
  nested += enc_u32(4) + enc_u64(1) + enc_u32(7);
  expect_bad("deep.gguf", tiny_file(1, nested), {"'deep'", "nested more than"});
}

TEST_F(GgufBad, TensorInfos) {
  // After "q4_k": u32 n_dims (2), u64 dims[2] (512, 6), u32 type, u64 offset.
  const size_t t = tensor_at("q4_k");
  std::string b = good_;
  put_u32(b, t + 4 + 16, 99);
  expect_bad("ttype.gguf", b, {"tensor 'q4_k'", "unknown ggml tensor type 99"});
  put_u32(b, t + 4 + 16, 4);  // Q4_2, removed from ggml
  expect_bad("ttype4.gguf", b, {"tensor 'q4_k'", "unknown ggml tensor type 4"});
  b = good_;
  put_u32(b, t, 5);
  expect_bad("ndims.gguf", b, {"tensor 'q4_k'", "n_dims is 5"});
  b = good_;
  put_u64(b, t + 4, uint64_t(1) << 40);
  put_u64(b, t + 12, uint64_t(1) << 40);
  expect_bad("dims.gguf", b, {"tensor 'q4_k'", "overflows"});
  b = good_;
  put_u64(b, t + 12, ~uint64_t(0));
  expect_bad("negdim.gguf", b, {"tensor 'q4_k'", "dim 1", "negative"});
  b = good_;
  put_u64(b, t + 4, 100);
  expect_bad("block.gguf", b, {"tensor 'q4_k'", "100", "Q4_K", "256"});
  b = good_;
  put_u64(b, t + 4 + 20, uint64_t(1) << 50);
  expect_bad("offset.gguf", b, {"tensor 'q4_k'", "runs out of the file"});
  b = good_;
  put_u64(b, t + 4 + 20, get_u64(good_, t + 4 + 20) + 4);
  expect_bad("unaligned.gguf", b, {"tensor 'q4_k'", "not a multiple of the alignment 64"});
  b = good_;
  put_u64(b, t + 4 + 20, get_u64(good_, t + 4 + 20) - 64);
  expect_bad("overlap.gguf", b, {"tensor 'q4_k'", "overlaps tensor 'q5_1.random'"});
  b = good_;
  const size_t q = tensor_at("q4_k");
  b[q - 1] = '0';  // "q4_k" -> "q4_0", a name already there
  expect_bad("dupname.gguf", b, {"duplicate tensor name 'q4_0'"});
  b = good_;
  put_u64(b, tensor_at("f32") - 3 - 8, uint64_t(1) << 62);  // the first tensor's name length
  expect_bad("namelen.gguf", b, {"tensor #0 name", "string"});
}
