// The process's hook-name resolver (hook_names.h).
#include <flex/flexcore/hook_names.h>
#include <flex/hooks/errors.h>

#include <utility>

namespace flex {

namespace {
HookNameResolver& installed() {
  static HookNameResolver resolver;
  return resolver;
}
}  // namespace

void set_hook_name_resolver(HookNameResolver resolver) { installed() = std::move(resolver); }

std::optional<HookPlace> resolve_hook_place(Module& root, const std::string& name) {
  if (!installed()) return std::nullopt;
  try {
    root.get_submodule(name);
    return std::nullopt;  // a module's own name always wins
  } catch (const NotFoundError&) {
  }
  return installed()(root, name);
}

}  // namespace flex
