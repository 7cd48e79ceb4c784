// flexmodel --version: what this binary is built from and runs with, so a
// bug report or a cluster job log says which libtorch (and where it was
// loaded from), which build of it, and which parallel backends exist.
#include "cli.h"
#include "flexmodel_version.h"

#include <flex/parallel/mpi_communicator.h>
#include <flex/parallel/nccl_communicator.h>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <torch/version.h>

#include <dlfcn.h>

#include <iostream>

namespace flex::cli {
namespace {

/// The file the running libtorch was loaded from (the dynamic loader's answer).
std::string libtorch_file() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&at::get_num_threads), &info) && info.dli_fname) return info.dli_fname;
  return "unknown location";
}

}  // namespace

int run_version() {
#ifdef FLEX_TORCH_CUDA
  const std::string build = "CUDA build";
#else
  const std::string build = "CPU build";
#endif
  std::cout << "flexmodel " << FLEX_VERSION << "\n"
            << "libtorch " << TORCH_VERSION << ", " << build << " (" << libtorch_file() << ")";
  if (at::hasCUDA()) std::cout << ", " << at::getNumGPUs() << " CUDA device(s) visible";
  std::cout << "\n";
  const std::string mpi = mpi_library_version(), nccl = nccl_library_version();
  std::cout << "MPI: " << (mpi_available() ? "compiled in (" + mpi + ")" : "not compiled in") << "\n"
            << "NCCL: " << (nccl_available() ? "compiled in (" + nccl + ")" : "not compiled in") << "\n";
  return 0;
}

}  // namespace flex::cli
