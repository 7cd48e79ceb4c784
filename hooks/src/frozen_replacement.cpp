#include <flex/hooks/frozen_replacement.h>

namespace flex {

namespace {
thread_local bool frozen = false;
thread_local bool replicas = false;
}  // namespace

FreezeNonlinearities::FreezeNonlinearities(bool batch_replicas) : previous_(frozen), previous_replicas_(replicas) {
  frozen = true;
  replicas = batch_replicas;
}
FreezeNonlinearities::~FreezeNonlinearities() {
  frozen = previous_;
  replicas = previous_replicas_;
}

bool nonlinearities_frozen() { return frozen; }
bool frozen_batch_replicas() { return frozen && replicas; }

}  // namespace flex
