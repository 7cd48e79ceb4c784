"""Issue 32's end-to-end check on run.sh's model (the 2-layer induction Llama).

Rows of its synthetic task (train_induction MODEL --work W --batch ROWS writes them) go through
`flexmodel capture --dataset` into shards of model.layers.1.hook_resid_pre; `flexmodel train-sae`
trains a TopK SAE (d_sae = 16 x d_model) on them; then, on held-out rows:
  - explained variance at k (the CLI's eval.json, on tokens never trained on),
  - the next-token loss with the SAE spliced in (replace mode) against the clean loss and the loss
    with the residual zeroed: CE loss recovered = (L_zero - L_sae) / (L_zero - L_clean),
  - SAELens 6.54 loads the folder and its encode equals flexmodel's.

    PYTHONPATH=build/python scripts/golden/.venv-sae/bin/python bench/sae/train_on_induction.py \\
        --model build/demo/induction-llama [--rows 16384] [--total-tokens 2000000]
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

import torch
from safetensors.torch import load_file, save_file

import flexmodel
import flexmodel.sae

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run(cmd):
    print("$", " ".join(str(c) for c in cmd), flush=True)
    t0 = time.time()
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": "2"})
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}):\n{r.stderr[-3000:]}")
    tail = [l for l in r.stderr.splitlines() if l.startswith("flexmodel:")]
    print("\n".join(tail[-2:]), f"({time.time() - t0:.0f} s)", flush=True)


def next_token_loss(fm, ids):
    """(mean next-token loss, log-probabilities [N, vocab] of every prediction)."""
    with torch.no_grad():
        logits = fm(ids)[:, :-1].reshape(-1, fm(ids).shape[-1]).float()
    return torch.nn.functional.cross_entropy(logits, ids[:, 1:].reshape(-1)).item(), logits.log_softmax(-1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--work", default="/tmp/flexmodel-train-induction")
    p.add_argument("--flexmodel", default=str(ROOT / "build/tools/flexmodel"))
    p.add_argument("--train-induction", default=str(ROOT / "build/examples/train_induction"))
    p.add_argument("--rows", type=int, default=16384)
    p.add_argument("--total-tokens", type=int, default=2_000_000)
    p.add_argument("--k", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    a = p.parse_args()
    work = pathlib.Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    hook = "model.layers.1.hook_resid_pre"
    cfg = json.loads((pathlib.Path(a.model) / "config.json").read_text())
    d = cfg["hidden_size"]

    ids_path = work / "repeated_ids.safetensors"
    if not ids_path.exists():
        run([a.train_induction, a.model, "--work", work, "--batch", a.rows])
    ids = load_file(str(ids_path))["input_ids"]
    T = ids.shape[1]
    held = ids[-256:]
    train_ids = work / "train_ids.safetensors"
    save_file({"input_ids": ids[:-256].contiguous()}, str(train_ids))
    print(f"rows {ids.shape[0]} x {T} tokens; held out for the loss: {held.shape[0]} rows", flush=True)

    acts = work / "acts"
    if not (acts / "dataset.json").exists():
        run([a.flexmodel, "capture", a.model, "--dataset", train_ids, "--context-len", T, "--batch-size", 64,
             "--hook", hook, "--stream-dir", acts])
    out = work / "sae"
    run([a.flexmodel, "train-sae", "--activations", acts, "--hook", hook, "--architecture", "topk",
         "--d-sae", 16 * d, "--k", a.k, "--lr", a.lr, "--batch-tokens", 4096, "--total-tokens", a.total_tokens,
         "--eval-tokens", 16384, "--out", out])
    ev = json.loads((out / "eval.json").read_text())
    print("eval.json:", json.dumps(ev))

    model = flexmodel.from_pretrained(a.model)
    fm = flexmodel.FlexModel(model, {})
    clean, lp_clean = next_token_loss(fm, held)
    sae = flexmodel.sae.load_sae(out)
    splice = flexmodel.sae.splice_sae(fm, sae, mode="replace")
    with_sae, lp_sae = next_token_loss(fm, held)
    splice.remove()
    fm.register_forward_hook(flexmodel.HookFunction(hook, editing_function=lambda m, x, c, t: torch.zeros_like(x)))
    zero, lp_zero = next_token_loss(fm, held)
    fm.restore()

    def kl(lp):  # KL(clean || other) per prediction, averaged
        return (lp_clean.exp() * (lp_clean - lp)).sum(-1).mean().item()

    agree = (lp_sae.argmax(-1) == lp_clean.argmax(-1)).float().mean().item()
    print(f"next-token loss on {lp_clean.shape[0]} held-out predictions: clean {clean:.4f}, SAE spliced {with_sae:.4f}, "
          f"residual zeroed {zero:.4f}; CE loss recovered (zero - sae) / (zero - clean) {(zero - with_sae) / (zero - clean):.4f}")
    print(f"KL(clean || spliced) {kl(lp_sae):.5f} nats, KL(clean || zeroed) {kl(lp_zero):.5f} nats "
          f"(KL recovered {1 - kl(lp_sae) / kl(lp_zero):.4f}); top-1 prediction unchanged on {agree:.4f}")

    try:
        from sae_lens import SAE
    except ImportError:
        print("sae_lens not importable here: run with scripts/golden/.venv-sae/bin/python for the SAELens check")
        return
    sl = SAE.load_from_disk(str(out), device="cpu")
    shards = sorted(acts.glob("shard-*.safetensors"))
    x = load_file(str(shards[-1]))[hook][-4096:].float()
    got, want = sae.encode(x), sl.encode(x)
    print(f"SAELens {type(sl).__name__} encode vs flexmodel on 4096 stored tokens: max abs diff "
          f"{(got - want).abs().max().item():.3g} (max |value| {want.abs().max().item():.3g}), "
          f"active-set mismatches {(got.ne(0) != want.ne(0)).sum().item()}")


if __name__ == "__main__":
    main()
