// flexmodel generate --cuda-graph (design decision 51) where no GPU is needed:
// the flag is listed, a CPU model is refused naming the device, and --patch
// falls back to eager decode with a note (the same text as without the flag).
// The recorded graph itself is checked on the gpu label (tests/gpu/test_cuda_graph.cpp).
#include "cli_util.h"
#include "tiny_gpt2_folder.h"
#include "hf_folder.h"

#include <flex/dispatch/safetensors.h>
#include <flex/models/from_pretrained.h>

#include <gtest/gtest.h>

#include "test_util.h"

using cli_test::run;

namespace {

const std::string& tiny_model() { return cli_test::tiny_gpt2_folder(); }

}  // namespace

TEST(CliCudaGraph, HelpListsTheFlag) {
  auto r = run({"generate", "--help"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("--cuda-graph"), std::string::npos) << r.out;
}

TEST(CliCudaGraph, CpuModelIsRefusedNamingTheDevice) {
  auto r = run({"generate", tiny_model(), "--prompt", "the cat", "--max-new-tokens", "3", "--cuda-graph"});
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.err.find("cpu"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("CUDA"), std::string::npos) << r.err;
}

TEST(CliCudaGraph, PatchFallsBackToEagerWithANote) {
  flex_test::TempDir tmp;
  const int64_t c = flex::load_pretrained(tiny_model())->config().hidden_size;
  flex::save_safetensors(tmp.str("p.safetensors"), {{"activation", at::linspace(-3.0, 3.0, 2 * c).view({1, 2, c})}});
  const std::vector<std::string> base = {"generate", tiny_model(), "--prompt", "the cat", "--max-new-tokens", "4",
                                         "--patch", "transformer.h.0=" + tmp.str("p.safetensors")};
  auto eager = run(base);
  ASSERT_EQ(eager.code, 0) << eager.err;
  std::vector<std::string> with_flag = base;
  with_flag.push_back("--cuda-graph");
  auto r = run(with_flag);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, eager.out);
  EXPECT_NE(r.err.find("--patch with --cuda-graph: decoding eagerly"), std::string::npos) << r.err;
}
