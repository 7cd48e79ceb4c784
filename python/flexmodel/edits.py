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


# --- feature edits, at a spliced dictionary's <module>.sae.hook_sae_acts_post ---------
def ablate_features(features, positions=()):
    """Features set to 0 (at sequence positions ``positions``, dim -2; all when empty)."""
    return _C.sae.ablate_features([int(f) for f in features], [int(p) for p in positions])


def clamp_feature(feature, value, positions=()):
    """One feature set to ``value``."""
    return _C.sae.clamp_feature(int(feature), float(value), [int(p) for p in positions])


def scale_feature(feature, factor, positions=()):
    """One feature multiplied by ``factor``."""
    return _C.sae.scale_feature(int(feature), float(factor), [int(p) for p in positions])


def steer_feature(sae, feature, alpha, positions=()):
    """activation + alpha * W_dec[feature]: at the place the dictionary writes (its splice's module)."""
    return _C.sae.steer_feature(sae, int(feature), float(alpha), [int(p) for p in positions])
