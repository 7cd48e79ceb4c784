#include <flex/hooks/frozen_replacement.h>

namespace flex {

namespace {
thread_local bool frozen = false;
}

FreezeNonlinearities::FreezeNonlinearities() : previous_(frozen) { frozen = true; }
FreezeNonlinearities::~FreezeNonlinearities() { frozen = previous_; }

bool nonlinearities_frozen() { return frozen; }

}  // namespace flex
