// safetensors reader/writer: byte-exact against the upstream writer's fixture
// files, values against independent sources, and every validation error.
#include <flex/dispatch/atomic_file.h>
#include <flex/dispatch/safetensors.h>
#include <flex/hooks/errors.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "expect_error.h"
#include "test_util.h"

namespace fs = std::filesystem;
using flex_test::fixture;

namespace {

using flex_test::expect_error;

std::string slurp(const std::string& path) { return flex::read_file(path); }

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

// A file from a header string and `data_bytes` zero bytes of data.
std::string make_file(const std::string& header, size_t data_bytes, uint64_t length_override = UINT64_MAX) {
  uint64_t n = length_override == UINT64_MAX ? header.size() : length_override;
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + std::string(data_bytes, '\0');
}

std::vector<std::pair<std::string, at::Tensor>> read_all(const flex::SafetensorsFile& f) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& n : f.names()) out.emplace_back(n, f.get(n));
  return out;
}


}  // namespace

// Reading every upstream-written file and writing its tensors back gives the
// same bytes: dtype-alignment order, name order, metadata, padding.
TEST(Safetensors, WriteBackIsByteIdenticalToUpstreamFiles) {
  std::vector<std::string> files = {
      "models/gpt2/model.safetensors", "models/llama/model.safetensors", "models/gpt-neox/model.safetensors",
      "models/llama3-rope-tied/model.safetensors", "models/llama-bf16/model.safetensors",
      "models/llama-sharded/model-00001-of-00003.safetensors",
      "models/llama-sharded/model-00002-of-00003.safetensors",
      "models/llama-sharded/model-00003-of-00003.safetensors", "golden/gpt2.safetensors",
      "golden/inputs.safetensors", "offload/mixed-dtypes/expected.safetensors"};
  flex_test::TempDir tmp;
  for (const auto& rel : files) {
    SCOPED_TRACE(rel);
    auto f = flex::SafetensorsFile::open(fixture(rel));
    auto tensors = read_all(*f);
    std::reverse(tensors.begin(), tensors.end());  // input order must not matter
    std::string out = tmp.str("out.safetensors");
    flex::save_safetensors(out, tensors, f->metadata());
    EXPECT_TRUE(slurp(out) == slurp(fixture(rel))) << "bytes differ for " << rel;
  }
}

// The header of a hand-built mixed-dtype file, spelled out by hand from the
// format's rules (I64 > F32 > BF16 > BOOL, then names, then space padding).
TEST(Safetensors, WriterHeaderMatchesTheFormatRules) {
  flex_test::TempDir tmp;
  std::vector<std::pair<std::string, at::Tensor>> t = {
      {"b", at::tensor({1.0f, 2.0f})},
      {"a", at::tensor({1, 0, 1}, at::kByte).to(at::kBool)},
      {"c", at::tensor({int64_t(7)})},
      {"d", at::tensor({1.5f}).to(at::kBFloat16)},
      {"aa", at::tensor({3.0f})}};
  flex::save_safetensors(tmp.str("x.safetensors"), t, {{"format", "pt"}});
  std::string bytes = slurp(tmp.str("x.safetensors"));
  std::string expect =
      "{\"__metadata__\":{\"format\":\"pt\"},"
      "\"c\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]},"
      "\"aa\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]},"
      "\"d\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[20,22]},"
      "\"a\":{\"dtype\":\"BOOL\",\"shape\":[3],\"data_offsets\":[22,25]}}";
  expect.append((8 - expect.size() % 8) % 8, ' ');
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ(n, expect.size());
  EXPECT_EQ(bytes.substr(8, n), expect);
  EXPECT_EQ(bytes.size(), 8 + n + 25);
  // Data: int64 7 little-endian first.
  EXPECT_EQ(static_cast<uint8_t>(bytes[8 + n]), 7);
}

// Values checked against independent sources: inputs.json, and the README's
// statement that llama-bf16 is the llama weights cast to bfloat16.
TEST(Safetensors, ReadsValuesOfTheFixtures) {
  auto in = flex::SafetensorsFile::open(fixture("golden/inputs.safetensors"));
  at::Tensor ids = in->get("input_ids");
  at::Tensor expect = at::tensor({31, 120, 25, 102, 49, 202, 120, 169, 42, 171, 17, 111, 214, 244, 94, 193},
                                 at::kLong).reshape({2, 8});
  EXPECT_TRUE(flex_test::equal(ids, expect));

  auto f32 = flex::SafetensorsFile::open(fixture("models/llama/model.safetensors"));
  auto bf16 = flex::SafetensorsFile::open(fixture("models/llama-bf16/model.safetensors"));
  ASSERT_EQ(f32->names().size(), 21u);
  for (const auto& n : f32->names()) {
    SCOPED_TRACE(n);
    EXPECT_EQ(bf16->info(n).dtype, at::kBFloat16);
    EXPECT_EQ(bf16->info(n).dtype_name, "BF16");
    EXPECT_TRUE(flex_test::equal(bf16->get(n), f32->get(n).to(at::kBFloat16)));
  }
  EXPECT_EQ(f32->metadata().at("format"), "pt");
  const auto& info = f32->info("model.embed_tokens.weight");
  EXPECT_EQ(info.shape, (std::vector<int64_t>{256, 64}));
  EXPECT_EQ(info.nbytes(), 256u * 64 * 4);
  // names() follows the data offsets.
  uint64_t last = 0;
  for (const auto& n : f32->names()) {
    EXPECT_EQ(f32->info(n).begin, last);
    last = f32->info(n).end;
  }
  EXPECT_EQ(f32->data_offset() + last, f32->file_size());
}

TEST(Safetensors, ViewsAreZeroCopyAndOutliveTheFile) {
  flex_test::TempDir tmp;
  std::string path = tmp.str("z.safetensors");
  at::Tensor a = at::arange(1000, at::kFloat), b = at::arange(10, at::kFloat) * 2;
  flex::save_safetensors(path, {{"a", a}, {"b", b}});
  std::string original = slurp(path);
  at::Tensor va, vb;
  {
    auto f = flex::SafetensorsFile::open(path);
    va = f->get("a");
    vb = f->get("b");
    // Two reads of one tensor share memory; neighbours sit at their file offsets.
    EXPECT_EQ(f->get("a").data_ptr(), va.data_ptr());
    EXPECT_EQ(static_cast<char*>(vb.data_ptr()) - static_cast<char*>(va.data_ptr()),
              static_cast<ptrdiff_t>(f->info("b").begin - f->info("a").begin));
  }  // the SafetensorsFile is gone; the views keep the mapping alive
  EXPECT_TRUE(flex_test::equal(va, a));
  EXPECT_TRUE(flex_test::equal(vb, b));
  // Editing a view is copy-on-write: the file keeps its bytes.
  va.mul_(3);
  EXPECT_TRUE(flex_test::equal(va, a * 3));
  EXPECT_TRUE(slurp(path) == original);
}

TEST(Safetensors, ScalarsEmptyAndStridedTensorsRoundTrip) {
  flex_test::TempDir tmp;
  std::string path = tmp.str("s.safetensors");
  at::Tensor scalar = at::scalar_tensor(3.25, at::kDouble);
  at::Tensor empty = at::empty({0, 4}, at::kInt);
  at::Tensor strided = at::arange(12, at::kShort).reshape({3, 4}).t();  // not contiguous
  at::Tensor i8 = at::tensor({-1, 2, -3}, at::kChar), u8 = at::tensor({250, 1}, at::kByte);
  at::Tensor f16 = at::tensor({0.5f, -65504.0f}).to(at::kHalf);
  flex::save_safetensors(path, {{"scalar", scalar}, {"empty", empty}, {"strided", strided}, {"i8", i8}, {"u8", u8}, {"f16", f16}});
  auto f = flex::SafetensorsFile::open(path);
  EXPECT_EQ(f->get("scalar").dim(), 0);
  EXPECT_EQ(f->get("scalar").item<double>(), 3.25);
  EXPECT_EQ(f->get("empty").sizes(), at::IntArrayRef({0, 4}));
  EXPECT_TRUE(flex_test::equal(f->get("strided"), strided));
  EXPECT_TRUE(flex_test::equal(f->get("i8"), i8));
  EXPECT_TRUE(flex_test::equal(f->get("u8"), u8));
  EXPECT_TRUE(flex_test::equal(f->get("f16"), f16));
  EXPECT_TRUE(f->metadata().empty());
}

TEST(Safetensors, UnknownNameListsClosestNames) {
  auto f = flex::SafetensorsFile::open(fixture("models/llama/model.safetensors"));
  EXPECT_FALSE(f->contains("model.norm.weights"));
  expect_error<flex::NotFoundError>([&] { f->info("model.norm.weights"); },
                                    {"model.norm.weights", "models/llama/model.safetensors", "'model.norm.weight'"});
}

TEST(Safetensors, WriterRejectsBadInput) {
  flex_test::TempDir tmp;
  std::string path = tmp.str("bad.safetensors");
  expect_error<flex::ConfigError>([&] { flex::save_safetensors(path, {{"x", at::ones({1})}, {"x", at::ones({1})}}); },
                                  {"'x'", "twice"});
  expect_error<flex::UnsupportedError>(
      [&] { flex::save_safetensors(path, {{"m", at::empty({2}, at::TensorOptions().device(at::kMeta))}}); },
      {"'m'", "meta"});
  expect_error<flex::UnsupportedError>([&] { flex::save_safetensors(path, {{"c", at::ones({2}, at::kComplexFloat)}}); },
                                       {"'c'"});
  EXPECT_FALSE(fs::exists(path));
  // An unwritable destination: IOError naming it, no temp file left behind.
  std::string nodir = tmp.str("missing/dir/x.safetensors");
  expect_error<flex::IOError>([&] { flex::save_safetensors(nodir, {{"x", at::ones({1})}}); }, {nodir});
  EXPECT_EQ(std::distance(fs::directory_iterator(tmp.path()), fs::directory_iterator()), 0);
}

TEST(AtomicFile, UncommittedWriteLeavesNothingAndKeepsTheOldFile) {
  flex_test::TempDir tmp;
  std::string path = tmp.str("f.txt");
  flex::write_file_atomic(path, "old");
  {
    flex::AtomicFile f(path);
    EXPECT_EQ(f.temp_path(), path + ".tmp." + std::to_string(::getpid()));
    f.write("new contents");
    EXPECT_TRUE(fs::exists(f.temp_path()));
  }  // destroyed without commit, as when an exception unwinds
  EXPECT_EQ(slurp(path), "old");
  EXPECT_EQ(std::distance(fs::directory_iterator(tmp.path()), fs::directory_iterator()), 1);
  flex::AtomicFile g(path);
  g.write("new");
  g.commit();
  EXPECT_EQ(slurp(path), "new");
  EXPECT_FALSE(fs::exists(g.temp_path()));
}

// ---- validation: each fault is a typed error naming the file and the fault ----

class SafetensorsValidation : public ::testing::Test {
 protected:
  flex_test::TempDir tmp;
  std::string path = tmp.str("v.safetensors");
  template <class E = flex::FileFormatError>
  void expect_bad(const std::string& bytes, std::vector<std::string> needles) {
    spit(path, bytes);
    needles.push_back(path);
    expect_error<E>([&] { flex::SafetensorsFile::open(path); }, needles);
  }
};

TEST_F(SafetensorsValidation, TruncatedFile) { expect_bad(std::string(5, '\0'), {"5 bytes", "shorter"}); }

TEST_F(SafetensorsValidation, HeaderLengthOverLimit) {
  expect_bad(make_file("{}", 0, 100000001), {"100000001", "exceeds"});
}

TEST_F(SafetensorsValidation, HeaderLengthBeyondFile) {
  expect_bad(make_file("{}", 0, 64), {"header length 64", "beyond the end"});
}

TEST_F(SafetensorsValidation, BadJson) { expect_bad(make_file("{\"a\":", 0), {"not valid JSON"}); }

TEST_F(SafetensorsValidation, HeaderNotAnObject) { expect_bad(make_file("[1,2]   ", 0), {"'{'"}); }

TEST_F(SafetensorsValidation, EntryNotAnObject) { expect_bad(make_file("{\"a\":[1,2]}", 0), {"'a'", "not a JSON object"}); }

TEST_F(SafetensorsValidation, MissingFields) {
  expect_bad(make_file("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4), {"'a'", "shape"});
}

TEST_F(SafetensorsValidation, MetadataNotStrings) {
  expect_bad(make_file("{\"__metadata__\":{\"n\":3}}", 0), {"__metadata__", "'n'"});
}

TEST_F(SafetensorsValidation, UnknownDtype) {
  expect_bad(make_file("{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4), {"'a'", "F33"});
}

TEST_F(SafetensorsValidation, ValidButUnsupportedDtypeFailsOnRead) {
  spit(path, make_file("{\"a\":{\"dtype\":\"U16\",\"shape\":[2],\"data_offsets\":[0,4]},"
                       "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8));
  auto f = flex::SafetensorsFile::open(path);  // the other tensors stay readable
  EXPECT_EQ(f->get("b").item<float>(), 0.0f);
  EXPECT_EQ(f->info("a").dtype_name, "U16");
  expect_error<flex::UnsupportedError>([&] { f->get("a"); }, {"'a'", "U16", path});
}

TEST_F(SafetensorsValidation, ReversedOffsets) {
  expect_bad(make_file("{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4), {"'a'", "end before"});
}

TEST_F(SafetensorsValidation, HeaderOrderMayDifferFromOffsetOrder) {
  // Upstream writes headers from a hash map: offsets, not key order, must be sorted.
  spit(path, make_file("{\"z\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                       "\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]}}", 4));
  auto f = flex::SafetensorsFile::open(path);
  EXPECT_EQ(f->names(), (std::vector<std::string>{"z", "a"}));
}

TEST_F(SafetensorsValidation, OverlappingOffsets) {
  expect_bad(make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                       "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12),
             {"'b'", "overlaps"});
}

TEST_F(SafetensorsValidation, HoleBetweenTensors) {
  expect_bad(make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                       "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12),
             {"hole", "'b'"});
}

TEST_F(SafetensorsValidation, OffsetsOutOfRange) {
  expect_bad(make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8), {"'a'", "out of range"});
}

TEST_F(SafetensorsValidation, DataNotCoveredExactly) {
  expect_bad(make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 12),
             {"cover 4 bytes", "12 bytes"});
}

TEST_F(SafetensorsValidation, ByteCountNotMatchingShape) {
  expect_bad(make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8),
             {"'a'", "8 bytes", "needs 12"});
}

TEST_F(SafetensorsValidation, DuplicateNames) {
  expect_bad(make_file("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                       "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2),
             {"duplicate", "'a'"});
}

TEST_F(SafetensorsValidation, MissingFileIsIOError) {
  expect_error<flex::IOError>([&] { flex::SafetensorsFile::open(tmp.str("nope.safetensors")); }, {"nope.safetensors"});
}
