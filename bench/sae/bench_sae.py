#!/usr/bin/env python3
"""Sparse dictionaries (SAEs): flexmodel against SAELens 6.54, in one process and one run.

Run with the SAE reference venv (torch 2.13.0+cpu, sae-lens 6.54.12) and the build's Python package:

    py=$(bash scripts/golden/setup.sh --sae)          # makes scripts/golden/.venv-sae
    PYTHONPATH=build/python "$py" bench/sae/bench_sae.py [--quick] [--work DIR] [--reps N] [--capture-reps N]

1. Dictionary cost, d_in 768 x d_sae 16384, float32, torch.no_grad(), inputs [1024, 768] and [128, 768]:
   SAELens encode / decode / forward against flexmodel's encode / decode / forward, a dense
   ``f @ W_dec + b_dec`` in torch (same f) and the encoder matmul alone (``x @ W_enc + b_enc``).
   TopK (k=64) and JumpReLU (L0 ~ 50). Outputs are compared (max abs diff, relative to max |ref|).
2. Dataset capture with the CLI on a random GPT-2-small checkpoint, 8192 tokens:
   (a) --hook transformer.h.8.hook_resid_pre, (b) --sae <TopK 16k> (features only), (c) both.

Every contender is timed once per repeat, in rotating order, and medians over the repeats are reported.
The SAEs are written by SAELens itself (SAE.save_model); SAELens times the SAE it loads back with
SAE.load_from_disk, flexmodel the one flexmodel.sae.load_sae reads from the same folder.
"""
import os

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("MKL_NUM_THREADS", "2")

import argparse
import json
import pathlib
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time

import torch
from safetensors.torch import load_file, save_file

import sae_lens
from sae_lens import SAE
from sae_lens.saes import JumpReLUSAE, JumpReLUSAEConfig, TopKSAE, TopKSAEConfig
from sae_lens.saes.sae import SAEMetadata

try:
    import flexmodel
    import flexmodel.sae
except Exception as e:  # noqa: BLE001 - say exactly why, then stop
    sys.exit(f"bench_sae: flexmodel does not import with this interpreter ({sys.executable}, torch "
             f"{torch.__version__}): {type(e).__name__}: {e}")

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "python"))
import checkpoints  # noqa: E402  (bench/python/checkpoints.py)

D_IN = 768
D_SAE = 16384
TOPK_K = 64
JUMPRELU_L0 = 50.0
HOOK_TL = "blocks.8.hook_resid_pre"
HOOK_MODULE = "transformer.h.8.hook_resid_pre"
REL_TOL = 1e-4
CLI = str(REPO / "build" / "tools" / "flexmodel")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default="/tmp/flexmodel-bench-sae", help="SAEs, corpus and stream dirs go here")
    p.add_argument("--cache", default="/tmp/flexmodel-bench-python",
                   help="random-weight checkpoints (bench/python/checkpoints.py), written once")
    p.add_argument("--reps", type=int, default=7, help="repeats of the dictionary timings")
    p.add_argument("--capture-reps", type=int, default=3, help="repeats of each capture run")
    p.add_argument("--max-tokens", type=int, default=8192, help="tokens per capture run")
    p.add_argument("--min-sample-s", type=float, default=0.25, help="a timing sample lasts at least this long")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="dry run: 2 repeats, 1 capture repeat of 1024 tokens")
    p.add_argument("--flexmodel-cli", default=str(REPO / "build" / "tools" / "flexmodel"))
    a = p.parse_args()
    global CLI
    CLI = a.flexmodel_cli
    if a.quick:
        a.reps, a.capture_reps, a.max_tokens, a.min_sample_s = 2, 1, 1024, 0.1
    return a


def log(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------------------------------------
# SAEs written by SAELens


def meta():
    return SAEMetadata(model_name="gpt2", hook_name=HOOK_TL, hook_head_index=None, context_size=128,
                       prepend_bos=True)


def make_x(n, seed):
    """Inputs: unit normal coordinates, each row scaled by U(0.8, 1.2)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, D_IN, generator=g) * (0.8 + 0.4 * torch.rand(n, 1, generator=g))).contiguous()


def base_weights(seed):
    g = torch.Generator().manual_seed(seed)
    w_enc = torch.randn(D_IN, D_SAE, generator=g) / D_IN ** 0.5  # N(0, 1/sqrt(d_in))
    w_dec = w_enc.T.clone()
    w_dec = (w_dec / w_dec.norm(dim=-1, keepdim=True)).contiguous()  # W_enc.T with unit rows
    b_dec = torch.randn(D_IN, generator=g) * 0.05
    return g, {"W_enc": w_enc.contiguous(), "W_dec": w_dec, "b_dec": b_dec}


@torch.no_grad()
def set_params(sae, params):
    own = dict(sae.named_parameters())
    for k, v in params.items():
        assert own[k].shape == v.shape, (k, own[k].shape, v.shape)
        own[k].data.copy_(v)


@torch.no_grad()
def write_saes(work):
    """{name: folder}: a TopK (k=64) and a JumpReLU (b_enc calibrated to L0 ~ 50) dictionary, 768 x 16384."""
    out = {}
    # TopK
    g, p = base_weights(1)
    p["b_enc"] = torch.randn(D_SAE, generator=g) * 0.1
    sae = TopKSAE(TopKSAEConfig(d_in=D_IN, d_sae=D_SAE, k=TOPK_K, metadata=meta()))
    set_params(sae, p)
    out["topk"] = work / "sae-topk-16k"
    sae.save_model(out["topk"])
    # JumpReLU: thresholds U(0.05, 0.25); b_enc = c + N(0, 0.1) with c bisected to L0 ~ 50 on calibration inputs
    g, p = base_weights(2)
    thr = 0.05 + 0.2 * torch.rand(D_SAE, generator=g)
    noise = torch.randn(D_SAE, generator=g) * 0.1
    pre = (make_x(1024, 99) - p["b_dec"]) @ p["W_enc"] + noise
    lo, hi = -10.0, 10.0
    for _ in range(40):
        c = (lo + hi) / 2
        h = pre + c
        l0 = ((h > thr) & (h > 0)).sum(-1).float().mean().item()
        lo, hi = (c, hi) if l0 < JUMPRELU_L0 else (lo, c)
    p["b_enc"] = noise + (lo + hi) / 2
    p["threshold"] = thr
    sae = JumpReLUSAE(JumpReLUSAEConfig(d_in=D_IN, d_sae=D_SAE, metadata=meta()))
    set_params(sae, p)
    out["jumprelu"] = work / "sae-jumprelu-16k"
    sae.save_model(out["jumprelu"])
    return out


# ---------------------------------------------------------------------------------------------
# timing


def calibrate(fn, min_s):
    fn()  # warm-up
    t = time.perf_counter()
    fn()
    dt = time.perf_counter() - t
    return max(1, int(min_s / max(dt, 1e-6) + 0.999))


def time_interleaved(contenders, reps, min_s):
    """{name: median seconds per call}; contenders timed once per repeat, the order rotating."""
    inner = {k: calibrate(fn, min_s) for k, fn in contenders.items()}
    samples = {k: [] for k in contenders}
    names = list(contenders)
    for r in range(reps):
        order = names[r % len(names):] + names[:r % len(names)]
        for k in order:
            fn, n = contenders[k], inner[k]
            t = time.perf_counter()
            for _ in range(n):
                fn()
            samples[k].append((time.perf_counter() - t) / n)
    return {k: statistics.median(v) for k, v in samples.items()}, inner


def diff(a, ref):
    a = a.to_dense() if a.is_sparse else a
    d = (a - ref).abs().max().item()
    scale = ref.abs().max().item()
    return d, d / scale if scale else d


@torch.no_grad()
def bench_dictionaries(saes, args):
    rows = []
    for arch, folder in saes.items():
        sl = SAE.load_from_disk(str(folder), device="cpu")
        sl.eval()
        fm = flexmodel.sae.load_sae(str(folder))
        W_enc, b_enc = sl.W_enc.detach(), sl.b_enc.detach()
        W_dec, b_dec = sl.W_dec.detach(), sl.b_dec.detach()
        for n in (1024, 128):
            x = make_x(n, 1000 + n)
            f_sl = sl.encode(x)
            f_fm = fm.encode(x)
            l0 = (f_sl != 0).sum(-1).float()
            active_mismatch = int(((f_sl != 0) != (f_fm != 0)).sum().item())
            checks = {
                "encode": diff(f_fm, f_sl),
                "decode": diff(fm.decode(f_sl), sl.decode(f_sl)),
                "forward": diff(fm(x), sl(x)),
                "dense_decode": diff(f_sl @ W_dec + b_dec, sl.decode(f_sl)),
            }
            contenders = {
                "sl.encode": lambda: sl.encode(x),
                "fm.encode": lambda: fm.encode(x),
                "sl.decode": lambda: sl.decode(f_sl),
                "fm.decode": lambda: fm.decode(f_sl),
                "torch.dense_decode": lambda: f_sl @ W_dec + b_dec,
                "sl.forward": lambda: sl(x),
                "fm.forward": lambda: fm(x),
                "enc_matmul": lambda: x @ W_enc + b_enc,
            }
            t0 = time.perf_counter()
            med, inner = time_interleaved(contenders, args.reps, args.min_sample_s)
            row = dict(arch=arch, n=n, l0_mean=l0.mean().item(), l0_min=int(l0.min()), l0_max=int(l0.max()),
                       active_mismatch=active_mismatch, checks=checks,
                       ms={k: v * 1e3 for k, v in med.items()}, inner=inner)
            rows.append(row)
            ms = row["ms"]
            log(f"[dict] {arch:8s} x[{n},{D_IN}] L0 {row['l0_mean']:.1f} ({row['l0_min']}..{row['l0_max']}) "
                f"in {time.perf_counter() - t0:.1f} s:  " + "  ".join(f"{k} {v:.2f}" for k, v in ms.items())
                + " ms")
            log("        agreement (max abs diff, relative to max|SAELens|): " + "  ".join(
                f"{k} {d:.2e} ({r:.1e})" for k, (d, r) in checks.items())
                + f"  active-set mismatches {active_mismatch}")
    return rows


# ---------------------------------------------------------------------------------------------
# capture with the CLI

RATE = re.compile(r"flexmodel: captured (\d+) tokens \((\d+) stored\).* in ([\d.]+) s: ([\d.]+) tokens/s")


def gpt2_folder(args, work):
    """GPT-2 small's shape, random weights; a view of it without the tokenizer files.

    The CLI reads the model folder's tokenizer even for a corpus of token ids, and it reads only BPE
    tokenizers; checkpoints.py writes a word-level one. The view holds config + weights only."""
    try:
        import transformers  # noqa: F401
        folder = checkpoints.ensure(args.cache, ["gpt2"])["gpt2"]
    except ImportError:
        code = ("import sys; sys.path.insert(0, %r); import checkpoints; "
                "print(checkpoints.ensure(%r, ['gpt2'])['gpt2'])") % (str(REPO / "bench" / "python"), args.cache)
        folder = pathlib.Path(subprocess.check_output(["python3", "-c", code], text=True).split()[-1])
    view = work / "gpt2-no-tokenizer"
    view.mkdir(exist_ok=True)
    for f in ("config.json", "generation_config.json", "model.safetensors"):
        if (folder / f).exists() and not (view / f).exists():
            (view / f).symlink_to(folder / f)
    return view


def run_capture(args, model, corpus, sdir, hook, sae, max_tokens):
    if sdir.exists():
        shutil.rmtree(sdir)
    cmd = [args.flexmodel_cli, "capture", str(model), "--dataset", str(corpus), "--context-len", "128",
           "--stream-dir", str(sdir), "--max-tokens", str(max_tokens), "--batch-size", "8"]
    if hook:
        cmd += ["--hook", HOOK_MODULE]
    if sae:
        cmd += ["--sae", str(sae)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    t = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr}")
    m = RATE.search(p.stderr)
    if not m:
        raise RuntimeError(f"no 'captured ... tokens/s' line in stderr:\n{p.stderr}")
    return dict(tokens=int(m[1]), stored=int(m[2]), secs=float(m[3]), tok_s=float(m[4]), wall=wall,
                line=[l for l in p.stderr.splitlines() if "captured" in l][0])


@torch.no_grad()
def check_capture(sdir, sae_folder):
    """Features stored by run (c) against SAELens's encode of the activations stored beside them."""
    sl = SAE.load_from_disk(str(sae_folder), device="cpu")
    n = bad_sets = 0
    max_d = max_ref = 0.0
    l0s = []
    for shard in sorted(sdir.glob("shard-*.safetensors")):
        d = load_file(str(shard))
        x = d[HOOK_MODULE]
        idx = d[HOOK_MODULE + ".sae.feature_indices"].long()
        val = d[HOOK_MODULE + ".sae.feature_values"]
        l0s.append(d[HOOK_MODULE + ".sae.l0"])
        dense = torch.zeros(x.shape[0], D_SAE).scatter_(1, idx.clamp(min=0), torch.where(idx >= 0, val, 0))
        ref = sl.encode(x)
        bad_sets += int((((ref != 0) != (dense != 0)).any(-1)).sum())
        max_d = max(max_d, (dense - ref).abs().max().item())
        max_ref = max(max_ref, ref.abs().max().item())
        n += x.shape[0]
    l0 = torch.cat(l0s).float()
    return dict(tokens=n, rows_with_other_features=bad_sets, max_abs_diff=max_d,
                rel=max_d / max_ref if max_ref else max_d, l0_mean=l0.mean().item(), l0_min=int(l0.min()),
                l0_max=int(l0.max()))


def bench_capture(args, work, sae_topk):
    model = gpt2_folder(args, work)
    corpus = work / "corpus-64x256.safetensors"
    g = torch.Generator().manual_seed(0)
    save_file({"input_ids": torch.randint(0, 50257, (64, 256), generator=g)}, str(corpus))
    runs = {"a": (True, None), "b": (False, sae_topk), "c": (True, sae_topk)}
    label = {"a": f"(a) --hook {HOOK_MODULE}", "b": "(b) --sae TopK-16k (features only)",
             "c": "(c) --hook + --sae"}
    # warm-up (page cache of the checkpoint), not timed
    run_capture(args, model, corpus, work / "stream-warmup", True, sae_topk, 1024)
    shutil.rmtree(work / "stream-warmup")
    res = {k: [] for k in runs}
    names = list(runs)
    for r in range(args.capture_reps):
        order = names[r % 3:] + names[:r % 3]
        for k in order:
            hook, sae = runs[k]
            out = run_capture(args, model, corpus, work / f"stream-{k}", hook, sae, args.max_tokens)
            res[k].append(out)
            log(f"[capture] rep {r} {label[k]}: {out['tok_s']:.0f} tokens/s, wall {out['wall']:.1f} s | {out['line']}")
    check = check_capture(work / "stream-c", sae_topk)
    log(f"[capture] check of (c): {check}")
    med = {k: dict(tok_s=statistics.median(o["tok_s"] for o in v), wall=statistics.median(o["wall"] for o in v),
                   tokens=v[0]["tokens"], label=label[k], all=[o["tok_s"] for o in v]) for k, v in res.items()}
    return med, check


# ---------------------------------------------------------------------------------------------


def machine():
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.check_output(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], text=True).strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "diff", "--quiet", "HEAD", "--", "src", "python", "tools"]
                               ).returncode != 0
    except Exception:  # noqa: BLE001
        commit, dirty = "?", False
    built = {}
    for name, f in (("_C", pathlib.Path(flexmodel.sae._C.__file__)), ("cli", pathlib.Path(CLI))):
        try:
            built[name] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(f.stat().st_mtime)) + " UTC"
        except OSError:
            built[name] = "?"
    return dict(nproc=os.cpu_count(), cpu=cpu, torch=torch.__version__, sae_lens=sae_lens.__version__,
                commit=commit + (" (+ uncommitted changes)" if dirty else ""), python=platform.python_version(),
                threads=torch.get_num_threads(), built=built, loadavg=loadavg())


def loadavg():
    try:
        return open("/proc/loadavg").read().split()[0]
    except OSError:
        return "?"


def table(m, rows, cap, check):
    L = []
    L.append(f"machine: {m['nproc']} CPUs ({m['cpu']}), torch threads {m['threads']}, OMP_NUM_THREADS="
             f"{os.environ.get('OMP_NUM_THREADS')}")
    L.append(f"versions: torch {m['torch']}, sae-lens {m['sae_lens']}, flexmodel {m['commit']} (HEAD; "
             f"flexmodel._C built {m['built']['_C']}, CLI built {m['built']['cli']}), Python {m['python']}")
    L.append(f"1-minute load average: {m['loadavg']} at the start, {loadavg()} at the end")
    L.append("")
    L.append(f"1. Dictionary cost: d_in {D_IN}, d_sae {D_SAE}, float32, torch.no_grad(); ms per call, "
             "median of the repeats")
    L.append("")
    L.append("| SAE | x | L0 | SAELens encode | flexmodel encode | SAELens decode | flexmodel decode | "
             "torch dense decode | dense / flexmodel decode | SAELens forward | flexmodel forward | "
             "encoder matmul | SAELens fwd / matmul | flexmodel fwd / matmul |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ms = r["ms"]
        L.append(f"| {r['arch']} | [{r['n']}, {D_IN}] | {r['l0_mean']:.1f} | {ms['sl.encode']:.2f} | "
                 f"{ms['fm.encode']:.2f} | {ms['sl.decode']:.2f} | {ms['fm.decode']:.2f} | "
                 f"{ms['torch.dense_decode']:.2f} | {ms['torch.dense_decode'] / ms['fm.decode']:.1f}x | "
                 f"{ms['sl.forward']:.2f} | {ms['fm.forward']:.2f} | {ms['enc_matmul']:.2f} | "
                 f"{ms['sl.forward'] / ms['enc_matmul']:.2f} | {ms['fm.forward'] / ms['enc_matmul']:.2f} |")
    L.append("")
    L.append("Agreement, flexmodel vs SAELens (max abs diff; in brackets relative to max |SAELens output|):")
    L.append("")
    L.append("| SAE | x | encode | decode (same f) | forward | torch dense decode vs SAELens | "
             "active-set mismatches | within 1e-4 rel |")
    L.append("|---|---|---|---|---|---|---|---|")
    for r in rows:
        c = r["checks"]
        ok = all(c[k][1] <= REL_TOL for k in ("encode", "decode", "forward")) and r["active_mismatch"] == 0
        L.append(f"| {r['arch']} | [{r['n']}, {D_IN}] | " + " | ".join(
            f"{c[k][0]:.2e} ({c[k][1]:.1e})" for k in ("encode", "decode", "forward", "dense_decode"))
            + f" | {r['active_mismatch']} | {'yes' if ok else 'NO'} |")
    if cap:
        a = cap["a"]["tok_s"]
        L.append("")
        L.append(f"2. CLI dataset capture: random GPT-2 small (124M, fp32), corpus 64 x 256 random ids, "
                 f"--context-len 128 --batch-size 8 --max-tokens {cap['a']['tokens']}, OMP_NUM_THREADS="
                 f"{os.environ.get('OMP_NUM_THREADS')}; median of {len(cap['a']['all'])} interleaved repeats")
        L.append("")
        L.append("| run | tokens/s (CLI line) | each repeat | wall s (process) | vs (a) |")
        L.append("|---|---|---|---|---|")
        for k in ("a", "b", "c"):
            v = cap[k]
            L.append(f"| {v['label']} | {v['tok_s']:.0f} | {', '.join(f'{t:.0f}' for t in v['all'])} | "
                     f"{v['wall']:.1f} | {v['tok_s'] / a:.3f} |")
        L.append("")
        L.append(f"b/a = {cap['b']['tok_s'] / a:.3f} (target >= 0.9), c/a = {cap['c']['tok_s'] / a:.3f}")
        L.append(f"Check of (c)'s stored features against SAELens encode of the stored activations: "
                 f"{check['tokens']} tokens, L0 {check['l0_mean']:.1f} ({check['l0_min']}..{check['l0_max']}), "
                 f"rows whose active set differs {check['rows_with_other_features']}, max abs diff "
                 f"{check['max_abs_diff']:.2e} ({check['rel']:.1e} relative)")
    return "\n".join(L)


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    work = pathlib.Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    m = machine()
    log(f"bench_sae: {m}; work dir {work}; reps {args.reps}, capture reps {args.capture_reps}")
    saes = write_saes(work)
    log(f"SAEs written by SAELens save_model: {', '.join(str(v) for v in saes.values())} "
        f"({time.perf_counter() - t0:.1f} s)")
    rows = bench_dictionaries(saes, args)
    cap, check = bench_capture(args, work, saes["topk"])
    log("")
    log(table(m, rows, cap, check))
    log(f"\ntotal {time.perf_counter() - t0:.0f} s")
    (work / "results.json").write_text(json.dumps(dict(machine=m, dictionaries=rows, capture=cap, check=check),
                                                  indent=1, default=str))


if __name__ == "__main__":
    main()
