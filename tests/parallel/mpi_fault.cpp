// Fault injection under mpirun (plain main; run by run_fault.sh, which checks
// that every rank stops quickly with a message naming the failing rank).
// Modes: throw (rank 1 throws), exit (the last rank calls exit(3)), hang
// (rank 1 never reaches the collective), mixed (rank 1 throws and rank 2
// exits with 3). The other ranks wait in an all_reduce meanwhile.
#include <flex/parallel/communicator.h>

#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  auto w = flex::make_world_communicator();
  const int r = w->rank(), n = w->size();
  w->barrier();
  if (mode == "throw" && r == 1) throw std::runtime_error("injected failure on rank 1");
  if (mode == "exit" && r == n - 1) std::exit(3);
  if (mode == "hang" && r == 1) std::this_thread::sleep_for(std::chrono::seconds(600));
  if (mode == "mixed") {
    if (r == 1) throw std::runtime_error("injected failure on rank 1");
    if (r == 2) std::exit(3);
  }
  at::Tensor t = at::ones({4});
  w->all_reduce(t);
  std::printf("rank %d of %d finished normally\n", r, n);
  return 0;
}
