#pragma once
// Accelerate's save and extract_model_from_parallel for flexmodel programs
// that run on many ranks.
//
//   flex::save(flex::Value(stats), "stats.pt", world.get());  // rank 0 writes, atomically
#include <flex/hooks/value.h>

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace flex {

class Communicator;
class FlexModel;
class Module;

struct SaveOptions {
  /// Write on every node's first rank (OMPI_COMM_WORLD_LOCAL_RANK /
  /// MPI_LOCALRANKID / LOCAL_RANK == 0) instead of global rank 0 only.
  bool save_on_each_node = false;
};

/// Writes `obj` with torch::pickle_save (which torch.load reads) to `path`
/// from global rank 0 of `comm` (every process when `comm` is null) through
/// a temporary file and a rename: the file is whole or absent. Other ranks
/// write nothing and do not wait. IOError naming the path on failure.
void save(const Value& obj, const std::string& path, const Communicator* comm = nullptr, SaveOptions options = {});
/// safe_serialization: tensors as one safetensors file, written the same way.
void save(const std::vector<std::pair<std::string, at::Tensor>>& tensors, const std::string& path,
          const Communicator* comm = nullptr, SaveOptions options = {});

/// The plain module behind a FlexModel. keep_hooks (Accelerate's
/// keep_fp32_wrapper): the module with the FlexModel's hooks still attached;
/// false: the hooks are removed first (FlexModel::restore()).
std::shared_ptr<Module> extract_model_from_parallel(FlexModel& model, bool keep_hooks = true);

}  // namespace flex
