// main() of the GoogleTest programs run under mpirun: every rank runs every
// test; the exit status is non-zero on all ranks when any rank failed.
#include <flex/parallel/communicator.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto world = flex::make_world_communicator();
  int rc = RUN_ALL_TESTS();
  at::Tensor any = at::tensor({rc}, at::kInt);
  world->all_reduce(any, flex::ReduceOp::Max);
  if (world->rank() == 0) std::printf("flex mpi test: %d ranks, %s\n", world->size(), any.item<int>() ? "FAILED" : "passed");
  return any.item<int>();
}
