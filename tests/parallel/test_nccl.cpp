// NCCL backend with one rank (a LocalCommunicator bootstrap). Skipped unless
// this build has NCCL (nccl.h + a CUDA libtorch) and a CUDA device is present.
#include <flex/parallel/local_communicator.h>
#include <flex/parallel/nccl_communicator.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

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
    EXPECT_TRUE(t.equal(x)) << c10::toString(dt);
    at::Tensor b;
    c->broadcast(b = x.clone(), 0);
    EXPECT_TRUE(b.equal(x));
    auto g = c->all_gather(x);
    ASSERT_EQ(g.size(), 1u);
    EXPECT_TRUE(g[0].equal(x));
    EXPECT_TRUE(c->reduce(x, 0, ReduceOp::Max).equal(x));
    EXPECT_TRUE(c->reduce_scatter(x, ReduceOp::Min).equal(x));
  }
  // CPU tensors go through the bootstrap.
  at::Tensor h = at::ones({3});
  c->all_reduce(h);
  EXPECT_TRUE(h.equal(at::ones({3})));
#endif
}
