#!/usr/bin/env python3
"""Hugging Face side of scripts/gpu/bench.sh: Transformers + Accelerate big-model inference.

    python3 scripts/gpu/bench_accelerate.py --model DIR --config NAME --map-out MAP.json
        [--gpu-blocks K|all] [--cpu-blocks M|rest] [--max-memory JSON] [--offload-folder DIR]
        [--prompt-len 512] [--new-tokens 64] [--repeats 2] [--hook-repeats 2]
        [--warmup-tokens 16] [--capture 12]

Loads DIR with AutoModelForCausalLM.from_pretrained(device_map="auto", max_memory=...,
dtype=bfloat16, offload_folder=...). max_memory is --max-memory when given, else
computed from config.json so that Accelerate's infer_auto_device_map puts the
embeddings and K decoder blocks on GPU 0, M blocks on the CPU and the rest (with
whatever follows them: norm, lm_head) on disk. model.hf_device_map is written to
--map-out before anything runs (bench_gpu_offload loads exactly that map).

Then greedy generation from a fixed prompt (the same ids bench_gpu_offload uses):
one warm-up generate of --warmup-tokens tokens, then --repeats timed generates
of --new-tokens tokens, each followed (the first --hook-repeats times) by one
with forward hooks on model.layers.{0..N-1}.mlp that copy every output to the
CPU, as a Python user would capture them. A StoppingCriteria that synchronizes
the GPU and reads the clock after every token gives the prompt latency (time
from generate() to the first token) and the decode speed ((new tokens - 1) /
time from the first to the last token). One JSON line per run on stdout; logs
go to stderr.
"""
import argparse
import json
import os
import sys
import time
import traceback


def log(*a):
    print("[bench_accelerate]", *a, file=sys.stderr, flush=True)


def prompt_ids(length, vocab):
    """A 31-bit LCG, ids in [3, vocab): the same sequence as bench_gpu_offload.cpp."""
    x, out = 12345, []
    for _ in range(length):
        x = (1103515245 * x + 12345) % (1 << 31)
        out.append(3 + (x >> 8) % (vocab - 3))
    return out


def block_sizes(cfg, bytes_per=2):
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q = cfg["num_attention_heads"] * hd
    kv = cfg.get("num_key_value_heads", cfg["num_attention_heads"]) * hd
    block = (h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h) * bytes_per
    embed = v * h * bytes_per
    head = 0 if cfg.get("tie_word_embeddings", False) else v * h * bytes_per
    return block, embed, head


def plan_max_memory(cfg, gpu_blocks, cpu_blocks):
    """A max_memory for which infer_auto_device_map gives `gpu_blocks` blocks on
    GPU 0, `cpu_blocks` on the CPU, the rest on disk. It fills devices in order
    and keeps room for the largest remaining layer on GPU 0 and on the CPU; the
    top-level "model" is treated (and split) first, after which the largest
    remaining layer is lm_head (when untied). Half a block of slack absorbs the
    buffers (rotary inv_freq)."""
    layers = cfg["num_hidden_layers"]
    block, embed, head = block_sizes(cfg)
    reserve = head if head else max(block, embed)
    total = embed + layers * block + head
    slack = block // 2
    if gpu_blocks >= layers:
        return {0: int(2 * total + (4 << 30)), "cpu": int(4 * total)}
    gpu = embed + gpu_blocks * block + reserve + slack
    if cpu_blocks is None or gpu_blocks + cpu_blocks >= layers:
        cpu = int(4 * total)
    else:
        cpu = cpu_blocks * block + reserve + slack
    return {0: int(gpu), "cpu": int(cpu)}


def device_of(device_map, name):
    """The device of `name` under an hf_device_map (closest dotted ancestor, '' included)."""
    parts = name.split(".")
    for n in range(len(parts), -1, -1):
        key = ".".join(parts[:n])
        if key in device_map:
            return device_map[key]
    return None


def block_counts(device_map, layers):
    counts = {"gpu": 0, "cpu": 0, "disk": 0}
    for n in range(layers):
        d = device_of(device_map, f"model.layers.{n}")
        if d in ("cpu", "disk"):
            counts[d] += 1
        elif d is not None:
            counts["gpu"] += 1
        else:
            counts["cpu"] += 1
    return counts


def json_device(d):
    """hf_device_map values as JSON: GPU ordinals stay ints, the rest strings."""
    if isinstance(d, int):
        return d
    s = str(d)
    if s.startswith("cuda:") and s[5:].isdigit():
        return int(s[5:])
    return s


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--config", default="unnamed")
    p.add_argument("--map-out", required=True)
    p.add_argument("--gpu-blocks", default="all")
    p.add_argument("--cpu-blocks", default="rest")
    p.add_argument("--max-memory", default=None, help='JSON, e.g. {"0": "2GiB", "cpu": "30GiB"}')
    p.add_argument("--offload-folder", default=None)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--hook-repeats", type=int, default=None, help="default: --repeats")
    # 16, not 4: on the H200 of 2026-11-28 (one run per row) the first timed
    # gpu-only generate after a 4-token warm-up ran at 16.4 tok/s and the
    # hooked one after it at 50.2: the device was still warming up.
    p.add_argument("--warmup-tokens", type=int, default=16)
    p.add_argument("--capture", type=int, default=0)
    a = p.parse_args()
    if a.new_tokens < 2 or a.repeats < 1:
        sys.exit("bench_accelerate: need --new-tokens >= 2 and --repeats >= 1")
    hook_repeats = a.repeats if a.hook_repeats is None else a.hook_repeats

    with open(os.path.join(a.model, "config.json")) as f:
        cfg = json.load(f)
    layers = cfg["num_hidden_layers"]

    if a.max_memory:
        max_memory = {}
        for k, v in json.loads(a.max_memory).items():
            max_memory[int(k) if str(k).isdigit() else k] = v
    else:
        gpu_blocks = layers if a.gpu_blocks == "all" else int(a.gpu_blocks)
        cpu_blocks = None if a.cpu_blocks == "rest" else int(a.cpu_blocks)
        max_memory = plan_max_memory(cfg, gpu_blocks, cpu_blocks)
    log("max_memory", max_memory)

    import torch
    import transformers
    import accelerate
    from transformers import AutoModelForCausalLM, StoppingCriteria, StoppingCriteriaList

    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "accelerate": accelerate.__version__}
    log("versions", versions)
    cuda = torch.cuda.is_available()
    if not cuda and any(isinstance(k, int) for k in max_memory):
        # No GPU (a smoke run on a CPU machine): Transformers refuses GPU budgets; everything goes to the CPU.
        max_memory = {k: v for k, v in max_memory.items() if not isinstance(k, int)}
        log("no CUDA device: GPU budgets dropped, max_memory", max_memory)
    if a.offload_folder:
        os.makedirs(a.offload_folder, exist_ok=True)

    def load(dtype_kw):
        kw = {"device_map": "auto", "max_memory": max_memory, dtype_kw: torch.bfloat16}
        if a.offload_folder:
            kw["offload_folder"] = a.offload_folder
        return AutoModelForCausalLM.from_pretrained(a.model, **kw)

    t0 = time.perf_counter()
    try:
        model = load("dtype")  # Transformers >= 4.56 (5.x: torch_dtype is deprecated)
    except TypeError as e:
        log("dtype= rejected (", e, "); using torch_dtype=")
        model = None
    if model is not None:
        # An older Transformers may take an unknown dtype= as a config attribute and load float32.
        floats = [q.dtype for q in model.parameters() if q.is_floating_point()]
        if floats and floats[0] != torch.bfloat16:
            log("dtype= was ignored (parameters are", floats[0], "); reloading with torch_dtype=")
            del model
            model = None
    if model is None:
        model = load("torch_dtype")
    model.eval()
    load_s = time.perf_counter() - t0

    hf_map = getattr(model, "hf_device_map", None)
    if not hf_map:
        # Transformers 5 dispatches (and records hf_device_map) only for a map with several devices or disk;
        # a model wholly on one device (the gpu-only config) has none: its map is that one device.
        devices = {p.device for p in model.parameters()} | {b.device for b in model.buffers()}
        if len(devices) != 1:
            sys.exit(f"bench_accelerate: no hf_device_map and parameters on several devices: {sorted(map(str, devices))}")
        only = devices.pop()
        hf_map = {"": only.index if only.type == "cuda" and only.index is not None else str(only)}
        log("no hf_device_map (one device); using", hf_map)
    device_map = {k: json_device(v) for k, v in hf_map.items()}
    tmp = a.map_out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(device_map, f, indent=1)
    os.replace(tmp, a.map_out)
    counts = block_counts(device_map, layers)
    log("hf_device_map", json.dumps(device_map))
    log("blocks per device", counts, "load", round(load_s, 1), "s")

    gpus = [d for d in device_map.values() if isinstance(d, int)]
    device = torch.device(f"cuda:{gpus[0]}" if (gpus and cuda) else "cpu")
    vocab = cfg["vocab_size"]
    ids = torch.tensor([prompt_ids(a.prompt_len, vocab)], dtype=torch.long, device=device)
    mask = torch.ones_like(ids)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    class StepClock(StoppingCriteria):
        """Never stops; records when each new token is there (GPU synchronized)."""

        def __init__(self):
            self.times = []

        def __call__(self, input_ids, scores, **kwargs):
            sync()
            self.times.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def generate(n):
        clock = StepClock()
        sync()
        t_start = time.perf_counter()
        out = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            use_cache=True,
            pad_token_id=0,
            stopping_criteria=StoppingCriteriaList([clock]),
        )
        sync()
        t_end = time.perf_counter()
        seq = out if torch.is_tensor(out) else out.sequences
        new = seq[0, ids.shape[1]:].tolist()
        tt = clock.times
        return {
            "prompt_ms": 1e3 * (tt[0] - t_start) if tt else None,
            "decode_tok_s": (len(tt) - 1) / (tt[-1] - tt[0]) if len(tt) >= 2 else None,
            "total_s": t_end - t_start,
            "generated": len(new),
            "steps_timed": len(tt),
            "tokens_head": new[:8],
        }

    capture_names = [f"model.layers.{i}.mlp" for i in range(min(a.capture, layers))]
    captured = {}

    def add_hooks():
        handles = []
        for name in capture_names:
            def hook(module, inputs, output, name=name):
                t = output[0] if isinstance(output, (tuple, list)) else output
                captured.setdefault(name, []).append(t.detach().to("cpu"))
            handles.append(model.get_submodule(name).register_forward_hook(hook))
        return handles

    base = {
        "impl": "accelerate",
        "config": a.config,
        "prefetch": None,
        "prompt_len": a.prompt_len,
        "new_tokens": a.new_tokens,
        "dtype": "bfloat16",
        "device": str(device),
        "load_s": load_s,
        "device_map_counts": counts,
        "max_memory": {str(k): v for k, v in max_memory.items()},
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "versions": versions,
    }
    ok = True

    def emit(run, capture, r, extra=None):
        nonlocal ok
        line = dict(base, capture=capture, run=run, **r)
        if cuda:
            line["gpu_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        if extra:
            line.update(extra)
        if r["generated"] != a.new_tokens or r["steps_timed"] != a.new_tokens:
            ok = False
        print(json.dumps(line), flush=True)

    with torch.no_grad():  # what generate() itself uses; Accelerate's offload hooks run under it
        generate(a.warmup_tokens)
        if capture_names:
            hs = add_hooks()
            generate(min(a.warmup_tokens, 2))
            for h in hs:
                h.remove()
            captured.clear()
        for run in range(a.repeats):
            plain = generate(a.new_tokens)
            emit(run, 0, plain)
            if not capture_names or run >= hook_repeats:
                continue
            captured.clear()
            hs = add_hooks()
            try:
                hooked = generate(a.new_tokens)
            finally:
                for h in hs:
                    h.remove()
            tensors = sum(len(v) for v in captured.values())
            on_cpu = all(t.device.type == "cpu" for v in captured.values() for t in v)
            per_module = all(len(captured.get(n, [])) == a.new_tokens for n in capture_names)
            nbytes = sum(t.numel() * t.element_size() for v in captured.values() for t in v)
            check = on_cpu and per_module
            ok = ok and check
            emit(run, len(capture_names), hooked, {
                "captured_tensors": tensors,
                "captured_mb": nbytes / 1e6,
                "captures_on_cpu_ok": check,
                "tokens_match_plain": hooked["tokens_head"] == plain["tokens_head"],
            })
            captured.clear()
    if not ok:
        log("a run generated too few tokens or a capture check failed")
        sys.exit(3)


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        sys.exit(1)
