"""Models: ``from_pretrained`` and the model object it returns."""
import json
import os
import warnings

from . import _C
from ._arguments import device_map_json, device_name, dtype_name, max_memory_json, quantization

Module = _C.Module
Module.__doc__ = "A module of the C++ model tree (named_modules, get_submodule, named_parameters, ...)."

def _edits_of(steer, ablate, patch, force_experts, ban_experts, scale_experts, model, cached):
    """(module name, Edit) pairs for generate's keyword edits, as the CLI's flags build them."""
    from . import edits
    out = [(name, edits.steer(vector, alpha)) for name, (vector, alpha) in (steer or {}).items()]
    for item in ablate or []:
        if isinstance(item, str):
            out.append((item, edits.ablate()))
        else:
            name, head = item
            out.append((_C.edits.head_hook_point(model, name), edits.ablate_head(head)))
    out += [(name, edits.patch(tensor, cached)) for name, tensor in (patch or {}).items()]
    out += [(block + ".hook_selected_experts", edits.force_experts(e)) for block, e in (force_experts or {}).items()]
    out += [(block + ".gate", edits.ban_experts(e)) for block, e in (ban_experts or {}).items()]
    out += [(name, edits.scale_output(f)) for name, f in (scale_experts or {}).items()]
    return out


class PreTrainedModel:
    """A causal LM loaded by :func:`from_pretrained` (every architecture of the zoo).

    ``model(input_ids, attention_mask=None)`` returns the logits ``[B, T, vocab]``.
    Module names are Transformers' (``transformer.h.0.mlp``, ``model.layers.3.self_attn``),
    plus flexmodel's hook points (``...hook_attn_probs``, ``...hook_head_out``).
    """

    def __init__(self, lm, name_or_path=None):
        self._lm = lm
        self.name_or_path = name_or_path

    # --- calling -------------------------------------------------------------------
    def __call__(self, input_ids, attention_mask=None):
        return self._lm.logits(input_ids, attention_mask)

    forward = __call__

    def generate(self, input_ids, attention_mask=None, max_new_tokens=20, do_sample=False, temperature=1.0,
                 top_k=0, top_p=1.0, seed=0, eos_token_id=None, pad_token_id=None, use_cache=True,
                 steer=None, ablate=None, patch=None, force_experts=None, ban_experts=None, scale_experts=None,
                 edits=None, taps=None, cuda_graph=False, static_step=False, static_capacity=0):
        """Greedy (or seeded sampled) generation; returns the sequences ``[B, T + new]``, or with ``taps``
        ``(sequences, {name: [tensor per model call]})`` (the prompt's ``[B, T, ...]``, then each step's).

        The edits are the command line's: ``steer={name: (vector, alpha)}``,
        ``ablate=[name, (attention_name, head), ...]``, ``patch={name: tensor}``,
        ``force_experts={block: [e, ...]}``, ``ban_experts={block: [e, ...]}``,
        ``scale_experts={expert: factor}``; ``edits={name: fn}`` adds editing functions (a
        ``flexmodel.edits`` one or any Python callable ``fn(activation) -> activation``). They apply to
        every forward (prompt and each step).

        ``cuda_graph=True`` records the decode step once as a CUDA graph (a model on one CUDA device;
        the CLI's ``--cuda-graph``); ``static_step=True`` runs the same static step eagerly on any device
        (design decision 51). Python editing functions and patches cannot be recorded (they run Python or
        track positions on the host): generation then decodes eagerly, with a warning.
        """
        built = _edits_of(steer, ablate, patch, force_experts, ban_experts, scale_experts, self._lm, use_cache)
        # A Python callable gets the activation only (the engine passes the module too).
        built += [(name, fn if isinstance(fn, _C.Edit) else (lambda module, a, fn=fn: fn(a)))
                  for name, fn in (edits or {}).items()]
        if cuda_graph:
            python_fns = [name for name, fn in (edits or {}).items() if not isinstance(fn, _C.Edit)]
            why = ("Python editing functions (on " + ", ".join(python_fns) + ")" if python_fns
                   else "patch (it tracks positions on the host)" if patch else None)
            if why:
                warnings.warn("generate(cuda_graph=True): " + why + " cannot be recorded in a CUDA graph; "
                              "decoding eagerly instead", RuntimeWarning, stacklevel=2)
                cuda_graph = False
        stop = None if eos_token_id is None else ([eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id))
        fm = _C.FlexModel(self._lm) if built else None
        try:
            for name, edit in built:
                fm.register(name, "forward", None, edit, 0, False, False)
            sequences, _, tapped = self._lm.generate(input_ids, attention_mask, max_new_tokens, do_sample,
                                                     temperature, top_k, top_p, seed, stop, pad_token_id, use_cache,
                                                     static_step, cuda_graph, int(static_capacity), list(taps or []))
        finally:
            if fm is not None:
                fm.restore()
        return (sequences, tapped) if taps else sequences

    # --- the module tree -----------------------------------------------------------
    def named_modules(self):
        return iter(self._lm.named_modules())

    def modules(self):
        return (m for _, m in self._lm.named_modules())

    def named_children(self):
        return iter(self._lm.named_children())

    def get_submodule(self, target):
        return self._lm.get_submodule(target)

    def named_parameters(self):
        """(name, tensor) pairs; the tensors share storage with the C++ model."""
        return iter(self._lm.named_parameters())

    def parameters(self):
        return (p for _, p in self._lm.named_parameters())

    def named_buffers(self):
        return iter(self._lm.named_buffers())

    def state_dict(self):
        return dict(self._lm.state_dict())

    def requires_grad_(self, requires_grad=True):
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    # --- what it is ------------------------------------------------------------------
    @property
    def config(self):
        """config.json as a dict."""
        return json.loads(self._lm.config_json)

    @property
    def hf_device_map(self):
        """{module: device} when loaded with a device map, else None (Transformers' attribute)."""
        text = self._lm.hf_device_map_json
        return None if text is None else json.loads(text)

    @property
    def dtype(self):
        return next(p.dtype for p in self.parameters() if p.is_floating_point())

    @property
    def class_name(self):
        return self._lm.class_name

    def __repr__(self):
        return f"<flexmodel.PreTrainedModel {self._lm.class_name} from {self.name_or_path!r}>"


def _engine_module(module):
    """The C++ module behind a PreTrainedModel (or a flexmodel.Module itself)."""
    if isinstance(module, PreTrainedModel):
        return module._lm
    if isinstance(module, _C.Module):
        return module
    from .errors import ConfigError
    raise ConfigError(f"expected a flexmodel model (flexmodel.from_pretrained) or flexmodel.Module, got "
                      f"{type(module).__module__}.{type(module).__name__} (flexmodel.FlexModel also takes any "
                      "torch.nn.Module, run by PyTorch: the torch engine)")


def from_pretrained(path, device_map=None, max_memory=None, offload_folder=None, torch_dtype=None,
                    quantization_config=None, mmap=True, fast_activations=False, prefetch_depth=1, quantize_head="none",
                    quantize_embeddings="none"):
    """Loads a Hugging Face model folder (config.json + safetensors / .bin, sharded or not).

    device_map: None (all on CPU), "auto" / "balanced" / "balanced_low_0" / "sequential",
    one device ("cpu", "disk", 0), or a dict {module: device}. max_memory: {device: bytes or "2GiB"}.
    torch_dtype: torch.float32 (default), torch.bfloat16, torch.float16, "auto".
    quantization_config: "int8" / "nf4" / "fp4", a dict or Transformers' BitsAndBytesConfig.
    mmap=False copies CPU weights into memory instead of leaving them views of the mapped file.
    A GGUF file (path to a .gguf) keeps its quantized matrices in their blocks; fast_activations=True
    quantizes those layers' inputs to 8 bits per 32 values as llama.cpp does (faster decoding, error in
    docs/gguf.md; the CLI's --fast-activations).
    prefetch_depth: offloaded blocks (cpu/disk entries of the map) read ahead by a reader thread while the
    previous block computes (0: off; outputs are bit-equal either way; the CLI's --prefetch-depth).
    quantize_head: "none" (default), "int8", "nf4", "q8_0" or "q6_k": the output head quantized at load
    (a tied embedding stays exact; the CLI's --quantize-head; error in docs/gguf.md).
    quantize_embeddings: "none" (default), "int8", "nf4", "q8_0" or "q6_k": the input token embedding
    stored quantized, a lookup dequantizing only its rows (the CLI's --quantize-embeddings); its
    module's weight is then the stored codes and module.float_weight() the dequantized table. A GGUF
    file's quantized token_embd stays in its blocks without this option.
    """
    path = os.fspath(path)
    strategy, explicit = None, None
    if isinstance(device_map, dict):
        explicit = device_map_json(device_map)
    elif device_map is not None:
        strategy = str(device_name(device_map))  # "auto", "cpu", "disk", 0, torch.device("cuda:1")
    lm = _C.from_pretrained(path, strategy, explicit, max_memory_json(max_memory),
                            None if offload_folder is None else os.fspath(offload_folder),
                            dtype_name(torch_dtype), quantization(quantization_config), mmap, fast_activations,
                            int(prefetch_depth), str(quantize_head), str(quantize_embeddings))
    return PreTrainedModel(lm, path)
