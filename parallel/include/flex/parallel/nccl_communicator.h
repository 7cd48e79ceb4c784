#pragma once
// NCCL backend for CUDA tensors (compiled when CMake finds nccl.h, libnccl
// and a CUDA-enabled libtorch; FLEX_HAVE_NCCL is then defined). The NCCL
// unique id is shared through a bootstrap communicator of the same ranks
// (normally the MPI one), which also carries the per-call header check and
// the point-to-point shapes. CPU tensors are passed to the bootstrap
// communicator. Every operation waits for its kernel with a deadline and
// aborts the NCCL communicator on timeout (CommError), never hangs.
#include <flex/parallel/communicator.h>

namespace flex {

#ifdef FLEX_HAVE_NCCL
/// Collective over `bootstrap`: one NCCL communicator of its ranks on CUDA device `device_index`.
std::shared_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Communicator> bootstrap, int device_index,
                                                     const CommOptions& opts = {});
#endif

/// True when this build has the NCCL backend.
bool nccl_available();

/// The linked NCCL's version ("2.27.3"), or "" when this build has no NCCL backend.
std::string nccl_library_version();

}  // namespace flex
