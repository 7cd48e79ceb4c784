"""nnsight-style tracing over FlexModel's HookFunctions (both engines).

    with fm.trace(input_ids) as tracer:
        fm.transformer.h[0].mlp.output[:, -1] = 0          # in place, at that module's hook
        fm.transformer.h[1].output = fm.transformer.h[1].output * 2
        h = fm.transformer.h[3].output.save()
        tracer.stop()                                      # optional: the forward ends here
    h                                                      # after the block: the tensor itself

Attribute and index access on the FlexModel mirrors the wrapped module tree (the module names of
flexmodel's model, or the torch.nn.Module's own); ``.output`` / ``.input`` (the first positional
input, as nnsight's) give proxies. The body of the ``with`` runs first and only records what it
does to them; on exit the model runs once, each module's HookFunction applying the recorded
operations that module's values make computable, in the order they were written, and
``.save()``d proxies become their values (as in nnsight 0.8, the variable itself holds the tensor
after the block; ``proxy.value`` too). So the body cannot branch on values (``if h.norm() > 1``
raises UnsupportedError): compute on the tensors after the block, or inside an editing function.

Over flexmodel's engine ``.output`` is the module's output tensor (the first one of a tuple: the
engine's unpack_idx=0) and the model's output is the logits; over the torch engine it is the
module's own output, tuple or model-output object, as nnsight gives it.

``fm.generate(input_ids, max_new_tokens=...)`` traces generation: the recorded operations apply at
every step (edits steer every step), a saved proxy becomes the list of its value at each step, and
``tracer.output`` is the generated sequences.
"""
import ctypes
import operator
import sys

from .errors import ConfigError, EditingFunctionError, NotFoundError, UnsupportedError
from .torch_engine import _StopTrace

_IO = ("output", "input")


class _Node:
    __slots__ = ("index", "op", "args", "kwargs", "value", "done", "saved", "steps", "ever")

    def __init__(self, index, op, args=(), kwargs=None):
        self.index, self.op, self.args, self.kwargs = index, op, args, kwargs or {}
        self.value, self.done, self.saved, self.steps, self.ever = None, False, False, [], False


def _unknown(what):
    return UnsupportedError(f"{what} of a traced value: values are not known while the body of the trace runs "
                            "(it only records); use the value after the with-block, or compute in tensor operations")


class Proxy:
    """A value of the traced forward, known once the model has run (``.save()`` keeps it after the block)."""

    __slots__ = ("_tracer", "_node", "__weakref__")

    def __init__(self, tracer, node):
        object.__setattr__(self, "_tracer", tracer)
        object.__setattr__(self, "_node", node)

    # --- recording -------------------------------------------------------------------
    def save(self):
        """Keeps this value after the trace (the variable then holds the value itself)."""
        self._node.saved = True
        return self

    @property
    def value(self):
        n = self._node
        if not n.saved:
            raise NotFoundError("this traced value was not saved (.save()); only saved values outlive the trace")
        if not self._tracer._ran:
            raise NotFoundError("the value of a traced proxy is known only after the with-block")
        if self._tracer._generating:
            return n.steps
        if not n.done:
            raise NotFoundError("this traced value was never computed (its module did not run before the model "
                                "finished or tracer.stop())")
        return n.value

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._tracer._record("call", (getattr, self, name))

    def __setattr__(self, name, value):
        self._tracer._record("call", (setattr, self, name, value))

    def __call__(self, *args, **kwargs):
        return self._tracer._record("call", (_call, self) + args, kwargs)

    def __getitem__(self, key):
        return self._tracer._record("call", (operator.getitem, self, key))

    def __setitem__(self, key, value):
        self._tracer._record("call", (operator.setitem, self, key, value))

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        tracer = next(a._tracer for a in _flatten((args, kwargs or {})) if isinstance(a, Proxy))
        return tracer._record("call", (func,) + tuple(args), kwargs)

    def __bool__(self):
        raise _unknown("the truth value")

    def __iter__(self):
        raise _unknown("iterating")

    def __len__(self):
        raise _unknown("len()")

    def __index__(self):
        raise _unknown("an index")

    def __repr__(self):
        n = self._node
        return f"<flexmodel traced value #{n.index} ({'saved' if n.saved else 'not saved'})>"

    __hash__ = object.__hash__


def _call(fn, *args, **kwargs):
    return fn(*args, **kwargs)


def _binary(op, reverse=False):
    if reverse:
        return lambda self, other: self._tracer._record("call", (op, other, self))
    return lambda self, other: self._tracer._record("call", (op, self, other))


for _name, _op in [("add", operator.add), ("sub", operator.sub), ("mul", operator.mul), ("truediv", operator.truediv),
                   ("floordiv", operator.floordiv), ("mod", operator.mod), ("pow", operator.pow),
                   ("matmul", operator.matmul), ("and", operator.and_), ("or", operator.or_), ("xor", operator.xor)]:
    setattr(Proxy, f"__{_name}__", _binary(_op))
    setattr(Proxy, f"__r{_name}__", _binary(_op, reverse=True))
for _name, _op in [("lt", operator.lt), ("le", operator.le), ("gt", operator.gt), ("ge", operator.ge),
                   ("eq", operator.eq), ("ne", operator.ne)]:
    setattr(Proxy, f"__{_name}__", _binary(_op))
for _name, _op in [("neg", operator.neg), ("pos", operator.pos), ("abs", operator.abs), ("invert", operator.invert)]:
    setattr(Proxy, f"__{_name}__", (lambda op: lambda self: self._tracer._record("call", (op, self)))(_op))


def _flatten(x):
    if isinstance(x, (list, tuple)):
        for v in x:
            yield from _flatten(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from _flatten(v)
    else:
        yield x


def _resolve(x):
    """x with every Proxy replaced by its node's value (in lists, tuples, dicts, slices)."""
    if isinstance(x, Proxy):
        return x._node.value
    if isinstance(x, tuple):
        return type(x)(_resolve(v) for v in x) if not hasattr(x, "_fields") else type(x)(*(_resolve(v) for v in x))
    if isinstance(x, list):
        return [_resolve(v) for v in x]
    if isinstance(x, dict):
        return {k: _resolve(v) for k, v in x.items()}
    if isinstance(x, slice):
        return slice(_resolve(x.start), _resolve(x.stop), _resolve(x.step))
    return x


def _proxies(x):
    if isinstance(x, Proxy):
        yield x
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _proxies(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from _proxies(v)
    elif isinstance(x, slice):
        yield from _proxies((x.start, x.stop, x.step))


class Envoy:
    """A module of the wrapped model inside a trace: child modules as attributes (``[i]`` for numbered
    children), ``.output`` / ``.input`` proxies, assignable."""

    __slots__ = ("_fm", "_path")

    def __init__(self, fm, path):
        object.__setattr__(self, "_fm", fm)
        object.__setattr__(self, "_path", path)

    def _child_path(self, name):
        return f"{self._path}.{name}" if self._path else name

    def _children(self):
        return self._fm._module_tree().get(self._path, [])

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name in self._children():
            return Envoy(self._fm, self._child_path(name))
        if name in _IO:
            return self._fm._active_tracer(f"'{self._path or '<model>'}'.{name}")._read(self._path, name)
        kids = self._children()
        import difflib
        close = difflib.get_close_matches(name, kids + list(_IO), n=3, cutoff=0.0)
        raise AttributeError(f"module '{self._path or '<model>'}' has no submodule '{name}'"
                             + (f"; closest: {', '.join(close)}" if close else ""))

    def __setattr__(self, name, value):
        if name not in _IO:
            raise ConfigError(f"only .output and .input of a traced module can be assigned, not .{name}")
        self._fm._active_tracer(f"'{self._path or '<model>'}'.{name} =")._assign(self._path, name, value)

    def __getitem__(self, i):
        kids = self._children()
        if isinstance(i, int):
            numbered = [k for k in kids if k.isdigit()]
            if not numbered:
                raise NotFoundError(f"module '{self._path}' has no numbered children")
            if i < 0:
                i += len(numbered)
            name = str(i)
        else:
            name = str(i)
        if name not in kids:
            raise NotFoundError(f"module '{self._path}' has no child '{name}' (children: {', '.join(kids[:8])}"
                                f"{', ...' if len(kids) > 8 else ''})")
        return Envoy(self._fm, self._child_path(name))

    def __iter__(self):
        return (Envoy(self._fm, self._child_path(k)) for k in self._children())

    def __len__(self):
        return len(self._children())

    def __dir__(self):
        return list(self._children()) + list(_IO)

    def __repr__(self):
        return f"<flexmodel.Envoy '{self._path or '<model>'}' ({len(self._children())} children)>"


class Tracer:
    """``with fm.trace(...) as tracer`` (or ``fm.generate``): records, then runs the model on exit."""

    def __init__(self, fm, args, kwargs, generate=False):
        self._fm, self._args, self._kwargs = fm, args, kwargs
        self._nodes = []
        self._ran = False
        self._generating = generate
        self._active = set()   # (path, io) events whose hook is running now
        self._current = {}     # (path, io) -> the value there now
        self._step_started = False
        self.output = None     # the model's output (generate: the sequences) after the block
        self.stopped = False

    # --- recording ----------------------------------------------------------------------
    def _record(self, op, args=(), kwargs=None):
        if self._ran:
            raise ConfigError("this trace has already run; operations on its proxies record nothing now")
        node = _Node(len(self._nodes), op, args, kwargs)
        self._nodes.append(node)
        return Proxy(self, node)

    def _read(self, path, io):
        return self._record("read", (path, io))

    def _assign(self, path, io, value):
        self._record("assign", (path, io, value))

    def stop(self):
        """Ends the forward once everything written before this call has been computed."""
        self._record("stop")

    @property
    def model_output(self):
        return self.output

    # --- running --------------------------------------------------------------------------
    def _ready(self, node):
        if node.op == "read":
            return node.args in self._active
        if node.op == "assign":
            return node.args[:2] in self._active and all(p._node.done for p in _proxies(node.args[2]))
        if node.op == "stop":
            return all(n.done for n in self._nodes[:node.index])
        return all(p._node.done for p in _proxies((node.args, node.kwargs)))

    def _evaluate(self, node):
        if node.op == "read":
            node.value = self._current[node.args]
        elif node.op == "assign":
            self._current[node.args[:2]] = _resolve(node.args[2])
        elif node.op == "stop":
            node.done = node.ever = True
            raise _StopTrace()
        else:
            fn, *args = node.args
            node.value = _resolve(fn)(*_resolve(args), **_resolve(node.kwargs))
        node.done = node.ever = True

    def _run_ready(self):
        for node in self._nodes:
            if not node.done and self._ready(node):
                self._evaluate(node)

    def _new_step(self):
        for node in self._nodes:
            if node.saved and node.done:
                node.steps.append(node.value)
            node.done, node.value = False, None

    def _event(self, path, io, value):
        key = (path, io)
        if self._generating and any(n.done for n in self._nodes if n.op in ("read", "assign") and n.args[:2] == key):
            self._new_step()  # this module runs again: the next generation step began
        self._current[key] = value
        self._active.add(key)
        try:
            self._run_ready()
        finally:
            self._active.discard(key)
        return self._current.pop(key)

    def _run(self):
        from .flex_model import HookFunction
        fm = self._fm
        torch_engine = fm.engine == "torch"
        events = sorted({n.args[:2] for n in self._nodes if n.op in ("read", "assign") and n.args[0]})
        hooks = []
        try:
            for path, io in events:
                def fn(module, x, save_ctx, modules, key=(path, io)):
                    return self._event(key[0], key[1], x)
                h = HookFunction(path, editing_function=fn, save=False, unpack_idx=None if torch_engine else 0)
                (fm.register_forward_hook if io == "output" else fm.register_forward_pre_hook)(h)
                hooks.append(h)
            for n in self._nodes:
                if n.op in ("read", "assign") and n.args[:2] == ("", "input"):
                    raise UnsupportedError("the model's own .input: use the inputs given to trace()")
            try:
                if self._generating:
                    out = fm._generate_for_trace(*self._args, **self._kwargs)
                else:
                    out = fm.forward(*self._args, **self._kwargs)
            except _StopTrace:
                self.stopped = True
                out = None
            except EditingFunctionError as e:
                if not isinstance(e.__cause__, _StopTrace):
                    raise
                self.stopped = True
                out = None
            if out is not None:
                out = self._event("", "output", out)
            self.output = out
            if self._generating:
                self._new_step()
        finally:
            for h in hooks:
                fm._unregister(h)
            self._ran = True
        unfinished = [n for n in self._nodes if n.op in ("assign", "read") and not n.ever]
        if unfinished and not self.stopped:
            path, io = unfinished[0].args[:2]
            raise NotFoundError(f"traced '{path or '<model>'}'.{io} was never computed: the module did not run, or "
                                "an edit used a value of a module that runs after it")

    def __enter__(self):
        if self._fm._tracer is not None:
            raise ConfigError("a trace of this FlexModel is already open")
        self._fm._tracer = self
        return self

    def __exit__(self, exc_type, exc, tb):
        self._fm._tracer = None
        if exc_type is not None:
            self._ran = True
            return False
        self._run()
        self._bind_saved(sys._getframe(1))
        return False

    def _bind_saved(self, frame):
        """As nnsight 0.8: after the block the caller's variables that held saved proxies hold their values."""
        def value_of(v):
            if isinstance(v, Proxy) and v._tracer is self and v._node.saved:
                try:
                    return True, v.value
                except NotFoundError:
                    pass
            return False, v

        changed = False
        local = frame.f_locals
        for name, v in list(local.items()):
            hit, new = value_of(v)
            if hit:
                local[name] = new
                changed = True
            elif isinstance(v, dict):      # saved proxies kept in a dict or list of the caller's (one level)
                for k, x in list(v.items()):
                    hit, new = value_of(x)
                    if hit:
                        v[k] = new
            elif isinstance(v, list):
                for i, x in enumerate(v):
                    hit, new = value_of(x)
                    if hit:
                        v[i] = new
        # In a function (CO_NEWLOCALS) before Python 3.13 f_locals is a snapshot: write it back to the frame
        # (3.13's f_locals writes through, PEP 667).
        if changed and frame.f_code.co_flags & 0x2 and local is not frame.f_globals and sys.version_info < (3, 13):
            ctypes.pythonapi.PyFrame_LocalsToFast(ctypes.py_object(frame), ctypes.c_int(0))
