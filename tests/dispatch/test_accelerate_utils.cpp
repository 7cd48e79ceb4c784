// Accelerate's single-process utilities: environment patches, version and
// capability checks, shard_checkpoint (the seed's own example), the file-name
// constants the writers use, load_state_dict with a device map, and
// extract_model_from_parallel. Checked against values computed here.
#include <flex/dispatch/checkpoint.h>
#include <flex/dispatch/constants.h>
#include <flex/dispatch/device_map.h>
#include <flex/dispatch/environment.h>
#include <flex/dispatch/safetensors.h>
#include <flex/dispatch/sharded_writer.h>
#include <flex/flexcore/flex_model.h>
#include <flex/flexcore/save.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/nn.h>
#include <flex/parallel/operations.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>  // environ
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/version.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "test_util.h"

namespace fs = std::filesystem;

TEST(Environment, PatchSetsUpperCasedVariablesAndRestoresThem) {
  ::setenv("FLEX_KEEP", "old", 1);
  ::unsetenv("FLEX_NEW");
  {
    flex::PatchEnvironment p({{"flex_keep", "new"}, {"flex_new", "1"}});
    EXPECT_STREQ(std::getenv("FLEX_KEEP"), "new");
    EXPECT_STREQ(std::getenv("FLEX_NEW"), "1");
  }
  EXPECT_STREQ(std::getenv("FLEX_KEEP"), "old");
  EXPECT_EQ(std::getenv("FLEX_NEW"), nullptr);
  try {  // restored when the scope ends by an exception too
    flex::PatchEnvironment p(std::map<std::string, std::string>{{"FLEX_KEEP", "during"}});
    throw std::runtime_error("x");
  } catch (const std::runtime_error&) {
  }
  EXPECT_STREQ(std::getenv("FLEX_KEEP"), "old");
}

TEST(Environment, ClearEmptiesAndRestoresExactly) {
  ::setenv("FLEX_KEEP", "old", 1);
  const std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
  {
    flex::ClearEnvironment c;
    EXPECT_EQ(std::getenv("FLEX_KEEP"), nullptr);
    EXPECT_EQ(std::getenv("PATH"), nullptr);
    EXPECT_TRUE(environ == nullptr || environ[0] == nullptr);
    ::setenv("FLEX_KEEP", "new_bar", 1);
    ::setenv("FLEX_INSIDE", "1", 1);
  }
  EXPECT_STREQ(std::getenv("FLEX_KEEP"), "old");
  EXPECT_EQ(std::getenv("FLEX_INSIDE"), nullptr);
  EXPECT_EQ(std::string(std::getenv("PATH") ? std::getenv("PATH") : ""), path);
}

TEST(Versions, CompareWithTheLibtorchHeadersVersion) {
  const int M = TORCH_VERSION_MAJOR, m = TORCH_VERSION_MINOR, p = TORCH_VERSION_PATCH;
  const std::string here = std::to_string(M) + "." + std::to_string(m) + "." + std::to_string(p);
  EXPECT_EQ(flex::torch_version(), here);
  EXPECT_TRUE(flex::is_torch_version("==", here));
  EXPECT_TRUE(flex::is_torch_version(">=", here + "+cu124"));
  EXPECT_TRUE(flex::is_torch_version("<", std::to_string(M) + "." + std::to_string(m + 1)));
  EXPECT_TRUE(flex::is_torch_version(">", std::to_string(M - 1) + ".99"));
  EXPECT_TRUE(flex::is_torch_version("!=", std::to_string(M + 1)));
  EXPECT_FALSE(flex::is_torch_version("<=", std::to_string(M - 1)));
  EXPECT_THROW(flex::is_torch_version("=>", "1.0"), flex::ConfigError);
  EXPECT_THROW(flex::is_torch_version(">=", "one.two"), flex::ConfigError);
}

TEST(Versions, CapabilitiesMatchWhatLibtorchDoes) {
  EXPECT_EQ(flex::is_cuda_available(), at::hasCUDA() && at::globalContext().hasCUDA());
  if (!flex::is_cuda_available()) {
    EXPECT_TRUE(flex::is_bf16_available());
    at::Tensor a = at::randn({4, 4}).to(at::kBFloat16);  // and bf16 arithmetic does run
    EXPECT_EQ(a.matmul(a).scalar_type(), at::kBFloat16);
  }
}

TEST(ShardCheckpoint, TheSeedsExampleSplitsInKeyOrder) {
  // Weights of [6, 6, 2, 6, 2, 2] units with a 10-unit limit become [6], [6+2], [6+2+2].
  const int64_t unit = 256;  // floats
  std::vector<std::pair<std::string, at::Tensor>> sd;
  const int sizes[] = {6, 6, 2, 6, 2, 2};
  for (int i = 0; i < 6; ++i) sd.emplace_back("w" + std::to_string(i), at::full({sizes[i] * unit}, float(i)));
  auto got = flex::shard_checkpoint(sd, 10 * unit * 4, flex::WEIGHTS_NAME);
  ASSERT_EQ(got.shards.size(), 3u);
  const std::map<std::string, std::vector<std::string>> want = {
      {"pytorch_model-00001-of-00003.bin", {"w0"}},
      {"pytorch_model-00002-of-00003.bin", {"w1", "w2"}},
      {"pytorch_model-00003-of-00003.bin", {"w3", "w4", "w5"}}};
  for (const auto& [file, names] : want) {
    ASSERT_TRUE(got.shards.count(file)) << file;
    std::vector<std::string> have;
    for (const auto& kv : got.shards.at(file)) have.push_back(kv.first);
    EXPECT_EQ(have, names) << file;
    for (const auto& n : names) EXPECT_EQ(got.index["weight_map"][n], file);
  }
  EXPECT_EQ(got.index["metadata"]["total_size"], 24 * unit * 4);
  // One shard keeps the plain name and has no index.
  auto one = flex::shard_checkpoint(sd, 1ull << 40, flex::SAFE_WEIGHTS_NAME);
  ASSERT_EQ(one.shards.size(), 1u);
  EXPECT_TRUE(one.shards.count("model.safetensors"));
  EXPECT_TRUE(one.index.is_null());
  auto two = flex::shard_checkpoint(sd, 14 * unit * 4, flex::SAFE_WEIGHTS_NAME);
  EXPECT_TRUE(two.shards.count("model-00001-of-00002.safetensors"));
}

TEST(LoadStateDict, EveryTensorOnTheDeviceItsModuleMapsTo) {
  flex_test::TempDir tmp;
  const std::vector<std::pair<std::string, at::Tensor>> sd = {
      {"a.weight", at::randn({3, 2})}, {"a.bias", at::randn({3})}, {"b.weight", at::randn({2, 2})}};
  // The writer names its files with the constants Transformers uses.
  auto written = flex::save_sharded_safetensors(tmp.str("ck"), sd, 40);
  EXPECT_EQ(fs::path(written.index_path).filename(), flex::SAFE_WEIGHTS_INDEX_NAME);
  for (const auto& path : {tmp.str("ck"), written.index_path}) {
    auto got = flex::load_state_dict(path);
    ASSERT_EQ(got.size(), 3u);
    for (const auto& [k, t] : sd) {
      auto it = std::find_if(got.begin(), got.end(), [&](const auto& kv) { return kv.first == k; });
      ASSERT_NE(it, got.end()) << k;
      EXPECT_TRUE(flex_test::equal(it->second, t)) << k;
    }
  }
  flex::DeviceMap map{{"a", flex::MapDevice::cpu()}, {"b", flex::MapDevice::disk()}};
  for (const auto& [k, t] : flex::load_state_dict(tmp.str("ck"), &map)) EXPECT_TRUE(t.device().is_cpu()) << k;
  flex::DeviceMap partial{{"a", flex::MapDevice::cpu()}};
  try {
    flex::load_state_dict(tmp.str("ck"), &partial);
    FAIL() << "b.weight has no device";
  } catch (const flex::DeviceMapError& e) {
    EXPECT_NE(std::string(e.what()).find("b.weight"), std::string::npos) << e.what();
  }
}

TEST(Save, OneProcessWritesAtomicallyWhatTorchLoadReads) {
  flex_test::TempDir tmp;
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("step", int64_t(12));
  d.insert("w", at::arange(6).reshape({2, 3}));
  flex::save(flex::Value(d), tmp.str("state.pt"));
  std::ifstream in(tmp.str("state.pt"), std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const flex::Value back = torch::jit::pickle_load(bytes);
  EXPECT_EQ(back.toGenericDict().at("step").toInt(), 12);
  EXPECT_TRUE(flex_test::equal(back.toGenericDict().at("w").toTensor(), at::arange(6).reshape({2, 3})));
  EXPECT_THROW(flex::save(flex::Value(d), tmp.str("missing/dir/state.pt")), flex::IOError);
  EXPECT_FALSE(fs::exists(tmp.str("missing")));
}

TEST(ExtractModelFromParallel, TheWrappedModuleWithOrWithoutHooks) {
  auto lin = std::make_shared<flex::Linear>(3, 2);
  flex::FlexModel fm(lin);
  fm.register_forward_hook(std::make_shared<flex::HookFunction>(""));
  at::NoGradGuard ng;
  auto inner = flex::extract_model_from_parallel(fm);
  EXPECT_EQ(inner.get(), lin.get());
  (*inner)(flex::Inputs{flex::Value(at::randn({1, 3}))});
  EXPECT_EQ(fm.output().count(""), 1u) << "keep_hooks: the hooks still capture";
  fm.clear();
  auto bare = flex::extract_model_from_parallel(fm, /*keep_hooks=*/false);
  EXPECT_EQ(bare.get(), lin.get());
  const at::Tensor x = at::randn({1, 3});
  const at::Tensor y = (*bare)(flex::Inputs{flex::Value(x)}).toTensor();
  // The module's own product (a float32 GEMV here) against float64: equal up to rounding.
  const at::Tensor want = at::linear(x.to(at::kDouble), lin->weight.to(at::kDouble), lin->bias.to(at::kDouble));
  EXPECT_TRUE(flex_test::close(y.to(at::kDouble), want, 1e-6, 1e-6));
  EXPECT_EQ(fm.output().count(""), 0u) << "hooks removed";
}

TEST(ConvertOutputsToFp32, HalfPrecisionLeavesOfTheResultBecomeFloat) {
  auto forward = [](const at::Tensor& x) {
    return flex::Value(c10::ivalue::Tuple::create(
        {flex::Value(x.to(at::kHalf) * 2), flex::Value(x.to(at::kBFloat16)), flex::Value(at::arange(3))}));
  };
  auto wrapped = flex::convert_outputs_to_fp32(forward);
  const at::Tensor x = at::randn({4});
  const auto out = wrapped(x).toTupleRef().elements();
  EXPECT_TRUE(flex_test::equal(out[0].toTensor(), (x.to(at::kHalf) * 2).to(at::kFloat)));
  EXPECT_TRUE(flex_test::equal(out[1].toTensor(), x.to(at::kBFloat16).to(at::kFloat)));
  EXPECT_EQ(out[2].toTensor().scalar_type(), at::kLong);
  // A callable returning a bare tensor works too.
  auto lin = flex::convert_outputs_to_fp32([](const at::Tensor& t) { return t.to(at::kHalf); });
  EXPECT_EQ(lin(x).toTensor().scalar_type(), at::kFloat);
}
