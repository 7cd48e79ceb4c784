// main() of the GoogleTest programs run under mpirun: every rank runs every
// test; the exit status is non-zero on all ranks when any rank failed.
#include <flex/parallel/communicator.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#if defined(__linux__) && defined(__x86_64__)
#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdio>
#include <initializer_list>

namespace {

// A crash report that names the caller of a call through a null pointer,
// which Open MPI's own handler cannot (it printed one frame and "(nil)" for
// parallel_mpi_process on the first GPU run): the faulting pc, the word at
// the stack pointer (the return address when a call jumped to address 0),
// the thread (main or another), then the backtrace. Installed after MPI_Init,
// so it replaces Open MPI's handler; the signal is re-raised afterwards.
void report_crash(int sig, siginfo_t* info, void* context) {
  const auto* uc = static_cast<const ucontext_t*>(context);
  void* pc = reinterpret_cast<void*>(uc->uc_mcontext.gregs[REG_RIP]);
  void* const* sp = reinterpret_cast<void* const*>(uc->uc_mcontext.gregs[REG_RSP]);
  void* top = sp ? *sp : nullptr;
  char line[256];
  const int n = std::snprintf(line, sizeof line,
                              "flex mpi test: signal %d (pid %d, thread %ld%s): pc %p, fault address %p, [sp] %p\n",
                              sig, static_cast<int>(getpid()), static_cast<long>(syscall(SYS_gettid)),
                              syscall(SYS_gettid) == getpid() ? ", the main thread" : ", not the main thread", pc,
                              info->si_addr, top);
  if (n > 0) (void)!write(STDERR_FILENO, line, static_cast<size_t>(n));
  (void)!write(STDERR_FILENO, "flex mpi test: pc, [sp]:\n", 25);
  backtrace_symbols_fd(&pc, 1, STDERR_FILENO);
  backtrace_symbols_fd(&top, 1, STDERR_FILENO);
  (void)!write(STDERR_FILENO, "flex mpi test: backtrace:\n", 26);
  void* frames[64];
  backtrace_symbols_fd(frames, backtrace(frames, 64), STDERR_FILENO);
  signal(sig, SIG_DFL);
  raise(sig);
}

void install_crash_report() {
  struct sigaction sa {};
  sa.sa_sigaction = report_crash;
  sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE}) sigaction(sig, &sa, nullptr);
}

}  // namespace
#else
namespace {
void install_crash_report() {}
}  // namespace
#endif

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto world = flex::make_world_communicator();
  install_crash_report();
  int rc = RUN_ALL_TESTS();
  at::Tensor any = at::tensor({rc}, at::kInt);
  world->all_reduce(any, flex::ReduceOp::Max);
  if (world->rank() == 0) std::printf("flex mpi test: %d ranks, %s\n", world->size(), any.item<int>() ? "FAILED" : "passed");
  return any.item<int>();
}
