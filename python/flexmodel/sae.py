"""Sparse dictionaries (SAEs and transcoders) in the forward pass, over flex/sae.

    import flexmodel
    sae = flexmodel.sae.load_sae("saes/gpt2-res-jb/blocks.6.hook_resid_pre")   # SAELens folder or params.npz
    fm = flexmodel.FlexModel(model, output_ptr={})
    splice = flexmodel.sae.splice_sae(fm, sae, mode="replace_with_error")
    fm.register_forward_hook(flexmodel.HookFunction(
        splice.module + ".sae.hook_sae_acts_post", editing_function=flexmodel.edits.clamp_feature(1234, 8.0)))
    logits = fm.forward(ids)

A dictionary is a flexmodel.Module (``sae.encode(x)``, ``sae.decode(f)``, ``sae(x)``) computing as
sae-lens 6.54 does; spliced, its hook points ``<module>.sae.hook_sae_input / _acts_pre / _acts_post /
_recons / _error / _output`` are hookable by name.
"""
from . import _C
from .flex_model import FlexModel
from .modeling import _engine_module

SparseDictionary = _C.sae.SparseDictionary
Splice = _C.sae.Splice


def load_sae(path, dtype=None):
    """A SAELens folder (cfg.json + sae_weights.safetensors), a Gemma Scope params.npz or a folder
    holding one. ``dtype`` ("float32", "bfloat16", ...) overrides a SAELens cfg's dtype."""
    if dtype is None:
        return _C.sae.load_sae(str(path))
    from ._arguments import dtype_name
    import os
    if os.path.isdir(path) and os.path.exists(os.path.join(path, "cfg.json")):
        return _C.sae.load_saelens_sae(str(path), dtype_name(dtype))
    return _C.sae.load_gemma_scope_sae(str(path), "", dtype_name(dtype))


def splice_sae(flex_model, sae, mode="replace", hook_name=None, hook_name_out=None):
    """Attaches ``sae`` where it reads (its cfg's TransformerLens hook name, or ``hook_name``: a
    TransformerLens name or one of the model's module names). mode: "observe" (features computed,
    the model unchanged), "replace" (the reconstruction flows on) or "replace_with_error" (plus the
    unedited error: unchanged until a feature is edited). A transcoder reads its input hook and
    stands in for ``hook_name_out``. Returns a Splice (``.module``, ``.remove()``)."""
    if not isinstance(flex_model, FlexModel):
        from .errors import ConfigError
        raise ConfigError(f"splice_sae needs a flexmodel.FlexModel, got {type(flex_model).__name__}")
    return _C.sae.splice_sae(flex_model._engine, sae, mode, hook_name or "", hook_name_out or "")


def train_sae(activations, hook, architecture, d_sae, out, *, total_tokens, transcoder_out=None, skip=False, k=None,
              l1=None, l0_coefficient=None, lr=3e-4, batch_tokens=4096, seed=0, dtype="float32",
              checkpoint_every=0, eval_tokens=8192, normalize=True, dead_feature_window=1000,
              model=None, dataset=None, context_len=128, batch_size=8, buffer_tokens=65536, text_field=None,
              tokenizer=None, from_pretrained=None):
    """Trains a dictionary as ``flexmodel train-sae`` does (the same C++), on an activation dataset
    (``activations``: a ``capture_dataset`` folder) or, with ``model`` (from_pretrained) and
    ``dataset`` (a corpus), on the fly from the model's forward (``activations`` None; ``tokenizer``:
    a folder, for text corpora). architecture "topk", "batchtopk", "jumprelu" or "standard";
    ``transcoder_out`` trains a transcoder to that hook. Writes SAELens's format, metrics.jsonl,
    curves.svg, eval.json and checkpoints to ``out`` (a rerun continues the last checkpoint).
    ``from_pretrained``: a dictionary folder (SAELens's format) to start from instead of a random
    initialisation (fresh optimizer state), as SAELens's from_pretrained_path.
    Returns a dict: steps, tokens, tokens_per_second, the held-out explained_variance, mse, l0,
    dead_latents, dense_latents, "sae" (the trained SparseDictionary) and, with ``model``, the
    next-token losses (clean, with the SAE spliced, zeroed) and ce_loss_recovered."""
    if str(dtype).replace("torch.", "") not in ("float32", "f32", "bfloat16", "bf16"):
        from .errors import ConfigError
        raise ConfigError(f"train_sae: dtype {dtype!r} is not float32 or bfloat16")
    if (model is None) == (activations is None):
        from .errors import ConfigError
        raise ConfigError("train_sae: give activations (a dataset folder) or model and dataset, not both")
    return _C.sae.train_sae(str(activations or ""), hook, architecture, int(d_sae), str(out), transcoder_out or "",
                            skip, k, l1, l0_coefficient, float(lr), int(batch_tokens), int(total_tokens), int(seed),
                            "bf" in str(dtype), int(checkpoint_every), int(eval_tokens), normalize,
                            int(dead_feature_window), _engine_module(model) if model is not None else None,
                            str(dataset or ""), int(context_len), int(batch_size), int(buffer_tokens),
                            text_field or "", str(tokenizer or ""), str(from_pretrained or ""))


def resolve_hook_name(model, hook_name):
    """(module name, reads the input?, normalised?) of a TransformerLens hook name in ``model``,
    holding what TransformerLens 4.3's run_with_cache gives under that name."""
    return _C.sae.resolve_hook_name(_engine_module(model), hook_name)


def sparse_code(feature_acts):
    """CSR of ``feature_acts`` [..., d_sae] by row: (indptr [N+1], indices [nnz], values [nnz])."""
    return _C.sae.sparse_code(feature_acts)


def strongest_features(feature_acts, width=0):
    """Per row the ``width`` largest features (0: every active one): (indices int32 [N, width],
    -1 pads; values [N, width]; l0 int32 [N], the active count)."""
    return _C.sae.strongest_features(feature_acts, int(width))
