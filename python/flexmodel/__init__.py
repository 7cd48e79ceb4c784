"""flexmodel: hook, capture and edit the modules of large transformers, from Python.

The C++ engine (libtorch) does the work; tensors pass in and out as
``torch.Tensor`` without copies, and Python editing functions run inside its
hooks.

    import flexmodel, torch
    model = flexmodel.from_pretrained("path/to/gpt2")
    out = {}
    fm = flexmodel.FlexModel(model, out)
    fm.register_forward_hook(flexmodel.HookFunction("transformer.h.0.mlp", expected_shape=(1, 8, 768)))
    logits = fm(torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]]))
    out["transformer.h.0.mlp"]  # a CPU torch.Tensor
"""
import torch as _torch

from . import _build_info


def _check_torch():
    built, found = _build_info.torch_version, _torch.__version__
    if built != found:
        raise ImportError(
            f"flexmodel was built against torch {built} but this Python imports torch {found} "
            f"(from {_torch.__file__}); rebuild flexmodel with this torch (bash test.sh or "
            f"pip install --no-build-isolation .), or install torch=={built.split('+')[0]}")


_check_torch()

from . import _C  # noqa: E402  (after the version check: a mismatched libtorch may not even load)

# Forwards allocate and free the same activation-sized blocks again and again, and a capture keeps
# its tensors until the next forward: glibc would serve them with fresh, page-faulted memory every
# time (up to a third of a capturing forward). Freed memory is kept for reuse instead; the process's
# resident size then stays at its high-water mark. FLEXMODEL_KEEP_FREED_MEMORY=0 leaves malloc alone.
_C.keep_freed_memory()
from .errors import (  # noqa: E402,F401
    ConfigError, DeviceError, DeviceMapError, EditingFunctionError, Error, FileFormatError, IOError, NotFoundError,
    NumericError, ShapeError, UnsupportedError)
from .modeling import Module, PreTrainedModel, from_pretrained  # noqa: E402,F401
from .flex_model import FlexModel, HookFunction  # noqa: E402,F401
from .transformers_model import from_transformers  # noqa: E402,F401
from .big_modeling import (  # noqa: E402,F401
    cpu_offload, disk_offload, dispatch_model, from_config, infer_auto_device_map, init_empty_weights,
    load_checkpoint_and_dispatch)
from .activation_datasets import ActivationDataset, ActivationLoader, capture_dataset  # noqa: E402,F401
from . import edits  # noqa: E402,F401
from . import sae  # noqa: E402,F401
from .attribution import attribute, intervene, intervene_generate  # noqa: E402,F401
from ._C import world_rank, world_size  # noqa: E402,F401  (mpirun: this process's rank, the job's size)

__version__ = "0.1.0"
