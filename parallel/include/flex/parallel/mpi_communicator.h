#pragma once
// Open MPI backend (compiled when CMake finds MPI; FLEX_HAVE_MPI is then
// defined for users of flex::parallel). CPU tensors move directly; CUDA
// tensors are staged through host memory.
//
// Process lifetime: the first world communicator calls MPI_Init_thread
// (FUNNELED) unless the program already initialised MPI, and then
//  - MPI_Finalize runs at a normal exit (status 0),
//  - an exit with a non-zero status, or an uncaught exception, prints
//    "flex: rank R of N ..." and calls MPI_Abort, so mpirun stops every rank
//    at once instead of leaving them waiting in a collective.
// Every wait polls with a deadline (CommOptions::timeout_s).
#include <flex/parallel/communicator.h>

namespace flex {

#ifdef FLEX_HAVE_MPI
/// The world communicator over MPI_COMM_WORLD (initialising MPI if needed).
std::shared_ptr<Communicator> make_mpi_world_communicator(const CommOptions& opts = {});
#endif

/// True when this build has the MPI backend.
bool mpi_available();

/// The MPI library's own version line ("Open MPI v4.1.4, ..."), or "" when
/// this build has no MPI backend. Callable before MPI is initialised.
std::string mpi_library_version();

/// True when the process looks launched by mpirun/srun (OMPI_COMM_WORLD_SIZE,
/// PMI_SIZE or PMIX_RANK in the environment).
bool launched_by_mpirun();

}  // namespace flex
