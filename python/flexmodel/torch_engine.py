"""The "torch" engine: FlexModel's API over any ``torch.nn.Module``, on PyTorch's own module hooks.

``flexmodel.FlexModel(module, output_ptr)`` with a plain ``torch.nn.Module`` (a Transformers model,
a vision model, a research model flexmodel has no architecture for) returns a :class:`TorchFlexModel`:
the same HookFunctions (expected shapes, editing functions, unpack_idx, save / save_after_edit),
pre-hooks (``name#input``), gradient hooks (``#grad_input``, ``#grad_output``, ``#grad``), hook
groups, save_ctx, trainable modules and restore(), with the same keys and typed errors as
flexmodel's engine, but the forward runs in PyTorch (``fm.engine == "torch"``).

Under ``torch.distributed`` (any backend; gloo on CPU) with ``tensor_parallel_size`` x
``data_parallel_size`` == the world size, every rank runs the same script on its own piece:
ranks ``r`` with the same ``r // tensor_parallel_size`` form a data-parallel replica (each its own
rows of the batch), ranks with the same ``r % tensor_parallel_size`` a data-parallel group. At a
hook the activation is gathered first over the tensor-parallel group along the module's sharded
dim (``HookFunction(..., shard_dim=d)``, or, as Vector Institute's FlexModel does, the one dim in
which the local shape differs from ``expected_shape``), then over the data-parallel group along
dim 0 (the batch); the editing function runs on every rank on that whole activation, rank 0 keeps
the capture, and each rank goes on with its own piece of the edited activation.

What it lacks next to flexmodel's engine: no pipeline parallelism, gathered activations carry no
gradient back to the local piece (gradient hooks are refused under a mesh), captures are always
copies, and the model's own sharding is the user's (flexmodel shards its models itself).
"""
import difflib
import re

import torch

from .errors import ConfigError, EditingFunctionError, NotFoundError, ShapeError, UnsupportedError
from .flex_model import FlexModel, HookFunction, SaveContext

_TYPE_NAMES = {"forward": "forward", "forward_pre": "forward-pre", "full_backward": "full-backward",
               "full_backward_pre": "full-backward-pre", "tensor": "tensor"}
_KEY_SUFFIX = {"forward": "", "forward_pre": "#input", "full_backward": "#grad_input",
               "full_backward_pre": "#grad_output", "tensor": "#grad"}


def _shape_text(shape):
    return "[" + ", ".join("*" if d is None or d == -1 else str(int(d)) for d in shape) + "]"


def _closest(name, names, limit=5):
    """Up to ``limit`` names closest to ``name`` (by similarity), for NotFoundError messages."""
    names = [n for n in names if n]
    return difflib.get_close_matches(name, names, n=limit, cutoff=0.0)


def _not_found(what, name, names, where):
    close = _closest(name, names)
    msg = f"no {what} named '{name}' in {where}"
    if close:
        msg += "; closest: " + ", ".join(f"'{c}'" for c in close)
    return NotFoundError(msg)


# --- tensor leaves of a module's value (depth first, as flexmodel's engine counts them) ------------
def _leaves(value, out):
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            _leaves(v, out)
    elif isinstance(value, (tuple, list)):
        for v in value:
            _leaves(v, out)
    return out


def _replace_leaf(value, idx, new):
    """``value`` with its ``idx``-th tensor leaf replaced by ``new``: (new value, leaves consumed)."""
    counter = [0]

    def walk(v):
        if isinstance(v, torch.Tensor):
            i = counter[0]
            counter[0] += 1
            return new if i == idx else v
        if isinstance(v, dict):
            items = {k: walk(x) for k, x in v.items()}
            try:
                out = type(v)(**items) if hasattr(v, "to_tuple") else type(v)(items)
            except TypeError:
                out = dict(items)
            return out
        if isinstance(v, tuple):
            items = [walk(x) for x in v]
            return type(v)(*items) if hasattr(v, "_fields") else type(v)(items)
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v
    return walk(value)


class _Entry:
    """One registered HookFunction in the torch engine (what the C++ engine's HookFunction is to the other)."""

    def __init__(self, hook, hook_type):
        self.hook = hook
        self.hook_type = _TYPE_NAMES[hook_type]
        self.type = hook_type
        self.module_name = hook.module_name
        self.key_name = hook.module_name + _KEY_SUFFIX[hook_type]
        self.groups = {"all"}
        self.enabled = True
        self.handles = []

    @property
    def key(self):
        return id(self)

    def describe(self):
        return f"{self.hook_type} hook on '{self.module_name}'"


class _Handle:
    """What register_* returns: ``remove()`` takes the hook off the module."""

    def __init__(self, fm, entry):
        self._fm, self._entry = fm, entry

    def remove(self):
        self._fm._detach(self._entry)


class _Mesh:
    """tensor x data parallel groups over torch.distributed's world (tp ranks adjacent)."""

    def __init__(self, tp, dp):
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_initialized():
            raise ConfigError(f"tensor_parallel_size={tp}, data_parallel_size={dp} with a torch.nn.Module needs "
                              "torch.distributed initialised first (torch.distributed.init_process_group, e.g. "
                              "backend='gloo' on CPU), one process per rank")
        world = dist.get_world_size()
        if tp * dp != world:
            raise ConfigError(f"tensor_parallel_size={tp} x data_parallel_size={dp} = {tp * dp} but torch.distributed "
                              f"has {world} ranks")
        self.dist = dist
        self.rank = dist.get_rank()
        self.tp_size, self.dp_size = tp, dp
        self.tp_rank, self.dp_rank = self.rank % tp, self.rank // tp
        self.tp_group = self.dp_group = None
        for d in range(dp):  # every rank takes part in creating every group
            g = dist.new_group([d * tp + t for t in range(tp)])
            if d == self.dp_rank:
                self.tp_group = g
        for t in range(tp):
            g = dist.new_group([d * tp + t for d in range(dp)])
            if t == self.tp_rank:
                self.dp_group = g

    def describe(self):
        return f"torch.distributed mesh tp={self.tp_size} x dp={self.dp_size} (rank {self.rank})"

    def gather(self, t, dim, group, size):
        """The pieces of every rank of ``group`` concatenated along ``dim`` (pieces may differ in size);
        returns (whole, this rank's offset along dim)."""
        if size == 1:
            return t, 0
        dist = self.dist
        t = t.detach().contiguous()
        n = torch.tensor([t.shape[dim]], dtype=torch.long)
        sizes = [torch.zeros_like(n) for _ in range(size)]
        dist.all_gather(sizes, n, group=group)
        sizes = [int(s) for s in sizes]
        biggest = max(sizes)
        if t.shape[dim] < biggest:
            pad = list(t.shape)
            pad[dim] = biggest - t.shape[dim]
            t = torch.cat([t, t.new_zeros(pad)], dim)
        pieces = [torch.empty_like(t) for _ in range(size)]
        dist.all_gather(pieces, t, group=group)
        me = dist.get_rank(group)
        whole = torch.cat([p.narrow(dim, 0, s) for p, s in zip(pieces, sizes)], dim)
        return whole, sum(sizes[:me])


class TorchFlexModel(FlexModel):
    """FlexModel over a ``torch.nn.Module`` (``fm.engine == "torch"``); made by ``flexmodel.FlexModel``."""

    engine = "torch"

    def __init__(self, module, output_ptr, tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1,
                 engine=None):
        if not isinstance(output_ptr, dict):
            raise ConfigError(f"output_ptr must be a dict, got {type(output_ptr).__name__}")
        if not isinstance(module, torch.nn.Module):
            raise ConfigError(f"expected a torch.nn.Module, got {type(module).__module__}.{type(module).__name__}")
        if pipeline_parallel_size != 1:
            raise UnsupportedError(f"pipeline_parallel_size={pipeline_parallel_size}: the torch engine has no pipeline "
                                   "parallelism (load the model with flexmodel.from_pretrained for it)")
        self.module = module
        self.output_ptr = output_ptr
        self.save_ctx = SaveContext()
        self.trainable_modules = torch.nn.ModuleDict()
        self.tp_size, self.pp_size, self.dp_size = tensor_parallel_size, 1, data_parallel_size
        self._mesh = _Mesh(tensor_parallel_size, data_parallel_size) \
            if tensor_parallel_size * data_parallel_size != 1 else None
        self._entries = []    # registration order
        self._hooks = {}      # entry key -> HookFunction
        self._known_groups = {"all"}
        self._pending = {}    # key -> [tensor per call], captures not stored yet
        self._stored = {}
        self._extra_handles = []

    # --- where this process is ------------------------------------------------------
    @property
    def rank(self):
        return 0 if self._mesh is None else self._mesh.rank

    @property
    def tp_rank(self):
        return 0 if self._mesh is None else self._mesh.tp_rank

    @property
    def pp_rank(self):
        return 0

    @property
    def dp_rank(self):
        return 0 if self._mesh is None else self._mesh.dp_rank

    # --- running ----------------------------------------------------------------------
    def forward(self, *args, groups="all", complement=False, **kwargs):
        """Runs the module (``module(*args, **kwargs)``) with the hooks of ``groups`` (or, with complement,
        all others) and returns its output; ``output_ptr`` then holds this forward's captures."""
        groups = [groups] if isinstance(groups, str) else list(groups)
        for g in groups:
            if g not in self._known_groups:
                raise NotFoundError(f"no hook group named '{g}'; groups: {', '.join(sorted(self._known_groups))}")
        for e in self._entries:
            inside = bool(e.groups.intersection(groups))
            e.enabled = not inside if complement else inside
        self._drop_previous()
        # As flexmodel's engine: the choice stays until the next forward (the module called directly, or a
        # backward, runs the hooks this forward ran).
        out = self.module(*args, **kwargs)
        self._store(self.take_captures())
        return out

    __call__ = forward

    def _forget_outside_calls(self):
        self._pending = {}

    def take_captures(self):
        """Captures made by calls of the module outside :meth:`forward`: ``{key: [tensor per call]}``, then emptied."""
        out, self._pending = self._pending, {}
        return out

    # --- one hook's work --------------------------------------------------------------
    def _check_shape(self, entry, t):
        exp = entry.hook.expected_shape
        if exp is None:
            return
        ok = len(exp) == t.dim() and all(d is None or d == -1 or d == s for d, s in zip(exp, t.shape))
        if not ok:
            raise ShapeError(f"{entry.describe()}: activation has shape {_shape_text(t.shape)}, expected "
                             f"{_shape_text(exp)}")

    def _shard_dim(self, entry, local):
        """The tensor-parallel sharded dim of ``local`` (None: the same on every tp rank). Inferred, it is never
        dim 0: expected_shape gives the whole batch there, of which each data-parallel rank holds a piece."""
        hook = entry.hook
        if hook.shard_dim is not None:
            return hook.shard_dim % local.dim()
        exp = hook.expected_shape
        if exp is None or len(exp) != local.dim():
            return None
        differ = [i for i, (d, s) in enumerate(zip(exp, local.shape)) if d is not None and d != -1 and d != s
                  and i != 0]
        if len(differ) > 1:
            raise ShapeError(f"{entry.describe()}: local activation {_shape_text(local.shape)} differs from the "
                             f"expected {_shape_text(exp)} in dims {differ}; only one dim can be sharded")
        return differ[0] if differ else None

    def _capture(self, entry, t):
        if self.rank != 0:
            return
        self._pending.setdefault(entry.key_name, []).append(t.detach().to("cpu", copy=True))

    def _process(self, entry, module, local):
        """Capture and edit one activation; returns the tensor the module goes on with."""
        hook = entry.hook
        whole, pieces = local, []
        if self._mesh is not None and entry.type in ("forward", "forward_pre") and isinstance(local, torch.Tensor):
            m = self._mesh
            dim = self._shard_dim(entry, local)
            if dim is not None and m.tp_size > 1:
                full, off = m.gather(whole, dim, m.tp_group, m.tp_size)
                pieces.append((dim, off, whole.shape[dim]))
                whole = full
            if m.dp_size > 1:
                if whole.dim() == 0:
                    raise ShapeError(f"{entry.describe()}: a data-parallel activation needs a batch dim, got a scalar")
                full, off = m.gather(whole, 0, m.dp_group, m.dp_size)
                pieces.append((0, off, whole.shape[0]))
                whole = full
        if isinstance(whole, torch.Tensor):
            self._check_shape(entry, whole)
        fn = hook.editing_function
        if hook.save and (not hook.save_after_edit or fn is None):
            self._capture(entry, whole)
        if fn is None:
            return local
        try:
            edited = fn(module, whole, self.save_ctx, self.trainable_modules)
        except Exception as exc:  # noqa: BLE001 - any error of the user's function, typed, with it as the cause
            if isinstance(exc, _PASS_THROUGH):
                raise
            raise EditingFunctionError(f"{entry.describe()}: editing function raised {type(exc).__name__}: "
                                       f"{exc}") from exc
        if hook.unpack_idx is None and not isinstance(whole, torch.Tensor):
            return edited  # tracing's hook on a whole tuple / model-output value
        if not isinstance(edited, torch.Tensor):
            raise EditingFunctionError(f"{entry.describe()}: editing function returned a "
                                       f"{type(edited).__name__}, not a torch.Tensor")
        if edited.shape != whole.shape:
            raise ShapeError(f"{entry.describe()}: editing function returned shape {_shape_text(edited.shape)} but "
                             f"the activation has shape {_shape_text(whole.shape)}")
        if hook.save and hook.save_after_edit:
            self._capture(entry, edited)
        for dim, off, size in reversed(pieces):
            edited = edited.narrow(dim, off, size)
        return edited

    def _process_value(self, entry, module, value):
        if entry.hook.unpack_idx is None:  # the whole value (tracing)
            return self._process(entry, module, value)
        leaves = _leaves(value, [])
        if not leaves:
            return value
        idx = entry.hook.unpack_idx
        if idx >= len(leaves):
            raise NotFoundError(f"{entry.describe()}: unpack_idx {idx} but the value holds only {len(leaves)} "
                                "tensors")
        new = self._process(entry, module, leaves[idx])
        if new is leaves[idx]:
            return value
        if isinstance(value, torch.Tensor):
            return new
        return _replace_leaf(value, idx, new)

    # --- registration -----------------------------------------------------------------
    def _module(self, name):
        try:
            return self.module.get_submodule(name)
        except AttributeError:
            raise _not_found("module", name, [n for n, _ in self.module.named_modules()],
                             type(self.module).__name__) from None

    def _parameter(self, name):
        params = dict(self.module.named_parameters())
        if name not in params:
            raise _not_found("parameter", name, list(params), type(self.module).__name__)
        return params[name]

    def _attach(self, entry):
        hook_type = entry.type
        if self._mesh is not None and hook_type in ("full_backward", "full_backward_pre", "tensor"):
            raise UnsupportedError(f"{entry.describe()} under {self._mesh.describe()}: gradient hooks are not "
                                   "supported over a torch.distributed mesh by the torch engine")
        if hook_type == "tensor":
            param = self._parameter(entry.module_name)
            if not param.requires_grad:
                raise ConfigError(f"{entry.describe()}: the tensor does not require grad, so it never gets a gradient")
            owner = self._module(entry.module_name.rpartition(".")[0])

            def grad_hook(grad):
                if not entry.enabled:
                    return None
                new = self._process(entry, owner, grad)
                return None if new is grad else new
            entry.handles.append(param.register_hook(grad_hook))
            return
        mod = self._module(entry.module_name)
        if hook_type == "forward":
            def fwd(m, args, output):
                if not entry.enabled:
                    return None
                new = self._process_value(entry, m, output)
                return None if new is output else new
            entry.handles.append(mod.register_forward_hook(fwd))
        elif hook_type == "forward_pre":
            if entry.hook.unpack_idx is None:  # tracing: the first input, positional or keyword
                def pre(m, args, kwargs):
                    if not entry.enabled:
                        return None
                    if args:
                        new = self._process(entry, m, args[0])
                        return None if new is args[0] else ((new,) + tuple(args[1:]), kwargs)
                    if kwargs:
                        k = next(iter(kwargs))
                        new = self._process(entry, m, kwargs[k])
                        return None if new is kwargs[k] else (args, {**kwargs, k: new})
                    return None
                entry.handles.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
            else:
                def pre(m, args):
                    if not entry.enabled:
                        return None
                    value = tuple(args)
                    new = self._process_value(entry, m, value)
                    return None if new is value else new
                entry.handles.append(mod.register_forward_pre_hook(pre))
        elif hook_type == "full_backward":
            def bwd(m, grad_input, grad_output):
                if not entry.enabled:
                    return None
                new = self._process_value(entry, m, tuple(grad_input))
                return None if all(a is b for a, b in zip(new, grad_input)) else new
            entry.handles.append(mod.register_full_backward_hook(bwd))
        elif hook_type == "full_backward_pre":
            def bwd_pre(m, grad_output):
                if not entry.enabled:
                    return None
                new = self._process_value(entry, m, tuple(grad_output))
                return None if all(a is b for a, b in zip(new, grad_output)) else new
            entry.handles.append(mod.register_full_backward_pre_hook(bwd_pre))
        else:
            raise ConfigError(f"unknown hook type '{hook_type}' (forward, forward_pre, full_backward, "
                              "full_backward_pre, tensor)")

    def _register(self, hook, hook_type, groups=()):
        if not isinstance(hook, HookFunction):
            raise ConfigError(f"expected a flexmodel.HookFunction, got {type(hook).__name__}")
        if hook._cpp is not None:
            raise ConfigError(f"{hook!r} is already registered")
        fn = hook.editing_function
        if fn is not None and type(fn).__module__ == "flexmodel._C":
            raise UnsupportedError(f"HookFunction({hook.module_name!r}): flexmodel.edits' built-in edits run in "
                                   "flexmodel's engine; with a torch.nn.Module give a Python editing function")
        if fn is not None and not callable(fn):
            raise ConfigError(f"HookFunction({hook.module_name!r}): editing_function must be callable, got "
                              f"{type(fn).__name__}")
        entry = _Entry(hook, hook_type)
        entry.groups.update(groups)
        self._attach(entry)
        hook._cpp, hook._handle = entry, _Handle(self, entry)
        self._entries.append(entry)
        self._hooks[entry.key] = hook
        return hook._handle

    def _detach(self, entry):
        for h in entry.handles:
            h.remove()
        entry.handles.clear()
        if entry in self._entries:
            self._entries.remove(entry)
        hook = self._hooks.pop(entry.key, None)
        if hook is not None:
            hook._cpp = hook._handle = None

    # --- groups -------------------------------------------------------------------------
    def create_hook_group(self, group_name, group_constructor, expected_shape=None, editing_function=None,
                          unpack_idx=0, regex=False, hook_type="forward"):
        """One HookFunction per module whose name contains ``group_constructor`` (or, with regex=True,
        fully matches it), all tagged ``group_name``; returns them."""
        if hook_type not in _TYPE_NAMES:
            raise ConfigError(f"unknown hook type '{hook_type}' (forward, forward_pre, full_backward, "
                              "full_backward_pre, tensor)")
        if hook_type == "tensor":
            names = [n for n, p in self.module.named_parameters() if p.requires_grad]
        else:
            names = [n for n, _ in self.module.named_modules() if n]
        if regex:
            pattern = re.compile(group_constructor)
            chosen = [n for n in names if pattern.fullmatch(n)]
            what = "the regular expression"
        else:
            chosen = [n for n in names if group_constructor in n]
            what = f"substring '{group_constructor}'"
        if not chosen:
            raise NotFoundError(f"hook group '{group_name}': no {'parameter' if hook_type == 'tensor' else 'module'} "
                                f"name matches {what}")
        made = []
        for n in chosen:
            h = HookFunction(n, expected_shape=expected_shape, editing_function=editing_function, unpack_idx=unpack_idx)
            self._register(h, hook_type, groups=(group_name,))
            made.append(h)
        self._known_groups.add(group_name)
        return made

    def _entries_of(self, hook_functions):
        if isinstance(hook_functions, HookFunction):
            hook_functions = [hook_functions]
        out = []
        for h in hook_functions:
            if not isinstance(h, HookFunction) or h._cpp is None or h._cpp.key not in self._hooks:
                raise NotFoundError(f"{h!r} is not registered with this FlexModel")
            out.append(h._cpp)
        return out

    def update_hook_groups(self, hook_functions, group_name):
        """Tags the hooks (a HookFunction, a list of them, or a module-name substring) with ``group_name``."""
        if isinstance(hook_functions, str):
            for e in self._entries:
                if hook_functions in e.module_name:
                    e.groups.add(group_name)
        else:
            for e in self._entries_of(hook_functions):
                e.groups.add(group_name)
        self._known_groups.add(group_name)

    def remove_hook_groups(self, hook_functions, group_name):
        if group_name == "all":
            raise ConfigError("every hook is in group 'all'; it cannot be removed from it")
        if isinstance(hook_functions, str):
            for e in self._entries:
                if hook_functions in e.module_name:
                    e.groups.discard(group_name)
        else:
            for e in self._entries_of(hook_functions):
                e.groups.discard(group_name)

    def get_group_hook_functions(self, group_name):
        if group_name not in self._known_groups:
            raise NotFoundError(f"no hook group named '{group_name}'; groups: {', '.join(sorted(self._known_groups))}")
        return [e.hook for e in self._entries if group_name in e.groups]

    def get_hook_function_groups(self, hook_function):
        return set(self._entries_of(hook_function)[0].groups)

    # --- trainable modules and parameters --------------------------------------------
    def register_trainable_module(self, name, module):
        """Makes a torch.nn.Module available to editing functions as ``modules[name]`` (under a mesh every
        rank starts from rank 0's values)."""
        if not isinstance(module, torch.nn.Module):
            raise ConfigError(f"register_trainable_module({name!r}): expected a torch.nn.Module, "
                              f"got {type(module).__name__}")
        if self._mesh is not None:
            with torch.no_grad():
                for t in list(module.parameters()) + list(module.buffers()):
                    self._mesh.dist.broadcast(t.data, 0)
        self.trainable_modules[name] = module

    def get_module_parameter(self, param_name, expected_shape=None):
        """The parameter (or buffer) named ``param_name``, detached (this rank's piece under a mesh)."""
        tensors = dict(self.module.named_parameters())
        tensors.update(self.module.named_buffers())
        if param_name not in tensors:
            raise _not_found("parameter", param_name, list(tensors), type(self.module).__name__)
        t = tensors[param_name].detach()
        if expected_shape is not None:
            exp = tuple(expected_shape)
            if len(exp) != t.dim() or any(d is not None and d != -1 and d != s for d, s in zip(exp, t.shape)):
                raise ShapeError(f"parameter '{param_name}' has shape {_shape_text(t.shape)}, expected "
                                 f"{_shape_text(exp)}")
        return t

    def wrapped_module_requires_grad(self, requires_grad):
        self.module.requires_grad_(requires_grad)

    def set_capture_by_reference(self, on):
        """Accepted for flexmodel's API; the torch engine always copies captures."""

    def _alias_names(self):
        return []  # TransformerLens's names are flexmodel's engine's (its models' places), not PyTorch's

    @property
    def wrapped_module_names(self):
        return [n for n, _ in self.module.named_modules()]

    @property
    def all_modules_names(self):
        return self.wrapped_module_names + list(self.trainable_modules.keys())

    def _unregister(self, hook):
        if hook._cpp is not None:
            self._detach(hook._cpp)

    def _generate_for_trace(self, *args, **kwargs):
        if not hasattr(self.module, "generate"):
            raise UnsupportedError(f"{type(self.module).__name__} has no generate() (a Transformers model has)")
        return self.module.generate(*args, **kwargs)

    def restore(self):
        """Removes every hook; returns the module, untouched."""
        for e in list(self._entries):
            self._detach(e)
        for h in self._extra_handles:
            h.remove()
        self._extra_handles.clear()
        return self.module


class _StopTrace(Exception):
    """tracer.stop(): ends the forward early (caught by the trace)."""


_PASS_THROUGH = (_StopTrace,)
