"""FlexModel and HookFunction, with the names and signatures of Vector Institute's FlexModel.

    output = {}
    fm = FlexModel(model, output)
    fm.register_forward_hook(HookFunction("model.layers.3.mlp", expected_shape=(None, None, 2048),
                                          editing_function=lambda module, x, save_ctx, modules: x * 0.5))
    logits = fm(input_ids)
    output["model.layers.3.mlp"]        # CPU torch.Tensor, captured before the edit

A hook without an editing function (or with a built-in one from flexmodel.edits)
runs entirely in C++; a Python editing function is called inside the C++ hook
with the GIL held only for that call.
"""
import re
import types
import warnings
import weakref

import torch

from . import _C
from .errors import ConfigError, Error, NotFoundError, UnsupportedError
from .modeling import _engine_module


class SaveContext(types.SimpleNamespace):
    """Attributes an editing function sets to keep values across calls (``save_ctx.x = ...``)."""


class HookFunction:
    """What to do at one module: capture its activation, optionally edit it.

    module_name: the module (or, for register_hook, the parameter) name.
    expected_shape: the whole activation's shape; None entries match any size.
    editing_function: ``fn(current_module, inputs, save_ctx, modules) -> tensor`` of the same
        shape, or a built-in edit from :mod:`flexmodel.edits`.
    unpack_idx: which tensor of a tuple output (depth first) is the activation.
    save: capture into the FlexModel's output_ptr; save_after_edit: capture the edited value.
    shard_dim: (torch engine under torch.distributed only) the dim along which the module's output is
        split over the tensor-parallel ranks; without it, the one dim in which the local activation
        differs from ``expected_shape`` (as Vector Institute's FlexModel infers it), else none.
    """

    def __init__(self, module_name, expected_shape=None, editing_function=None, unpack_idx=0, save=True,
                 save_after_edit=False, shard_dim=None):
        self.module_name = module_name
        self.expected_shape = None if expected_shape is None else tuple(expected_shape)
        self.editing_function = editing_function
        self.unpack_idx = unpack_idx
        self.save = save
        self.save_after_edit = save_after_edit
        self.shard_dim = shard_dim
        self._cpp = None      # the engine's HookFunction once registered
        self._handle = None

    @property
    def hook_type(self):
        return None if self._cpp is None else self._cpp.hook_type

    def __repr__(self):
        where = f", {self.hook_type}" if self._cpp is not None else ""
        return f"HookFunction({self.module_name!r}{where})"


def _engine_edit(fm, fn, what):
    """What the engine runs for an editing function: None, a built-in Edit as is, or a Python callable
    wrapped so that it also gets save_ctx and the trainable modules (through a weak reference: the
    engine's hooks must not keep the FlexModel alive)."""
    if fn is None or isinstance(fn, _C.Edit):
        return fn
    if not callable(fn):
        raise ConfigError(f"{what}: editing_function must be callable, got {type(fn).__name__}")
    fm_ref = weakref.ref(fm)

    def call(module, activation):
        fm = fm_ref()
        return fn(module, activation, fm.save_ctx, fm.trainable_modules)
    return call


def _adopt(module, required=False):
    """flexmodel's model around a Transformers model of a known model_type (flexmodel's engine), or None
    (the torch engine): for any other module, and, with a warning saying why, where adopting fails.
    required (engine="flexmodel"): the reason is raised instead."""
    from .transformers_model import from_transformers, model_type_of
    if required:
        return from_transformers(module)
    if model_type_of(module) is None:
        return None
    try:
        return from_transformers(module)
    except Error as e:
        warnings.warn(f"flexmodel.FlexModel: {type(module).__name__} runs on the torch engine, not flexmodel's: {e}",
                      stacklevel=3)
        return None


class FlexModel:
    """Wraps a flexmodel model: hooks by module name, captures into ``output_ptr``.

    module: a model from :func:`flexmodel.from_pretrained` (or a flexmodel.Module), run by flexmodel's
        engine (``fm.engine == "flexmodel"``); a Transformers model whose model_type flexmodel knows, run by
        flexmodel's engine on the Transformers model's own tensors (:func:`flexmodel.from_transformers`;
        ``restore()`` returns the Transformers model); or any other ``torch.nn.Module``, run by PyTorch with
        the same API on its module hooks (``fm.engine == "torch"``, :mod:`flexmodel.torch_engine`).
    engine: None (as above), "torch" (a Transformers model on PyTorch's hooks even where flexmodel knows its
        architecture) or "flexmodel" (an error saying why, instead of the torch engine).
    output_ptr: a dict; after each forward it maps every capturing hook's key (the module
        name; ``name#input`` for pre-hooks, ``name#grad_input`` / ``#grad_output`` / ``#grad``
        for gradient hooks) to a CPU tensor, or a list of tensors when the module ran
        several times in that forward. Entries of the previous forward are dropped when the next
        one starts (keep a reference to a tensor to keep it).
    """

    engine = "flexmodel"
    _tracer = None       # the open trace (flexmodel.tracing), if any
    _tree = None         # module path -> its children's names, for tracing's attribute access

    _adopted = None      # flexmodel's model around a Transformers model's tensors (from_transformers)

    def __new__(cls, module=None, *args, engine=None, **kwargs):
        if engine not in (None, "flexmodel", "torch"):
            raise ConfigError(f"engine must be None (chosen by the module), 'flexmodel' or 'torch', got {engine!r}")
        if cls is FlexModel and isinstance(module, torch.nn.Module):
            adopted = None if engine == "torch" else _adopt(module, required=engine == "flexmodel")
            if adopted is None:
                from .torch_engine import TorchFlexModel
                return object.__new__(TorchFlexModel)
            fm = object.__new__(cls)
            fm._adopted = adopted
            return fm
        return object.__new__(cls)

    def __init__(self, module, output_ptr, tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1,
                 engine=None):
        if not isinstance(output_ptr, dict):
            raise ConfigError(f"output_ptr must be a dict, got {type(output_ptr).__name__}")
        self.module = module
        self.output_ptr = output_ptr
        self.save_ctx = SaveContext()
        self.trainable_modules = torch.nn.ModuleDict()
        self.tp_size, self.pp_size, self.dp_size = tensor_parallel_size, pipeline_parallel_size, data_parallel_size
        self._hooks = {}  # engine hook key -> HookFunction
        self._stored = {}  # output_ptr entries the last forward wrote
        if engine == "torch" and type(self) is FlexModel:
            raise ConfigError("engine='torch' takes a torch.nn.Module; a flexmodel model runs on flexmodel's engine")
        engine_module = _engine_module(module if self._adopted is None else self._adopted)
        self._mesh = None
        self._parallel_module = None  # the engine's sharded model under a mesh (its TransformerLens names)
        if tensor_parallel_size * pipeline_parallel_size * data_parallel_size != 1:
            # Every rank of the job (mpirun -np tp*pp*dp) loaded the same model; each keeps its slices
            # and the engine's router brings whole activations to rank 0.
            if not isinstance(engine_module, _C.CausalLM):
                raise UnsupportedError("tensor / pipeline / data parallel FlexModel needs a causal LM from "
                                       "flexmodel.from_pretrained")
            self._mesh = _C.DeviceMesh(tensor_parallel_size, pipeline_parallel_size, data_parallel_size)
            engine_module = _C.parallelize(engine_module, self._mesh)
            self._parallel_module = engine_module
        self._engine = _C.FlexModel(engine_module)
        if self._mesh is not None:
            self._engine.set_mesh(self._mesh, engine_module)

    # --- where this process is --------------------------------------------------------
    @property
    def rank(self):
        """This process's rank in the (tp, pp, dp) mesh; 0 in one process. Captures and the whole
        logits are on rank 0."""
        return 0 if self._mesh is None else self._mesh.rank

    @property
    def tp_rank(self):
        return 0 if self._mesh is None else self._mesh.tp_rank

    @property
    def pp_rank(self):
        return 0 if self._mesh is None else self._mesh.pp_rank

    @property
    def dp_rank(self):
        return 0 if self._mesh is None else self._mesh.dp_rank

    # --- running -------------------------------------------------------------------
    def forward(self, input_ids, attention_mask=None, groups="all", complement=False):
        """Runs the model with the hooks of ``groups`` (or, with complement, all others); returns the logits.

        Under mpirun every rank calls it with the whole batch; rank 0 gets the whole logits and the
        captures in ``output_ptr`` (other ranks' output_ptr stays empty)."""
        groups = [groups] if isinstance(groups, str) else list(groups)
        self._drop_previous()
        logits, captures = self._engine.forward(input_ids, attention_mask, groups, complement)
        self._store(captures)
        return logits

    __call__ = forward

    def _store(self, captures):
        for key, tensors in captures.items():
            self.output_ptr[key] = value = tensors[0] if len(tensors) == 1 else tensors
            self._stored[key] = value

    def _drop_previous(self):
        # output_ptr holds this forward's captures: the previous forward's are let go before the model
        # runs (unless the caller replaced or kept them elsewhere), so their memory is reused instead of
        # the allocator taking fresh pages for every captured activation.
        for key, value in self._stored.items():
            if self.output_ptr.get(key) is value:
                del self.output_ptr[key]
        self._stored.clear()
        self._forget_outside_calls()

    def _forget_outside_calls(self):
        """Captures of calls outside forward (the model called directly) are not this forward's."""
        self._engine.clear()

    def take_captures(self):
        """Captures made by calls of the model outside :meth:`forward` (``model(ids)``, ``model.generate``
        with this FlexModel's hooks attached): ``{key: [tensor per call]}``, then emptied."""
        return self._engine.take_captures()

    # --- registration ----------------------------------------------------------------
    def _register(self, hook, hook_type):
        if not isinstance(hook, HookFunction):
            raise ConfigError(f"expected a flexmodel.HookFunction, got {type(hook).__name__}")
        if hook._cpp is not None:
            raise ConfigError(f"{hook!r} is already registered")
        if hook.shard_dim is not None:
            raise ConfigError(f"{hook!r}: shard_dim is for a torch.nn.Module under torch.distributed; flexmodel's "
                              "engine knows how its own models are sharded")
        fn = _engine_edit(self, hook.editing_function, f"HookFunction({hook.module_name!r})")
        cpp, handle = self._engine.register(hook.module_name, hook_type, hook.expected_shape, fn, hook.unpack_idx,
                                            hook.save, hook.save_after_edit)
        hook._cpp, hook._handle = cpp, handle
        self._hooks[cpp.key] = hook
        return handle

    def register_forward_hook(self, hook_function):
        return self._register(hook_function, "forward")

    def register_forward_pre_hook(self, hook_function):
        return self._register(hook_function, "forward_pre")

    def register_full_backward_hook(self, hook_function):
        return self._register(hook_function, "full_backward")

    def register_full_backward_pre_hook(self, hook_function):
        return self._register(hook_function, "full_backward_pre")

    def register_hook(self, hook_function):
        """A gradient hook on the parameter named ``hook_function.module_name``."""
        return self._register(hook_function, "tensor")

    # --- groups ----------------------------------------------------------------------
    def _python_hooks(self, cpp_hooks):
        out = []
        for cpp in cpp_hooks:
            hook = self._hooks.get(cpp.key)
            if hook is None:  # made by create_hook_group
                hook = HookFunction(cpp.module_name)
                hook._cpp = cpp
                self._hooks[cpp.key] = hook
            out.append(hook)
        return out

    def create_hook_group(self, group_name, group_constructor, expected_shape=None, editing_function=None,
                          unpack_idx=0, regex=False, hook_type="forward"):
        """One HookFunction per module whose name contains ``group_constructor`` (or, with regex=True,
        fully matches it), all tagged ``group_name``; returns them. Where no module name matches, the
        TransformerLens names that do (``"blocks\\.\\d+\\.hook_resid_post"``, regex=True) make the group."""
        fn = _engine_edit(self, editing_function, f"hook group {group_name!r}")
        try:
            made = self._engine.create_hook_group(group_name, group_constructor, regex, hook_type, expected_shape, fn,
                                                  unpack_idx, True)
        except NotFoundError:
            aliases = [a for a in (self._alias_names() if hook_type == "forward" else [])
                       if (re.fullmatch(group_constructor, a) if regex else group_constructor in a)]
            if not aliases:
                raise
            made = []
            for name in aliases:
                hook = HookFunction(name, expected_shape, editing_function, unpack_idx)
                self.register_forward_hook(hook)
                self._engine.update_hook_groups([hook._cpp], group_name)
                made.append(hook._cpp)
        hooks = self._python_hooks(made)
        for h in hooks:
            h.expected_shape = None if expected_shape is None else tuple(expected_shape)
            h.editing_function, h.unpack_idx = editing_function, unpack_idx
        return hooks

    def _cpp_hooks(self, hook_functions):
        if isinstance(hook_functions, HookFunction):
            hook_functions = [hook_functions]
        out = []
        for h in hook_functions:
            if not isinstance(h, HookFunction) or h._cpp is None:
                raise NotFoundError(f"{h!r} is not registered with this FlexModel")
            out.append(h._cpp)
        return out

    def update_hook_groups(self, hook_functions, group_name):
        """Tags the hooks (a HookFunction, a list of them, or a module-name substring) with ``group_name``."""
        if isinstance(hook_functions, str):
            self._engine.update_hook_groups_matching(hook_functions, group_name)
        else:
            self._engine.update_hook_groups(self._cpp_hooks(hook_functions), group_name)

    def remove_hook_groups(self, hook_functions, group_name):
        if isinstance(hook_functions, str):
            self._engine.remove_hook_groups_matching(hook_functions, group_name)
        else:
            self._engine.remove_hook_groups(self._cpp_hooks(hook_functions), group_name)

    def get_group_hook_functions(self, group_name):
        return self._python_hooks(self._engine.get_group_hook_functions(group_name))

    def get_hook_function_groups(self, hook_function):
        return set(self._engine.get_hook_function_groups(self._cpp_hooks(hook_function)[0]))

    # --- trainable modules and parameters --------------------------------------------
    def register_trainable_module(self, name, module):
        """Makes a torch.nn.Module available to editing functions as ``modules[name]``."""
        if not isinstance(module, torch.nn.Module):
            raise ConfigError(f"register_trainable_module({name!r}): expected a torch.nn.Module, "
                              f"got {type(module).__name__}")
        if self._mesh is not None:
            # One probe, not one per rank: every rank starts from rank 0's values (a collective).
            for tensor in list(module.parameters()) + list(module.buffers()):
                self._mesh.broadcast_(tensor, 0)
        self.trainable_modules[name] = module

    def get_module_parameter(self, param_name, expected_shape=None):
        """The whole parameter (a quantized weight reads as the float weight it stands for), detached."""
        return self._engine.get_module_parameter(param_name, [] if expected_shape is None else
                                                 [-1 if d is None else d for d in expected_shape])

    def wrapped_module_requires_grad(self, requires_grad):
        self._engine.wrapped_module_requires_grad(requires_grad)

    def set_capture_by_reference(self, on):
        """True (default): CPU captures the model does not change later are kept without a copy."""
        self._engine.set_capture_by_reference(on)

    @property
    def wrapped_module_names(self):
        return list(self._engine.wrapped_module_names())

    @property
    def all_modules_names(self):
        return self.wrapped_module_names + list(self.trainable_modules.keys())

    def restore(self):
        """Removes every hook; returns the model, whose outputs are then those before wrapping."""
        self._engine.restore()
        for h in self._hooks.values():
            h._cpp = h._handle = None
        self._hooks.clear()
        return self.module

    def _unregister(self, hook):
        if hook._cpp is None:
            return
        self._hooks.pop(hook._cpp.key, None)
        hook._handle.remove()
        hook._cpp = hook._handle = None

    def _generate_for_trace(self, input_ids, attention_mask=None, **kwargs):
        model = self.module if self._adopted is None else self._adopted
        if not hasattr(model, "generate"):
            raise UnsupportedError("tracing generate needs a causal LM from flexmodel.from_pretrained")
        return model.generate(input_ids, attention_mask, **kwargs)

    # --- nnsight-style tracing (flexmodel.tracing) ------------------------------------
    def trace(self, *args, **kwargs):
        """``with fm.trace(input_ids) as tracer:``: records what the body does to module proxies
        (``fm.transformer.h[0].output``), then runs ``fm(*args, **kwargs)`` once on exit."""
        from .tracing import Tracer
        return Tracer(self, args, kwargs)

    def generate(self, *args, **kwargs):
        """``with fm.generate(input_ids, max_new_tokens=n) as tracer:``: tracing over generation; the recorded
        operations apply at every step, saved proxies become per-step lists, ``tracer.output`` the sequences."""
        from .tracing import Tracer
        return Tracer(self, args, kwargs, generate=True)

    @property
    def envoy(self):
        """The wrapped model's root module for tracing (``fm.envoy.output``); attribute access on the FlexModel
        itself (``fm.model.layers[3]``) reaches the same tree where no FlexModel attribute has the name."""
        from .tracing import Envoy
        return Envoy(self, "")

    def _module_tree(self):
        if self._tree is None:
            tree = {}
            for name in self.wrapped_module_names + self._alias_names():
                parts = name.split(".") if name else []
                for i in range(len(parts)):  # an alias's parents (blocks, blocks.3, blocks.3.attn) are nodes too
                    parent, child = ".".join(parts[:i]), parts[i]
                    kids = tree.setdefault(parent, [])
                    if child not in kids:
                        kids.append(child)
            self._tree = tree
        return self._tree

    def _alias_names(self):
        """TransformerLens's hook names the model takes (``fm.blocks[3].hook_resid_post`` in a trace)."""
        if self._parallel_module is not None:  # the engine resolves them on the sharded model under a mesh
            return list(_C.sae.transformer_lens_names(self._parallel_module))
        return list(_C.sae.transformer_lens_names(_engine_module(self.module if self._adopted is None
                                                                 else self._adopted)))

    def _active_tracer(self, what):
        if self._tracer is None:
            raise ConfigError(f"{what} is only available inside `with fm.trace(...)` (or fm.generate(...))")
        return self._tracer

    def __getattr__(self, name):
        # Only reached when no attribute has the name: the wrapped model's child modules, .output, .input.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.envoy, name)
