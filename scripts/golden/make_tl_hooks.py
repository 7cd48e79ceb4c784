#!/usr/bin/env python3
"""What TransformerLens 4.3.0's hook names hold, on three tiny checkpoints.

    python3 scripts/golden/make_tl_hooks.py [OUT]      (OUT defaults to tests/data/tl_hooks)

Run with the main interpreter (transformer-lens 4.3.0, transformers 5.23.0, torch 2.13.0
CPU), not scripts/golden/.venv-sae (that one pins transformer-lens 3.9). No network: the
checkpoints are tests/data/golden5/{gpt2,gemma2,gemma3_text} and the tokenizer TL insists
on is a word-level stub built here (the token ids are passed to TL directly, so it is
never used to encode anything).

For each case the checkpoint is loaded with

    TransformerBridge.boot_transformers(<local dir>, device="cpu", dtype=torch.float32,
                                        tokenizer=<stub>)

(TL 4.x has no HookedTransformer; boot_transformers loads the HF model with eager
attention and keeps its weights unprocessed, no fold_ln / centering), hook_mlp_in is
switched on with bridge.set_use_hook_mlp_in(True) (it never fires otherwise), and
bridge.run_with_cache(input_ids) runs on 2 rows of 12 ids. Written to
OUT/<case>.safetensors: input_ids (int64), logits and, for every layer L, the cache
entries named in HOOKS (keys are the TL hook names, values contiguous float32).

The script then runs the same checkpoint in plain Transformers (eager attention) with
forward hooks on its modules and prints, for every hook name, the Transformers
expression it equals, the shape and the max abs difference over all layers, plus the
difference to the nearest plausible alternative (to show the test can tell them apart).
It fails if any TL hook differs from its expression by more than TOL. Seeded and
single-threaded: a second run writes the same bytes.
"""
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import torch  # noqa: E402
import transformers  # noqa: E402
import transformer_lens  # noqa: E402
from importlib.metadata import version  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from tokenizers import Tokenizer, models  # noqa: E402
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast  # noqa: E402
from transformer_lens.model_bridge import TransformerBridge  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SRC = os.path.join(ROOT, "tests", "data", "golden5")
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "data", "tl_hooks")
CASES = ["gpt2", "gemma2", "gemma3_text"]
TOL = 1e-5
HOOKS = ["hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out", "hook_mlp_out",
         "hook_mlp_in", "ln2.hook_normalized", "attn.hook_z", "attn.hook_pattern"]

torch.set_num_threads(1)
torch.manual_seed(0)


def stub_tokenizer(vocab_size):
    """Word-level tokenizer "t<i>" -> i; boot_transformers requires some tokenizer.

    name_or_path must be set (TL pops it) and add_bos_token=True stops TL from
    re-loading the tokenizer by name."""
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="t2", eos_token="t1", pad_token="t0",
                                   unk_token="t0", add_bos_token=True, name_or_path="wordlevel-stub")


def input_ids(vocab_size):
    g = torch.Generator().manual_seed(20261124)
    return torch.randint(3, vocab_size, (2, 12), generator=g)


def run_tl(path, ids, vocab_size):
    bridge = TransformerBridge.boot_transformers(path, device="cpu", dtype=torch.float32,
                                                 tokenizer=stub_tokenizer(vocab_size))
    bridge.eval()
    # Without this flag blocks.L.hook_mlp_in never fires (as in legacy HookedTransformer).
    _, cache_off = bridge.run_with_cache(ids)
    mlp_in_without_flag = "blocks.0.hook_mlp_in" in cache_off
    bridge.set_use_hook_mlp_in(True)
    with torch.no_grad():
        logits, cache = bridge.run_with_cache(ids)
    return logits, cache, mlp_in_without_flag


def first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


class Recorder:
    """Forward (pre-)hooks on plain Transformers modules: name -> tensor."""

    def __init__(self):
        self.t, self.handles = {}, []

    def inp(self, module, name):
        def h(_m, args, kwargs):
            self.t[name] = (args[0] if args else kwargs["hidden_states"]).detach().clone()
        self.handles.append(module.register_forward_pre_hook(h, with_kwargs=True))

    def out(self, module, name, index=None):
        def h(_m, _a, o):
            self.t[name] = (first(o) if index is None else o[index]).detach().clone()
        self.handles.append(module.register_forward_hook(h))


def unaffine_layernorm(x, eps):
    x = x - x.mean(-1, keepdim=True)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def unaffine_rmsnorm(x, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def run_hf(path, ids):
    """Plain Transformers, eager attention; returns logits and per-layer expressions."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    cfg = model.config
    rec = Recorder()
    gpt2 = cfg.model_type == "gpt2"
    if gpt2:
        base, layers = model.transformer, model.transformer.h
        rec.out(base.wte, "wte")
        rec.out(base.wpe, "wpe")
        for i, l in enumerate(layers):
            rec.inp(l, f"{i}.layer_in")
            rec.out(l, f"{i}.layer_out")
            rec.out(l.attn, f"{i}.attn_out")
            rec.out(l.attn, f"{i}.attn_weights", index=1)
            rec.inp(l.attn.c_proj, f"{i}.o_in")
            rec.inp(l.ln_2, f"{i}.ln2_in")
            rec.out(l.ln_2, f"{i}.ln2_out")
            rec.out(l.mlp, f"{i}.mlp_out")
    else:
        base, layers = model.model, model.model.layers
        rec.out(base.embed_tokens, "embed_tokens")
        for i, l in enumerate(layers):
            rec.inp(l, f"{i}.layer_in")
            rec.out(l, f"{i}.layer_out")
            rec.out(l.self_attn, f"{i}.attn_out")
            rec.out(l.self_attn, f"{i}.attn_weights", index=1)
            rec.inp(l.self_attn.o_proj, f"{i}.o_in")
            rec.out(l.post_attention_layernorm, f"{i}.post_attn_ln_out")
            rec.inp(l.pre_feedforward_layernorm, f"{i}.ln2_in")
            rec.out(l.pre_feedforward_layernorm, f"{i}.ln2_out")
            rec.out(l.mlp, f"{i}.mlp_out")
            rec.out(l.post_feedforward_layernorm, f"{i}.post_ffw_ln_out")
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits
    r = rec.t
    n_heads = cfg.num_attention_heads
    d_head = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads
    if gpt2:
        raw_embed = base.wte.weight[ids]
    else:
        raw_embed = base.embed_tokens.weight[ids]
    return model, logits, r, raw_embed, n_heads, d_head


def expectations(model, r, raw_embed, n_heads, d_head, layer):
    """hook -> [(expression, tensor)], the first being what TL 4.3 gives, the rest alternatives."""
    cfg = model.config
    i = layer
    B, T = raw_embed.shape[:2]
    z = r[f"{i}.o_in"].reshape(B, T, n_heads, d_head)
    if cfg.model_type == "gpt2":
        eps = cfg.layer_norm_epsilon
        c_proj = model.transformer.h[i].attn.c_proj
        return {
            "hook_resid_pre": [("h[L] input (L=0: wte(ids) + wpe(pos))", r[f"{i}.layer_in"])],
            "hook_attn_out": [("h[L].attn(...)[0] = c_proj(merge_heads(z)) incl. c_proj.bias", r[f"{i}.attn_out"]),
                              ("same without c_proj.bias", r[f"{i}.attn_out"] - c_proj.bias.detach())],
            "hook_resid_mid": [("h[L] input + attn(...)[0] = ln_2 input", r[f"{i}.ln2_in"])],
            "hook_mlp_in": [("ln_2 input (= resid_mid)", r[f"{i}.ln2_in"]),
                            ("ln_2 output (MLP input)", r[f"{i}.ln2_out"])],
            "ln2.hook_normalized": [("(x - mean) * rsqrt(var + eps), x = ln_2 input; no weight/bias",
                                     unaffine_layernorm(r[f"{i}.ln2_in"], eps)),
                                    ("ln_2 output (MLP input)", r[f"{i}.ln2_out"])],
            "hook_mlp_out": [("h[L].mlp output (c_proj incl. bias)", r[f"{i}.mlp_out"])],
            "hook_resid_post": [("h[L] output", r[f"{i}.layer_out"])],
            "attn.hook_z": [("attn.c_proj input viewed [B, T, heads, d_head]", z)],
            "attn.hook_pattern": [("attn(...)[1] eager softmax weights [B, heads, q, k]",
                                   r[f"{i}.attn_weights"])],
        }
    eps = cfg.rms_norm_eps
    return {
        "hook_resid_pre": [("layers[L] input (L=0: embed_tokens output)", r[f"{i}.layer_in"])],
        "hook_attn_out": [("post_attention_layernorm(self_attn(...)[0])", r[f"{i}.post_attn_ln_out"]),
                          ("self_attn(...)[0] (o_proj output, before the post-norm)", r[f"{i}.attn_out"])],
        "hook_resid_mid": [("layers[L] input + post_attention_layernorm(self_attn out) "
                            "= pre_feedforward_layernorm input", r[f"{i}.ln2_in"])],
        "hook_mlp_in": [("pre_feedforward_layernorm input (= resid_mid)", r[f"{i}.ln2_in"]),
                        ("pre_feedforward_layernorm output (MLP input)", r[f"{i}.ln2_out"])],
        "ln2.hook_normalized": [("x * rsqrt(mean(x^2) + eps), x = pre_feedforward_layernorm input; "
                                 "no (1 + weight)", unaffine_rmsnorm(r[f"{i}.ln2_in"], eps)),
                                ("pre_feedforward_layernorm output (MLP input)", r[f"{i}.ln2_out"])],
        "hook_mlp_out": [("post_feedforward_layernorm(mlp(...))", r[f"{i}.post_ffw_ln_out"]),
                         ("mlp(...) output (down_proj, before the post-norm)", r[f"{i}.mlp_out"])],
        "hook_resid_post": [("layers[L] output", r[f"{i}.layer_out"])],
        "attn.hook_z": [("self_attn.o_proj input viewed [B, T, heads, d_head]", z)],
        "attn.hook_pattern": [("self_attn(...)[1] eager softmax weights [B, heads, q, k] "
                               "(after soft-cap and sliding/causal mask)", r[f"{i}.attn_weights"])],
    }


def maxdiff(a, b):
    return float((a.detach().float() - b.detach().float()).abs().max())


def main():
    os.makedirs(OUT, exist_ok=True)
    print(f"transformer-lens {version('transformer-lens')}, transformers {transformers.__version__}, "
          f"torch {torch.__version__}")
    failures = []
    for case in CASES:
        path = os.path.join(SRC, case)
        model_cfg = transformers.AutoConfig.from_pretrained(path)
        vocab = model_cfg.vocab_size
        ids = input_ids(vocab)
        tl_logits, cache, mlp_in_without_flag = run_tl(path, ids, vocab)
        model, hf_logits, r, raw_embed, n_heads, d_head = run_hf(path, ids)
        n_layers = model.config.num_hidden_layers
        d_logits = maxdiff(tl_logits, hf_logits)
        print(f"\n== {case}: {n_layers} layers, input_ids {tuple(ids.shape)}; "
              f"max |TL logits - Transformers logits| = {d_logits:.3g}; "
              f"hook_mlp_in cached without set_use_hook_mlp_in(True): {mlp_in_without_flag}")
        if d_logits > TOL:
            failures.append(f"{case}: logits {d_logits}")

        tensors = {"input_ids": ids.contiguous(), "logits": tl_logits.detach().float().clone().contiguous()}
        names = ["hook_embed"] + (["hook_pos_embed"] if model.config.model_type == "gpt2" else [])
        names += [f"blocks.{L}.{h}" for L in range(n_layers) for h in HOOKS]
        for name in names:
            if name not in cache:
                print(f"  MISSING in TL cache: {name}")
                continue
            tensors[name] = cache[name].detach().float().clone().contiguous()  # several names alias one tensor

        # hook_embed / hook_pos_embed
        rows = []
        if model.config.model_type == "gpt2":
            rows.append(("hook_embed", [("transformer.wte(ids) (raw lookup)", r["wte"])]))
            rows.append(("hook_pos_embed", [("transformer.wpe(arange(T)), broadcast to [B, T, d]",
                                             r["wpe"].expand_as(r["wte"]))]))
        else:
            scale = model.config.hidden_size ** 0.5
            rows.append(("hook_embed", [
                ("embed_tokens(ids) = weight[ids] * sqrt(hidden) (scaled, as cast to fp32)", r["embed_tokens"]),
                ("weight[ids] (raw lookup, unscaled)", raw_embed)]))
            assert maxdiff(r["embed_tokens"], raw_embed * torch.tensor(scale, dtype=torch.float32)) < 1e-6
        per_layer = [expectations(model, r, raw_embed, n_heads, d_head, L) for L in range(n_layers)]
        for hook in HOOKS:
            exprs = [e for e, _ in per_layer[0][hook]]
            merged = []
            for k, expr in enumerate(exprs):
                merged.append((expr, [per_layer[L][hook][k][1] for L in range(n_layers)]))
            rows.append((f"blocks.L.{hook}", merged))
        print(f"  {'hook':28} {'shape':16} {'max|diff|':>9}  expression   [alternative: max|diff|]")
        for hook, cands in rows:
            if hook.startswith("blocks.L."):
                tl = [tensors.get(hook.replace("blocks.L.", f"blocks.{L}.")) for L in range(n_layers)]
                if any(t is None for t in tl):
                    print(f"  {hook:28} missing in TL")
                    continue
                diffs = [max(maxdiff(a, b) for a, b in zip(tl, c)) for _, c in cands]
                shape = tuple(tl[0].shape)
            else:
                tl = tensors[hook]
                diffs = [maxdiff(tl, c) for _, c in cands]
                shape = tuple(tl.shape)
            alt = "".join(f"   [{e}: {d:.3g}]" for (e, _), d in zip(cands[1:], diffs[1:]))
            print(f"  {hook:28} {str(shape):16} {diffs[0]:9.3g}  {cands[0][0]}{alt}")
            if diffs[0] > TOL:
                failures.append(f"{case} {hook}: {diffs[0]}")
        save_file(tensors, os.path.join(OUT, f"{case}.safetensors"),
                  # One key only: safetensors writes metadata in hash-map order.
                  metadata={"made_by": f"scripts/golden/make_tl_hooks.py from tests/data/golden5/{case}; "
                                       f"transformer-lens {version('transformer-lens')}, "
                                       f"transformers {transformers.__version__}, "
                                       f"torch {torch.__version__.split('+')[0]}"})
    if failures:
        print("\nFAILED:", *failures, sep="\n  ")
        sys.exit(1)


if __name__ == "__main__":
    main()
