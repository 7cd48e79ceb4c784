"""Attribution graphs: flexmodel against circuit-tracer 0.5.0, time and peak memory, one run.

    PY=$(bash scripts/golden/setup.sh --attribution)        # circuit-tracer's venv (.venv-ct)
    PYTHONPATH=build/python python3 bench/attribution/bench_attribution.py --ct-python $PY
        [--work DIR] [--shape gpt2-small|small4] [--tokens 64] [--d-sae 4096] [--max-feature-nodes 256]
        [--batch-size 64] [--reps 2] [--max-memory SIZE] [--limit-gb G] [--timeout S] [--clt]

The model is GPT-2-small shaped (12 layers, d 768, 12 heads, vocab 50257), or with --shape small4
GPT-2 shaped with 4 layers, d 256, 4 heads (the 4096-token case), with random weights,
written once as a Transformers folder; the transcoders are random per-layer ReLU transcoders
(SAELens folders, d_sae 4096, encoder bias set so that about 25 features fire per token and
layer). Each contender runs in a fresh process per repeat (flexmodel.attribute in this
interpreter, circuit-tracer's attribute() on the same weights in TransformerLens in its venv),
contenders alternating; each reports the seconds of the graph computation alone, the process's
resident size before it, and its peak resident size (ru_maxrss, read by the driver from wait4 so
that a contender that fails or is killed still has one). --max-memory passes flexmodel's working
memory bound (flexmodel.attribute(max_memory=): the adjacency streamed through a temporary file);
--limit-gb caps each contender's address space (prlimit --as) and --timeout its seconds, so that
a tool that cannot finish is recorded as such with its peak. Both graphs of the last repeat are
compared (same features, largest edge difference) when both finished in memory. Numbers are medians
over repeats, from one run; the load average is printed before and after.

--clt: a random cross-layer transcoder instead (circuit-tracer's file layout, W_enc_i / W_dec_i
.safetensors, the same encoders' statistics, decoders into every later layer): flexmodel reads the
folder (flexmodel.attribute given its path), circuit-tracer its load_clt (lazy decoders, its default).
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


def vm_peak_mb():
    """The largest address space (what --limit-gb caps), for comparing with the cap."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmPeak:"):
                return int(line.split()[1]) / 1024
    return 0.0


# --- setup (this interpreter: transformers 5.23) ---------------------------------------------


SHAPES = {"gpt2-small": dict(n_layer=12, n_embd=768, n_head=12, n_positions=1024),
          "small4": dict(n_layer=4, n_embd=256, n_head=4, n_positions=4096)}


def make_clt(work, shape, n_layer, d, d_sae):
    """A random CLT in circuit-tracer's layout (what its to_safetensors writes)."""
    from safetensors.torch import save_file
    clt_dir = os.path.join(work, f"clt-{shape}-{d_sae}")
    if not os.path.exists(os.path.join(clt_dir, f"W_dec_{n_layer - 1}.safetensors")):
        os.makedirs(clt_dir, exist_ok=True)
        g = torch.Generator().manual_seed(3)
        for i in range(n_layer):
            save_file({f"W_enc_{i}": torch.randn(d_sae, d, generator=g) / d**0.5,
                       f"b_enc_{i}": torch.full((d_sae,), -2.5),  # ~25 of 4096 active per token, as above
                       f"b_dec_{i}": torch.zeros(d)}, os.path.join(clt_dir, f"W_enc_{i}.safetensors"))
            save_file({f"W_dec_{i}": torch.randn(d_sae, n_layer - i, d, generator=g) * 0.02 / (n_layer - i)**0.5},
                      os.path.join(clt_dir, f"W_dec_{i}.safetensors"))
    return clt_dir


def make_inputs(work, shape, tokens, d_sae, clt=False):
    from safetensors.torch import save_file
    sh = SHAPES[shape]
    n_layer, d = sh["n_layer"], sh["n_embd"]
    model_dir = os.path.join(work, "gpt2-small-random" if shape == "gpt2-small" else f"{shape}-random")
    if not os.path.exists(os.path.join(model_dir, "config.json")):
        from transformers import GPT2Config, GPT2LMHeadModel
        torch.manual_seed(0)
        cfg = GPT2Config(vocab_size=50257, **sh)
        GPT2LMHeadModel(cfg).eval().save_pretrained(model_dir)
    tc_dir = os.path.join(work, f"transcoders-{d_sae}" if shape == "gpt2-small" else f"transcoders-{shape}-{d_sae}")
    if clt:
        tc_dir = make_clt(work, shape, n_layer, d, d_sae)
    elif not os.path.exists(os.path.join(tc_dir, f"layer_{n_layer - 1}", "cfg.json")):
        g = torch.Generator().manual_seed(1)
        for layer in range(n_layer):
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
                                "hook_name_out": f"blocks.{layer}.mlp.hook_out", "model_name": os.path.basename(model_dir)}}
            with open(os.path.join(out, "cfg.json"), "w") as f:
                json.dump(cfg, f)
    ids = torch.randint(0, 50257, (tokens,), generator=torch.Generator().manual_seed(2))
    ids[0] = 50256  # <|endoftext|> first, as circuit-tracer prepends a special token
    ids_path = os.path.join(work, f"ids-{shape}-{tokens}.pt")
    torch.save(ids, ids_path)
    return model_dir, tc_dir, ids_path


# --- contenders (each in its own process) ---------------------------------------------------


def run_flexmodel(a):
    import flexmodel
    model = flexmodel.from_pretrained(a.model)
    # Transcoders read before the clock starts, as circuit-tracer's are.
    if a.clt:
        tcs = a.transcoders  # the CLT folder, read (mapped) by attribute()
    else:
        n_layer = len([n for n in os.listdir(a.transcoders) if n.startswith("layer_")])
        tcs = [flexmodel.sae.load_sae(os.path.join(a.transcoders, f"layer_{l}")) for l in range(n_layer)]
    ids = torch.load(a.ids)
    with torch.no_grad():
        model(ids.unsqueeze(0))  # weights paged in before the clock starts (circuit-tracer's are in memory)
    before = rss_mb()
    t0 = time.perf_counter()
    g = flexmodel.attribute(model, tcs, ids, batch_size=a.batch_size, max_feature_nodes=a.max_feature_nodes,
                            max_memory=a.max_memory)
    seconds = time.perf_counter() - t0
    torch.save({"adjacency": g["adjacency"], "active_features": g["active_features"],
                "selected_features": g["selected_features"]}, a.graph_out)
    n = int(g["node_mask"].shape[0])
    return {"seconds": seconds, "rss_before_mb": before, "peak_mb": peak_mb(), "vm_peak_mb": vm_peak_mb(),
            "active_features": int(g["active_features"].shape[0]), "nodes": n,
            "working_peak_mb": None if g["peak_working_memory"] is None else g["peak_working_memory"] / 1e6}


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
    for layer in range(0 if a.clt else c.n_layer):
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
    if a.clt:
        from circuit_tracer.transcoder.cross_layer_transcoder import load_clt
        model._configure_replacement_model(load_clt(a.transcoders, "mlp.hook_in", "mlp.hook_out", scan="bench",
                                                    device=torch.device("cpu"), dtype=torch.float32))
    else:
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
    return {"seconds": seconds, "rss_before_mb": before, "peak_mb": peak_mb(), "vm_peak_mb": vm_peak_mb(),
            "active_features": int(g.active_features.shape[0]), "nodes": int(g.adjacency_matrix.shape[0])}


# --- driver --------------------------------------------------------------------------------


def run_child(cmd, env, timeout, log):
    """Runs one contender with its output in files; its peak RSS from wait4, also when it fails."""
    with open(log + ".out", "w") as out, open(log + ".err", "w") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        deadline = None if timeout is None else t0 + timeout
        killed = False
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if deadline and time.perf_counter() > deadline and not killed:
                proc.kill()
                killed = True
            time.sleep(0.2)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
    peak = usage.ru_maxrss / 1024
    lines = open(log + ".out").read().splitlines()
    result = [l for l in lines if l.startswith("RESULT ")]
    if proc.returncode != 0 or not result:
        tail = " | ".join(open(log + ".err").read().strip().splitlines()[-2:])[-400:]
        why = f"killed at the {timeout:.0f} s timeout" if killed else f"exit status {proc.returncode}"
        return {"failed": why, "wall_s": wall, "peak_mb": peak, "tail": tail}
    r = json.loads(result[0][7:])
    r["peak_mb"] = max(r["peak_mb"], peak)
    return r



def main():
    p = argparse.ArgumentParser()
    p.add_argument("--run", choices=["flexmodel", "circuit-tracer"])
    p.add_argument("--ct-python", default=os.path.join(HERE, "../../scripts/golden/.venv-ct/bin/python"))
    p.add_argument("--work", default="/tmp/flexmodel-bench-attribution")
    p.add_argument("--shape", choices=sorted(SHAPES), default="gpt2-small")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--max-memory", default=None, help="flexmodel's working memory bound, e.g. 4GB (streamed)")
    p.add_argument("--limit-gb", type=float, default=None, help="address-space cap of each contender (prlimit --as)")
    p.add_argument("--timeout", type=float, default=None, help="seconds before a contender is killed")
    p.add_argument("--d-sae", type=int, default=4096)
    p.add_argument("--max-feature-nodes", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--clt", action="store_true", help="a random cross-layer transcoder instead of per-layer ones")
    p.add_argument("--model"), p.add_argument("--transcoders"), p.add_argument("--ids"), p.add_argument("--graph-out")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    if a.run:
        result = (run_flexmodel if a.run == "flexmodel" else run_circuit_tracer)(a)
        print("RESULT " + json.dumps(result))
        return
    os.makedirs(a.work, exist_ok=True)
    model, tcs, ids = make_inputs(a.work, a.shape, a.tokens, a.d_sae, a.clt)
    load0 = os.getloadavg()
    results = {"flexmodel": [], "circuit-tracer": []}
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    for rep in range(a.reps):
        order = ["flexmodel", "circuit-tracer"] if rep % 2 == 0 else ["circuit-tracer", "flexmodel"]
        for who in order:
            py = sys.executable if who == "flexmodel" else a.ct_python
            cmd = [py, os.path.abspath(__file__), "--run", who, "--model", model, "--transcoders", tcs, "--ids", ids,
                   "--graph-out", os.path.join(a.work, f"graph-{who}.pt"), "--batch-size", str(a.batch_size),
                   "--max-feature-nodes", str(a.max_feature_nodes), "--threads", str(a.threads)]
            if a.clt:
                cmd += ["--clt"]
            if who == "flexmodel" and a.max_memory:
                cmd += ["--max-memory", a.max_memory]
            if a.limit_gb:
                cmd = ["prlimit", f"--as={int(a.limit_gb * 2**30)}", "--"] + cmd
            r = run_child(cmd, env, a.timeout, os.path.join(a.work, f"log-{who}-{rep}"))
            results[who].append(r)
            if r.get("failed"):
                print(f"rep {rep} {who:15s} FAILED after {r['wall_s']:.1f} s ({r['failed']}), peak {r['peak_mb']:.0f} MB; "
                      f"last lines: {r['tail']}", flush=True)
                continue
            print(f"rep {rep} {who:15s} {r['seconds']:8.2f} s  peak {r['peak_mb']:8.0f} MB  "
                  f"(before the call {r['rss_before_mb']:.0f} MB, address space peak {r['vm_peak_mb']:.0f} MB)  "
                  f"{r['active_features']} active features, "
                  f"{r['nodes']} nodes" + (f", working memory measured {r['working_peak_mb']:.0f} MB of the "
                                          f"{a.max_memory} bound" if r.get("working_peak_mb") else ""), flush=True)
    load1 = os.getloadavg()
    shape = SHAPES[a.shape]
    print(f"\n{a.shape} ({shape['n_layer']} layers, d {shape['n_embd']}), random weights, {a.tokens} tokens, d_sae "
          f"{a.d_sae}{' (cross-layer transcoder)' if a.clt else ''}, max_feature_nodes {a.max_feature_nodes}, batch {a.batch_size}, {a.threads} threads"
          + (f", flexmodel max_memory {a.max_memory}" if a.max_memory else "")
          + (f", each contender capped at {a.limit_gb} GB of address space" if a.limit_gb else "")
          + (f", timeout {a.timeout:.0f} s" if a.timeout else "")
          + f"; load average (1/5/15 min) {'/'.join(f'{x:.2f}' for x in load0)} -> {'/'.join(f'{x:.2f}' for x in load1)}")
    ok = {who: [r for r in results[who] if not r.get("failed")] for who in results}
    med = lambda who, k: sorted(r[k] for r in ok[who])[len(ok[who]) // 2]
    for who in results:
        if ok[who]:
            print(f"  {who:15s} median {med(who, 'seconds'):8.2f} s   peak RSS {med(who, 'peak_mb'):8.0f} MB   "
                  f"(RSS before the call {med(who, 'rss_before_mb'):.0f} MB)")
        else:
            print(f"  {who:15s} did not finish: " + "; ".join(f"{r['failed']} after {r['wall_s']:.0f} s at peak RSS "
                                                              f"{r['peak_mb']:.0f} MB" for r in results[who]))
    if not (ok["flexmodel"] and ok["circuit-tracer"]):
        return
    print(f"  circuit-tracer / flexmodel time: {med('circuit-tracer', 'seconds') / med('flexmodel', 'seconds'):.2f}x")
    f = torch.load(os.path.join(a.work, "graph-flexmodel.pt"))
    c = torch.load(os.path.join(a.work, "graph-circuit-tracer.pt"))
    same = torch.equal(f["active_features"], c["active_features"].to(torch.int64))
    same_sel = torch.equal(f["selected_features"], c["selected_features"].to(torch.int64))
    both = f["adjacency"] is not None and f["adjacency"].shape == c["adjacency"].shape
    diff = (f["adjacency"] - c["adjacency"]).abs().max().item() if both else float("nan")
    print(f"  same active features: {same}; same selected features: {same_sel}; largest |edge difference| {diff:.3g} "
          f"(largest edge {c['adjacency'].abs().max().item():.3g})")


if __name__ == "__main__":
    main()
