"""flexmodel from Python against Transformers, nnsight, TransformerLens and Vector's FlexModel.

One run, the same random-weight checkpoints for every tool (GPT-2 small's
shape and a Llama of the same size with GQA, see checkpoints.py), the tools
interleaved round-robin in every repetition (a warm-up call first, which is
also the correctness pass), medians reported. Each tool runs in a process of
its own (spawned, driven over a pipe), as a user runs it: tools do not share a
heap, so one tool's resident models and captures do not change another's
allocations. The peers' processes import flexmodel too, so every tool runs
under the same malloc settings (design decision 32; --peer-malloc default
leaves the peers on glibc's). Tasks, at inputs 1x128 and 8x128:
a plain forward, capturing the 12 block outputs, capturing every module, and
adding a vector to the 12 block outputs; then 64 greedy tokens from a 1x16
prompt with a vector added at block 6. Registering hooks is not timed.

    python3 bench/python/bench_python.py [--quick] [--out DIR] [--cache DIR] [--reps N]

Prints one markdown table (ms and the ratio to Transformers: its plain
forward for the forward tasks, its hooked generate for generation), the
checks, and writes DIR/bench_python.json. A tool that fails to import, load or
run is a row with its error, never a crash.
"""
import argparse
import gc
import importlib.util
import json
import multiprocessing
import pathlib
import statistics
import sys
import time
import warnings

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# The extension as the build leaves it, unless a flexmodel is importable already (installed, or PYTHONPATH).
if importlib.util.find_spec("flexmodel") is None and (HERE.parents[1] / "build" / "python").is_dir():
    sys.path.insert(0, str(HERE.parents[1] / "build" / "python"))

import checkpoints  # noqa: E402
import contenders  # noqa: E402
import report  # noqa: E402

FORWARD_TASKS = ["forward", "capture12", "capture_all", "edit12"]
UNSUPPORTED = {("Vector FlexModel", "generate"): "n/a: it has no generate (hooks are switched on in its forward)"}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2 repetitions, input 1x128 only (a smoke test)")
    p.add_argument("--out", default="/tmp/flexmodel-bench-python", help="folder for bench_python.json")
    p.add_argument("--cache", default="/tmp/flexmodel-bench-python", help="where the checkpoints are written once")
    p.add_argument("--models", default="gpt2,llama")
    p.add_argument("--reps", type=int, help="timed repetitions (default 5, --quick 2)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--paired-reps", type=int,
                   help="pairs of flexmodel forward / every-module capture timed back to back (default 15, --quick 3)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--peer-malloc", choices=["kept", "default"], default="kept",
                   help="the peers' processes: keep freed memory as flexmodel does (kept), or glibc's defaults")
    a = p.parse_args()
    a.models = [m for m in a.models.split(",") if m]
    a.reps = a.reps or (2 if a.quick else 5)
    a.shapes = [(1, 128)] if a.quick else [(1, 128), (8, 128)]
    a.edit_cost_reps = 20 if a.quick else 50
    a.paired_reps = a.paired_reps or (3 if a.quick else 15)
    return a


def prompt_ids(batch, length, vocab):
    """Deterministic token ids, different in every row (bench_decode's formula)."""
    i = torch.arange(batch * length, dtype=torch.long).reshape(batch, length)
    return (i * 7919 + 13) % vocab


def load_tools(kind, folder, vec, new_tokens):
    """(tools that loaded, {tool name: error line} for those that did not), in this process."""
    tools, failed = [], {}
    for cls in contenders.TOOLS:
        tool, error = _load_tool(cls, kind, folder, vec, new_tokens)
        if tool is None:
            failed[cls.name] = error
        else:
            tools.append(tool)
    return tools, failed


def _load_tool(cls, kind, folder, vec, new_tokens):
    print(f"  loading {cls.name}", file=sys.stderr, flush=True)
    try:
        return cls(kind, folder, vec, new_tokens), None
    except ModuleNotFoundError as e:
        return None, f"not installed ({e}): {cls.install_hint}"
    except Exception as e:  # noqa: BLE001 - any peer failure becomes a row
        return None, "setup failed: " + report.one_line(e)


# --- one process per tool ----------------------------------------------------------------
def _quiet(threads):
    warnings.filterwarnings("ignore")
    import transformers
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(threads)


def _worker(conn, tool_name, kind, folder, vec, new_tokens, threads, keep_memory):
    """A tool in a process of its own: ("cases", task) -> labels, ("warm" | "time", task, label, ids)
    -> the result | ms, ("quit",). Replies are ("ok", value), ("error", text) or ("failed", text)."""
    if keep_memory:
        try:
            import flexmodel  # noqa: F401 - sets malloc to keep freed memory, as in flexmodel's own process
        except Exception:  # noqa: BLE001 - then glibc's defaults; flexmodel's own worker fails on load instead
            pass
    _quiet(threads)
    cls = next(c for c in contenders.TOOLS if c.name == tool_name)
    tool, error = _load_tool(cls, kind, folder, vec, new_tokens)
    if tool is None:
        conn.send(("failed", error))
        return
    conn.send(("ok", None))
    cases = {}
    while True:
        msg = conn.recv()
        try:
            if msg[0] == "quit":
                return
            if msg[0] == "cases":
                made = tool.cases(msg[1])
                cases.update({(msg[1], c.label): c for c in made})
                conn.send(("ok", [c.label for c in made]))
            elif msg[0] == "warm":
                conn.send(("ok", timed(cases[(msg[1], msg[2])], msg[3])[1]))
            elif msg[0] == "time":
                conn.send(("ok", timed(cases[(msg[1], msg[2])], msg[3])[0]))
            elif msg[0] == "drop":
                cases.clear()
                gc.collect()
                conn.send(("ok", None))
        except Exception as e:  # noqa: BLE001 - the case's row gets the error
            conn.send(("error", "failed: " + report.one_line(e)))


class RemoteError(Exception):
    pass


class RemoteTool:
    """Drives one tool's worker process; cases(task) gives RemoteCases."""

    def __init__(self, ctx, name, kind, folder, vec, new_tokens, args):
        self.name = name
        self.conn, child = ctx.Pipe()
        keep = name == "flexmodel" or args.peer_malloc == "kept"
        self.proc = ctx.Process(target=_worker, args=(child, name, kind, str(folder), vec, new_tokens, args.threads,
                                                      keep), daemon=True)
        self.proc.start()
        child.close()

    def loaded(self):
        """None, or why the tool did not load."""
        status, value = self._recv()
        return None if status == "ok" else value

    def _recv(self):
        try:
            return self.conn.recv()
        except EOFError:
            return "failed", f"its process ended (exit code {self.proc.exitcode})"

    def call(self, *msg):
        try:
            self.conn.send(msg)
        except (BrokenPipeError, OSError) as e:
            raise RemoteError(f"its process is gone ({e})") from None
        status, value = self._recv()
        if status != "ok":
            raise RemoteError(value)
        return value

    def cases(self, task):
        return [RemoteCase(self, task, label) for label in self.call("cases", task)]

    def close(self):
        try:
            self.conn.send(("quit",))
        except (BrokenPipeError, OSError):
            pass
        self.proc.join(timeout=60)
        if self.proc.is_alive():
            self.proc.kill()


class RemoteCase:
    def __init__(self, remote, task, label):
        self.remote, self.task, self.label, self.tool = remote, task, label, remote.name

    def warm(self, ids):
        return self.remote.call("warm", self.task, self.label, ids)

    def time(self, ids):
        return self.remote.call("time", self.task, self.label, ids)


def start_tools(kind, folder, vec, new_tokens, args):
    """(RemoteTools that loaded, {tool name: error line}); the processes load in parallel."""
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no fork of a process running libtorch
    remotes = [RemoteTool(ctx, cls.name, kind, folder, vec, new_tokens, args) for cls in contenders.TOOLS]
    tools, failed = [], {}
    for r in remotes:
        error = r.loaded()
        if error is None:
            tools.append(r)
        else:
            failed[r.name] = error
            r.close()
    return tools, failed


# --- correctness -------------------------------------------------------------------------
def _max_diff(a, b):
    a, b = contenders.first_tensor(a), contenders.first_tensor(b)
    if a is None or b is None or a.shape != b.shape:
        return None
    return float((a.double() - b.double()).abs().max())


def compare(task, result, ref, prompt_len):
    """(the table's check text, the number behind it) for one case's warm-up result against Transformers'."""
    if task == "generate":
        if result.shape != ref.shape:
            return f"tokens {tuple(result.shape)} vs {tuple(ref.shape)}", None
        new = ref.shape[1] - prompt_len
        same = int((result == ref)[:, prompt_len:].all(0).sum())
        return f"{same}/{new} new tokens equal", new - same
    if task in ("capture12", "capture_all"):
        diffs = [_max_diff(result[n], ref[n]) for n in result if n in ref]
        diffs = [d for d in diffs if d is not None]
        if not diffs:
            return "its own hook names: not compared", None
        return f"max abs diff {max(diffs):.1e} on {len(diffs)} modules", max(diffs)
    d = _max_diff(result, ref)
    return ("logits shape differs", None) if d is None else (f"max abs diff {d:.1e}", d)


# --- timing ------------------------------------------------------------------------------
def timed(case, ids):
    """(ms of case.run(ids), its result); the hooks' setup and teardown are outside the timing."""
    try:
        case.setup()
        t0 = time.perf_counter()
        result = case.run(ids)
        return (time.perf_counter() - t0) * 1e3, result
    finally:
        case.teardown()


def measure(kind, shape_text, tasks, tools, ids, reps):
    """Rows for every case of `tasks`: warm-up (+ check against Transformers), then reps round-robin."""
    rows, live = [], []
    for task in tasks:
        ref = None
        for tool in tools:
            cases = tool.cases(task)
            if not cases and (tool.name, task) in UNSUPPORTED:
                rows.append(dict(model=kind, input=shape_text, task=task, tool=tool.name, label=tool.name,
                                 error=UNSUPPORTED[(tool.name, task)]))
            for case in cases:
                row = dict(model=kind, input=shape_text, task=task, tool=case.tool, label=case.label, samples=[])
                rows.append(row)
                try:
                    result = case.warm(ids)
                except RemoteError as e:
                    row["error"] = str(e)
                    continue
                if task.startswith("capture"):
                    row["modules"] = len(result)
                if case.tool == "Transformers" and ref is None:
                    ref, row["check"] = result, "reference"
                elif ref is not None:
                    row["check"], row["diff"] = compare(task, result, ref, ids.shape[1])
                del result
                live.append((case, row))
        del ref
    for rep in range(reps):
        print(f"  {kind} {shape_text}: repetition {rep + 1}/{reps}", file=sys.stderr, flush=True)
        start = rep % max(1, len(live))  # a different case goes first each time
        for case, row in live[start:] + live[:start]:
            if row.get("error"):
                continue
            try:
                row["samples"].append(case.time(ids))
            except RemoteError as e:
                row["error"] = str(e)
    for tool in tools:
        try:
            tool.call("drop")
        except RemoteError:
            pass
    for row in rows:
        if row.get("samples") and not row.get("error"):
            row["ms"] = statistics.median(row["samples"])
    return rows


def with_failed(rows, kind, shape_text, tasks, failed):
    """rows + a row per task for each tool that did not load, in task order (the sort is stable)."""
    rows = rows + [dict(model=kind, input=shape_text, task=t, tool=name, label=name, error=err)
                   for t in tasks for name, err in failed.items()]
    return sorted(rows, key=lambda r: tasks.index(r["task"]))


def add_ratios(rows):
    """ms / Transformers' plain forward (generate: / Transformers' hooked generate), same model and input."""
    base = {}
    for r in rows:
        if r["tool"] == "Transformers" and r.get("ms") and r["task"] in ("forward", "generate"):
            base[(r["model"], r["input"], r["task"])] = r["ms"]
    for r in rows:
        b = base.get((r["model"], r["input"], "generate" if r["task"] == "generate" else "forward"))
        if b and r.get("ms"):
            r["ratio"] = r["ms"] / b


def interleaved_ms(cases, ids, reps):
    """{name: [ms per repetition]} for in-process cases timed back to back, the order rotating each
    repetition so that no case always runs first."""
    names = list(cases)
    ms = {k: [] for k in names}
    for rep in range(reps):
        r = rep % len(names)
        for k in names[r:] + names[:r]:
            ms[k].append(timed(cases[k], ids)[0])
    return ms


# --- flexmodel's Python editing function, per call ---------------------------------------
def python_edit_cost(folder, reps):
    """us per call of a no-op Python editing function: every module of GPT-2's tree at width 64 hooked,
    with and without it, at 1x8 tokens. The forward is then ~1 ms next to hundreds of calls, so the
    difference is the calls' cost and not the noise of a big forward; median of paired differences."""
    calls = [0]

    def noop(module, x, save_ctx, modules):
        calls[0] += 1
        return x
    flex = contenders.Flexmodel("gpt2-tiny", folder, torch.zeros(64), 0)
    names = flex.all_names()
    without = flex.hooked("", names, flex.captures)
    with_fn = flex.hooked("", names, flex.captures, noop)
    ids = prompt_ids(1, 8, 512)
    timed(without, ids)
    calls[0] = 0
    timed(with_fn, ids)
    per_forward = calls[0]
    ms = interleaved_ms({"without": without, "with": with_fn}, ids, reps)
    a, b = ms["without"], ms["with"]
    diff = statistics.median(y - x for x, y in zip(a, b))
    return dict(us_per_call=diff * 1e3 / per_forward, calls_per_forward=per_forward, model="gpt2-tiny",
                input="1x8", reps=reps, ms_without=statistics.median(a), ms_with=statistics.median(b))


# --- flexmodel's every-module capture against its own forward, paired ---------------------
def capture_overhead(kind, folder, shape, reps):
    """Every-module capture / flexmodel's own unhooked forward, as the median of paired ratios: each
    repetition times the forward, the capture of every name and of the modules only back to back (the
    order rotates), so a slow spell of the machine lands on the pair, not on one side of the ratio.
    The statistic was chosen before any run; the table's medians of unpaired samples are beside it."""
    flex = contenders.Flexmodel(kind, folder, torch.zeros(1), 0)
    names = flex.all_names()
    cases = {"forward": flex.cases("forward")[0],
             "every": flex.hooked("", names, flex.captures),
             "modules": flex.hooked("", [n for n in names if ".hook_" not in n], flex.captures)}
    ids = prompt_ids(*shape, flex.model.config["vocab_size"])
    for c in cases.values():
        timed(c, ids)
    ms = interleaved_ms(cases, ids, reps)
    out = dict(model=kind, input=f"{shape[0]}x{shape[1]}", reps=reps, ms=ms)
    for k in ("every", "modules"):
        out[f"{k}_paired_ratio"] = statistics.median(e / f for e, f in zip(ms[k], ms["forward"]))
    return out


def _own_process_worker(conn, threads, fn, args):
    _quiet(threads)
    try:
        conn.send(fn(*args))
    except Exception as e:  # noqa: BLE001 - flexmodel missing or failing: the rest still reports
        conn.send({"error": report.one_line(e)})


def in_own_process(threads, fn, *args):
    """fn(*args) in a spawned process of its own (a fresh heap, no other tool's models)."""
    ctx = multiprocessing.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=_own_process_worker, args=(child, threads, fn, args))
    proc.start()
    child.close()
    try:
        value = conn.recv()
    except EOFError:
        value = {"error": f"its process ended (exit code {proc.exitcode})"}
    proc.join()
    return value


def run_model(kind, folder, args):
    import transformers
    config = transformers.AutoConfig.from_pretrained(folder)
    vec = torch.randn(config.hidden_size, generator=torch.Generator().manual_seed(1))
    print(f"{kind}: loading the tools, each in a process of its own", file=sys.stderr, flush=True)
    tools, failed = start_tools(kind, folder, vec, args.new_tokens, args)
    rows = []
    for b, t in args.shapes:
        shape_text = f"{b}x{t}"
        measured = measure(kind, shape_text, FORWARD_TASKS, tools, prompt_ids(b, t, config.vocab_size), args.reps)
        rows += with_failed(measured, kind, shape_text, FORWARD_TASKS, failed)
    gen_text = f"1x16 +{args.new_tokens}"
    measured = measure(kind, gen_text, ["generate"], tools, prompt_ids(1, 16, config.vocab_size), args.reps)
    rows += with_failed(measured, kind, gen_text, ["generate"], failed)
    for tool in tools:
        tool.close()
    return rows


# --- checks ------------------------------------------------------------------------------
def _ms(rows, kind, shape, task, label):
    return next((r.get("ms") for r in rows if (r["model"], r["input"], r["task"], r["label"]) ==
                 (kind, shape, task, label)), None)


def _best(rows, kind, shape, task, label):
    return next((min(r["samples"]) for r in rows if (r["model"], r["input"], r["task"], r["label"]) ==
                 (kind, shape, task, label) and r.get("samples")), None)


def checks(rows, models, shape, edit_cost, paired):
    """The targets: every-module capture vs the unhooked forwards, and a Python editing function's cost."""
    out, lines = {"python_edit": edit_cost, "paired": paired}, []
    hf_forward = f"Transformers ({contenders.HF_ATTENTION}, plain)"
    fmt = (lambda v, f: "n/a" if v is None else f.format(v))
    for kind in models:
        fx = _ms(rows, kind, shape, "forward", "flexmodel (model(ids))")
        hf = _ms(rows, kind, shape, "forward", hf_forward)
        out[kind] = dict(input=shape)
        for label, what in [("flexmodel (FlexModel)", "every-module capture"),
                            ("flexmodel (FlexModel, modules only)", "capture of every module (no hook points)")]:
            every = _ms(rows, kind, shape, "capture_all", label)
            x = every / fx if every and fx else None
            y = every / hf if every and hf else None
            key = "every" if label == "flexmodel (FlexModel)" else "modules"
            out[kind].update({f"{key}_vs_flexmodel_forward": x, f"{key}_vs_transformers_forward": y})
            lines.append(f"{kind}: {what} {shape} / flexmodel unhooked forward = {fmt(x, '{:.3f}')} "
                         f"(target <= 1.05)")
            lines.append(f"{kind}: {what} {shape} / Transformers unhooked forward = {fmt(y, '{:.3f}')} "
                         f"(target < 1)")
            # On a noisy machine the medians of bimodal samples move by 5-10%; the best of each is steadier.
            be, bf = _best(rows, kind, shape, "capture_all", label), _best(rows, kind, shape, "forward",
                                                                            "flexmodel (model(ids))")
            out[kind][f"{key}_best_vs_flexmodel_forward_best"] = be / bf if be and bf else None
            lines.append(f"{kind}: {what} {shape}, best of the repetitions / best flexmodel unhooked forward = "
                         f"{fmt(be / bf if be and bf else None, '{:.3f}')}")
        p = paired.get(kind, {})
        for key, what in [("every", "every-module capture"), ("modules", "capture of every module (no hook points)")]:
            r = p.get(f"{key}_paired_ratio")
            where = (f"median of {p['reps']} paired ratios at {p['input']}, own process" if r is not None
                     else p.get("error", "not measured"))
            lines.append(f"{kind}: {what} / flexmodel unhooked forward, back to back = {fmt(r, '{:.3f}')} "
                         f"(target <= 1.05; {where})")
        py12 = _ms(rows, kind, shape, "edit12", "flexmodel (Python editing fn)")
        cpp12 = _ms(rows, kind, shape, "edit12", "flexmodel (built-in edits.steer)")
        if py12 and cpp12:
            out[kind]["python_minus_builtin_edit_us_per_block"] = (py12 - cpp12) * 1e3 / 12
            lines.append(f"{kind}: (12 Python edits - 12 built-in edits) / 12 at {shape} = "
                         f"{(py12 - cpp12) * 1e3 / 12:.0f} us (includes the add in Python; within the noise "
                         f"of a forward this size)")
    z = edit_cost.get("us_per_call")
    where = (f" ({edit_cost['calls_per_forward']} calls per {edit_cost['model']} {edit_cost['input']} forward, "
             f"median of {edit_cost['reps']} paired differences)" if z is not None else
             f" ({edit_cost.get('error', 'flexmodel not loaded')})")
    lines.append(f"Python editing function: {fmt(z, '{:.1f}')} us/call (target <= 20){where}")
    return out, lines


def correctness_lines(rows):
    """The largest difference from Transformers per task, over the tools that ran."""
    lines = []
    for task in ["forward", "capture12", "capture_all", "edit12"]:
        worst = [(r["diff"], r["label"], r["model"], r["input"]) for r in rows
                 if r["task"] == task and r.get("diff") is not None]
        if worst:
            d, label, kind, shape = max(worst)
            lines.append(f"{report.TASK_TITLES[task]}: largest abs difference from Transformers {d:.2e} "
                         f"({label}, {kind} {shape})")
    gen = [r for r in rows if r["task"] == "generate" and "check" in r and r["check"] != "reference"]
    if gen:
        lines.append("steered generate vs Transformers' tokens: " +
                     "; ".join(f"{r['model']} {r['label']}: {r['check']}" for r in gen))
    return lines


def main():
    args = parse_args()
    warnings.filterwarnings("ignore")
    import transformers
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    versions, machine = report.versions(), report.machine(args.threads)
    folders = checkpoints.ensure(args.cache, args.models)
    rows = []
    for kind in args.models:
        rows += run_model(kind, folders[kind], args)
    add_ratios(rows)
    print("flexmodel: a Python editing function's cost per call", file=sys.stderr, flush=True)
    folder = checkpoints.ensure(args.cache, ["gpt2-tiny"])["gpt2-tiny"]
    edit_cost = in_own_process(args.threads, python_edit_cost, str(folder), args.edit_cost_reps)
    paired = {}
    for kind in args.models:
        print(f"flexmodel: {kind} every-module capture and forward, {args.paired_reps} pairs", file=sys.stderr,
              flush=True)
        paired[kind] = in_own_process(args.threads, capture_overhead, kind, str(folders[kind]), args.shapes[-1],
                                      args.paired_reps)
    check_shape = f"{args.shapes[-1][0]}x{args.shapes[-1][1]}"
    check_values, check_lines = checks(rows, args.models, check_shape, edit_cost, paired)

    print()
    print(report.header(versions, machine))
    print(f"random-weight checkpoints in {args.cache}: {', '.join(args.models)}; fp32; torch.no_grad(); "
          f"Transformers attention: {contenders.HF_ATTENTION}; median of {args.reps} after a warm-up, round-robin")
    print()
    print(report.table(rows))
    print()
    for line in correctness_lines(rows) + check_lines:
        print(line)

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = dict(quick=args.quick, reps=args.reps, paired_reps=args.paired_reps, processes="one per tool",
                    peer_malloc=args.peer_malloc, shapes=[f"{b}x{t}" for b, t in args.shapes],
                    new_tokens=args.new_tokens, threads=args.threads, hf_attention=contenders.HF_ATTENTION,
                    steer_block=contenders.STEER_BLOCK, cache=str(args.cache))
    (out / "bench_python.json").write_text(json.dumps(
        dict(versions=versions, machine=machine, settings=settings, rows=rows, checks=check_values), indent=1))
    print(f"\nwrote {out / 'bench_python.json'}")


if __name__ == "__main__":
    main()
