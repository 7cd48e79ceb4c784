#include <flex/flexcore/save.h>

#include <flex/dispatch/atomic_file.h>
#include <flex/dispatch/safetensors.h>
#include <flex/flexcore/flex_model.h>
#include <flex/parallel/communicator.h>

#include <torch/csrc/jit/serialization/pickle.h>

#include <cstdlib>

namespace flex {

namespace {

// The launcher's local rank, when it tells one (Open MPI, MPICH, torchrun).
int local_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "LOCAL_RANK"})
    if (const char* s = std::getenv(v); s && *s) return std::atoi(s);
  return 0;
}

bool writes(const Communicator* comm, const SaveOptions& o) {
  if (o.save_on_each_node) return local_rank() == 0;
  return !comm || comm->rank() == 0;
}

}  // namespace

void save(const Value& obj, const std::string& path, const Communicator* comm, SaveOptions options) {
  if (!writes(comm, options)) return;
  const std::vector<char> bytes = torch::jit::pickle_save(obj);
  write_file_atomic(path, std::string(bytes.begin(), bytes.end()));
}

void save(const std::vector<std::pair<std::string, at::Tensor>>& tensors, const std::string& path,
          const Communicator* comm, SaveOptions options) {
  if (!writes(comm, options)) return;
  save_safetensors(path, tensors, {{"format", "pt"}});
}

std::shared_ptr<Module> extract_model_from_parallel(FlexModel& model, bool keep_hooks) {
  return keep_hooks ? model.module() : model.restore();
}

}  // namespace flex
