"""``from_transformers``: flexmodel's model around a Transformers model already in memory.

    hf = transformers.AutoModelForCausalLM.from_pretrained("path/to/llama")
    model = flexmodel.from_transformers(hf)          # flexmodel.PreTrainedModel, run by flexmodel's engine
    fm = flexmodel.FlexModel(hf, output)             # the same, wrapped (fm.engine == "flexmodel")

The C++ model is built from ``hf.config`` (read as from_pretrained reads config.json) around the very
tensors of ``hf`` (flex/models/adopt_weights.h): no second copy of the weights, the same dtype and
device; module names are Transformers' own. ``hf`` itself is left as it was.
"""
from . import _C
from .errors import UnsupportedError
from .modeling import PreTrainedModel


def model_type_of(module):
    """config.model_type of a Transformers model flexmodel has an architecture for, else None."""
    config = getattr(module, "config", None)
    model_type = getattr(config, "model_type", None)
    if not isinstance(model_type, str) or not hasattr(config, "to_json_string"):
        return None
    return model_type if _C.knows_model_type(model_type) else None


def from_transformers(hf_model):
    """flexmodel's :class:`~flexmodel.PreTrainedModel` sharing ``hf_model``'s parameter storage.

    hf_model: a ``transformers.PreTrainedModel`` causal LM whose ``config.model_type`` flexmodel knows
    (``flexmodel.UnsupportedError`` otherwise: wrap it with ``flexmodel.FlexModel``, which runs any
    torch.nn.Module on PyTorch's hooks). Transformers 5's fused experts become views per expert.
    Parameters flexmodel's architecture has no place for (an adapter's) are an UnsupportedError naming them.
    """
    what = type(hf_model).__name__
    if model_type_of(hf_model) is None:
        model_type = getattr(getattr(hf_model, "config", None), "model_type", None)
        raise UnsupportedError(f"{what} (model_type {model_type!r}) has no flexmodel architecture; "
                               "flexmodel.FlexModel(module, output) runs it on PyTorch's hooks (the torch engine)")
    parameters = dict(hf_model.named_parameters(remove_duplicate=False))
    buffers = dict(hf_model.named_buffers(remove_duplicate=False))
    lm = _C.adopt_weights(hf_model.config.to_json_string(use_diff=False), parameters, buffers, what)
    return PreTrainedModel(lm, getattr(hf_model, "name_or_path", None) or None)
