"""Arguments as the C++ readers take them: dtype names, device maps and budgets as JSON text,
quantization configs as dicts. One place for what from_pretrained and the big-model functions share."""
import json

import torch

from .errors import ConfigError

_DTYPES = {
    None: "float32", "auto": "auto",
    torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float64: "float64",
    "float32": "float32", "bfloat16": "bfloat16", "float16": "float16", "float64": "float64",
    "fp32": "float32", "bf16": "bfloat16", "fp16": "float16",
}


def dtype_name(torch_dtype):
    try:
        return _DTYPES[torch_dtype]
    except (KeyError, TypeError):
        raise ConfigError(f"torch_dtype {torch_dtype!r} is not one of torch.float32, torch.bfloat16, "
                          "torch.float16, torch.float64, 'auto'") from None


def quantization(config):
    """None, "int8" / "nf4" / "fp4", a dict, or an object with to_dict() (Transformers' BitsAndBytesConfig)."""
    if config is None or isinstance(config, (str, dict)):
        return config
    if hasattr(config, "to_dict"):
        d = config.to_dict()
        # json can not hold torch dtypes; the C++ reader takes their names.
        return {k: (str(v).replace("torch.", "") if isinstance(v, torch.dtype) else v) for k, v in d.items()}
    raise ConfigError(f"quantization_config must be None, 'int8', 'nf4', 'fp4', a dict or a BitsAndBytesConfig, "
                      f"got {type(config).__name__}")


def device_name(device):
    if isinstance(device, torch.device):
        return str(device)
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    if isinstance(device, str):
        return device
    raise ConfigError(f"device {device!r} is not a GPU index, 'cpu', 'disk' or a torch.device")


def device_map_json(device_map):
    """{module: device} as JSON text (devices as Accelerate writes them)."""
    if not isinstance(device_map, dict):
        raise ConfigError(f"device_map must be a dict {{module: device}}, got {type(device_map).__name__}")
    return json.dumps({str(k): device_name(v) for k, v in device_map.items()})


def max_memory_json(max_memory):
    """{device: bytes or "10GiB"} as JSON text (GPU indices become their names)."""
    if max_memory is None:
        return None
    if not isinstance(max_memory, dict):
        raise ConfigError(f"max_memory must be a dict {{device: size}}, got {type(max_memory).__name__}")
    return json.dumps({str(k): v for k, v in max_memory.items()})


def device_text(device):
    return None if device is None else str(device_name(device))


def dtype_or_none(dtype):
    return None if dtype is None else dtype_name(str(dtype).replace("torch.", "") if isinstance(dtype, str)
                                                  else dtype)


def as_list(x):
    return [] if x is None else ([x] if isinstance(x, str) else list(x))
