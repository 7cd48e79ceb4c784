// The single-process communicator and the world factory without mpirun.
#include <flex/parallel/communicator.h>
#include <flex/parallel/local_communicator.h>
#include <flex/parallel/mpi_communicator.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "test_util.h"

using namespace flex;

TEST(LocalComm, CollectivesAreCopies) {
  LocalCommunicator c;
  at::Tensor t = at::arange(6, at::kFloat).view({2, 3});
  at::Tensor orig = t.clone();
  c.all_reduce(t, ReduceOp::Max);
  EXPECT_TRUE(flex_test::equal(t, orig));
  auto g = c.gather(t, 0);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_TRUE(flex_test::equal(g[0], orig));
  EXPECT_NE(g[0].data_ptr(), t.data_ptr());
  EXPECT_TRUE(flex_test::equal(c.reduce_scatter(t), orig));
  EXPECT_TRUE(flex_test::equal(c.reduce(t, 0), orig));
  EXPECT_THROW(c.gather(t, 1), ConfigError);
}

TEST(LocalComm, SendToSelfQueuesInOrder) {
  LocalCommunicator c;
  c.send(at::ones({2}, at::kInt), 0, 5);
  c.send(at::zeros({3}, at::kBool), 0, 5);
  EXPECT_TRUE(flex_test::equal(c.recv(0, 5), at::ones({2}, at::kInt)));
  EXPECT_TRUE(flex_test::equal(c.recv(0, 5), at::zeros({3}, at::kBool)));
  EXPECT_THROW(c.recv(0, 5), CommError);  // would wait forever
}

TEST(LocalComm, UnsupportedDtypeNamed) {
  LocalCommunicator c;
  at::Tensor z = at::zeros({2}, at::kComplexFloat);
  try {
    c.all_reduce(z);
    FAIL();
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("ComplexFloat"), std::string::npos) << e.what();
  }
}

TEST(LocalComm, SplitAndGroups) {
  LocalCommunicator c;
  EXPECT_EQ(c.split(-1, 0, "x"), nullptr);
  auto sub = c.split(3, 0, "sub");
  ASSERT_TRUE(sub);
  EXPECT_EQ(sub->name(), "sub");
  EXPECT_TRUE(c.create_group({0}, "g"));
  EXPECT_THROW(c.create_group({0, 0}, "g"), ConfigError);
}

TEST(WorldFactory, LocalWithoutMpirun) {
  if (launched_by_mpirun()) GTEST_SKIP() << "running under mpirun";
  auto w = make_world_communicator();
  EXPECT_STREQ(w->backend(), "local");
  EXPECT_EQ(w->size(), 1);
  EXPECT_EQ(make_world_communicator().get(), w.get());
}

TEST(CommOptions, TimeoutFromEnvironment) {
  EXPECT_EQ(resolve_timeout(CommOptions{7.5}), 7.5);
  setenv("FLEX_COMM_TIMEOUT", "12", 1);
  EXPECT_EQ(resolve_timeout({}), 12.0);
  setenv("FLEX_COMM_TIMEOUT", "soon", 1);
  EXPECT_THROW(resolve_timeout({}), ConfigError);
  unsetenv("FLEX_COMM_TIMEOUT");
  EXPECT_EQ(resolve_timeout({}), 300.0);
}
