#!/usr/bin/env python3
"""SAE training throughput: sae-lens 6.54.12's SAETrainer against `flexmodel train-sae`, one run.

Run with the SAE reference venv (torch 2.13.0+cpu, sae-lens 6.54.12) from the repository root:

    PYTHONPATH=/work/main/build/python scripts/golden/.venv-sae/bin/python bench/sae/bench_train.py [--quick]
        [--work DIR]          # dataset, flexmodel outputs, results.json (default /tmp/flexmodel-bench-train)
        [--flexmodel PATH]    # the CLI (default build/tools/flexmodel)
        [--reps 3] [--tokens 65536] [--batch-tokens 4096] [--dataset-tokens 262144]
        [--archs topk,jumprelu,standard]   # batchtopk also works
        [--threads 2] [--seed 0]
        [--starts random,trained] [--pretrain-tokens 393216] [--pretrain-batch-tokens 1024] [--pretrain-lr LR]
    --quick: a dry run, 1 repeat of 2 steps.

PYTHONPATH is optional: the script needs only torch, safetensors and sae_lens. When the flexmodel
Python package imports, the script also reads the dataset back with flexmodel.ActivationDataset
(the C++ reader that `train-sae --activations` uses) to check that it loads.

What it does

1. Writes a synthetic activation dataset once (reused while its generator settings are unchanged)
   in the layout that `flexmodel capture --dataset` writes (datasets/include/flex/datasets/
   activation_shards.h): dataset.json and shard-NNNNN.safetensors holding the hook's [n, 768]
   float32 activations, the int64 index tensors token_ids / document / position / context /
   offset and the metadata flexmodel.first_context / end_context / cursor / format. Tokens come
   in contexts of 128 (one document per context); a shard holds 512 whole contexts (65536
   tokens, ~200 MB). Each token is a sparse combination of a fixed random dictionary: 32
   directions drawn (power-law frequencies) from 4096 unit directions in R^768, exponential
   magnitudes, plus a shared mean vector and Gaussian noise, scaled to norm ~70 (about a GPT-2
   residual stream). Everything comes from --data-seed.
2. Two starting points (--starts). "random": both tools initialise the dictionary as they do, the
   first steps of a run, when a third or more of the latents of standard and JumpReLU SAEs fire.
   "trained": both continue from one dictionary that flexmodel trains first (untimed, cached in
   --work as pretrained-ARCH, rerun when its command or the dataset changes), the sparsity of the
   rest of a run. SAELens's training SAE gets its weights with the scaling factor unfolded as
   `flexmodel train-sae --from-pretrained` unfolds them (start_from_dictionary()); Adam starts
   fresh on both sides. SAELens's cost per step does not depend on how many latents fire;
   flexmodel's sparse products do.
3. For each repeat, for each start and architecture, runs SAELens and then flexmodel (the order flips
   every repeat) on the first --tokens tokens of that dataset, in dataset order (no shuffle):
   - SAELens: TopKTrainingSAE / JumpReLUTrainingSAE / StandardTrainingSAE (d_in 768, d_sae
     16*768) driven by sae_lens.training.sae_trainer.SAETrainer, exactly as SAETrainer.fit()
     drives it minus logging: maybe_reset_sparsity(), trainer.step(batch) (forward, losses,
     backward, grad-norm clipping at 1, Adam, LR and coefficient schedulers, dead-latent and
     firing statistics), n_training_steps += 1. wandb off, no checkpoints, no evals.
     torch.set_num_threads(--threads). One untimed warm-up step on the first batch comes
     first; tokens/s = timed tokens / wall time of the timed steps. Model construction,
     dataset loading and the normalisation estimate are not timed.
   - flexmodel: `flexmodel train-sae --activations DIR --hook H --architecture A --d-sae N
     [--k 64 | --l0-coefficient 1.0 | --l1 5] --lr LR --batch-tokens B --total-tokens T
     --out DIR --seed S --eval-tokens 0 [--from-pretrained DIR]` with OMP_NUM_THREADS=--threads; tokens/s is the number
     before " tokens/s" on its stderr line starting "flexmodel: trained". If the binary is
     missing, fails, or prints no such line, that column reads n/a (and the tail of its
     stderr is printed; the median is over the runs that succeeded).
4. Prints a markdown table of medians (and each repeat), flexmodel/SAELens, the 1-minute load
   average at start and end (the end value includes the benchmark's own busy threads: about
   --threads on an otherwise idle machine), versions and CPU, and writes results.json to --work.

SAELens settings, matched to flexmodel's SaeTrainingOptions defaults (sae/include/flex/sae/trainer.h):
lr 3e-4 constant, Adam (0.9, 0.999), clip 1.0, decoder_init_norm 0.1, apply_b_dec_to_input True,
dead_feature_window 1000. TopK: k 64, rescale_acts_by_decoder_norm True, aux_loss_coefficient 1.
JumpReLU: l0_coefficient 1, jumprelu_init_threshold 0.01, bandwidth 0.05, "step" L0 loss.
Standard: l1_coefficient 5. normalize_activations "expected_average_only_in": the scaling factor
sqrt(d_in) / mean ||x|| is estimated, like flexmodel, from the first batch only (SAETrainer.fit()
would use n_batches_for_norm_estimate batches) and set on the trainer's ActivationScaler. b_dec
starts at the mean of that (scaled) batch, as flexmodel's default b_dec_init Mean does (SAELens
6.54 itself starts b_dec at zero); this is set before timing and costs nothing per step.
Seeds: torch.manual_seed(--seed) before SAELens builds each SAE; --seed S for flexmodel (the two
initialisations are not bit-identical; only the cost per step is compared).
"""
import os

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("MKL_NUM_THREADS", "2")

import argparse
import gc
import json
import math
import pathlib
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time

import torch
from safetensors import safe_open
from safetensors.torch import save_file

import sae_lens
from sae_lens.config import SAETrainerConfig
from sae_lens.saes import (
    BatchTopKTrainingSAE,
    BatchTopKTrainingSAEConfig,
    JumpReLUTrainingSAE,
    JumpReLUTrainingSAEConfig,
    StandardTrainingSAE,
    StandardTrainingSAEConfig,
    TopKTrainingSAE,
    TopKTrainingSAEConfig,
)
from sae_lens.saes.sae import SAEMetadata
from sae_lens.training.sae_trainer import SAETrainer

REPO = pathlib.Path(__file__).resolve().parents[2]

D_IN = 768
CONTEXT_LEN = 128
SHARD_CONTEXTS = 512  # 65536 tokens, ~200 MB of float32 activations per shard (< flexmodel's 256 MiB)
TOPK_K = 64
L0_COEFFICIENT = 1.0  # JumpReLU
L1_COEFFICIENT = 5.0  # standard
JUMPRELU_INIT_THRESHOLD = 0.01
JUMPRELU_BANDWIDTH = 0.05
DEAD_FEATURE_WINDOW = 1000
AUX_LOSS_COEFFICIENT = 1.0

# Synthetic data: the generator's settings; the dataset is rewritten when any of them changes.
N_TRUE = 4096  # true dictionary directions
ACTIVE = 32  # directions drawn per token (with replacement: a repeat adds up)
ZIPF = 0.8  # frequency of the i-th commonest direction ~ (i + 1)^-ZIPF
NOISE = 0.1  # per-dimension Gaussian noise (before the overall scale)
MEAN_NORM = 5.0  # norm of the shared mean vector (before the overall scale)
SCALE = 7.0  # overall scale: mean ||x|| ~ 70
GEN_CHUNK = 8192


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default="/tmp/flexmodel-bench-train", help="dataset, flexmodel outputs, results.json")
    p.add_argument("--flexmodel", default=str(REPO / "build" / "tools" / "flexmodel"), help="the flexmodel CLI")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--tokens", type=int, default=65536, help="training tokens per run (timed)")
    p.add_argument("--batch-tokens", type=int, default=4096)
    p.add_argument("--dataset-tokens", type=int, default=262144, help="tokens in the synthetic dataset")
    p.add_argument("--d-sae", type=int, default=16 * D_IN)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--archs", default="topk,jumprelu,standard", help="comma list of topk, batchtopk, jumprelu, standard")
    p.add_argument("--hook", default="blocks.6.hook_resid_post")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0, help="SAE initialisation seed (both sides)")
    p.add_argument("--data-seed", type=int, default=1234, help="synthetic dataset seed")
    p.add_argument("--flex-timeout", type=float, default=1800, help="seconds one flexmodel run may take")
    p.add_argument("--quick", action="store_true", help="dry run: 1 repeat of 2 steps")
    p.add_argument("--starts", default="random,trained",
                   help="comma list: random (a fresh initialisation, the first steps of a run: many latents "
                        "fire) and trained (both tools continue from one dictionary flexmodel trained first: "
                        "the L0 of the rest of a run)")
    p.add_argument("--pretrain-tokens", type=int, default=393216,
                   help="trained start: tokens of the pre-training run (untimed, cached in --work)")
    p.add_argument("--pretrain-batch-tokens", type=int, default=1024)
    p.add_argument("--pretrain-lr", type=float,
                   help="pre-training learning rate (default: jumprelu 5e-3, whose thresholds move by about the "
                        "learning rate per step, the others 1e-3)")
    p.add_argument("--peer-malloc", choices=["default", "kept"], default="default",
                   help="SAELens's process: glibc's malloc as shipped (default), or keeping freed memory as "
                        "flexmodel's command line and `import flexmodel` do (kept)")
    a = p.parse_args()
    if a.quick:
        a.reps = 1
        a.tokens = 2 * a.batch_tokens
    a.archs = [s.strip() for s in a.archs.split(",") if s.strip()]
    a.starts = [s.strip() for s in a.starts.split(",") if s.strip()]
    for start in a.starts:
        if start not in ("random", "trained"):
            p.error(f"unknown start {start!r}")
    if a.quick:
        a.pretrain_tokens = 4 * a.pretrain_batch_tokens
    for arch in a.archs:
        if arch not in ("topk", "batchtopk", "jumprelu", "standard"):
            p.error(f"unknown architecture {arch!r}")
    if a.tokens < a.batch_tokens or a.tokens % a.batch_tokens:
        p.error("--tokens must be a positive multiple of --batch-tokens")
    a.dataset_tokens = max(a.dataset_tokens, a.tokens)
    a.dataset_tokens = -(-a.dataset_tokens // CONTEXT_LEN) * CONTEXT_LEN  # whole contexts
    return a


# ---------------------------------------------------------------------------------------------
# The synthetic activation dataset, in flexmodel's on-disk layout.


def generator_settings(a):
    return {"generator": "bench/sae/bench_train.py", "tokens": a.dataset_tokens, "d_in": D_IN,
            "hook": a.hook, "data_seed": a.data_seed, "n_true": N_TRUE, "active": ACTIVE, "zipf": ZIPF,
            "noise": NOISE, "mean_norm": MEAN_NORM, "scale": SCALE, "context_len": CONTEXT_LEN,
            "shard_contexts": SHARD_CONTEXTS, "gen_chunk": GEN_CHUNK}


def generate_tokens(n, gen, dictionary, cdf, feature_scale, mean):
    """n synthetic activations [n, D_IN]: sparse combinations of the dictionary plus mean and noise."""
    u = torch.rand(n, ACTIVE, generator=gen)
    idx = torch.searchsorted(cdf, u).clamp_(max=N_TRUE - 1)
    mags = torch.empty(n, ACTIVE).exponential_(generator=gen) * feature_scale[idx]
    x = torch.nn.functional.embedding_bag(idx, dictionary, per_sample_weights=mags, mode="sum")
    x += mean
    x += NOISE * torch.randn(n, D_IN, generator=gen)
    return x.mul_(SCALE)


def write_dataset(a, ddir):
    """Writes the dataset to ddir (through a temporary folder renamed at the end); returns seconds taken."""
    t0 = time.perf_counter()
    tmp = ddir.with_name(ddir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    gen = torch.Generator().manual_seed(a.data_seed)
    dictionary = torch.randn(N_TRUE, D_IN, generator=gen)
    dictionary /= dictionary.norm(dim=1, keepdim=True)
    freq = (torch.arange(N_TRUE, dtype=torch.float64) + 1) ** -ZIPF
    freq = freq[torch.randperm(N_TRUE, generator=gen)]
    cdf = (torch.cumsum(freq, 0) / freq.sum()).float()
    feature_scale = 0.5 + 1.5 * torch.rand(N_TRUE, generator=gen)
    mean = torch.randn(D_IN, generator=gen)
    mean *= MEAN_NORM / mean.norm()

    n_contexts = a.dataset_tokens // CONTEXT_LEN
    settings = {
        "format": "flexmodel-activations", "version": 1,
        "model": "synthetic (bench/sae/bench_train.py)",
        "dataset": "synthetic (bench/sae/bench_train.py)", "dataset_bytes": 0, "text_field": "text",
        "context_len": CONTEXT_LEN, "positions": "all", "seed": a.data_seed, "exclude_bos": False,
        "hooks": [a.hook], "dtype": "Float", "shapes": {a.hook: [D_IN]},
    }
    (tmp / "dataset.json").write_text(json.dumps(settings, indent=1, sort_keys=True))
    for shard, first in enumerate(range(0, n_contexts, SHARD_CONTEXTS)):
        end = min(first + SHARD_CONTEXTS, n_contexts)
        n = (end - first) * CONTEXT_LEN
        acts = torch.cat([generate_tokens(min(GEN_CHUNK, n - s), gen, dictionary, cdf, feature_scale, mean)
                          for s in range(0, n, GEN_CHUNK)])
        context = torch.arange(first, end, dtype=torch.int64).repeat_interleave(CONTEXT_LEN)
        offset = torch.arange(CONTEXT_LEN, dtype=torch.int64).repeat(end - first)
        tensors = {
            a.hook: acts.contiguous(),
            "token_ids": torch.randint(0, 50257, (n,), generator=gen, dtype=torch.int64),
            "document": context.clone(),  # one document per context
            "position": offset.clone(),  # its position in the document (0: the BOS)
            "context": context,
            "offset": offset,
        }
        cursor = json.dumps({"byte_offset": 0, "context": end, "document": end, "token_offset": 0},
                            separators=(",", ":"), sort_keys=True)
        meta = {"flexmodel.format": "flexmodel-activations", "flexmodel.first_context": str(first),
                "flexmodel.end_context": str(end), "flexmodel.cursor": cursor}
        save_file(tensors, str(tmp / f"shard-{shard:05d}.safetensors"), metadata=meta)
    (tmp / "bench_generator.json").write_text(json.dumps(generator_settings(a), indent=1, sort_keys=True))
    shutil.rmtree(ddir, ignore_errors=True)
    tmp.rename(ddir)
    return time.perf_counter() - t0


def ensure_dataset(a, ddir):
    gfile = ddir / "bench_generator.json"
    if gfile.exists():
        try:
            if json.loads(gfile.read_text()) == generator_settings(a):
                print(f"dataset: reusing {ddir}", flush=True)
                return
        except ValueError:
            pass
    print(f"dataset: writing {a.dataset_tokens} tokens x {D_IN} to {ddir} ...", flush=True)
    s = write_dataset(a, ddir)
    print(f"dataset: written in {s:.1f} s", flush=True)


def check_with_flexmodel_reader(a, ddir):
    """Reads the dataset with flexmodel's C++ reader (through its Python package) when that imports.
    Importing flexmodel would set this process's malloc to keep freed memory (SAELens trains here):
    --peer-malloc default keeps SAELens on glibc's settings as shipped."""
    if a.peer_malloc == "default":
        os.environ["FLEXMODEL_KEEP_FREED_MEMORY"] = "0"
    try:
        import flexmodel  # noqa: F401
        from flexmodel.activation_datasets import ActivationDataset
    except Exception as e:  # noqa: BLE001 - optional check
        return f"not checked (flexmodel does not import: {type(e).__name__}: {e})"
    try:
        data = ActivationDataset(str(ddir))
        assert len(data) == a.dataset_tokens, (len(data), a.dataset_tokens)
        assert data.hooks == [a.hook], data.hooks
        assert data.num_contexts == a.dataset_tokens // CONTEXT_LEN, data.num_contexts
        batch = next(iter(data.loader(batch_tokens=a.batch_tokens)))
        ref = load_tokens(ddir, a.hook, a.batch_tokens)
        assert torch.equal(batch[a.hook], ref), "first batch differs from what safetensors reads"
        return f"ok ({len(data)} tokens, {data.num_shards} shards, {data.num_contexts} contexts)"
    except Exception as e:  # noqa: BLE001 - report it, it means the CLI will not load it either
        return f"FAILED: {type(e).__name__}: {e}"


def load_tokens(ddir, hook, n):
    """The first n tokens' activations [n, D_IN], in dataset order, read with safetensors."""
    parts, have, i = [], 0, 0
    while have < n:
        path = ddir / f"shard-{i:05d}.safetensors"
        with safe_open(str(path), framework="pt") as f:
            sl = f.get_slice(hook)
            rows = sl.get_shape()[0]
            take = min(rows, n - have)
            parts.append(sl[:take])
        have += take
        i += 1
    return torch.cat(parts).contiguous()


# ---------------------------------------------------------------------------------------------
# SAELens


def saelens_sae(arch, a):
    common = dict(d_in=D_IN, d_sae=a.d_sae, dtype="float32", device="cpu", apply_b_dec_to_input=True,
                  normalize_activations="expected_average_only_in", decoder_init_norm=0.1,
                  metadata=SAEMetadata(hook_name=a.hook))
    if arch == "topk":
        cfg = TopKTrainingSAEConfig(k=TOPK_K, rescale_acts_by_decoder_norm=True,
                                    aux_loss_coefficient=AUX_LOSS_COEFFICIENT, **common)
        return TopKTrainingSAE(cfg)
    if arch == "batchtopk":
        cfg = BatchTopKTrainingSAEConfig(k=TOPK_K, rescale_acts_by_decoder_norm=True,
                                         aux_loss_coefficient=AUX_LOSS_COEFFICIENT, **common)
        return BatchTopKTrainingSAE(cfg)
    if arch == "jumprelu":
        cfg = JumpReLUTrainingSAEConfig(l0_coefficient=L0_COEFFICIENT, jumprelu_init_threshold=JUMPRELU_INIT_THRESHOLD,
                                        jumprelu_bandwidth=JUMPRELU_BANDWIDTH, jumprelu_sparsity_loss_mode="step",
                                        **common)
        return JumpReLUTrainingSAE(cfg)
    if arch == "standard":
        cfg = StandardTrainingSAEConfig(l1_coefficient=L1_COEFFICIENT, **common)
        return StandardTrainingSAE(cfg)
    raise ValueError(arch)


def start_from_dictionary(sae, trainer, folder):
    """SAELens's training SAE set to the dictionary in `folder` (SAELens's format, scaling folded in):
    the weights unfolded with the trainer's scaling factor c, as `flexmodel train-sae --from-pretrained`
    unfolds them with its own (W_enc / c, W_dec * c, b_dec * c; b_enc and the threshold as saved)."""
    c = trainer.activation_scaler.scaling_factor
    with safe_open(str(folder / "sae_weights.safetensors"), framework="pt") as f:
        w = {k: f.get_tensor(k).float() for k in f.keys()}
    with torch.no_grad():
        sae.W_enc.copy_(w["W_enc"] / c)
        sae.W_dec.copy_(w["W_dec"] * c)
        sae.b_dec.copy_(w["b_dec"] * c)
        sae.b_enc.copy_(w["b_enc"])
        if hasattr(sae, "threshold") and "threshold" in w:
            sae.threshold.copy_(w["threshold"])
        if hasattr(sae, "topk_threshold") and "threshold" in w:
            sae.topk_threshold.fill_(w["threshold"].mean().item() * c)


def run_saelens(arch, a, batches, start_dir=None):
    """Trains on `batches` ([batch_tokens, D_IN] each) with SAETrainer's step loop; returns a dict.
    start_dir: a dictionary to continue from (else SAELens's random initialisation)."""
    torch.manual_seed(a.seed)
    sae = saelens_sae(arch, a)
    n_steps = len(batches)
    cfg = SAETrainerConfig(
        total_training_samples=(n_steps + 1) * a.batch_tokens,  # + the warm-up step
        train_batch_size_samples=a.batch_tokens,
        lr=a.lr, lr_end=a.lr / 10, lr_scheduler_name="constant", lr_warm_up_steps=0, lr_decay_steps=0,
        adam_beta1=0.9, adam_beta2=0.999, device="cpu", autocast=False,
        dead_feature_window=DEAD_FEATURE_WINDOW, n_checkpoints=0, checkpoint_path=None,
        save_final_checkpoint=False, n_batches_for_norm_estimate=1,
    )
    assert not cfg.logger.log_to_wandb
    trainer = SAETrainer(cfg=cfg, sae=sae, data_provider=iter(batches))
    # Normalisation and b_dec as flexmodel initialises them: from the first batch, untimed.
    # (ActivationScaler.estimate_scaling_factor's formula, without its progress bar)
    trainer.activation_scaler.scaling_factor = D_IN**0.5 / batches[0].norm(dim=-1).float().mean().item()
    with torch.no_grad():
        sae.b_dec.copy_(trainer.activation_scaler(batches[0]).mean(0))
    if start_dir is not None:
        start_from_dictionary(sae, trainer, start_dir)
    sae.to(cfg.device)

    def one_step(batch):
        trainer.maybe_reset_sparsity()  # what fit() does around step(); no logging
        out = trainer.step(batch)
        trainer.n_training_steps += 1
        return out

    one_step(batches[0])  # warm-up, untimed
    t0 = time.perf_counter()
    for batch in trainer.data_provider:
        out = one_step(batch)
    seconds = time.perf_counter() - t0
    with torch.no_grad():
        l0 = out.feature_acts.bool().float().sum(-1).mean().item()
        ev = (1 - (out.sae_out - out.sae_in).pow(2).sum(-1).mean()
              / (out.sae_in - out.sae_in.mean(0)).pow(2).sum(-1).mean()).item()
        losses = {k: float(v.item()) for k, v in out.losses.items()}
    res = {"tokens_per_s": n_steps * a.batch_tokens / seconds, "seconds": seconds, "steps": n_steps,
           "s_per_step": seconds / n_steps, "last_loss": float(out.loss.item()), "last_losses": losses,
           "last_l0": l0, "last_explained_variance": ev, "scaling_factor": trainer.activation_scaler.scaling_factor}
    del trainer, sae, out
    gc.collect()
    return res


# ---------------------------------------------------------------------------------------------
# flexmodel

TRAINED_RE = re.compile(r"(\d[\d,]*(?:\.\d*)?(?:[eE][+-]?\d+)?)\s*tokens/s")


def arch_flags(arch):
    if arch in ("topk", "batchtopk"):
        return ["--k", str(TOPK_K)]
    if arch == "jumprelu":
        return ["--l0-coefficient", str(L0_COEFFICIENT)]
    return ["--l1", str(L1_COEFFICIENT)]


def flex_command(arch, a, ddir, out, start_dir=None):
    cmd = [a.flexmodel, "train-sae", "--activations", str(ddir), "--hook", a.hook, "--architecture", arch,
           "--d-sae", str(a.d_sae)] + arch_flags(arch)
    cmd += ["--lr", str(a.lr), "--batch-tokens", str(a.batch_tokens), "--total-tokens", str(a.tokens),
            "--out", str(out), "--seed", str(a.seed), "--eval-tokens", "0",
            # One checkpoint, at the end (after the rate is taken): SAELens writes none in its loop.
            "--checkpoint-every", str(a.tokens)]
    if start_dir is not None:
        cmd += ["--from-pretrained", str(start_dir)]
    return cmd


def last_metrics(out):
    """The last line of a run's metrics.jsonl (step, loss, l0, explained_variance, ...), or {}."""
    try:
        lines = (pathlib.Path(out) / "metrics.jsonl").read_text().strip().splitlines()
        return json.loads(lines[-1]) if lines else {}
    except (OSError, ValueError):
        return {}


def pretrain_lr(arch, a):
    return a.pretrain_lr or (5e-3 if arch == "jumprelu" else 1e-3)


def ensure_pretrained(arch, a, ddir, work):
    """The trained start: a dictionary flexmodel trains first (untimed) at pretrain_lr() on batches of
    --pretrain-batch-tokens, written once to work/pretrained-ARCH and reused while its command is unchanged.
    Returns (folder, its last metrics line)."""
    out = work / f"pretrained-{arch}"
    cmd = [a.flexmodel, "train-sae", "--activations", str(ddir), "--hook", a.hook, "--architecture", arch,
           "--d-sae", str(a.d_sae)] + arch_flags(arch) + [
           "--lr", str(pretrain_lr(arch, a)), "--batch-tokens", str(a.pretrain_batch_tokens),
           "--total-tokens", str(a.pretrain_tokens), "--seed", str(a.seed), "--eval-tokens", "0",
           "--checkpoint-every", str(a.pretrain_tokens), "--out", str(out)]
    key = out / "bench_command.json"
    settings = {"command": cmd[1:], "dataset": generator_settings(a)}
    if (out / "sae_weights.safetensors").exists() and key.exists():
        try:
            if json.loads(key.read_text()) == settings:
                return out, last_metrics(out)
        except ValueError:
            pass
    shutil.rmtree(out, ignore_errors=True)
    print(f"pretraining {arch}: {' '.join(cmd)}", flush=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads))
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"pretraining {arch} failed (exit status {p.returncode}):\n{tail(p.stderr)}")
    key.write_text(json.dumps(settings))
    return out, last_metrics(out)


def tail(text, lines=15):
    return "\n".join(text.strip().splitlines()[-lines:])


def run_flexmodel(arch, a, ddir, out, start_dir=None):
    """Runs the CLI once; returns a dict with tokens_per_s (None when it failed) and what it printed."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = flex_command(arch, a, ddir, out, start_dir)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads))
    env.pop("FLEXMODEL_KEEP_FREED_MEMORY", None)  # the command line as it ships
    res = {"tokens_per_s": None, "command": " ".join(cmd)}
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.flex_timeout)
    except FileNotFoundError as e:
        res["error"] = f"cannot run {a.flexmodel}: {e}"
        return res
    except subprocess.TimeoutExpired as e:
        res["error"] = f"timed out after {a.flex_timeout} s"
        res["stderr_tail"] = tail(e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or ""))
        return res
    finally:
        res["wall_s"] = time.perf_counter() - t0
    res["rc"] = p.returncode
    line = next((l for l in p.stderr.splitlines() + p.stdout.splitlines() if l.startswith("flexmodel: trained")), None)
    m = TRAINED_RE.search(line) if line else None
    if p.returncode != 0 or not m:
        res["error"] = (f"exit status {p.returncode}" if p.returncode != 0
                        else "no 'flexmodel: trained ... tokens/s' line in its output")
        res["stderr_tail"] = tail(p.stderr or p.stdout)
        return res
    res["tokens_per_s"] = float(m.group(1).replace(",", ""))
    res["trained_line"] = line
    m = last_metrics(out)
    res["last_l0"], res["last_explained_variance"] = m.get("l0"), m.get("explained_variance")
    shutil.rmtree(out, ignore_errors=True)  # ~75 MB of weights per run
    return res


# ---------------------------------------------------------------------------------------------


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def fmt(v, digits=0):
    return "n/a" if v is None else f"{v:,.{digits}f}"


def main():
    a = parse_args()
    torch.set_num_threads(a.threads)
    work = pathlib.Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    ddir = work / "acts"
    load_start = os.getloadavg()
    info = {
        "torch": torch.__version__, "sae_lens": sae_lens.__version__, "python": platform.python_version(),
        "cpu": cpu_model(), "cpus": os.cpu_count(), "threads": a.threads, "flexmodel_cli": a.flexmodel,
        "d_in": D_IN, "d_sae": a.d_sae, "batch_tokens": a.batch_tokens, "tokens_per_run": a.tokens,
        "steps_per_run": a.tokens // a.batch_tokens, "reps": a.reps, "lr": a.lr, "seed": a.seed, "hook": a.hook,
        "dataset": str(ddir), "dataset_tokens": a.dataset_tokens, "archs": a.archs, "quick": a.quick,
        "loadavg_start": load_start, "saelens_malloc": a.peer_malloc,
    }
    print(f"torch {info['torch']}, sae_lens {info['sae_lens']}, {info['cpu']} ({info['cpus']} cpus), "
          f"{a.threads} threads; load average {load_start[0]:.2f}", flush=True)

    ensure_dataset(a, ddir)
    info["dataset_check"] = check_with_flexmodel_reader(a, ddir)
    print(f"dataset: flexmodel reader: {info['dataset_check']}", flush=True)
    torch.set_num_threads(a.threads)  # again, in case importing flexmodel changed it
    acts = load_tokens(ddir, a.hook, a.tokens)
    batches = list(acts.split(a.batch_tokens))
    print(f"SAELens data: {len(batches)} batches of {a.batch_tokens} tokens, mean norm "
          f"{acts.norm(dim=1).mean():.1f}", flush=True)

    cases = [(start, arch) for start in a.starts for arch in a.archs]
    starts = {}
    for start, arch in cases:
        if start == "trained":
            folder, m = ensure_pretrained(arch, a, ddir, work)
            starts[arch] = folder
            info.setdefault("pretrained", {})[arch] = {"folder": str(folder), "last_metrics": m}
            print(f"trained start {arch}: {folder} (after {a.pretrain_tokens} tokens: L0 {m.get('l0', 0):.1f}, "
                  f"explained variance {m.get('explained_variance', 0):.3f})", flush=True)
    saelens = {c: [] for c in cases}
    flex = {c: [] for c in cases}
    t_start = time.perf_counter()
    for rep in range(a.reps):
        for start, arch in cases:
            start_dir = starts[arch] if start == "trained" else None
            order = ("saelens", "flexmodel") if rep % 2 == 0 else ("flexmodel", "saelens")
            for who in order:
                if who == "saelens":
                    r = run_saelens(arch, a, batches, start_dir)
                    saelens[(start, arch)].append(r)
                    print(f"rep {rep} {start:7s} {arch:9s} SAELens   {r['tokens_per_s']:10,.0f} tokens/s "
                          f"({r['s_per_step']:.3f} s/step; last loss {r['last_loss']:.4g}, L0 {r['last_l0']:.1f}, "
                          f"EV {r['last_explained_variance']:.3f})", flush=True)
                else:
                    r = run_flexmodel(arch, a, ddir, work / f"flex-out-{arch}", start_dir)
                    flex[(start, arch)].append(r)
                    if r["tokens_per_s"] is None:
                        print(f"rep {rep} {start:7s} {arch:9s} flexmodel n/a: {r['error']}\n  $ {r['command']}",
                              flush=True)
                        if r.get("stderr_tail"):
                            print("  " + r["stderr_tail"].replace("\n", "\n  "), flush=True)
                    else:
                        print(f"rep {rep} {start:7s} {arch:9s} flexmodel {r['tokens_per_s']:10,.0f} tokens/s "
                              f"(last L0 {fmt(r.get('last_l0'), 1)}, EV {fmt(r.get('last_explained_variance'), 3)}; "
                              f"{r['trained_line']})", flush=True)
    info["bench_seconds"] = time.perf_counter() - t_start
    info["loadavg_end"] = os.getloadavg()

    rows, summary = [], {}
    for start, arch in cases:
        s_runs, f_runs = saelens[(start, arch)], flex[(start, arch)]
        s_vals = [r["tokens_per_s"] for r in s_runs]
        f_vals = [r["tokens_per_s"] for r in f_runs if r["tokens_per_s"] is not None]
        s_med = statistics.median(s_vals)
        f_med = statistics.median(f_vals) if f_vals else None
        ratio = f_med / s_med if f_med else None
        l0s = [r.get("last_l0") for r in f_runs if r.get("last_l0") is not None]
        summary[f"{start}/{arch}"] = {"start": start, "arch": arch, "saelens_tokens_per_s": s_med,
                                      "flexmodel_tokens_per_s": f_med, "ratio": ratio,
                                      "saelens_runs": s_runs, "flexmodel_runs": f_runs}
        per_rep_s = ", ".join(f"{v:,.0f}" for v in s_vals)
        per_rep_f = ", ".join(fmt(r["tokens_per_s"]) for r in f_runs)
        l0 = f"{s_runs[-1]['last_l0']:.0f} / {fmt(l0s[-1] if l0s else None)}"
        rows.append(f"| {arch} | {start} | {l0} | {fmt(s_med)} | {fmt(f_med)} | {fmt(ratio, 2)} | {per_rep_s} | "
                    f"{per_rep_f} |")

    steps = a.tokens // a.batch_tokens
    print()
    print(f"SAE training, d_in {D_IN} x d_sae {a.d_sae}, batch {a.batch_tokens} tokens, {a.tokens} tokens "
          f"({steps} steps) per run, {a.threads} threads, median of {a.reps} repeat(s), tokens/s; SAELens's "
          f"malloc: {'as shipped' if a.peer_malloc == 'default' else 'keeping freed memory, as flexmodel'}:")
    print()
    if "trained" in a.starts:
        print(f"start 'trained': both continue from one dictionary flexmodel trained first for {a.pretrain_tokens} "
              f"tokens (batches of {a.pretrain_batch_tokens}, lr "
              f"{', '.join(f'{x} {pretrain_lr(x, a):g}' for x in a.archs)}); 'random': a fresh initialisation. "
              f"L0: at the last timed step (SAELens / flexmodel).")
        print()
    print("| architecture | start | L0 | SAELens 6.54 | flexmodel | flexmodel / SAELens | SAELens per repeat | "
          "flexmodel per repeat |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print()
    print(f"torch {info['torch']}, sae_lens {info['sae_lens']}, {info['cpu']}, {info['cpus']} cpus; "
          f"1-min load average {info['loadavg_start'][0]:.2f} at start, {info['loadavg_end'][0]:.2f} at end; "
          f"benchmark {info['bench_seconds']:.0f} s")
    info["results"] = summary
    out = work / "results.json"
    out.write_text(json.dumps(info, indent=1))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
