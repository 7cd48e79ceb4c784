"""Golden attribution graph through a cross-layer transcoder (CLT) from circuit-tracer 0.5.0.

Run with the venv of `bash scripts/golden/setup.sh --attribution`
(circuit-tracer 0.5.0, transformer-lens 2.16.1, transformers 4.57.3, torch 2.13):

    PY=$(bash scripts/golden/setup.sh --attribution)
    $PY scripts/golden/make_attribution_clt.py

The models and prompts are make_attribution.py's (the GPT-2 and Llama test
fixtures in TransformerLens, no norm folding). The CLT is random, seeded:
JumpReLU (thresholds in [0, 0.3), a quarter of them 0), features reading
layer L (GPT-2: blocks.L.mlp.hook_in, the MLP input; Llama: blocks.L.hook_resid_mid,
the residual before the MLP's norm, circuit-tracer's default for CLTs) and
writing blocks.L'.mlp.hook_out / hook_mlp_out for every L' >= L, as
circuit-tracer's CrossLayerTranscoder (no skip: its load_clt reads none).
It is written by circuit-tracer's own to_safetensors (what flexmodel's
--transcoders reads), with circuit-tracer's hub config.yaml naming the hooks.
Written, for FAMILY in gpt2, llama:

  FAMILY-clt/                        W_enc_{0,1}.safetensors, W_dec_{0,1}.safetensors, config.yaml
  FAMILY-clt-circuit-tracer.safetensors
        input_ids, active_features, activation_values, selected_features,
        logit_tokens, logit_probabilities, adjacency [N, N] (attribute(),
        batch_size 16), node_mask, edge_mask, cumulative_scores (prune_graph
        at 0.8 / 0.98); interventions [2, 4] (layer, position, feature, value)
        and frozen_logits / unfrozen_logits [T, V] (feature_intervention with
        freeze_attention True / False), clean_logits [T, V]; frozen_generated
        [T + 5] and frozen_step_logits [5, V] (feature_intervention_generate,
        greedy, KV cache, freeze_attention True, both interventions)
  FAMILY-clt-circuit-tracer-graph.json   the graph file create_graph_files writes
        (its create_nodes / create_used_nodes_and_edges / build_model; token
        strings are the ids; slug FAMILY-clt-circuit-tracer-graph)
"""

import os
import sys

import torch

import circuit_tracer
from circuit_tracer.replacement_model.replacement_model_transformerlens import TransformerLensReplacementModel
from circuit_tracer.transcoder.cross_layer_transcoder import CrossLayerTranscoder

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_attribution import (OUT, PROMPTS, attribute_and_prune, gpt2_model, graph_metadata,  # noqa: E402
                              graph_tensors, intervention_tensors, llama_model, save_golden, tl_replacement_model,
                              write_graph_json)

assert circuit_tracer.__version__ == "0.5.0", circuit_tracer.__version__

D_CLT = 16


HOOKS = {"gpt2": ("mlp.hook_in", "mlp.hook_out"), "llama": ("hook_resid_mid", "hook_mlp_out")}


def random_clt(d_model, n_layers, in_scale=1.0):
    torch.manual_seed(44)
    clt = CrossLayerTranscoder(n_layers, D_CLT, d_model, activation_function="jump_relu", lazy_decoder=False,
                               device=torch.device("cpu"), dtype=torch.float32)
    with torch.no_grad():
        # Pre-activations of a few units on a unit-scale input (in_scale: 1 / the input's rms).
        clt.W_enc.copy_(torch.randn(n_layers, D_CLT, d_model) * 2.0 / d_model**0.5 * in_scale)
        clt.b_enc.copy_(torch.randn(n_layers, D_CLT) * 0.3)
        clt.b_dec.copy_(torch.randn(n_layers, d_model) * 0.1)
        for i in range(n_layers):
            clt.W_dec[i].copy_(torch.randn(D_CLT, n_layers - i, d_model) * 0.2)
        threshold = torch.rand(n_layers, 1, D_CLT) * 0.3
        threshold[torch.rand(n_layers, 1, D_CLT) < 0.25] = 0.0
        clt.activation_function.threshold.copy_(threshold)
    return clt


def make(family):
    cfg, weights = gpt2_model() if family == "gpt2" else llama_model()
    folder = os.path.join(OUT, f"{family}-clt")
    in_hook, out_hook = HOOKS[family]
    in_scale = 1.0
    if in_hook == "hook_resid_mid":
        plain = TransformerLensReplacementModel(cfg)
        plain.load_state_dict(weights, strict=False)
        _, cache = plain.run_with_cache(torch.tensor(PROMPTS[family]))
        mids = torch.stack([cache[f"blocks.{l}.hook_resid_mid"] for l in range(cfg.n_layers)])
        in_scale = 1.0 / float(mids.pow(2).mean().sqrt())
    random_clt(cfg.d_model, cfg.n_layers, in_scale).to_safetensors(folder)
    with open(os.path.join(folder, "config.yaml"), "w") as f:
        f.write(f"model_kind: cross_layer_transcoder\nfeature_input_hook: \"{in_hook}\"\n"
                f"feature_output_hook: \"{out_hook}\"\n")
    for f in os.listdir(folder):
        os.chmod(os.path.join(folder, f), 0o644)

    def replacement_model():
        # Read back from the files, as a user's CLT would be.
        from circuit_tracer.transcoder.cross_layer_transcoder import load_clt
        clt = load_clt(folder, feature_input_hook=in_hook, feature_output_hook=out_hook,
                       scan=f"flexmodel-{family}-clt", device=torch.device("cpu"), dtype=torch.float32,
                       lazy_decoder=False)
        return tl_replacement_model(cfg, weights, clt, PROMPTS[family][0])

    model = replacement_model()
    prompt = torch.tensor(PROMPTS[family])
    graph, node_mask, edge_mask, cumulative = attribute_and_prune(model, PROMPTS[family])

    # Interventions: an active layer-0 feature at position 3 switched off
    # (it writes into layers 0 and 1), an active layer-0 feature at the last
    # position doubled.
    clean, acts = model.feature_intervention(prompt, [], freeze_attention=False)
    acts = acts.to_dense() if acts.is_sparse else acts  # [L, T, F]
    T = prompt.numel()
    on3 = int(acts[0, 3].nonzero()[0])
    on_last = int(acts[0, T - 1].nonzero()[0])
    ivs = [(0, 3, on3, 0.0), (0, T - 1, on_last, 2.0 * float(acts[0, T - 1, on_last]))]
    frozen, _ = model.feature_intervention(prompt, ivs, freeze_attention=True)
    unfrozen, _ = model.feature_intervention(prompt, ivs, freeze_attention=False)

    gen_model = replacement_model()
    gen_model.tokenizer.pad_token_id = -1  # generate() masks pad tokens: none here
    gen_ids, step_logits, _ = gen_model.feature_intervention_generate(
        prompt.unsqueeze(0), ivs, freeze_attention=True, max_new_tokens=5, do_sample=False, verbose=False)

    out = {
        "frozen_generated": gen_ids.reshape(-1).to(torch.int64).contiguous(),
        "frozen_step_logits": step_logits.float().contiguous(),
        **graph_tensors(graph, node_mask, edge_mask, cumulative),
        **intervention_tensors(ivs, clean, frozen, unfrozen, T),
    }
    save_golden(out, os.path.join(OUT, f"{family}-clt-circuit-tracer.safetensors"),
                graph_metadata(transformer_lens="2.16.1"))
    write_graph_json(graph, node_mask, edge_mask, cumulative, model.tokenizer, f"{family}-clt-circuit-tracer-graph",
                     f"flexmodel-{family}-clt")
    print(f"{family} CLT: {len(graph.selected_features)} features, {graph.adjacency_matrix.shape[0]} nodes, "
          f"{len(graph.logit_targets)} logits, {int(node_mask.sum())} nodes / {int(edge_mask.sum())} edges kept; "
          f"interventions {ivs}: largest logit change frozen {(frozen - clean).abs().max():.4g}, "
          f"unfrozen {(unfrozen - clean).abs().max():.4g}", file=sys.stderr)


def main():
    for family in sys.argv[1:] or ["gpt2", "llama"]:
        make(family)


if __name__ == "__main__":
    main()
