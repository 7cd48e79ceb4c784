"""Golden attribution graph from circuit-tracer 0.5.0 (tests/data/attribution).

Run with the venv of `bash scripts/golden/setup.sh --attribution`
(circuit-tracer 0.5.0, transformer-lens 2.16.1, transformers 4.57.3, torch 2.13):

    PY=$(bash scripts/golden/setup.sh --attribution)
    $PY scripts/golden/make_attribution.py

The model is the GPT-2 test fixture (tests/data/fixtures/models/gpt2: 2
layers, d 64, vocab 256) loaded into TransformerLens (no LayerNorm folding,
as circuit-tracer loads models), with random skip transcoders (layer 0
ReLU, layer 1 JumpReLU), seeded. The transcoders are written as SAELens
folders (what flexmodel's --transcoders reads; circuit-tracer's W_enc is
their W_enc transposed) and given to circuit-tracer as its own
SingleLayerTranscoder objects. Written:

  gpt2-transcoders/layer_{0,1}/   cfg.json + sae_weights.safetensors
  gpt2-circuit-tracer.safetensors input_ids, active_features, activation_values,
                                  selected_features, logit_tokens, logit_probabilities,
                                  adjacency [N, N] (circuit-tracer's attribute(),
                                  batch_size 16), node_mask, edge_mask,
                                  cumulative_scores (its prune_graph at 0.8 / 0.98)
  gpt2-circuit-tracer-graph.json  the graph file create_graph_files writes for
                                  Neuronpedia (its create_nodes / create_used_nodes_and_edges
                                  / build_model; token strings are the ids)
"""

import json
import os
import sys

import torch
from safetensors.torch import save_file

import circuit_tracer
import transformer_lens
from circuit_tracer.attribution.attribute import attribute
from circuit_tracer.graph import prune_graph
from circuit_tracer.replacement_model.replacement_model_transformerlens import TransformerLensReplacementModel
from circuit_tracer.transcoder.activation_functions import JumpReLU
from circuit_tracer.transcoder.single_layer_transcoder import SingleLayerTranscoder, TranscoderSet
from circuit_tracer.utils.create_graph_files import build_model, create_nodes, create_used_nodes_and_edges
from transformer_lens import HookedTransformerConfig
from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights
from transformers import GPT2LMHeadModel

assert circuit_tracer.__version__ == "0.5.0", circuit_tracer.__version__

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(ROOT, "tests/data/fixtures/models/gpt2")
OUT = os.path.join(ROOT, "tests/data/attribution")
D_SAE = 16
PROMPT = [255, 17, 42, 7, 99, 5, 11, 64, 2, 8]  # 255: the fixture's bos token
BATCH = 16


class IdTokenizer:
    """What circuit-tracer asks of a tokenizer, for a model without one: ids shown as numbers."""

    all_special_ids = [255]
    bos_token_id = 255
    pad_token_id = None
    eos_token_id = 255
    padding_side = "right"
    vocab_size = 256

    def decode(self, ids):
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        if isinstance(ids, int):
            ids = [ids]
        return " ".join(str(i) for i in ids)


def gpt2_model():
    hf = GPT2LMHeadModel.from_pretrained(FIXTURE, dtype=torch.float32).eval()
    c = hf.config
    cfg = HookedTransformerConfig(
        n_layers=c.n_layer, d_model=c.n_embd, n_ctx=c.n_positions, d_head=c.n_embd // c.n_head, n_heads=c.n_head,
        d_mlp=4 * c.n_embd, d_vocab=c.vocab_size, act_fn="gelu_new", normalization_type="LN", eps=c.layer_norm_epsilon,
        positional_embedding_type="standard", original_architecture="GPT2LMHeadModel", model_name="gpt2-fixture",
        default_prepend_bos=False, dtype=torch.float32, device="cpu",
    )
    weights = convert_gpt2_weights(hf, cfg)
    weights.setdefault("unembed.b_U", torch.zeros(c.vocab_size))  # GPT-2 has no unembedding bias
    return cfg, weights


def transcoders(d_model, n_layers):
    torch.manual_seed(51)
    set_, saelens = {}, []
    for layer in range(n_layers):
        w_enc = torch.randn(d_model, D_SAE) * 0.25 / d_model**0.5 * 8  # [d_in, d_sae] as SAELens stores it
        b_enc = torch.randn(D_SAE) * 0.3
        w_dec = torch.randn(D_SAE, d_model) * 0.2
        b_dec = torch.randn(d_model) * 0.1
        w_skip = torch.randn(d_model, d_model) * 0.05
        threshold = torch.rand(D_SAE) * 0.3 if layer == 1 else None
        act = JumpReLU(threshold.clone()) if threshold is not None else torch.nn.ReLU()
        t = SingleLayerTranscoder(d_model, D_SAE, act, layer, skip_connection=True, device="cpu", dtype=torch.float32)
        with torch.no_grad():
            t.W_enc.copy_(w_enc.T)
            t.b_enc.copy_(b_enc)
            t.W_dec.copy_(w_dec)
            t.b_dec.copy_(b_dec)
            t.W_skip.copy_(w_skip)
        set_[layer] = t
        tensors = {"W_enc": w_enc, "b_enc": b_enc, "W_dec": w_dec, "b_dec": b_dec, "W_skip": w_skip}
        if threshold is not None:
            tensors["threshold"] = threshold
        cfg = {
            "architecture": "jumprelu_skip_transcoder" if threshold is not None else "skip_transcoder",
            "d_in": d_model, "d_sae": D_SAE, "d_out": d_model, "dtype": "float32", "device": "cpu",
            "apply_b_dec_to_input": False, "normalize_activations": "none", "reshape_activations": "none",
            "metadata": {"sae_lens_version": "6.54.12", "hook_name": f"blocks.{layer}.mlp.hook_in", "hook_name_out": f"blocks.{layer}.mlp.hook_out",
                         "model_name": "gpt2-fixture", "hook_head_index": None, "prepend_bos": True,
                         "context_size": 64},
        }
        saelens.append((cfg, tensors))
    return TranscoderSet(set_, feature_input_hook="mlp.hook_in", feature_output_hook="mlp.hook_out",
                         scan="flexmodel-gpt2-fixture"), saelens


def main():
    cfg, weights = gpt2_model()
    tset, saelens = transcoders(cfg.d_model, cfg.n_layers)
    model = TransformerLensReplacementModel(cfg)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not [k for k in missing if "IGNORE" not in k and "mask" not in k], missing
    model._configure_replacement_model(tset)
    model.tokenizer = IdTokenizer()
    model.eval()

    graph = attribute(torch.tensor(PROMPT), model, max_n_logits=10, desired_logit_prob=0.95, batch_size=BATCH)
    node_mask, edge_mask, cumulative = prune_graph(graph, node_threshold=0.8, edge_threshold=0.98)

    os.makedirs(OUT, exist_ok=True)
    for layer, (c, tensors) in enumerate(saelens):
        d = os.path.join(OUT, "gpt2-transcoders", f"layer_{layer}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "cfg.json"), "w") as f:
            json.dump(c, f, indent=1)
        save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(d, "sae_weights.safetensors"))
    out = {
        "input_ids": graph.input_tokens.to(torch.int64),
        "active_features": graph.active_features.to(torch.int64).contiguous(),
        "activation_values": graph.activation_values.float().contiguous(),
        "selected_features": graph.selected_features.to(torch.int64),
        "logit_tokens": torch.tensor([t.vocab_idx for t in graph.logit_targets], dtype=torch.int64),
        "logit_probabilities": graph.logit_probabilities.float(),
        "adjacency": graph.adjacency_matrix.float().contiguous(),
        "node_mask": node_mask.to(torch.uint8),
        "edge_mask": edge_mask.to(torch.uint8).contiguous(),
        "cumulative_scores": cumulative.float(),
    }
    save_file(out, os.path.join(OUT, "gpt2-circuit-tracer.safetensors"),
              metadata={"circuit_tracer": circuit_tracer.__version__,
                        "transformer_lens": transformer_lens.__version__ if hasattr(transformer_lens, "__version__") else "2.16.1",
                        "torch": torch.__version__, "batch_size": str(BATCH)})
    tok = IdTokenizer()
    nodes = create_nodes(graph, node_mask, tok, cumulative)
    used_nodes, used_edges = create_used_nodes_and_edges(graph, nodes, edge_mask)
    viewer = build_model(graph, used_nodes, used_edges, "gpt2-circuit-tracer-graph", "flexmodel-gpt2-fixture", 0.8, tok)
    with open(os.path.join(OUT, "gpt2-circuit-tracer-graph.json"), "w") as f:
        f.write(viewer.model_dump_json(indent=1))
    print(f"{len(graph.selected_features)} features, {graph.adjacency_matrix.shape[0]} nodes, "
          f"{len(graph.logit_targets)} logits, {int(node_mask.sum())} nodes / {int(edge_mask.sum())} edges kept",
          file=sys.stderr)


if __name__ == "__main__":
    main()
