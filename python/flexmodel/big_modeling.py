"""Accelerate's big-model functions, same names and arguments, over the C++ dispatch layer.

    with flexmodel.init_empty_weights():
        model = flexmodel.from_config("path/to/model")          # parameters on meta: no memory
    device_map = flexmodel.infer_auto_device_map(model, max_memory={0: "10GiB", "cpu": "30GiB"})
    model = flexmodel.load_checkpoint_and_dispatch(model, "path/to/model", device_map=device_map)

Device maps are ``{module name: device}`` with devices as Accelerate writes them: a GPU
index, ``"cpu"``, ``"disk"`` (or a torch.device).
"""
import contextlib
import json
import os
import threading

import torch

from . import _C
from ._arguments import as_list, device_map_json, dtype_name, dtype_or_none, device_text, max_memory_json
from .modeling import PreTrainedModel, _engine_module

_state = threading.local()  # init_empty_weights is per thread, as the C++ EmptyInit scope


@contextlib.contextmanager
def init_empty_weights(include_buffers=False):
    """Models built by :func:`from_config` inside this block put their parameters (and, with
    include_buffers, their buffers) on the meta device: no memory, no initialisation."""
    previous = getattr(_state, "empty", None)
    _state.empty = bool(include_buffers)
    try:
        yield
    finally:
        _state.empty = previous


def from_config(config, torch_dtype=None):
    """A model of the zoo built from its config (a dict, a config.json path or a model folder), with
    random weights, or on meta inside :func:`init_empty_weights` (Transformers' from_config)."""
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        try:
            with open(path) as f:
                config = json.load(f)
        except OSError as e:
            from .errors import IOError as FlexIOError
            raise FlexIOError(f"{path}: cannot read the config ({e.strerror})") from None
        except json.JSONDecodeError as e:
            from .errors import FileFormatError
            raise FileFormatError(f"{path}: not JSON ({e})") from None
    elif not isinstance(config, dict):
        from .errors import ConfigError
        raise ConfigError(f"config must be a dict or a path, got {type(config).__name__}")
    empty = getattr(_state, "empty", None)
    lm = _C.from_config(json.dumps(config), dtype_name(torch_dtype), empty is not None, bool(empty))
    return PreTrainedModel(lm, config.get("_name_or_path"))


# --- the functions -----------------------------------------------------------------------------
def infer_auto_device_map(model, max_memory=None, no_split_module_classes=None, dtype=None, special_dtypes=None,
                          verbose=False, clean_result=True, offload_buffers=False, fallback_allocation=False):
    """Plans {module: device} from the budgets (Accelerate's planner, step for step: the same model and
    budgets give Accelerate's map). Without max_memory: the free memory of every device."""
    specials = {k: dtype_or_none(v) for k, v in (special_dtypes or {}).items()}
    text = _C.infer_auto_device_map(_engine_module(model), max_memory_json(max_memory),
                                    as_list(no_split_module_classes), dtype_or_none(dtype), specials, clean_result,
                                    offload_buffers, fallback_allocation, verbose)
    return json.loads(text)


def load_checkpoint_and_dispatch(model, checkpoint, device_map=None, max_memory=None, no_split_module_classes=None,
                                 offload_folder=None, offload_buffers=False, dtype=None, offload_state_dict=None,
                                 skip_keys=None, preload_module_classes=None, force_hooks=False, strict=False):
    """Loads ``checkpoint`` (a file, a sharded index or a model folder) into ``model`` (usually built
    under init_empty_weights), each tensor straight to its device, and dispatches it. device_map: a dict,
    "auto" / "balanced" / "balanced_low_0" / "sequential", or None (all on CPU). Returns the model.
    offload_state_dict is accepted for Accelerate's signature; it is not needed here (CPU weights
    are views of the memory-mapped checkpoint)."""
    del offload_state_dict
    strategy, explicit = (device_map, None) if isinstance(device_map, str) else (None, device_map)
    missing, unexpected = _C.load_checkpoint_and_dispatch(
        _engine_module(model), os.fspath(checkpoint), strategy,
        None if explicit is None else device_map_json(explicit), max_memory_json(max_memory),
        as_list(no_split_module_classes) or _default_no_split(model),
        None if offload_folder is None else os.fspath(offload_folder), offload_buffers, dtype_or_none(dtype),
        set(as_list(skip_keys)), as_list(preload_module_classes), force_hooks, strict)
    if isinstance(model, PreTrainedModel):
        model.missing_keys, model.unexpected_keys = missing, unexpected
    return model


def _default_no_split(model):
    # Transformers' _no_split_modules: a decoder block is never split across devices.
    lm = _engine_module(model)
    return list(lm.no_split_modules) if isinstance(lm, _C.CausalLM) else []


def dispatch_model(model, device_map, main_device=None, state_dict=None, offload_dir=None, offload_index=None,
                   offload_buffers=False, skip_keys=None, preload_module_classes=None, force_hooks=False):
    """Places the model as ``device_map`` says and attaches the hooks that run it there (weights of
    "cpu" modules move to the main device while they run when it is a GPU; "disk" modules read theirs
    from ``offload_dir``, written from the model when it holds no index.json). Returns the model."""
    if offload_index is not None:
        from .errors import ConfigError
        raise ConfigError("offload_index: pass offload_dir (an Accelerate offload folder with its index.json)")
    _C.dispatch_model(_engine_module(model), device_map_json(device_map), device_text(main_device), state_dict,
                      None if offload_dir is None else os.fspath(offload_dir), offload_buffers,
                      set(as_list(skip_keys)), as_list(preload_module_classes), force_hooks)
    return model


def cpu_offload(model, execution_device=None, offload_buffers=False, state_dict=None, preload_module_classes=None):
    """Keeps every weight on the CPU (in ``state_dict``, default copies of the model's) and loads each
    module's weights on ``execution_device`` only while it runs. Returns the model."""
    _C.cpu_offload(_engine_module(model), device_text(execution_device), offload_buffers, state_dict,
                   as_list(preload_module_classes))
    return model


def disk_offload(model, offload_dir, execution_device=None, offload_buffers=False, preload_module_classes=None):
    """The same with the weights in an Accelerate offload folder (written from the model when
    ``offload_dir/index.json`` is missing). Returns the model."""
    _C.disk_offload(_engine_module(model), os.fspath(offload_dir), device_text(execution_device),
                    offload_buffers, as_list(preload_module_classes))
    return model
