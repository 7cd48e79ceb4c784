"""Built-in editing functions, run in C++ (no Python call per hook).

Each can be given as a HookFunction's ``editing_function``:

    HookFunction("model.layers.3", editing_function=flexmodel.edits.steer(vector, 4.0))
"""
import torch

from . import _C


def steer(vector, alpha=1.0):
    """activation + alpha * vector (along the last dimension, at every position)."""
    return _C.edits.add_vector(torch.as_tensor(vector), float(alpha))


def ablate():
    """The activation replaced by zeros."""
    return _C.edits.zero_activation()


def ablate_head(head):
    """One head zeroed, at an attention module's per-head outputs (``<attn>.hook_head_out``)."""
    return _C.edits.zero_head(int(head))


def head_hook_point(model, attention):
    """The hook point holding ``attention``'s per-head outputs."""
    from .modeling import _engine_module
    return _C.edits.head_hook_point(_engine_module(model), attention)


def patch(activation, cached=False):
    """Positions 0..T-1 of the output replaced by ``activation`` ([1 or B, T, ...])."""
    return _C.edits.patch_positions(torch.as_tensor(activation), cached)


def force_experts(experts, tokens=()):
    """At ``<block>.hook_selected_experts``: route tokens (all, or the given flat indices) to ``experts``."""
    return _C.edits.force_experts(list(experts), list(tokens))


def ban_experts(experts):
    """At a router ``<block>.gate``: the experts' logits become -inf."""
    return _C.edits.ban_experts(list(experts))


def scale_output(factor):
    """The module's output times ``factor``."""
    return _C.edits.scale_output(float(factor))
