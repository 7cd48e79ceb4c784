// flexmodel._C: the C++ engine's Python face (see bindings.h).
#include "bindings.h"

#include <flex/kernels/memory_reuse.h>
#include <flex/sae/tl_hook_names.h>

PYBIND11_MODULE(_C, m) {
  m.doc() = "flexmodel's C++ engine (use the flexmodel package, not this module)";
  // The libtorch this extension was compiled against: flexmodel/__init__.py
  // compares it with the imported torch before loading anything else.
  m.attr("torch_version") = FLEX_BUILT_TORCH_VERSION;
  m.def("keep_freed_memory", &flex::keep_freed_memory,
        "Makes this process's malloc keep freed memory for reuse (flex/kernels/memory_reuse.h); "
        "flexmodel/__init__.py calls it on import; FLEXMODEL_KEEP_FREED_MEMORY=0 makes it a no-op.");
  flex::python::bind_errors(m);
  flex::python::bind_modules(m);
  flex::python::bind_dispatch(m);
  flex::python::bind_parallel(m);
  flex::python::bind_flex_model(m);
  flex::python::bind_datasets(m);
  flex::python::bind_sae(m);
  flex::python::bind_attribution(m);
  // TransformerLens hook names (blocks.3.hook_resid_post) wherever a module name is.
  flex::install_transformer_lens_names();
}
