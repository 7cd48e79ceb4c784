// DeviceMap (hf_device_map JSON), clean/check_device_map, memory budgets and
// size strings, against Accelerate's documented examples.
#include <flex/dispatch/device_map.h>
#include <flex/dispatch/memory.h>
#include <flex/hooks/errors.h>

#include <gtest/gtest.h>

#include <fstream>

#include "test_util.h"
#include "toy_models.h"

namespace {

template <typename E, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "no exception";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(MapDevice, ParsesAndPrints) {
  EXPECT_TRUE(flex::MapDevice("cpu").is_cpu());
  EXPECT_TRUE(flex::MapDevice("disk").is_disk());
  EXPECT_EQ(flex::MapDevice("3").index(), 3);
  EXPECT_EQ(flex::MapDevice("cuda:1"), flex::MapDevice(1));
  EXPECT_EQ(flex::MapDevice("cuda"), flex::MapDevice(0));
  EXPECT_EQ(flex::MapDevice(2).str(), "2");
  EXPECT_EQ(flex::MapDevice::disk().str(), "disk");
  EXPECT_EQ(flex::MapDevice(1).torch_device(), c10::Device(c10::DeviceType::CUDA, 1));
  EXPECT_EQ(flex::MapDevice::cpu().torch_device(), c10::Device(c10::DeviceType::CPU));
  EXPECT_THROW(flex::MapDevice::disk().torch_device(), flex::UnsupportedError);
  // Budget order: GPUs by ordinal, then cpu, then disk.
  EXPECT_LT(flex::MapDevice(0), flex::MapDevice(1));
  EXPECT_LT(flex::MapDevice(7), flex::MapDevice::cpu());
  EXPECT_LT(flex::MapDevice::cpu(), flex::MapDevice::disk());
}

TEST(MapDevice, UnknownNamesAreDeviceMapErrors) {
  for (const char* bad : {"mps", "gpu", "-1", "cuda:x", "", "CPU", "cuda:-1"}) {
    auto msg = error_of<flex::DeviceMapError>([&] { flex::MapDevice d(bad); });
    EXPECT_TRUE(has(msg, std::string("'") + bad + "'")) << bad << ": " << msg;
  }
  EXPECT_TRUE(has(error_of<flex::DeviceMapError>([] { flex::MapDevice d(-2); }), "-2"));
}

TEST(DeviceMap, JsonRoundTripKeepsOrder) {
  flex::DeviceMap m{{"transformer.h.0", 0}, {"lm_head", "cpu"}, {"x", "disk"}, {"transformer.h.1", 1}};
  EXPECT_EQ(m.to_json(), R"({"transformer.h.0":0,"lm_head":"cpu","x":"disk","transformer.h.1":1})");
  auto back = flex::DeviceMap::from_json(m.to_json(2));
  EXPECT_EQ(back.keys(), m.keys());
  EXPECT_EQ(back, m);
  auto parsed = flex::DeviceMap::from_json(R"({"b": "cuda:2", "a": 0, "": "cpu"})");
  EXPECT_EQ(parsed.keys(), (std::vector<std::string>{"b", "a", ""}));
  EXPECT_EQ(parsed.at("b"), flex::MapDevice(2));
  EXPECT_EQ(parsed.devices(), (std::vector<flex::MapDevice>{2, 0, "cpu"}));
}

TEST(DeviceMap, SaveAndLoadFile) {
  flex_test::TempDir dir;
  flex::DeviceMap m{{"model.embed_tokens", 0}, {"model.layers", "disk"}};
  m.save(dir.str("map.json"));
  EXPECT_EQ(flex::DeviceMap::load(dir.str("map.json")), m);
  EXPECT_THROW(flex::DeviceMap::load(dir.str("missing.json")), flex::IOError);
}

TEST(DeviceMap, BadJsonNamesFileAndKey) {
  flex_test::TempDir dir;
  {
    std::ofstream(dir.str("broken.json")) << "{\"a\": 0,";
  }
  auto msg = error_of<flex::FileFormatError>([&] { flex::DeviceMap::load(dir.str("broken.json")); });
  EXPECT_TRUE(has(msg, "broken.json")) << msg;
  msg = error_of<flex::FileFormatError>([] { flex::DeviceMap::from_json("[0, 1]", "list.json"); });
  EXPECT_TRUE(has(msg, "list.json")) << msg;
  msg = error_of<flex::DeviceMapError>([] { flex::DeviceMap::from_json(R"({"a": 0, "b.c": "mps"})", "m.json"); });
  EXPECT_TRUE(has(msg, "m.json") && has(msg, "'b.c'") && has(msg, "'mps'")) << msg;
  msg = error_of<flex::DeviceMapError>([] { flex::DeviceMap::from_json(R"({"a": 1.5})", "f.json"); });
  EXPECT_TRUE(has(msg, "f.json") && has(msg, "'a'") && has(msg, "1.5")) << msg;
  msg = error_of<flex::DeviceMapError>([] { flex::DeviceMap::from_json(R"({"a": -1})", "n.json"); });
  EXPECT_TRUE(has(msg, "'a'") && has(msg, "-1")) << msg;
  msg = error_of<flex::DeviceMapError>([] { flex::DeviceMap::from_json(R"({"a": null})", "z.json"); });
  EXPECT_TRUE(has(msg, "'a'")) << msg;
  msg = error_of<flex::DeviceMapError>([] { flex::DeviceMap::from_json(R"({"a": 0, "b": {"a": 1}, "a": 1})", "d.json"); });
  EXPECT_TRUE(has(msg, "d.json") && has(msg, "'a' appears twice")) << msg;
  // Nested objects are not devices.
  msg = error_of<flex::DeviceMapError>([] { flex::DeviceMap::from_json(R"({"b": {"a": 1}})", "d.json"); });
  EXPECT_TRUE(has(msg, "'b'")) << msg;
}

TEST(DeviceMap, SetEraseFindAndAncestors) {
  flex::DeviceMap m{{"a", 0}, {"b.c", "cpu"}};
  m.set("a", 1);  // replaced in place
  m.set("d", "disk");
  EXPECT_EQ(m.keys(), (std::vector<std::string>{"a", "b.c", "d"}));
  EXPECT_EQ(m.at("a"), flex::MapDevice(1));
  EXPECT_TRUE(m.erase("b.c"));
  EXPECT_FALSE(m.erase("b.c"));
  EXPECT_EQ(m.keys(), (std::vector<std::string>{"a", "d"}));
  EXPECT_EQ(m.at("d"), flex::MapDevice::disk());
  auto msg = error_of<flex::NotFoundError>([&] { m.at("aa"); });
  EXPECT_TRUE(has(msg, "'aa'")) << msg;

  flex::DeviceMap n{{"transformer.h.1", 1}, {"transformer", 0}};
  EXPECT_EQ(n.device_of("transformer.h.1.attn.c_attn.weight"), flex::MapDevice(1));
  EXPECT_EQ(n.device_of("transformer.h.10.attn"), flex::MapDevice(0));  // "h.1" is not an ancestor of "h.10"
  EXPECT_FALSE(n.device_of("lm_head.weight").has_value());
  EXPECT_EQ(flex::DeviceMap({{"", "cpu"}}).device_of("anything.at.all"), flex::MapDevice::cpu());
}

TEST(DeviceMap, EqualityIgnoresOrder) {
  EXPECT_EQ((flex::DeviceMap{{"a", 0}, {"b", 1}}), (flex::DeviceMap{{"b", 1}, {"a", 0}}));
  EXPECT_NE((flex::DeviceMap{{"a", 0}, {"b", 1}}), (flex::DeviceMap{{"a", 0}, {"b", 0}}));
  EXPECT_NE((flex::DeviceMap{{"a", 0}}), (flex::DeviceMap{{"a", 0}, {"b", 0}}));
}

TEST(CleanDeviceMap, ReferenceExample) {
  flex::DeviceMap in{{"a.x", 0}, {"a.y", 0}, {"b.x.0", 1}, {"b.x.1", 1}, {"b.y.0", 2}, {"b.y.1", 2}, {"c", 2}};
  auto out = flex::clean_device_map(in);
  EXPECT_EQ(out, (flex::DeviceMap{{"a", 0}, {"b.x", 1}, {"b.y", 2}, {"c", 2}})) << out;
  // The collapsed key takes its first child's place.
  EXPECT_EQ(out.keys(), (std::vector<std::string>{"a", "b.x", "b.y", "c"}));
}

TEST(CleanDeviceMap, CollapsesToRootAndKeepsSingletons) {
  EXPECT_EQ(flex::clean_device_map({{"a", 0}, {"b.c", 0}, {"b.d", 0}}), (flex::DeviceMap{{"", 0}}));
  // One key under a prefix is not collapsed into it.
  EXPECT_EQ(flex::clean_device_map({{"a.x", 0}, {"b", 1}}), (flex::DeviceMap{{"a.x", 0}, {"b", 1}}));
  // "a.b" and "a.bc" share the string prefix "a.b" but not the module.
  EXPECT_EQ(flex::clean_device_map({{"a.b.x", 0}, {"a.bc", 0}, {"z", 1}}), (flex::DeviceMap{{"a", 0}, {"z", 1}}));
  EXPECT_EQ(flex::clean_device_map({{"a.b.x", 0}, {"a.b.y", 0}, {"a.bc", 1}}),
            (flex::DeviceMap{{"a.b", 0}, {"a.bc", 1}}));
  EXPECT_TRUE(flex::clean_device_map({}).empty());
}

TEST(CheckDeviceMap, CoverageOfStateDict) {
  flex_test::ModelForTest model;
  EXPECT_EQ(flex::state_dict_keys(model),
            (std::vector<std::string>{"linear1.weight", "linear1.bias", "batchnorm.weight", "batchnorm.bias",
                                      "batchnorm.running_mean", "batchnorm.running_var",
                                      "batchnorm.num_batches_tracked", "linear2.weight", "linear2.bias"}));
  EXPECT_NO_THROW(flex::check_device_map(model, {{"", 0}}));
  EXPECT_NO_THROW(flex::check_device_map(model, {{"linear1", 0}, {"batchnorm", 1}, {"linear2", "disk"}}));
  EXPECT_NO_THROW(flex::check_device_map(
      model, {{"linear1", 0}, {"batchnorm.weight", 1}, {"batchnorm.bias", 1}, {"batchnorm.running_mean", 1},
              {"batchnorm.running_var", 1}, {"batchnorm.num_batches_tracked", 1}, {"linear2", "disk"}}));
  auto msg = error_of<flex::DeviceMapError>([&] { flex::check_device_map(model, {{"linear1", 0}, {"batchnorm", 1}}); });
  EXPECT_TRUE(has(msg, "linear2.weight, linear2.bias")) << msg;
  EXPECT_FALSE(has(msg, "linear1.weight")) << msg;
  // A prefix that is not a module boundary covers nothing.
  msg = error_of<flex::DeviceMapError>([&] { flex::check_device_map(model, {{"linear", 0}, {"batchnorm", 0}}); });
  EXPECT_TRUE(has(msg, "linear1.weight") && has(msg, "linear2.bias")) << msg;
}

TEST(CheckDeviceMap, NonPersistentBuffersNeedNoDevice) {
  class Holder : public flex::Module {
   public:
    Holder() : Module("Holder") {
      add_parameter("w", w, flex::new_parameter({2}));
      add_buffer("mask", mask, at::ones({4}, at::kBool), /*persistent=*/false);
    }
    flex::Value forward(flex::Inputs in) override { return in.args.at(0); }
    at::Tensor w, mask;
  };
  Holder outer;
  EXPECT_EQ(flex::state_dict_keys(outer), std::vector<std::string>{"w"});
  EXPECT_NO_THROW(flex::check_device_map(outer, {{"w", "cpu"}}));
}

// --- sizes and budgets ---------------------------------------------------------------

TEST(ConvertFileSize, Units) {
  EXPECT_EQ(flex::convert_file_size_to_int("5GB"), 5000000000LL);
  EXPECT_EQ(flex::convert_file_size_to_int("5GiB"), 5LL << 30);
  EXPECT_EQ(flex::convert_file_size_to_int("5Gb"), 625000000LL);
  EXPECT_EQ(flex::convert_file_size_to_int("100KB"), 100000);
  EXPECT_EQ(flex::convert_file_size_to_int("200KiB"), 204800);
  EXPECT_EQ(flex::convert_file_size_to_int("0.1MB"), 100000);
  EXPECT_EQ(flex::convert_file_size_to_int("1MiB"), 1048576);
  EXPECT_EQ(flex::convert_file_size_to_int("3Mb"), 375000);
  EXPECT_EQ(flex::convert_file_size_to_int("1.5gib"), 1610612736LL);
  EXPECT_EQ(flex::convert_file_size_to_int("1234"), 1234);
}

TEST(ConvertFileSize, BadStringsAreConfigErrors) {
  for (const char* bad : {"5XB", "GB", "-5GB", "abc", "", "5 G B", "nanGB", "1e400GB", "0x10MB"}) {
    auto msg = error_of<flex::ConfigError>([&] { flex::convert_file_size_to_int(bad); });
    EXPECT_TRUE(has(msg, std::string("'") + bad + "'")) << bad << ": " << msg;
  }
}

TEST(MaxMemory, OrderedGpusCpuDisk) {
  auto mm = flex::MaxMemory::from_json(R"({"disk": 5, "cpu": "1GB", "1": 100, "0": 200.5})");
  EXPECT_EQ(mm.at(flex::MapDevice(0)), 200.5);
  EXPECT_EQ(mm.at("cpu"), 1e9);
  auto sorted = flex::get_max_memory(mm);
  std::vector<std::string> keys;
  for (const auto& e : sorted.entries()) keys.push_back(e.first.str());
  EXPECT_EQ(keys, (std::vector<std::string>{"0", "1", "cpu", "disk"}));
  EXPECT_EQ(sorted, mm);
  EXPECT_EQ(sorted.gpus(), (std::vector<int>{0, 1}));
  EXPECT_EQ(flex::MaxMemory::from_json(sorted.to_json()), mm);
}

TEST(MaxMemory, UnknownDevicesAndBadSizes) {
  auto msg = error_of<flex::DeviceMapError>([] { flex::MaxMemory::from_json(R"({"0": 10, "mps": 100})", "budget.json"); });
  EXPECT_TRUE(has(msg, "'mps'") && has(msg, "budget.json") && has(msg, "not recognized")) << msg;
  flex::MaxMemory mm;
  msg = error_of<flex::DeviceMapError>([&] { mm.set("xpu", "1GB"); });
  EXPECT_TRUE(has(msg, "'xpu'")) << msg;
  msg = error_of<flex::ConfigError>([] { flex::MaxMemory::from_json(R"({"cpu": "lots"})", "b.json"); });
  EXPECT_TRUE(has(msg, "'cpu'") && has(msg, "'lots'") && has(msg, "b.json")) << msg;
  EXPECT_THROW(mm.set(flex::MapDevice(0), -1.0), flex::ConfigError);
  EXPECT_THROW(flex::MaxMemory::from_json("{"), flex::FileFormatError);
  msg = error_of<flex::DeviceMapError>([] { flex::MaxMemory{{0, 10}}.at("cpu"); });
  EXPECT_TRUE(has(msg, "cpu")) << msg;
}

TEST(MaxMemory, DefaultsToThisMachine) {
  auto mm = flex::get_max_memory();
  ASSERT_TRUE(mm.contains("cpu"));
  // Compare with MemTotal read independently: available RAM is positive and below it.
  std::ifstream in("/proc/meminfo");
  std::string key;
  double total_kib = 0;
  while (in >> key)
    if (key == "MemTotal:") {
      in >> total_kib;
      break;
    }
  ASSERT_GT(total_kib, 0);
  EXPECT_GT(mm.at("cpu"), 0);
  EXPECT_LE(mm.at("cpu"), total_kib * 1024);
  EXPECT_EQ(mm.gpus().size(), static_cast<size_t>(flex::gpu_device_count()));
  EXPECT_EQ(mm.entries().back().first, flex::MapDevice::cpu());
}
