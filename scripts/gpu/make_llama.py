#!/usr/bin/env python3
"""Writes a Llama-shaped Hugging Face folder with random bf16 weights.

    python3 scripts/gpu/make_llama.py DIR [--hidden 2048] [--layers 24] [--intermediate 8192]
        [--heads 16] [--kv-heads 8] [--vocab 32000] [--seed 0]

DIR gets config.json (LlamaForCausalLM, torch_dtype bfloat16, untied lm_head)
and one model.safetensors (one file, not shards: Transformers' disk offload
indexes a single safetensors file directly). Weights are normal(0, 0.02)
drawn on the GPU when there is one; the norms are ones. Names are
Transformers' (model.embed_tokens.weight, model.layers.N.self_attn.q_proj.weight,
..., model.norm.weight, lm_head.weight). When DIR already holds both files for
the same shape, nothing is written. Prints one JSON line with the sizes.
"""
import argparse
import json
import os
import sys
import time


def shapes(c):
    h, i, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    q = c["num_attention_heads"] * c["head_dim"]
    kv = c["num_key_value_heads"] * c["head_dim"]
    out = [("model.embed_tokens.weight", (v, h))]
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}."
        out += [
            (p + "self_attn.q_proj.weight", (q, h)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.o_proj.weight", (h, q)),
            (p + "mlp.gate_proj.weight", (i, h)),
            (p + "mlp.up_proj.weight", (i, h)),
            (p + "mlp.down_proj.weight", (h, i)),
            (p + "input_layernorm.weight", (h,)),
            (p + "post_attention_layernorm.weight", (h,)),
        ]
    out += [("model.norm.weight", (h,)), ("lm_head.weight", (v, h))]
    return out


def sizes(c, bytes_per=2):
    """Bytes of the pieces Accelerate places: embeddings, one block, the head, all."""
    per = {}
    for name, shp in shapes(c):
        n = 1
        for d in shp:
            n *= d
        per[name] = n * bytes_per
    block = sum(b for k, b in per.items() if k.startswith("model.layers.0."))
    return {
        "embed_bytes": per["model.embed_tokens.weight"],
        "block_bytes": block,
        "norm_bytes": per["model.norm.weight"],
        "lm_head_bytes": per["lm_head.weight"],
        "total_bytes": sum(per.values()),
        "layers": c["num_hidden_layers"],
    }


def make_config(a):
    head_dim = a.hidden // a.heads
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": a.vocab,
        "hidden_size": a.hidden,
        "intermediate_size": a.intermediate,
        "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "use_cache": True,
        "torch_dtype": "bfloat16",
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--intermediate", type=int, default=8192)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.hidden % a.heads or a.heads % a.kv_heads:
        sys.exit("make_llama: heads must divide hidden and kv-heads must divide heads")

    cfg = make_config(a)
    cfg_path = os.path.join(a.dir, "config.json")
    st_path = os.path.join(a.dir, "model.safetensors")
    info = sizes(cfg)
    if os.path.exists(cfg_path) and os.path.exists(st_path):
        with open(cfg_path) as f:
            old = json.load(f)
        same = all(old.get(k) == v for k, v in cfg.items() if k != "architectures")
        if same:
            print(json.dumps({"make_llama": "exists", "dir": a.dir, **info}), flush=True)
            return
        print(f"make_llama: {a.dir} holds another shape; rewriting", file=sys.stderr, flush=True)

    import torch
    from safetensors.torch import save_file

    t0 = time.time()
    os.makedirs(a.dir, exist_ok=True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=dev)
    gen.manual_seed(a.seed)
    tensors = {}
    for name, shp in shapes(cfg):
        if name.endswith("norm.weight"):
            t = torch.ones(shp, dtype=torch.bfloat16)
        else:
            t = torch.empty(shp, dtype=torch.bfloat16, device=dev).normal_(0.0, 0.02, generator=gen).cpu()
        tensors[name] = t.contiguous()
    # Temporary names, then renames: an interrupted run never leaves a folder that looks complete.
    tmp_st = st_path + ".tmp"
    save_file(tensors, tmp_st, metadata={"format": "pt"})
    os.replace(tmp_st, st_path)
    with open(cfg_path + ".tmp", "w") as f:
        json.dump(cfg, f, indent=2)
    os.replace(cfg_path + ".tmp", cfg_path)
    print(json.dumps({"make_llama": "written", "dir": a.dir, "seconds": round(time.time() - t0, 1), **info}),
          flush=True)


if __name__ == "__main__":
    main()
