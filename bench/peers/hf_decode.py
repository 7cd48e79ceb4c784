"""Transformers (+ bitsandbytes) greedy decoding, the peer of bench_decode.

Loads one checkpoint in one format, prints "ready", then for every line
"run" on stdin times a prompt forward and a greedy generate exactly as
bench_decode times flexmodel, and prints one JSON line:
{"prefill_ms", "total_ms", "tokens": [...]}.

    python hf_decode.py MODEL_DIR fp32|bf16|int8|nf4 --threads 2 --prompt 128 --new 128
"""
import argparse
import json
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM


def prompt_ids(n, vocab):
    # The same deterministic prompt bench_decode builds.
    return torch.tensor([[(i * 7919 + 13) % vocab for i in range(n)]], dtype=torch.long)


def load(model_dir, fmt):
    kw = {"device_map": "cpu"}
    if fmt == "fp32":
        kw["dtype"] = torch.float32
    elif fmt == "bf16":
        kw["dtype"] = torch.bfloat16
    else:
        from transformers import BitsAndBytesConfig
        kw["dtype"] = torch.bfloat16  # embeddings, norms and head, as bench_decode's quantized models
        if fmt == "int8":
            kw["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
        else:
            kw["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
    return AutoModelForCausalLM.from_pretrained(model_dir, **kw).eval()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model_dir")
    p.add_argument("format", choices=["fp32", "bf16", "int8", "nf4"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--new", type=int, default=128)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    try:
        model = load(a.model_dir, a.format)
    except Exception as e:  # bitsandbytes without a CPU backend, ...
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
        return
    ids = prompt_ids(a.prompt, model.config.vocab_size)
    versions = {"transformers": transformers.__version__, "torch": torch.__version__}
    if a.format in ("int8", "nf4"):
        import bitsandbytes
        versions["bitsandbytes"] = bitsandbytes.__version__
    print(json.dumps({"ready": True, "versions": versions}), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        with torch.inference_mode():
            t0 = time.perf_counter()
            model(ids)
            t1 = time.perf_counter()
            out = model.generate(ids, max_new_tokens=a.new, min_new_tokens=a.new, do_sample=False,
                                 pad_token_id=0, eos_token_id=None)
            t2 = time.perf_counter()
        print(json.dumps({"prefill_ms": (t1 - t0) * 1e3, "total_ms": (t2 - t1) * 1e3,
                          "tokens": out[0, a.prompt:].tolist()}), flush=True)


if __name__ == "__main__":
    main()
