"""The tools the bench compares, each behind the same small interface.

A tool loads its own copy of the checkpoint (nnsight, TransformerLens and
Vector's FlexModel change the model they wrap: hooks, envoys, forced eager
attention) and offers, for each task, zero or more Cases. A Case is
setup / run / teardown: only run is timed, so registering hooks is not counted
and every timed call sees exactly its own hooks (flexmodel's and PyTorch's
hooks stay attached to the model, and would otherwise run in every case).

run(ids) returns what the correctness checks compare:
  forward, edit12      logits [B, T, vocab]
  capture12            {block name: block output}, names as in Transformers
  capture_all          {module name: output} (only the count is reported)
  generate             token ids [B, T + new]

Every forward runs under torch.no_grad(), for all tools alike: flexmodel
refuses inference tensors ("Inference tensors do not track version counter"),
so torch.inference_mode() is not an option for it.
"""
import pathlib
import tempfile

import torch

from checkpoints import block_names

STEER_BLOCK = 6  # generate: the steering vector is added to this block's output
HF_ATTENTION = "sdpa"  # Transformers' default; eager measured no faster on this machine (see README)


class Case:
    def __init__(self, tool, variant, run, setup=None, teardown=None):
        self.tool, self.variant = tool, variant
        self.label = tool if not variant else f"{tool} ({variant})"
        self._run, self._setup, self._teardown = run, setup, teardown

    def setup(self):
        if self._setup:
            self._setup()

    def run(self, ids):
        with torch.no_grad():
            return self._run(ids)

    def teardown(self):
        if self._teardown:
            self._teardown()


def first_tensor(value):
    """The activation in a module's output (a tensor, or the first tensor of a tuple / ModelOutput)."""
    if isinstance(value, torch.Tensor):
        return value
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else ()
    for v in items:
        t = first_tensor(v)
        if t is not None:
            return t
    return None


def add_to_output(output, vec):
    """A block's output + vec, keeping the output's container (tensor or tuple)."""
    if isinstance(output, tuple):
        return (output[0] + vec,) + output[1:]
    return output + vec


def load_hf(folder, attn=HF_ATTENTION):
    """A Transformers model in eval mode with its weights in process memory.

    save_pretrained's safetensors come back as views of the mapped file; mapped
    pages read slower here, so every tool (flexmodel: mmap=False) gets weights
    in anonymous memory, as bench_decode does.
    """
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation=attn)
    for p in list(model.parameters()) + list(model.buffers()):
        p.data = p.data.clone()  # tied weights are one Parameter: they stay tied
    return model.eval()


def generate_kwargs(new_tokens):
    # Exactly new_tokens greedy tokens: the random model may well emit its eos.
    return dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                eos_token_id=None)


class Tool:
    """Base: a name, and cases(task) -> [Case] (none: the tool has no such API)."""
    name = "?"
    install_hint = "bash scripts/install-deps.sh --bench"

    def __init__(self, kind, folder, vec, new_tokens):
        self.kind, self.folder, self.vec, self.new_tokens = kind, pathlib.Path(folder), vec, new_tokens
        self.blocks = block_names(kind)

    def cases(self, task):
        make = getattr(self, "case_" + task, None)
        return make() if make else []

    def _hooked(self, variant, run, register):
        """A Case whose setup calls register() -> list of removable handles."""
        handles = []

        def teardown():
            for h in handles:
                h.remove()
            handles.clear()
        return Case(self.name, variant, run, setup=lambda: handles.extend(register()), teardown=teardown)


# --- Transformers ------------------------------------------------------------------------
class Transformers(Tool):
    name = "Transformers"

    def __init__(self, *a):
        super().__init__(*a)
        self.model = load_hf(self.folder)
        self.store = {}

    def _logits(self, ids):
        return self.model(input_ids=ids, use_cache=False).logits

    def _capture(self, ids):
        self.store.clear()
        self._logits(ids)
        return dict(self.store)

    def _register_capture(self, names):
        def hook(name):
            return lambda module, args, output: self.store.__setitem__(name, output)
        return [self.model.get_submodule(n).register_forward_hook(hook(n)) for n in names]

    def _register_edit(self, names):
        return [self.model.get_submodule(n).register_forward_hook(lambda m, a, out: add_to_output(out, self.vec))
                for n in names]

    def case_forward(self):
        return [Case(self.name, f"{HF_ATTENTION}, plain", self._logits)]

    def case_capture12(self):
        return [self._hooked("forward hooks", self._capture, lambda: self._register_capture(self.blocks))]

    def case_capture_all(self):
        names = [n for n, _ in self.model.named_modules() if n]
        return [self._hooked("forward hooks", self._capture, lambda: self._register_capture(names))]

    def case_edit12(self):
        return [self._hooked("forward hooks", self._logits, lambda: self._register_edit(self.blocks))]

    def case_generate(self):
        kw = generate_kwargs(self.new_tokens)
        return [self._hooked("forward hook", lambda ids: self.model.generate(ids, **kw),
                             lambda: self._register_edit([self.blocks[STEER_BLOCK]]))]


# --- nnsight -------------------------------------------------------------------------------
class NNsight(Tool):
    """nnsight 0.8's TransformersModel (LanguageModel is its deprecated alias) around its own HF model.

    Interventions must request modules in the order the model runs them, so
    "every module" saves them in the order a plain forward's hooks fire.
    """
    name = "nnsight"

    def __init__(self, *a):
        super().__init__(*a)
        import transformers
        from nnsight.modeling.transformers import TransformersModel
        hf = load_hf(self.folder)
        self.order = _execution_order(hf)
        tok = transformers.AutoTokenizer.from_pretrained(self.folder)
        self.lm = TransformersModel(hf, task="text-generation", tokenizer=tok)
        self.block_envoys = [self.lm.get(n) for n in self.blocks]
        self.all_envoys = [self.lm.get(n) for n in self.order]

    def _forward(self, ids):
        with self.lm.trace(ids, use_cache=False):
            logits = self.lm.output.logits.save()
        return logits

    def _save(self, names, envoys, ids):
        saved = []
        with self.lm.trace(ids, use_cache=False):
            for e in envoys:
                saved.append(e.output.save())
        return dict(zip(names, saved))

    def _cache_all(self, ids):
        with self.lm.trace(ids, use_cache=False) as tracer:
            cache = tracer.cache()
        # Paths are the envoys' ("model.transformer.h.0"); the root itself is "model".
        return {k[len("model."):]: cache[k].output for k in cache.keys() if k.startswith("model.")}

    def _edit(self, ids):
        with self.lm.trace(ids, use_cache=False):
            for e in self.block_envoys:
                e.output = add_to_output(e.output, self.vec)
            logits = self.lm.output.logits.save()
        return logits

    def _generate(self, ids):
        steer = self.block_envoys[STEER_BLOCK]
        with self.lm.generate(ids, **generate_kwargs(self.new_tokens)) as tracer:
            # A bounded loop: code after an unbounded tracer.all() is never reached.
            for _ in tracer.iter[:self.new_tokens]:
                steer.output = add_to_output(steer.output, self.vec)
            tokens = tracer.result.save()
        return tokens

    def case_forward(self):
        return [Case(self.name, "trace, logits saved", self._forward)]

    def case_capture12(self):
        return [Case(self.name, ".save()", lambda ids: self._save(self.blocks, self.block_envoys, ids))]

    def case_capture_all(self):
        return [Case(self.name, ".save()", lambda ids: self._save(self.order, self.all_envoys, ids)),
                Case(self.name, "tracer.cache()", self._cache_all)]

    def case_edit12(self):
        return [Case(self.name, "in-trace edit", self._edit)]

    def case_generate(self):
        return [Case(self.name, "generate + edit", self._generate)]


def _execution_order(model):
    """Module names in the order their forward hooks fire (each module that runs, once)."""
    order = []
    handles = [m.register_forward_hook(lambda mod, a, o, n=n: order.append(n))
               for n, m in model.named_modules() if n]
    try:
        with torch.no_grad():
            model(input_ids=torch.ones(1, 4, dtype=torch.long), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return list(dict.fromkeys(order))


# --- TransformerLens -----------------------------------------------------------------------
class TransformerLens(Tool):
    """TransformerLens 4's TransformerBridge: HookedTransformer was removed in 4.0, and
    TransformerBridge.boot_transformers(name, hf_model=...) is what replaces
    HookedTransformer.from_pretrained(name, hf_model=...). It keeps the HF weights as
    they are (no LayerNorm folding), so its activations are comparable, and it
    switches its model to eager attention (its hooks need the attention pattern)."""
    name = "TransformerLens"

    def __init__(self, *a):
        super().__init__(*a)
        import transformers
        from transformer_lens.model_bridge import TransformerBridge
        tok = transformers.AutoTokenizer.from_pretrained(self.folder)
        self.bridge = TransformerBridge.boot_transformers(str(self.folder), hf_model=load_hf(self.folder),
                                                          tokenizer=tok, device="cpu")
        self.hook_names = [f"blocks.{i}.hook_out" for i in range(len(self.blocks))]

    def _edit_hook(self, x, hook):
        return add_to_output(x, self.vec)

    def _capture12(self, ids):
        wanted = set(self.hook_names)
        _, cache = self.bridge.run_with_cache(ids, names_filter=lambda n: n in wanted)
        return {b: cache[h] for b, h in zip(self.blocks, self.hook_names)}

    def _capture_all(self, ids):
        _, cache = self.bridge.run_with_cache(ids)
        return dict(cache.items())

    def _edit(self, ids):
        return self.bridge.run_with_hooks(ids, fwd_hooks=[(h, self._edit_hook) for h in self.hook_names])

    def _generate(self, ids):
        with self.bridge.hooks(fwd_hooks=[(self.hook_names[STEER_BLOCK], self._edit_hook)]):
            return self.bridge.generate(ids, max_new_tokens=self.new_tokens, do_sample=False, stop_at_eos=False,
                                        verbose=False)

    def case_forward(self):
        return [Case(self.name, "bridge, eager", lambda ids: self.bridge(ids))]

    def case_capture12(self):
        return [Case(self.name, "run_with_cache", self._capture12)]

    def case_capture_all(self):
        return [Case(self.name, "run_with_cache", self._capture_all)]

    def case_edit12(self):
        return [Case(self.name, "run_with_hooks", self._edit)]

    def case_generate(self):
        return [Case(self.name, "generate + hooks", self._generate)]


# --- Vector Institute's FlexModel -----------------------------------------------------------
class VectorFlexModel(Tool):
    """Vector Institute's FlexModel (PyPI flex-model) around its own HF model.

    It always runs under torch.distributed and asks for NCCL unless it is
    given a process group, so it gets a one-process gloo group (a file store:
    no network). It has no generate, and appends each forward's captures to
    lists, so the output dict is emptied before every call.
    """
    name = "Vector FlexModel"

    def __init__(self, *a):
        super().__init__(*a)
        import logging
        import torch.distributed as dist
        from flex_model.core import FlexModel, HookFunction
        if not dist.is_initialized():
            store = tempfile.NamedTemporaryFile(prefix="flexmodel-bench-dist-", delete=False).name
            dist.init_process_group("gloo", init_method="file://" + store, rank=0, world_size=1)
        self._group = dist.group.WORLD
        self._FlexModel, self._HookFunction = FlexModel, HookFunction
        self.model = load_hf(self.folder)
        self.out = {}
        self.fm = None
        logging.getLogger("flex_model").setLevel(logging.WARNING)

    def _wrap(self, names, edit=None):
        def setup():
            self.fm = self._FlexModel(self.model, self.out, process_group=self._group)
            for n in names:
                self.fm.register_forward_hook(self._HookFunction(n, editing_function=edit))

        def teardown():
            if self.fm is not None:  # None when setup failed before making it
                self.fm.restore()
            self.fm = None
        return setup, teardown

    def _call(self, ids):
        self.out.clear()
        logits = self.fm(input_ids=ids, use_cache=False).logits
        return logits, {n: v[0] for n, v in self.out.items()}

    def _case(self, variant, names, result, edit=None):
        setup, teardown = self._wrap(names, edit)
        return Case(self.name, variant, lambda ids: result(self._call(ids)), setup, teardown)

    def case_forward(self):
        return [self._case("no hooks", [], lambda r: r[0])]

    def case_capture12(self):
        return [self._case("HookFunction", self.blocks, lambda r: r[1])]

    def case_capture_all(self):
        names = [n for n, _ in self.model.named_modules() if n]
        return [self._case("HookFunction", names, lambda r: r[1])]

    def case_edit12(self):
        return [self._case("Python editing fn", self.blocks, lambda r: r[0],
                           edit=lambda module, x, save_ctx, modules: x + self.vec)]


# --- flexmodel (this project) ---------------------------------------------------------------
class Flexmodel(Tool):
    name = "flexmodel"
    install_hint = "build it (bash scripts/build.sh) or put its build/python on PYTHONPATH"

    def __init__(self, *a):
        super().__init__(*a)
        import flexmodel
        self.fx = flexmodel
        self.model = flexmodel.from_pretrained(self.folder, mmap=False)
        self.hooked_model, self.out, self.fm = None, {}, None

    def all_names(self):
        """Every module it lists (its hook points such as ...hook_attn_probs included), the root excepted."""
        return [n for n, _ in self.model.named_modules() if n]

    def hooked(self, variant, names, run, edit=None, save=True):
        """A Case on its own copy of the model, hooked by a FlexModel once (at the first setup) and left
        so, as in a working session: hooks stay on the model they are registered on, so a shared model
        would carry them into the other cases. Registration is not timed; the first (warm-up) forward
        of a capture hook also checks whether the model changes the tensor in place later, after which
        unchanged activations are captured by reference."""
        state = {}

        def setup():
            if not state:
                model = self.fx.from_pretrained(self.folder, mmap=False)
                out = {}
                fm = self.fx.FlexModel(model, out)
                for n in names:
                    fm.register_forward_hook(self.fx.HookFunction(n, editing_function=edit, save=save))
                state.update(model=model, out=out, fm=fm)
            self.hooked_model, self.out, self.fm = state["model"], state["out"], state["fm"]
        return Case(self.name, variant, run, setup)

    def captures(self, ids):
        self.fm(ids)
        return dict(self.out)

    def python_edit(self, module, x, save_ctx, modules):
        return x + self.vec

    def case_forward(self):
        return [Case(self.name, "model(ids)", lambda ids: self.model(ids))]

    def case_capture12(self):
        return [self.hooked("FlexModel", self.blocks, self.captures)]

    def case_capture_all(self):
        # Every name it lists, and the modules alone (the set Transformers' hooks see): hooking
        # ...hook_attn_probs makes attention materialize its probabilities instead of running fused.
        modules = [n for n in self.all_names() if ".hook_" not in n]
        return [self.hooked("FlexModel", self.all_names(), self.captures),
                self.hooked("FlexModel, modules only", modules, self.captures)]

    def case_edit12(self):
        steer = self.fx.edits.steer(self.vec, 1.0)
        return [self.hooked("Python editing fn", self.blocks, lambda ids: self.fm(ids), self.python_edit, save=False),
                self.hooked("built-in edits.steer", self.blocks, lambda ids: self.fm(ids), steer, save=False)]

    def case_generate(self):
        block = self.blocks[STEER_BLOCK]
        steer = {block: (self.vec, 1.0)}
        # Hooks a FlexModel registers stay on the model, so they also run inside generate.
        return [Case(self.name, "generate(steer=)",
                     lambda ids: self.model.generate(ids, max_new_tokens=self.new_tokens, steer=steer)),
                self.hooked("Python editing fn + generate", [block],
                            lambda ids: self.hooked_model.generate(ids, max_new_tokens=self.new_tokens),
                            self.python_edit, save=False)]


TOOLS = [Transformers, NNsight, TransformerLens, VectorFlexModel, Flexmodel]
