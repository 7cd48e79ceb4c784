"""Attribution graphs: flexmodel against circuit-tracer 0.5.0, time and peak memory, one run.

    PY=$(bash scripts/golden/setup.sh --attribution)        # circuit-tracer's venv (.venv-ct)
    PYTHONPATH=build/python python3 bench/attribution/bench_attribution.py --ct-python $PY
        [--work DIR] [--tokens 64] [--d-sae 4096] [--max-feature-nodes 256] [--batch-size 64] [--reps 2]

The model is GPT-2-small shaped (12 layers, d 768, 12 heads, vocab 50257) with random weights,
written once as a Transformers folder; the transcoders are random per-layer ReLU transcoders
(SAELens folders, d_sae 4096, encoder bias set so that about 25 features fire per token and
layer). Each contender runs in a fresh process per repeat (flexmodel.attribute in this
interpreter, circuit-tracer's attribute() on the same weights in TransformerLens in its venv),
contenders alternating; each reports the seconds of the graph computation alone, the process's
resident size before it, and its peak resident size (ru_maxrss). Both graphs of the last repeat are
compared (same features, largest edge difference). Numbers are medians over repeats, from one run.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --- setup (this interpreter: transformers 5.23) ---------------------------------------------


def make_inputs(work, tokens, d_sae):
    from safetensors.torch import save_file
    model_dir = os.path.join(work, "gpt2-small-random")
    if not os.path.exists(os.path.join(model_dir, "config.json")):
        from transformers import GPT2Config, GPT2LMHeadModel
        torch.manual_seed(0)
        cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
        GPT2LMHeadModel(cfg).eval().save_pretrained(model_dir)
    tc_dir = os.path.join(work, f"transcoders-{d_sae}")
    if not os.path.exists(os.path.join(tc_dir, "layer_11", "cfg.json")):
        g = torch.Generator().manual_seed(1)
        d = 768
        for layer in range(12):
            out = os.path.join(tc_dir, f"layer_{layer}")
            os.makedirs(out, exist_ok=True)
            scale = 1.0
            tensors = {
                "W_enc": torch.randn(d, d_sae, generator=g) * scale / d**0.5,
                "b_enc": torch.full((d_sae,), -2.5 * scale),  # P(active) ~ 0.6%: ~25 of 4096 per token
                "W_dec": torch.randn(d_sae, d, generator=g) * 0.02,
                "b_dec": torch.zeros(d),
            }
            save_file(tensors, os.path.join(out, "sae_weights.safetensors"))
            cfg = {"architecture": "transcoder", "d_in": d, "d_sae": d_sae, "d_out": d, "dtype": "float32",
                   "device": "cpu", "apply_b_dec_to_input": False, "normalize_activations": "none",
                   "reshape_activations": "none",
                   "metadata": {"sae_lens_version": "6.54.12", "hook_name": f"blocks.{layer}.mlp.hook_in",
                                "hook_name_out": f"blocks.{layer}.mlp.hook_out", "model_name": "gpt2-small-random"}}
            with open(os.path.join(out, "cfg.json"), "w") as f:
                json.dump(cfg, f)
    ids = torch.randint(0, 50257, (tokens,), generator=torch.Generator().manual_seed(2))
    ids[0] = 50256  # <|endoftext|> first, as circuit-tracer prepends a special token
    ids_path = os.path.join(work, f"ids-{tokens}.pt")
    torch.save(ids, ids_path)
    return model_dir, tc_dir, ids_path


# --- contenders (each in its own process) ---------------------------------------------------


def run_flexmodel(a):
    import flexmodel
    model = flexmodel.from_pretrained(a.model)
    # Transcoders read before the clock starts, as circuit-tracer's are.
    tcs = [flexmodel.sae.load_sae(os.path.join(a.transcoders, f"layer_{l}")) for l in range(12)]
    ids = torch.load(a.ids)
    with torch.no_grad():
        model(ids.unsqueeze(0))  # weights paged in before the clock starts (circuit-tracer's are in memory)
    before = rss_mb()
    t0 = time.perf_counter()
    g = flexmodel.attribute(model, tcs, ids, batch_size=a.batch_size, max_feature_nodes=a.max_feature_nodes)
    seconds = time.perf_counter() - t0
    torch.save({"adjacency": g["adjacency"], "active_features": g["active_features"],
                "selected_features": g["selected_features"]}, a.graph_out)
    return {"seconds": seconds, "rss_before_mb": before, "peak_mb": peak_mb(),
            "active_features": int(g["active_features"].shape[0]), "nodes": int(g["adjacency"].shape[0])}


class IdTokenizer:
    all_special_ids = [50256]
    bos_token_id = pad_token_id = eos_token_id = 50256
    padding_side = "right"
    vocab_size = 50257

    def decode(self, ids):
        ids = ids.tolist() if hasattr(ids, "tolist") else ids
        return " ".join(str(i) for i in (ids if isinstance(ids, list) else [ids]))


def run_circuit_tracer(a):
    from safetensors.torch import load_file
    from circuit_tracer.attribution.attribute import attribute
    from circuit_tracer.replacement_model.replacement_model_transformerlens import TransformerLensReplacementModel
    from circuit_tracer.transcoder.single_layer_transcoder import SingleLayerTranscoder, TranscoderSet
    from transformer_lens import HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel.from_pretrained(a.model, dtype=torch.float32).eval()
    c = hf.config
    cfg = HookedTransformerConfig(
        n_layers=c.n_layer, d_model=c.n_embd, n_ctx=c.n_positions, d_head=c.n_embd // c.n_head, n_heads=c.n_head,
        d_mlp=4 * c.n_embd, d_vocab=c.vocab_size, act_fn="gelu_new", normalization_type="LN", eps=c.layer_norm_epsilon,
        positional_embedding_type="standard", original_architecture="GPT2LMHeadModel", model_name="gpt2-small-random",
        default_prepend_bos=False, dtype=torch.float32, device="cpu")
    weights = convert_gpt2_weights(hf, cfg)
    weights.setdefault("unembed.b_U", torch.zeros(c.vocab_size))
    del hf
    tcs = {}
    for layer in range(c.n_layer):
        w = load_file(os.path.join(a.transcoders, f"layer_{layer}", "sae_weights.safetensors"))
        d_sae = w["W_enc"].shape[1]
        t = SingleLayerTranscoder(c.n_embd, d_sae, torch.nn.ReLU(), layer, device="cpu", dtype=torch.float32)
        with torch.no_grad():
            t.W_enc.copy_(w["W_enc"].T)
            t.b_enc.copy_(w["b_enc"])
            t.W_dec.copy_(w["W_dec"])
            t.b_dec.copy_(w["b_dec"])
        tcs[layer] = t
    model = TransformerLensReplacementModel(cfg)
    model.load_state_dict(weights, strict=False)
    del weights
    model._configure_replacement_model(TranscoderSet(tcs, "mlp.hook_in", "mlp.hook_out", scan="bench"))
    model.tokenizer = IdTokenizer()
    model.eval()
    ids = torch.load(a.ids)
    with torch.no_grad():
        model(ids.unsqueeze(0))  # the same warm-up forward as flexmodel's
    before = rss_mb()
    t0 = time.perf_counter()
    g = attribute(ids, model, batch_size=a.batch_size, max_feature_nodes=a.max_feature_nodes)
    seconds = time.perf_counter() - t0
    torch.save({"adjacency": g.adjacency_matrix, "active_features": g.active_features,
                "selected_features": g.selected_features}, a.graph_out)
    return {"seconds": seconds, "rss_before_mb": before, "peak_mb": peak_mb(),
            "active_features": int(g.active_features.shape[0]), "nodes": int(g.adjacency_matrix.shape[0])}


# --- driver --------------------------------------------------------------------------------


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--run", choices=["flexmodel", "circuit-tracer"])
    p.add_argument("--ct-python", default=os.path.join(HERE, "../../scripts/golden/.venv-ct/bin/python"))
    p.add_argument("--work", default="/tmp/flexmodel-bench-attribution")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--d-sae", type=int, default=4096)
    p.add_argument("--max-feature-nodes", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model"), p.add_argument("--transcoders"), p.add_argument("--ids"), p.add_argument("--graph-out")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    if a.run:
        result = (run_flexmodel if a.run == "flexmodel" else run_circuit_tracer)(a)
        print("RESULT " + json.dumps(result))
        return
    os.makedirs(a.work, exist_ok=True)
    model, tcs, ids = make_inputs(a.work, a.tokens, a.d_sae)
    load0 = os.getloadavg()[0]
    results = {"flexmodel": [], "circuit-tracer": []}
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    for rep in range(a.reps):
        order = ["flexmodel", "circuit-tracer"] if rep % 2 == 0 else ["circuit-tracer", "flexmodel"]
        for who in order:
            py = sys.executable if who == "flexmodel" else a.ct_python
            cmd = [py, os.path.abspath(__file__), "--run", who, "--model", model, "--transcoders", tcs, "--ids", ids,
                   "--graph-out", os.path.join(a.work, f"graph-{who}.pt"), "--batch-size", str(a.batch_size),
                   "--max-feature-nodes", str(a.max_feature_nodes), "--threads", str(a.threads)]
            out = subprocess.run(cmd, capture_output=True, text=True, env=env)
            line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
            if out.returncode != 0 or not line:
                sys.exit(f"{who} failed:\n{out.stderr[-3000:]}")
            r = json.loads(line[0][7:])
            results[who].append(r)
            print(f"rep {rep} {who:15s} {r['seconds']:8.2f} s  peak {r['peak_mb']:8.0f} MB  "
                  f"(before the call {r['rss_before_mb']:.0f} MB)  {r['active_features']} active features, "
                  f"{r['nodes']} nodes", flush=True)
    f = torch.load(os.path.join(a.work, "graph-flexmodel.pt"))
    c = torch.load(os.path.join(a.work, "graph-circuit-tracer.pt"))
    same = torch.equal(f["active_features"], c["active_features"].to(torch.int64))
    same_sel = torch.equal(f["selected_features"], c["selected_features"].to(torch.int64))
    diff = (f["adjacency"] - c["adjacency"]).abs().max().item() if f["adjacency"].shape == c["adjacency"].shape else float("nan")
    med = lambda who, k: sorted(r[k] for r in results[who])[len(results[who]) // 2]
    print(f"\nGPT-2-small shape, random weights, {a.tokens} tokens, d_sae {a.d_sae}, max_feature_nodes "
          f"{a.max_feature_nodes}, batch {a.batch_size}, {a.threads} threads; load average {load0:.2f} -> "
          f"{os.getloadavg()[0]:.2f}")
    for who in results:
        print(f"  {who:15s} median {med(who, 'seconds'):8.2f} s   peak RSS {med(who, 'peak_mb'):8.0f} MB   "
              f"(RSS before the call {med(who, 'rss_before_mb'):.0f} MB)")
    print(f"  circuit-tracer / flexmodel time: {med('circuit-tracer', 'seconds') / med('flexmodel', 'seconds'):.2f}x")
    print(f"  same active features: {same}; same selected features: {same_sel}; largest |edge difference| {diff:.3g} "
          f"(largest edge {c['adjacency'].abs().max().item():.3g})")


if __name__ == "__main__":
    main()
