// The bad-input catalogue: one table of distinct bad inputs across files,
// configs, device maps, hook registrations, tensor shapes and (when the
// flexmodel binary is built) CLI arguments. Every row must fail with the
// stated typed flex error whose message names the culprit (file, key, module,
// shape or flag) — never a crash, a hang, an untyped exception or success.
#include <flex/dispatch/atomic_file.h>
#include <flex/dispatch/checkpoint.h>
#include <flex/dispatch/device_map.h>
#include <flex/dispatch/load_checkpoint.h>
#include <flex/dispatch/memory.h>
#include <flex/dispatch/offload_folder.h>
#include <flex/dispatch/safetensors.h>
#include <flex/dispatch/set_module_tensor.h>
#include <flex/flexcore/flex_model.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/nn.h>
#include <flex/models/config.h>
#include <flex/tokenizers/tokenizer.h>

#include "test_util.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <typeinfo>
#include <sys/wait.h>
#include <vector>

namespace fs = std::filesystem;
using namespace flex;

namespace {

enum class Kind { NotFound, Shape, FileFormat, IO, DeviceMap, Config, Unsupported, CliExit };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::NotFound: return "NotFoundError";
    case Kind::Shape: return "ShapeError";
    case Kind::FileFormat: return "FileFormatError";
    case Kind::IO: return "IOError";
    case Kind::DeviceMap: return "DeviceMapError";
    case Kind::Config: return "ConfigError";
    case Kind::Unsupported: return "UnsupportedError";
    case Kind::CliExit: return "the expected exit status with one error line";
  }
  return "?";
}

bool is_kind(const Error& e, Kind k) {
  switch (k) {
    case Kind::NotFound: return dynamic_cast<const NotFoundError*>(&e) != nullptr;
    case Kind::Shape: return dynamic_cast<const ShapeError*>(&e) != nullptr;
    case Kind::FileFormat: return dynamic_cast<const FileFormatError*>(&e) != nullptr;
    case Kind::IO: return dynamic_cast<const IOError*>(&e) != nullptr;
    case Kind::DeviceMap: return dynamic_cast<const DeviceMapError*>(&e) != nullptr;
    case Kind::Config: return dynamic_cast<const ConfigError*>(&e) != nullptr;
    case Kind::Unsupported: return dynamic_cast<const UnsupportedError*>(&e) != nullptr;
    case Kind::CliExit: return false;
  }
  return false;
}

// ---- a scratch area shared by the rows ---------------------------------------------------

flex_test::TempDir& scratch() {
  static flex_test::TempDir dir;
  return dir;
}

std::string put(const std::string& rel, const std::string& bytes) {
  fs::path p = scratch().path() / rel;
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << bytes;
  return p.string();
}

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return s;
}

// A safetensors file from a header and a data section (header not padded: the
// reader must not require padding, upstream does not).
std::string st(const std::string& rel, const std::string& header, const std::string& data) {
  return put(rel, le64(header.size()) + header + data);
}

// A small valid safetensors file: w [2, 2] F32 (16 bytes).
std::string good_st(const std::string& rel) {
  return st(rel, R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})", std::string(16, '\0'));
}

// A gpt2 config.json with one field replaced (or removed when `value` is null).
std::string gpt2_config(const std::string& rel, const std::string& field, const nlohmann::json& value) {
  std::ifstream in(flex_test::fixture("models/gpt2/config.json"));
  nlohmann::json j = nlohmann::json::parse(in);
  if (value.is_null())
    j.erase(field);
  else
    j[field] = value;
  return put(rel, j.dump());
}

// fc1 (4 -> 8), act, fc2 (8 -> 2).
struct Net : Module {
  std::shared_ptr<Linear> fc1, fc2;
  std::shared_ptr<Activation> act;
  Net() : Module("Net") {
    fc1 = add("fc1", std::make_shared<Linear>(4, 8));
    act = add("act", std::make_shared<Activation>("relu"));
    fc2 = add("fc2", std::make_shared<Linear>(8, 2));
  }
  Value forward(Inputs in) override { return (*fc2)((*act)((*fc1)(in.tensor(0)))); }
};

std::shared_ptr<HookFunction> hook(const std::string& name, HookFunctionOptions o = {}) {
  return std::make_shared<HookFunction>(name, std::move(o));
}

at::Tensor x() { return at::ones({3, 4}); }

// ---- CLI ---------------------------------------------------------------------------------

#ifdef FLEX_CLI
// Runs the CLI with `args`; throws ConfigError carrying stderr when it exits
// with `status` (2: usage error, 1: runtime error) and prints exactly one
// line, so the row's needles apply to that line.
void cli(const std::string& args, int want_status) {
  const std::string err = scratch().str("cli.err");
  const std::string cmd = std::string(FLEX_CLI) + " " + args + " >/dev/null 2>" + err;
  int rc = std::system(cmd.c_str());
  std::string text = read_file(err);
  int status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  size_t lines = 0;
  for (char c : text) lines += c == '\n';
  if (status == want_status && lines == 1) throw ConfigError(text);
  throw std::runtime_error("flexmodel " + args + " exited " + std::to_string(status) + " with " +
                           std::to_string(lines) + " stderr lines: " + text);
}
#endif

// ---- the catalogue -----------------------------------------------------------------------

struct Row {
  std::string name;
  Kind kind;
  std::vector<std::string> needles;  // substrings the message must contain
  std::function<void()> run;
};

std::vector<Row> catalogue() {
  std::vector<Row> rows = {
      // ---------- safetensors files
      {"st_empty_file", Kind::FileFormat, {"st_empty.safetensors"},
       [] { SafetensorsFile::open(put("st_empty.safetensors", "")); }},
      {"st_header_longer_than_file", Kind::FileFormat, {"st_trunc.safetensors"},
       [] { SafetensorsFile::open(put("st_trunc.safetensors", le64(1000) + "{}")); }},
      {"st_header_over_limit", Kind::FileFormat, {"st_huge.safetensors"},
       [] { SafetensorsFile::open(put("st_huge.safetensors", le64(uint64_t(1) << 40) + "{}")); }},
      {"st_header_not_json", Kind::FileFormat, {"st_json.safetensors"},
       [] { SafetensorsFile::open(st("st_json.safetensors", "{\"w\": [", "")); }},
      {"st_header_not_object", Kind::FileFormat, {"st_array.safetensors"},
       [] { SafetensorsFile::open(st("st_array.safetensors", "[1,2]", "")); }},
      {"st_unknown_dtype", Kind::FileFormat, {"st_dtype.safetensors", "F33"},
       [] { SafetensorsFile::open(st("st_dtype.safetensors", R"({"w":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", std::string(4, 'x'))); }},
      {"st_offsets_past_end", Kind::FileFormat, {"st_range.safetensors", "w"},
       [] { SafetensorsFile::open(st("st_range.safetensors", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", std::string(8, 'x'))); }},
      {"st_shape_disagrees_with_bytes", Kind::FileFormat, {"st_shape.safetensors", "w"},
       [] { SafetensorsFile::open(st("st_shape.safetensors", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", std::string(16, 'x'))); }},
      {"st_overlapping_tensors", Kind::FileFormat, {"st_overlap.safetensors"},
       [] { SafetensorsFile::open(st("st_overlap.safetensors", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", std::string(12, 'x'))); }},
      {"st_negative_dim", Kind::FileFormat, {"st_neg.safetensors", "w"},
       [] { SafetensorsFile::open(st("st_neg.safetensors", R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", std::string(4, 'x'))); }},
      {"st_missing_file", Kind::IO, {"no_such.safetensors"},
       [] { SafetensorsFile::open(scratch().str("no_such.safetensors")); }},
      {"st_unknown_tensor_name", Kind::NotFound, {"ww", "'w'"},
       [] { SafetensorsFile::open(good_st("st_good.safetensors"))->get("ww"); }},
      {"st_save_reserved_name", Kind::Config, {"__metadata__"},
       [] { save_safetensors(scratch().str("st_out.safetensors"), {{"__metadata__", at::ones({1})}}); }},
      {"st_save_meta_tensor", Kind::Unsupported, {"m"},
       [] { save_safetensors(scratch().str("st_out2.safetensors"), {{"m", at::empty({2}, at::kMeta)}}); }},
      // ---------- sharded index
      {"index_not_json", Kind::FileFormat, {"model.safetensors.index.json"},
       [] { Checkpoint::open(put("idx1/model.safetensors.index.json", "{\"weight_map\": ")); }},
      {"index_names_missing_shard", Kind::NotFound, {"absent-shard.safetensors"},
       [] { Checkpoint::open(put("idx2/model.safetensors.index.json", R"({"weight_map":{"w":"absent-shard.safetensors"}})")); }},
      {"index_key_not_in_its_shard", Kind::FileFormat, {"v"},
       [] {
         good_st("idx3/s1.safetensors");
         Checkpoint::open(put("idx3/model.safetensors.index.json", R"({"weight_map":{"w":"s1.safetensors","v":"s1.safetensors"}})"));
       }},
      {"index_weight_map_not_object", Kind::FileFormat, {"model.safetensors.index.json"},
       [] { Checkpoint::open(put("idx4/model.safetensors.index.json", R"({"weight_map":[1,2]})")); }},
      {"folder_without_checkpoint", Kind::NotFound, {"idx5"},
       [] { put("idx5/readme.txt", "x"); Checkpoint::open(scratch().str("idx5")); }},
      {"folder_with_two_indexes", Kind::FileFormat, {"idx6"},
       [] {
         put("idx6/a.index.json", "{}");
         put("idx6/b.index.json", "{}");
         Checkpoint::open(scratch().str("idx6"));
       }},
      {"checkpoint_missing_path", Kind::IO, {"nowhere"},
       [] { Checkpoint::open(scratch().str("nowhere")); }},
      // ---------- offload folders
      {"offload_no_index", Kind::IO, {"index.json"},
       [] { fs::create_directories(scratch().path() / "off1"); OffloadFolder::open(scratch().str("off1")); }},
      {"offload_index_not_json", Kind::FileFormat, {"index.json"},
       [] { OffloadIndex::parse("{\"a\": {", "off/index.json"); }},
      {"offload_entry_not_object", Kind::FileFormat, {"'w'"},
       [] { OffloadIndex::parse(R"({"w": 3})", "off/index.json"); }},
      {"offload_dat_wrong_size", Kind::FileFormat, {"w"},
       [] {
         put("off2/w.dat", std::string(12, 'x'));
         put("off2/index.json", R"({"w":{"dtype":"float32","shape":[4]}})");
         OffloadFolder::open(scratch().str("off2")).get("w");
       }},
      {"offload_dat_missing", Kind::IO, {"v.dat"},
       [] {
         put("off3/index.json", R"({"v":{"dtype":"float32","shape":[4]}})");
         OffloadFolder::open(scratch().str("off3")).get("v");
       }},
      {"offload_unknown_dtype", Kind::Unsupported, {"float33"},
       [] {
         put("off4/u.dat", std::string(4, 'x'));
         put("off4/index.json", R"({"u":{"dtype":"float33","shape":[1]}})");
         OffloadFolder::open(scratch().str("off4")).get("u");
       }},
      {"offload_unknown_name", Kind::NotFound, {"lm_head.weigth"},
       [] { OffloadFolder::open(flex_test::fixture("offload/llama")).get("lm_head.weigth"); }},
      {"offload_weight_name_with_slash", Kind::Config, {"a/b"},
       [] {
         OffloadIndex idx;
         offload_weight(at::ones({2}), "a/b", scratch().str("off5"), idx);
       }},
      // ---------- torch .bin
      {"bin_not_a_zip", Kind::Unsupported, {"junk.bin", "zip"},
       [] { load_torch_bin(put("junk.bin", std::string(64, 'j'))); }},
      {"bin_truncated", Kind::FileFormat, {"cut.bin"},
       [] {
         std::string b = read_file(flex_test::data_path("files/torch-bin/pytorch_model.bin"));
         load_torch_bin(put("cut.bin", b.substr(0, b.size() / 2)));
       }},
      // ---------- configs
      {"config_missing", Kind::IO, {"cfg_none"},
       [] { load_config(scratch().str("cfg_none/config.json")); }},
      {"config_not_json", Kind::FileFormat, {"cfg1.json"},
       [] { load_config(put("cfg1.json", "{\"model_type\": \"gpt2\",")); }},
      {"config_unknown_model_type", Kind::Config, {"bert"},
       [] { load_config(gpt2_config("cfg2.json", "model_type", "bert")); }},
      {"config_missing_size_field", Kind::Config, {"n_embd"},
       [] { load_config(gpt2_config("cfg3.json", "n_embd", nullptr)); }},
      {"config_field_wrong_type", Kind::Config, {"n_layer"},
       [] { load_config(gpt2_config("cfg4.json", "n_layer", "two")); }},
      {"config_heads_do_not_divide_hidden", Kind::Config, {"n_head"},
       [] { load_config(gpt2_config("cfg5.json", "n_head", 5)); }},
      {"config_negative_vocab", Kind::Config, {"vocab_size"},
       [] { load_config(gpt2_config("cfg6.json", "vocab_size", -3)); }},
      {"config_not_object", Kind::Config, {"cfg7.json"},
       [] { load_config(put("cfg7.json", "[1,2,3]")); }},
      // ---------- tokenizer files
      {"tokenizer_json_not_json", Kind::FileFormat, {"tokenizer.json"},
       [] { put("tok1/tokenizer.json", "{\"model\": "); load_tokenizer(scratch().str("tok1")); }},
      {"tokenizer_folder_empty", Kind::IO, {"tok2"},
       [] { fs::create_directories(scratch().path() / "tok2"); load_tokenizer(scratch().str("tok2")); }},
      // ---------- device maps and budgets
      {"device_map_not_json", Kind::FileFormat, {"dm.json"},
       [] { DeviceMap::from_json("{\"a\": ", "dm.json"); }},
      {"device_map_not_object", Kind::FileFormat, {"dm.json"},
       [] { DeviceMap::from_json("[0, 1]", "dm.json"); }},
      {"device_map_unknown_device", Kind::DeviceMap, {"tpu", "fc1"},
       [] { DeviceMap::from_json(R"({"fc1": "tpu"})", "dm.json"); }},
      {"device_map_non_device_value", Kind::DeviceMap, {"fc2"},
       [] { DeviceMap::from_json(R"({"fc1": 0, "fc2": [1]})", "dm.json"); }},
      {"device_map_key_twice", Kind::DeviceMap, {"fc1"},
       [] { DeviceMap::from_json(R"({"fc1": 0, "fc1": "cpu"})", "dm.json"); }},
      {"device_map_negative_gpu", Kind::DeviceMap, {"-2"},
       [] { DeviceMap::from_json(R"({"fc1": -2})", "dm.json"); }},
      {"device_map_uncovered_parameters", Kind::DeviceMap, {"fc2.weight"},
       [] { Net net; check_device_map(net, DeviceMap{{"fc1", "cpu"}}); }},
      {"device_map_lookup_unknown_key", Kind::NotFound, {"fc3"},
       [] { DeviceMap{{"fc1", 0}, {"fc2", "cpu"}}.at("fc3"); }},
      {"device_map_file_missing", Kind::IO, {"dm_none.json"},
       [] { DeviceMap::load(scratch().str("dm_none.json")); }},
      {"max_memory_bad_size", Kind::Config, {"12XB"},
       [] { MaxMemory::from_json(R"({"cpu": "12XB"})"); }},
      {"max_memory_negative", Kind::Config, {"-5"},
       [] { MaxMemory::from_json(R"({"cpu": -5})"); }},
      {"max_memory_unknown_device", Kind::DeviceMap, {"mps"},
       [] { MaxMemory::from_json(R"({"mps": "1GB"})"); }},
      // ---------- hook registrations
      {"hook_unknown_module", Kind::NotFound, {"fc3", "fc1"},
       [] { FlexModel fm(std::make_shared<Net>()); fm.register_forward_hook(hook("fc3")); }},
      {"hook_unpack_idx_out_of_range", Kind::NotFound, {"fc1", "unpack_idx 4"},
       [] {
         FlexModel fm(std::make_shared<Net>());
         HookFunctionOptions o;
         o.unpack_idx = 4;
         fm.register_forward_hook(hook("fc1", o));
         fm.forward(x());
       }},
      {"hook_edit_changes_shape", Kind::Shape, {"fc1", "[3, 8]"},
       [] {
         FlexModel fm(std::make_shared<Net>());
         HookFunctionOptions o;
         o.editing_function = [](Module&, const at::Tensor& t, SaveContext&, TrainableModules&) { return t.sum(0); };
         fm.register_forward_hook(hook("fc1", o));
         fm.forward(x());
       }},
      {"hook_registered_twice", Kind::Config, {"fc2"},
       [] {
         FlexModel fm(std::make_shared<Net>());
         auto h = hook("fc2");
         fm.register_forward_hook(h);
         fm.register_forward_hook(h);
       }},
      {"hook_unknown_group", Kind::NotFound, {"probes"},
       [] {
         FlexModel fm(std::make_shared<Net>());
         fm.register_forward_hook(hook("fc1"));
         fm.forward(x(), {"probes"});
       }},
      {"hook_expected_shape_mismatch", Kind::Shape, {"fc2", "[3, 2]"},
       [] {
         FlexModel fm(std::make_shared<Net>());
         HookFunctionOptions o;
         o.expected_shape = {3, 5};
         fm.register_forward_hook(hook("fc2", o));
         fm.forward(x());
       }},
      {"hook_group_matches_nothing", Kind::NotFound, {"attn"},
       [] { FlexModel fm(std::make_shared<Net>()); fm.create_hook_group("g", "attn"); }},
      {"hook_remove_from_all", Kind::Config, {"all"},
       [] {
         FlexModel fm(std::make_shared<Net>());
         fm.register_forward_hook(hook("fc1"));
         fm.remove_hook_groups("fc1", "all");
       }},
      {"hook_tensor_hook_without_grad", Kind::Config, {"fc1.weight"},
       [] {
         auto net = std::make_shared<Net>();
         net->fc1->weight.set_requires_grad(false);
         FlexModel fm(net);
         fm.register_hook(hook("fc1.weight"));
       }},
      // ---------- tensor shapes
      {"load_checkpoint_mismatched_shape", Kind::Shape, {"fc1.weight", "[3, 3]"},
       [] {
         Net net;
         save_safetensors(scratch().str("shape.safetensors"),
                          {{"fc1.weight", at::ones({3, 3})}, {"fc1.bias", at::ones({8})},
                           {"fc2.weight", at::ones({2, 8})}, {"fc2.bias", at::ones({2})}});
         load_checkpoint_in_model(net, scratch().str("shape.safetensors"));
       }},
      {"set_module_tensor_mismatched_shape", Kind::Shape, {"fc2.bias", "[5]"},
       [] { Net net; set_module_tensor_to_device(net, "fc2.bias", at::kCPU, at::ones({5})); }},
      {"set_module_tensor_unknown_name", Kind::NotFound, {"fc2.bais"},
       [] { Net net; set_module_tensor(net, "fc2.bais", at::ones({2})); }},
  };
#ifdef FLEX_CLI
  const std::string bin = flex_test::fixture("models/gpt2");
  std::vector<Row> cli_rows = {
      {"cli_unknown_command", Kind::CliExit, {"frobnicate"}, [] { cli("frobnicate", 2); }},
      {"cli_unknown_option", Kind::CliExit, {"--colour"}, [=] { cli("inspect " + bin + " --colour", 2); }},
      {"cli_option_missing_value", Kind::CliExit, {"--out"}, [=] { cli("capture " + bin + " --out", 2); }},
      {"cli_capture_missing_model", Kind::CliExit, {"nonexistent_model"},
       [] { cli("capture " + scratch().str("nonexistent_model") + " --hook transformer.h.0 --out " + scratch().str("c.safetensors") + " --prompt hi", 1); }},
      {"cli_capture_unknown_hook", Kind::CliExit, {"transformer.h.9", "transformer.h.0"},
       [=] {
         cli("capture " + bin + " --hook transformer.h.9 --out " + scratch().str("c.safetensors") + " --input-ids " +
             flex_test::fixture("golden/inputs.safetensors"), 1);
       }},
  };
  rows.insert(rows.end(), cli_rows.begin(), cli_rows.end());
#endif
  return rows;
}

// gtest prints a row by name instead of its bytes.
void PrintTo(const Row& r, std::ostream* os) { *os << r.name; }

class BadInputs : public ::testing::TestWithParam<Row> {};

TEST_P(BadInputs, FailsWithTypedErrorNamingTheCulprit) {
  const Row& row = GetParam();
  try {
    row.run();
    ADD_FAILURE() << row.name << ": no error; expected " << kind_name(row.kind);
    return;
  } catch (const Error& e) {
    const std::string msg = e.what();
    const bool typed = row.kind == Kind::CliExit ? dynamic_cast<const ConfigError*>(&e) != nullptr : is_kind(e, row.kind);
    EXPECT_TRUE(typed) << row.name << ": expected " << kind_name(row.kind) << ", got " << typeid(e).name() << ": " << msg;
    for (const auto& n : row.needles) EXPECT_NE(msg.find(n), std::string::npos) << row.name << ": message lacks '" << n << "': " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << row.name << ": untyped " << typeid(e).name() << ": " << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Catalogue, BadInputs, ::testing::ValuesIn(catalogue()),
                         [](const ::testing::TestParamInfo<Row>& i) { return i.param.name; });

// The catalogue is as large as promised and its rows are distinct.
TEST(BadInputCatalogue, HasAtLeastFortyDistinctRows) {
  auto rows = catalogue();
  std::set<std::string> names;
  for (const auto& r : rows) names.insert(r.name);
  EXPECT_EQ(names.size(), rows.size());
  EXPECT_GE(rows.size(), 40u);
}

}  // namespace
