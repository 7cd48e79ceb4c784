"""Tracing's overhead: ``with fm.trace(ids)`` against the same work done with plain FlexModel HookFunctions.

    PYTHONPATH=build/python python3 bench/python/bench_tracing.py [--reps 15] [--threads 2] [--layers 12]
        [--width 768] [--tokens 128]

Both engines: flexmodel's (the model loaded by flexmodel.from_pretrained) and the torch engine (the
Transformers model wrapped as a torch.nn.Module). A GPT-2-shaped model with random weights (built with
Transformers from a config, saved once to a temporary folder). Two tasks:

- capture: the output of every block (``HookFunction(name)`` each, vs ``.save()`` each);
- edit: every block's output + a vector (a Python editing function each, vs ``h.output = h.output + v``).

The cases are interleaved round-robin, each timed ``--reps`` times; the table gives medians (ms) and
the trace / hooks ratio.
"""
import argparse
import statistics
import tempfile
import time

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--tokens", type=int, default=128)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import transformers
    transformers.logging.set_verbosity_error()
    import flexmodel

    cfg = transformers.GPT2Config(n_layer=args.layers, n_embd=args.width, n_head=12, vocab_size=50257,
                                  n_positions=1024)
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    folder = tempfile.mkdtemp(prefix="flexmodel-bench-tracing-")
    hf.save_pretrained(folder)
    ids = torch.randint(0, 50257, (1, args.tokens), generator=torch.Generator().manual_seed(0))
    vector = torch.randn(args.width) * 0.01
    blocks = [f"transformer.h.{i}" for i in range(args.layers)]
    engines = {"flexmodel": flexmodel.from_pretrained(folder), "torch": hf}

    def wrap(model, out):  # the Transformers model on PyTorch's hooks (it would run in flexmodel's engine)
        return flexmodel.FlexModel(model, out, engine="torch" if model is hf else None)

    def hooks_capture(model):
        out = {}
        fm = wrap(model, out)
        for b in blocks:
            fm.register_forward_hook(flexmodel.HookFunction(b))
        fm(ids)
        fm.restore()
        return len(out)

    def trace_capture(model):
        fm = wrap(model, {})
        saved = {}
        with fm.trace(ids):
            for i in range(args.layers):
                saved[i] = fm.transformer.h[i].output.save()
        fm.restore()
        return len(saved)

    def hooks_edit(model):
        fm = wrap(model, {})
        for b in blocks:
            fm.register_forward_hook(flexmodel.HookFunction(b, save=False,
                                                            editing_function=lambda m, x, c, mods: x + vector))
        fm(ids)
        fm.restore()

    def trace_edit(model):
        fm = wrap(model, {})
        with fm.trace(ids):
            for i in range(args.layers):
                fm.transformer.h[i].output = fm.transformer.h[i].output + vector
        fm.restore()

    cases = {(e, task, how): (fn, m) for e, m in engines.items()
             for task, how, fn in [("capture", "hooks", hooks_capture), ("capture", "trace", trace_capture),
                                   ("edit", "hooks", hooks_edit), ("edit", "trace", trace_edit)]}
    times = {k: [] for k in cases}
    with torch.no_grad():
        for fn, m in cases.values():  # warm-up
            fn(m)
        for _ in range(args.reps):
            for k, (fn, m) in cases.items():
                t0 = time.perf_counter()
                fn(m)
                times[k].append((time.perf_counter() - t0) * 1e3)
    print(f"GPT-2 shape {args.layers}x{args.width}, input 1x{args.tokens}, {args.threads} threads, "
          f"median of {args.reps} (ms)")
    print("| engine | task | hooks | trace | trace / hooks |")
    print("|---|---|---|---|---|")
    for e in engines:
        for task in ("capture", "edit"):
            h = statistics.median(times[(e, task, "hooks")])
            t = statistics.median(times[(e, task, "trace")])
            print(f"| {e} | {task} {args.layers} blocks | {h:.1f} | {t:.1f} | {t / h:.3f} |")


if __name__ == "__main__":
    main()
