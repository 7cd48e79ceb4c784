// NCCL backend with one rank (a LocalCommunicator bootstrap). The collectives
// need a CUDA libtorch and a device; without them the backend (built whenever
// nccl.h, libnccl and the CUDA runtime are found) must fail with a typed error.
#include <flex/parallel/local_communicator.h>
#include <flex/parallel/nccl_communicator.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "test_util.h"

using namespace flex;

TEST(Nccl, OneRankCollectives) {
#ifndef FLEX_HAVE_NCCL
  EXPECT_FALSE(nccl_available());
  GTEST_SKIP() << "built without NCCL";
#else
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  auto c = make_nccl_communicator(std::make_shared<LocalCommunicator>(), 0);
  EXPECT_STREQ(c->backend(), "nccl");
  const auto cuda = at::TensorOptions().device(at::kCUDA, 0);
  for (auto dt : {at::kDouble, at::kFloat, at::kHalf, at::kBFloat16, at::kLong, at::kInt, at::kShort, at::kChar,
                  at::kByte, at::kBool}) {
    const at::Tensor x = (at::arange(12, cuda.dtype(at::kLong)) % 5).to(dt).view({4, 3});
    at::Tensor t = x.clone();
    c->all_reduce(t, ReduceOp::Sum);
    EXPECT_TRUE(flex_test::equal(t, x)) << c10::toString(dt);
    at::Tensor b;
    c->broadcast(b = x.clone(), 0);
    EXPECT_TRUE(flex_test::equal(b, x));
    auto g = c->all_gather(x);
    ASSERT_EQ(g.size(), 1u);
    EXPECT_TRUE(flex_test::equal(g[0], x));
    EXPECT_TRUE(flex_test::equal(c->reduce(x, 0, ReduceOp::Max), x));
    EXPECT_TRUE(flex_test::equal(c->reduce_scatter(x, ReduceOp::Min), x));
  }
  // CPU tensors go through the bootstrap.
  at::Tensor h = at::ones({3});
  c->all_reduce(h);
  EXPECT_TRUE(flex_test::equal(h, at::ones({3})));
#endif
}

TEST(Nccl, WithoutACudaDeviceCreationFailsWithATypedError) {
#ifndef FLEX_HAVE_NCCL
  GTEST_SKIP() << "built without NCCL";
#else
  if (at::hasCUDA()) GTEST_SKIP() << "a CUDA device is present";
  try {
    auto c = make_nccl_communicator(std::make_shared<LocalCommunicator>(), 0);
    // A GPU with a CPU-only libtorch: NCCL comes up, but no tensor can be CUDA.
    EXPECT_STREQ(c->backend(), "nccl");
  } catch (const flex::Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(msg.find("nccl") != std::string::npos || msg.find("NCCL") != std::string::npos ||
                msg.find("CUDA") != std::string::npos)
        << msg;
  }
#endif
}
