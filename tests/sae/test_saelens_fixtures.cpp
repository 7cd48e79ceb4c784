// Dictionaries read from SAELens folders and Gemma Scope's params.npz compute
// what sae-lens 6.54.12 computes: encode, decode, forward, the inner hook points and the
// error-term output, for every architecture (tests/data/sae, made by
// scripts/golden/make_sae_fixtures.py with sae-lens itself); bad files give
// typed errors naming the file and tensor.
#include <flex/dispatch/safetensors.h>
#include <flex/hooks/errors.h>
#include <flex/sae/load_sae.h>
#include <flex/sae/npz.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "test_util.h"

namespace fs = std::filesystem;

namespace {

std::string sae_dir(const std::string& name) { return flex_test::data_path("sae/" + name); }

std::map<std::string, at::Tensor> golden(const std::string& name) {
  const auto f = flex::SafetensorsFile::open(sae_dir(name) + "/golden.safetensors");
  std::map<std::string, at::Tensor> out;
  for (const auto& n : f->names()) out[n] = f->get(n).clone();
  return out;
}

// Bit-for-bit is what a reader following FORMAT.md gets with the same ATen
// kernels; the tolerance only allows for another matmul kernel.
double rtol_for(const at::Tensor& want) {
  return want.scalar_type() == at::kFloat || want.scalar_type() == at::kDouble ? 1e-5 : 1e-2;
}

::testing::AssertionResult same(const at::Tensor& got, const at::Tensor& want) {
  const double rtol = rtol_for(want);
  return flex_test::close(got, want, rtol, rtol * 1e-2);
}

class SaeLensFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(SaeLensFixture, EncodeDecodeForwardAndHooksEqualSaeLens) {
  const std::string name = GetParam();
  auto g = golden(name);
  auto sae = flex::load_sae(sae_dir(name));  // gemmascope_like holds a params.npz, the others a SAELens folder
  const at::Tensor x = g.at("x");
  at::NoGradGuard no_grad;

  EXPECT_TRUE(same(sae->encode(x), g.at("encode"))) << name << " encode";
  EXPECT_TRUE(same(sae->decode(sae->encode(x)), g.at("decode"))) << name << " decode";

  auto seen = std::make_shared<std::map<std::string, at::Tensor>>();
  std::vector<flex::HookHandle> handles;
  for (const char* point : {"hook_sae_input", "hook_sae_acts_pre", "hook_sae_recons", "hook_sae_error"}) {
    handles.push_back(sae->get_submodule(point)->register_forward_hook(
        [seen, point](flex::Module&, const flex::Inputs&, flex::Value& out) {
          if (!seen->count(point)) (*seen)[point] = out.toTensor().clone();
        }));
  }
  const at::Tensor y = (*sae)(x);
  EXPECT_TRUE(same(y, g.at("forward"))) << name << " forward";
  for (const char* point : {"hook_sae_input", "hook_sae_acts_pre", "hook_sae_recons"}) {
    const std::string key = std::string("hook.") + point;
    ASSERT_TRUE(seen->count(point)) << name << ": " << point << " did not fire";
    EXPECT_TRUE(same(seen->at(point), g.at(key))) << name << " " << point;
  }
  EXPECT_FALSE(seen->count("hook_sae_error")) << name << ": hook_sae_error fired without the error term";

  if (g.count("error_term.forward")) {
    seen->clear();
    sae->use_error_term = true;
    EXPECT_TRUE(same((*sae)(x), g.at("error_term.forward"))) << name << " error-term forward";
    ASSERT_TRUE(seen->count("hook_sae_error")) << name;
    // The error is x - recons, two values of x's size: it carries their
    // rounding (an ulp of x), not an ulp of its own small size.
    const at::Tensor& err = g.at("error_term.hook.hook_sae_error");
    const double ulp_of_x = rtol_for(err) * g.at("hook.hook_sae_recons").abs().max().item<double>();
    EXPECT_TRUE(flex_test::close(seen->at("hook_sae_error"), err, rtol_for(err), ulp_of_x)) << name << " hook_sae_error";
  }
  for (auto& h : handles) h.remove();
}

INSTANTIATE_TEST_SUITE_P(AllArchitectures, SaeLensFixture,
                         ::testing::Values("standard", "standard_no_bdec", "standard_layer_norm",
                                           "standard_constant_norm_rescale", "standard_bf16", "gated", "jumprelu",
                                           "topk", "topk_rescale", "batchtopk", "transcoder", "skip_transcoder",
                                           "jumprelu_transcoder", "jumprelu_skip_transcoder", "legacy_pre6",
                                           "gemmascope_like"),
                         [](const auto& info) { return info.param; });

TEST(SaeLens, ConfigReadsArchitecturesAndHookNames) {
  auto sae = flex::load_saelens_sae(sae_dir("legacy_pre6"));
  EXPECT_EQ(sae->config().architecture, flex::SaeArchitecture::TopK);  // activation_fn "topk" of an old file
  EXPECT_EQ(sae->config().k, 8);
  EXPECT_EQ(sae->class_name(), "TopKSAE");
  auto tc = flex::load_saelens_sae(sae_dir("jumprelu_skip_transcoder"));
  EXPECT_EQ(tc->config().d_out, 64);
  EXPECT_TRUE(tc->config().has_skip());
  auto bf = flex::load_saelens_sae(sae_dir("standard_bf16"));
  EXPECT_EQ(bf->W_enc.scalar_type(), at::kBFloat16);
  auto as_f32 = flex::load_saelens_sae(sae_dir("standard_bf16"), at::kFloat);
  EXPECT_EQ(as_f32->W_enc.scalar_type(), at::kFloat);
}

// A copy of a fixture folder with one file replaced, for the bad-input cases.
class BrokenSae : public ::testing::Test {
 protected:
  std::string copy(const std::string& name) {
    const fs::path dst = tmp_.path() / name;
    fs::copy(sae_dir(name), dst, fs::copy_options::recursive);
    return dst.string();
  }
  void write_weights(const std::string& dir, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
    flex::save_safetensors(dir + "/sae_weights.safetensors", tensors);
  }
  flex_test::TempDir tmp_;
};

TEST_F(BrokenSae, TypedErrorsNameTheFileAndTensor) {
  const std::string dir = copy("standard");
  auto good = flex::load_saelens_sae(dir);
  std::vector<std::pair<std::string, at::Tensor>> t;
  for (const auto& kv : good->named_parameters(false)) t.emplace_back(kv.key(), kv.value().detach().clone());

  auto with = [&](const std::string& name, at::Tensor v) {
    auto u = t;
    for (auto& kv : u)
      if (kv.first == name) kv.second = v;
    return u;
  };
  write_weights(dir, with("W_enc", at::zeros({32, 256})));
  try {
    flex::load_saelens_sae(dir);
    FAIL() << "a wrong W_enc shape loaded";
  } catch (const flex::ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("'W_enc'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[64, 256]"), std::string::npos) << e.what();
  }
  at::Tensor nan = t[0].second.clone();
  nan.view(-1)[3] = std::nan("");
  write_weights(dir, with(t[0].first, nan));
  EXPECT_THROW(flex::load_saelens_sae(dir), flex::FileFormatError);
  auto missing = t;
  missing.pop_back();
  write_weights(dir, missing);
  try {
    flex::load_saelens_sae(dir);
    FAIL() << "a missing tensor loaded";
  } catch (const flex::FileFormatError& e) {
    EXPECT_NE(std::string(e.what()).find("sae_weights.safetensors"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
  }
  std::ofstream(dir + "/cfg.json") << "{\"architecture\": \"standard\", \"d_sae\": 256}";
  try {
    flex::load_saelens_sae(dir);
    FAIL() << "a cfg.json without d_in loaded";
  } catch (const flex::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'d_in'"), std::string::npos) << e.what();
  }
  std::ofstream(dir + "/cfg.json") << "{\"architecture\": \"temporal\", \"d_in\": 64, \"d_sae\": 256}";
  EXPECT_THROW(flex::load_saelens_sae(dir), flex::UnsupportedError);
  EXPECT_THROW(flex::load_saelens_sae(tmp_.str("nowhere")), flex::IOError);
  at::NoGradGuard no_grad;
  EXPECT_THROW(good->encode(at::zeros({2, 63})), flex::ShapeError);
}

TEST_F(BrokenSae, GemmaScopeNpzErrorsAreTyped) {
  const std::string dir = copy("gemmascope_like");
  const std::string npz = dir + "/params.npz";
  auto sae = flex::load_sae(dir);
  EXPECT_EQ(sae->config().architecture, flex::SaeArchitecture::JumpReLU);
  EXPECT_FALSE(sae->config().apply_b_dec_to_input);
  EXPECT_EQ(sae->config().d_sae, 256);
  const auto size = fs::file_size(npz);
  fs::resize_file(npz, size / 2);
  EXPECT_THROW(flex::load_gemma_scope_sae(npz), flex::FileFormatError);
  std::ofstream(npz, std::ios::trunc) << "not a zip";
  EXPECT_THROW(flex::load_gemma_scope_sae(npz), flex::FileFormatError);
  EXPECT_THROW(flex::load_gemma_scope_sae(dir + "/absent.npz"), flex::IOError);
  EXPECT_THROW(flex::load_sae(tmp_.str("absent")), flex::IOError);
}

TEST(Npz, ReadsDtypesShapesAndFortranOrder) {
  // scripts/golden/make_npz_fixture.py: arange(6).reshape(2, 3) in each dtype, deflated members.
  auto a = flex::read_npz(sae_dir("npz/arrays.npz"));
  const at::Tensor want = at::arange(6, at::kLong).reshape({2, 3});
  const std::map<std::string, at::ScalarType> dtypes{{"f32", at::kFloat}, {"f64_fortran", at::kDouble},
                                                     {"f16", at::kHalf}, {"i64", at::kLong}, {"u8", at::kByte}};
  for (const auto& [name, dtype] : dtypes) {
    ASSERT_TRUE(a.count(name)) << name;
    EXPECT_TRUE(flex_test::equal(a.at(name), want.to(dtype))) << name;
  }
  EXPECT_TRUE(flex_test::equal(a.at("b1"), want.remainder(2).to(at::kBool)));
  EXPECT_EQ(a.at("scalar").dim(), 0);
  EXPECT_EQ(a.at("scalar").item<float>(), 7.0f);
  auto g = flex::read_npz(sae_dir("gemmascope_like/params.npz"));
  EXPECT_EQ(g.at("W_enc").sizes(), (std::vector<int64_t>{64, 256}));
}

}  // namespace
