// Inputs that once made a fuzz target fail (fuzz/), replayed through the same
// entry points: each must now give a typed flex error naming the file, never
// an untyped exception or a crash. One folder per target under
// tests/reliability/fuzz_regressions/.
#include <flex/dispatch/checkpoint.h>
#include <flex/dispatch/device_map.h>
#include <flex/dispatch/offload_folder.h>
#include <flex/dispatch/safetensors.h>
#include <flex/hooks/errors.h>
#include <flex/models/config.h>
#include <flex/tokenizers/tokenizer.h>

#include <nlohmann/json.hpp>

#include "test_util.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <typeinfo>

namespace fs = std::filesystem;

namespace {

std::vector<fs::path> inputs(const std::string& target) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(fs::path(FLEX_FUZZ_REGRESSIONS) / target)) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// `run` must throw flex::FileFormatError whose message contains `needle`.
void expect_file_format_error(const std::function<void()>& run, const std::string& needle, const std::string& input) {
  try {
    run();
    ADD_FAILURE() << input << ": accepted";
  } catch (const flex::FileFormatError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << input << ": " << typeid(e).name() << ": " << e.what();
  }
}

// Each input of `target`, copied alone into a folder as `file_name`: loading
// the folder must throw FileFormatError containing `needle`.
void expect_each_refused_in_a_folder(const std::string& target, const std::string& file_name,
                                     const std::function<void(const std::string&)>& load, const std::string& needle) {
  auto files = inputs(target);
  ASSERT_FALSE(files.empty());
  for (const auto& f : files) {
    flex_test::TempDir dir;
    fs::copy_file(f, dir.path() / file_name);
    expect_file_format_error([&] { load(dir.str()); }, needle, f.string());
  }
}

}  // namespace

// A JSON number too large for a double (out_of_range, not parse_error, in nlohmann).
TEST(FuzzRegressions, SafetensorsHeaders) {
  auto files = inputs("safetensors");
  ASSERT_FALSE(files.empty());
  for (const auto& f : files)
    expect_file_format_error([&] { flex::SafetensorsFile::open(f.string()); }, f.filename().string(), f.string());
}

TEST(FuzzRegressions, OffloadIndexes) {
  auto files = inputs("offload_index");
  ASSERT_FALSE(files.empty());
  for (const auto& f : files)
    expect_file_format_error([&] { flex::OffloadIndex::parse(slurp(f), f.string()); }, f.filename().string(), f.string());
}

TEST(FuzzRegressions, CheckpointIndexes) {
  expect_each_refused_in_a_folder("checkpoint_index", "model.safetensors.index.json",
                                  [](const std::string& dir) { flex::Checkpoint::open(dir); },
                                  "model.safetensors.index.json");
}

// A key "" (the whole model) next to other keys sent clean_device_map into
// endless recursion (stack overflow). Cleaning must keep every key's device.
TEST(FuzzRegressions, DeviceMapsClean) {
  auto files = inputs("device_map");
  ASSERT_FALSE(files.empty());
  for (const auto& f : files) {
    flex::DeviceMap m = flex::DeviceMap::from_json(slurp(f), f.string());
    flex::DeviceMap cleaned = flex::clean_device_map(m);
    for (const auto& [key, dev] : m) EXPECT_EQ(cleaned.device_of(key), std::optional<flex::MapDevice>(dev)) << f << " " << key;
  }
}

// An index naming a shard whose path the OS refuses (ENAMETOOLONG) made
// std::filesystem throw an untyped filesystem_error; it is a NotFoundError
// naming the index and the shard.
TEST(FuzzRegressions, CheckpointIndexWithUnreadableShardPath) {
  auto files = inputs("checkpoint_index_unreadable_shard");
  ASSERT_FALSE(files.empty());
  for (const auto& f : files) {
    flex_test::TempDir dir;
    fs::copy_file(f, dir.path() / "model.safetensors.index.json");
    try {
      flex::Checkpoint::open(dir.str());
      ADD_FAILURE() << f << ": accepted";
    } catch (const flex::NotFoundError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("model.safetensors.index.json"), std::string::npos) << msg;
      EXPECT_NE(msg.find("points at shard"), std::string::npos) << msg;
    } catch (const std::exception& e) {
      ADD_FAILURE() << f << ": " << typeid(e).name() << ": " << e.what();
    }
  }
}

// A float size too large for int64 (intermediate_size 7.8e48) was cast to
// int64 (undefined behaviour, caught by UBSan); it is a ConfigError naming the field.
TEST(FuzzRegressions, ConfigIntegersOutOfRange) {
  auto files = inputs("config");
  ASSERT_FALSE(files.empty());
  for (const auto& f : files) {
    try {
      flex::parse_config(nlohmann::json::parse(slurp(f)), f.string());
      ADD_FAILURE() << f << ": accepted";
    } catch (const flex::ConfigError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("intermediate_size"), std::string::npos) << msg;
      EXPECT_NE(msg.find("must be an integer"), std::string::npos) << msg;
    } catch (const std::exception& e) {
      ADD_FAILURE() << f << ": " << typeid(e).name() << ": " << e.what();
    }
  }
}


// A BPE vocabulary with one id near 2^31 sized the id -> token table from it
// (a 54 GB allocation, out of memory under ASan); ids may leave only a bounded
// number unused, so the file is refused naming the token and its id.
TEST(FuzzRegressions, TokenizerVocabularyIdFarBeyondItsSize) {
  expect_each_refused_in_a_folder("tokenizer", "tokenizer.json",
                                  [](const std::string& dir) { flex::load_tokenizer(dir); }, "model.vocab: token");
}
