// Accelerate offload folders: byte-identical writes, zero-copy reads, merging.
#include <flex/dispatch/atomic_file.h>
#include <flex/dispatch/offload_folder.h>
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


// The files of a folder, name -> bytes.
std::map<std::string, std::string> folder_bytes(const std::string& dir, const std::string& skip = "") {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename() != skip) out[e.path().filename().string()] = flex::read_file(e.path().string());
  return out;
}

}  // namespace

// Reading expected.safetensors (the same tensors, in the index's order) and
// offloading them reproduces Accelerate's folder byte for byte: the .dat
// files and index.json (json.dump indent=2, bf16 as "bfloat16", 0-d as []).
TEST(OffloadFolder, MixedDtypesByteIdenticalToAccelerate) {
  auto expected = flex::SafetensorsFile::open(fixture("offload/mixed-dtypes/expected.safetensors"));
  auto ref_index = flex::load_offload_index(fixture("offload/mixed-dtypes"));
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [name, e] : ref_index.entries()) tensors.emplace_back(name, expected->get(name));
  flex_test::TempDir tmp;
  flex::offload_state_dict(tmp.str("off"), tensors);
  auto ours = folder_bytes(tmp.str("off"));
  auto ref = folder_bytes(fixture("offload/mixed-dtypes"), "expected.safetensors");
  EXPECT_EQ(ours.size(), ref.size());
  for (const auto& [name, bytes] : ref) EXPECT_TRUE(ours[name] == bytes) << name;
}

TEST(OffloadFolder, LlamaStateDictByteIdenticalToAccelerate) {
  auto model = flex::SafetensorsFile::open(fixture("models/llama/model.safetensors"));
  auto ref_index = flex::load_offload_index(fixture("offload/llama"));
  ASSERT_EQ(ref_index.size(), 21u);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [name, e] : ref_index.entries()) tensors.emplace_back(name, model->get(name));
  flex_test::TempDir tmp;
  flex::offload_state_dict(tmp.str(), tensors);
  auto ours = folder_bytes(tmp.str());
  auto ref = folder_bytes(fixture("offload/llama"));
  EXPECT_EQ(ours.size(), ref.size());
  for (const auto& [name, bytes] : ref) EXPECT_TRUE(ours[name] == bytes) << name;
}

// Reading Accelerate's folder gives the tensors of expected.safetensors.
TEST(OffloadFolder, ReadsAccelerateFolderAsZeroCopyViews) {
  auto folder = flex::OffloadFolder::open(fixture("offload/mixed-dtypes"));
  auto expected = flex::SafetensorsFile::open(fixture("offload/mixed-dtypes/expected.safetensors"));
  ASSERT_EQ(folder.names().size(), 10u);
  for (const auto& name : folder.names()) {
    SCOPED_TRACE(name);
    at::Tensor t = folder.get(name), e = expected->get(name);
    EXPECT_EQ(t.scalar_type(), e.scalar_type());
    EXPECT_EQ(t.sizes(), e.sizes());
    EXPECT_TRUE(flex_test::equal(t, e));
  }
  EXPECT_EQ(folder.get("f32.scalar").dim(), 0);
  EXPECT_EQ(folder.get("f32.scalar").item<float>(), 3.25f);
  EXPECT_EQ(folder.get("bf16.matrix").scalar_type(), at::kBFloat16);
  // Views are private copy-on-write mappings: editing one changes neither
  // the file nor later reads.
  flex_test::TempDir tmp;
  flex::offload_state_dict(tmp.str(), {{"w", at::arange(6, at::kFloat)}});
  auto f2 = flex::OffloadFolder::open(tmp.str());
  at::Tensor w = f2.get("w");
  w.add_(1);
  EXPECT_TRUE(flex_test::equal(f2.get("w"), at::arange(6, at::kFloat)));
  expect_error<flex::NotFoundError>([&] { folder.get("f32.matrx"); }, {"'f32.matrx'", "'f32.matrix'", "mixed-dtypes"});
}

// save_offload_index merges like dict.update: existing keys keep their place.
TEST(OffloadFolder, IndexMergesOnEverySave) {
  flex_test::TempDir tmp;
  std::string dir = tmp.str();
  flex::offload_state_dict(dir, {{"a", at::ones({2})}, {"b", at::ones({3})}});
  flex::OffloadIndex idx;
  flex::offload_weight(at::zeros({4}, at::kDouble), "c", dir, idx);
  flex::offload_weight(at::zeros({5}, at::kHalf), "a", dir, idx);
  flex::save_offload_index(idx, dir);
  std::string expect =
      "{\n  \"a\": {\n    \"dtype\": \"float16\",\n    \"shape\": [\n      5\n    ]\n  },\n"
      "  \"b\": {\n    \"dtype\": \"float32\",\n    \"shape\": [\n      3\n    ]\n  },\n"
      "  \"c\": {\n    \"dtype\": \"float64\",\n    \"shape\": [\n      4\n    ]\n  }\n}";
  EXPECT_EQ(flex::read_file(dir + "/index.json"), expect);
  auto f = flex::OffloadFolder::open(dir);
  EXPECT_EQ(f.get("a").scalar_type(), at::kHalf);
  EXPECT_EQ(f.get("a").numel(), 5);
  EXPECT_EQ(fs::file_size(dir + "/a.dat"), 10u);
}

// Entries that point into a safetensors file (Transformers' form), cast to the entry's dtype.
TEST(OffloadFolder, SafetensorsEntries) {
  flex_test::TempDir tmp;
  std::string st = fs::absolute(fixture("models/llama/model.safetensors")).string();
  std::ofstream(tmp.str("index.json")) << "{\"w\": {\"safetensors_file\": \"" << st
                                       << "\", \"weight_name\": \"model.norm.weight\", \"dtype\": \"float16\"},"
                                       << " \"v\": {\"safetensors_file\": \"" << st
                                       << "\", \"weight_name\": \"model.layers.0.input_layernorm.weight\"}}";
  auto f = flex::OffloadFolder::open(tmp.str());
  auto model = flex::SafetensorsFile::open(st);
  EXPECT_TRUE(flex_test::equal(f.get("w"), model->get("model.norm.weight").to(at::kHalf)));
  EXPECT_TRUE(flex_test::equal(f.get("v"), model->get("model.layers.0.input_layernorm.weight")));
  // Re-saving an index keeps the entry's form.
  flex::OffloadIndex extra;
  flex::offload_weight(at::ones({1}), "z", tmp.str(), extra);
  flex::save_offload_index(extra, tmp.str());
  auto again = flex::load_offload_index(tmp.str());
  ASSERT_NE(again.find("w"), nullptr);
  EXPECT_EQ(again.find("w")->weight_name, "model.norm.weight");
  EXPECT_EQ(again.find("w")->dtype, "float16");
}

TEST(OffloadFolder, Errors) {
  flex_test::TempDir tmp;
  std::string dir = tmp.str();
  expect_error<flex::IOError>([&] { flex::OffloadFolder::open(dir); }, {dir, "index.json"});
  flex::offload_state_dict(dir, {{"a", at::ones({4})}});
  // A .dat file of the wrong size.
  std::ofstream(dir + "/a.dat", std::ios::binary | std::ios::trunc) << "xyz";
  auto f = flex::OffloadFolder::open(dir);
  expect_error<flex::FileFormatError>([&] { f.get("a"); }, {"a.dat", "3 bytes", "needs 16"});
  // A missing .dat file.
  fs::remove(dir + "/a.dat");
  expect_error<flex::IOError>([&] { f.get("a"); }, {"a.dat"});
  // Malformed index entries.
  std::ofstream(dir + "/index.json", std::ios::trunc) << R"({"a": {"dtype": "float32"}})";
  expect_error<flex::FileFormatError>([&] { flex::OffloadFolder::open(dir); }, {"index.json", "'a'", "shape"});
  std::ofstream(dir + "/index.json", std::ios::trunc) << R"({"a": {"dtype": "complex64", "shape": [1]}})";
  auto g = flex::OffloadFolder::open(dir);
  expect_error<flex::UnsupportedError>([&] { g.get("a"); }, {"'a'", "complex64"});
  // Names that would escape the folder; meta tensors.
  flex::OffloadIndex idx;
  expect_error<flex::ConfigError>([&] { flex::offload_weight(at::ones({1}), "../x", dir, idx); }, {"../x"});
  expect_error<flex::UnsupportedError>(
      [&] { flex::offload_weight(at::empty({1}, at::TensorOptions().device(at::kMeta)), "m", dir, idx); }, {"'m'", "meta"});
}
