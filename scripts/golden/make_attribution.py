"""Golden attribution graph from circuit-tracer 0.5.0 (tests/data/attribution).

Run with the venv of `bash scripts/golden/setup.sh --attribution`
(circuit-tracer 0.5.0, transformer-lens 2.16.1, transformers 4.57.3, torch 2.13):

    PY=$(bash scripts/golden/setup.sh --attribution)
    $PY scripts/golden/make_attribution.py

The models are the GPT-2 and Llama test fixtures (tests/data/fixtures/models/
gpt2 and llama: 2 layers, d 64, vocab 256; Llama with grouped-query attention
and RoPE) loaded into TransformerLens (no norm folding, as circuit-tracer
loads models), each with random skip transcoders (layer 0 ReLU, layer 1
JumpReLU), seeded. The transcoders are written as SAELens
folders (what flexmodel's --transcoders reads; circuit-tracer's W_enc is
their W_enc transposed) and given to circuit-tracer as its own
SingleLayerTranscoder objects. Written:

For FAMILY in gpt2, llama (or the families given as arguments):

  FAMILY-transcoders/layer_{0,1}/   cfg.json + sae_weights.safetensors
  FAMILY-circuit-tracer.safetensors input_ids, active_features, activation_values,
                                  selected_features, logit_tokens, logit_probabilities,
                                  adjacency [N, N] (circuit-tracer's attribute(),
                                  batch_size 16), node_mask, edge_mask,
                                  cumulative_scores (its prune_graph at 0.8 / 0.98)
  FAMILY-circuit-tracer-graph.json  the graph file create_graph_files writes for
                                  Neuronpedia (its create_nodes / create_used_nodes_and_edges
                                  / build_model; token strings are the ids)

With --interventions (only this file is written, for each family):

  FAMILY-circuit-tracer-interventions.safetensors
                                  interventions [3, 4] (layer, position, feature, value as
                                  float), clean_logits, frozen_logits, unfrozen_logits [T, V]:
                                  circuit-tracer's feature_intervention with
                                  freeze_attention True / False on the same prompt;
                                  frozen_generated [T + 5] and frozen_step_logits [5, V]: its
                                  feature_intervention_generate (greedy, KV cache,
                                  freeze_attention True) with the first two interventions.
                                  (With freeze_attention False and token-id input, 0.5.0
                                  sizes its deltas by the batch dimension and fails: "index 3
                                  is out of bounds for dimension 0 with size 1".)
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
from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights, convert_llama_weights
from transformers import GPT2LMHeadModel, LlamaForCausalLM

assert circuit_tracer.__version__ == "0.5.0", circuit_tracer.__version__

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests/data/fixtures/models")
OUT = os.path.join(ROOT, "tests/data/attribution")
D_SAE = 16
PROMPTS = {"gpt2": [255, 17, 42, 7, 99, 5, 11, 64, 2, 8],  # 255: the fixture's bos token
           "llama": [1, 17, 42, 7, 99, 5, 11, 64, 2, 8]}  # 1: its bos token
BATCH = 16


class IdTokenizer:
    """What circuit-tracer asks of a tokenizer, for a model without one: ids shown as numbers."""

    def __init__(self, bos):
        self.all_special_ids = [bos]
        self.bos_token_id = self.eos_token_id = bos
        self.pad_token_id = None
    padding_side = "right"
    vocab_size = 256

    def decode(self, ids):
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        if isinstance(ids, int):
            ids = [ids]
        return " ".join(str(i) for i in ids)


def gpt2_model():
    hf = GPT2LMHeadModel.from_pretrained(os.path.join(FIXTURES, "gpt2"), dtype=torch.float32).eval()
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


def llama_model():
    hf = LlamaForCausalLM.from_pretrained(os.path.join(FIXTURES, "llama"), dtype=torch.float32).eval()
    c = hf.config
    cfg = HookedTransformerConfig(
        n_layers=c.num_hidden_layers, d_model=c.hidden_size, n_ctx=c.max_position_embeddings, d_head=c.head_dim,
        n_heads=c.num_attention_heads, n_key_value_heads=c.num_key_value_heads, d_mlp=c.intermediate_size,
        d_vocab=c.vocab_size, act_fn="silu", normalization_type="RMS", eps=c.rms_norm_eps, gated_mlp=True,
        final_rms=True, positional_embedding_type="rotary", rotary_dim=c.head_dim, rotary_base=c.rope_theta,
        rotary_adjacent_pairs=False, original_architecture="LlamaForCausalLM", model_name="llama-fixture",
        default_prepend_bos=False, dtype=torch.float32, device="cpu",
    )
    weights = convert_llama_weights(hf, cfg)
    weights.setdefault("unembed.b_U", torch.zeros(c.vocab_size))
    return cfg, weights


def transcoders(d_model, n_layers, family):
    torch.manual_seed(51)
    set_, saelens = {}, []
    for layer in range(n_layers):
        # Pre-activations of a few units on the norm's unit-scale output.
        w_enc = torch.randn(d_model, D_SAE) * 2.0 / d_model**0.5  # [d_in, d_sae] as SAELens stores it
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
                         "model_name": f"{family}-fixture", "hook_head_index": None, "prepend_bos": True,
                         "context_size": 64},
        }
        saelens.append((cfg, tensors))
    return TranscoderSet(set_, feature_input_hook="mlp.hook_in", feature_output_hook="mlp.hook_out",
                         scan=f"flexmodel-{family}-fixture"), saelens


def tl_replacement_model(cfg, weights, transcoder_set, bos):
    """circuit-tracer's TransformerLens replacement model on `weights` (every
    weight loaded: only TransformerLens' buffers may be missing)."""
    model = TransformerLensReplacementModel(cfg)
    missing, _ = model.load_state_dict(weights, strict=False)
    assert not [k for k in missing if "IGNORE" not in k and "mask" not in k and "rotary" not in k], missing
    model._configure_replacement_model(transcoder_set)
    model.tokenizer = IdTokenizer(bos)
    return model.eval()


def attribute_and_prune(model, prompt):
    """circuit-tracer's attribute() with its defaults (10 logits up to p 0.95),
    batch BATCH, and prune_graph at 0.8 / 0.98: (graph, node_mask, edge_mask, cumulative)."""
    graph = attribute(torch.tensor(prompt), model, max_n_logits=10, desired_logit_prob=0.95, batch_size=BATCH)
    return (graph, *prune_graph(graph, node_threshold=0.8, edge_threshold=0.98))


def write_saelens_folders(name, saelens):
    """OUT/name/layer_L/cfg.json + sae_weights.safetensors, per (cfg, tensors) of transcoders()."""
    os.makedirs(OUT, exist_ok=True)
    for layer, (c, tensors) in enumerate(saelens):
        d = os.path.join(OUT, name, f"layer_{layer}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "cfg.json"), "w") as f:
            json.dump(c, f, indent=1)
        save_golden({k: v.contiguous() for k, v in tensors.items()}, os.path.join(d, "sae_weights.safetensors"))


def graph_tensors(graph, node_mask, edge_mask, cumulative):
    """The graph and its pruning as the golden files store them."""
    return {
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


def intervention_tensors(ivs, clean, frozen, unfrozen, T):
    """The interventions (layer, position, feature, value as float) and the logits [T, V] they give."""
    return {
        "interventions": torch.tensor([[float(x) for x in iv] for iv in ivs]),
        "clean_logits": clean.reshape(T, -1).float().contiguous(),
        "frozen_logits": frozen.reshape(T, -1).float().contiguous(),
        "unfrozen_logits": unfrozen.reshape(T, -1).float().contiguous(),
    }


def save_golden(tensors, path, metadata=None):
    save_file(tensors, path, metadata=metadata)
    os.chmod(path, 0o644)


def graph_metadata(**versions):
    """What a golden graph file records: circuit-tracer's version, `versions` (the backend's), torch's, the batch size."""
    return {"circuit_tracer": circuit_tracer.__version__, **versions, "torch": torch.__version__,
            "batch_size": str(BATCH)}


def write_graph_json(graph, node_mask, edge_mask, cumulative, tok, slug, scan):
    """OUT/slug.json: the graph file circuit-tracer's create_graph_files writes for Neuronpedia."""
    nodes = create_nodes(graph, node_mask, tok, cumulative)
    used_nodes, used_edges = create_used_nodes_and_edges(graph, nodes, edge_mask)
    viewer = build_model(graph, used_nodes, used_edges, slug, scan, 0.8, tok)
    with open(os.path.join(OUT, f"{slug}.json"), "w") as f:
        f.write(viewer.model_dump_json(indent=1))


def make(family):
    cfg, weights = gpt2_model() if family == "gpt2" else llama_model()
    tset, saelens = transcoders(cfg.d_model, cfg.n_layers, family)
    model = tl_replacement_model(cfg, weights, tset, PROMPTS[family][0])
    graph, node_mask, edge_mask, cumulative = attribute_and_prune(model, PROMPTS[family])

    write_saelens_folders(f"{family}-transcoders", saelens)
    save_golden(graph_tensors(graph, node_mask, edge_mask, cumulative),
                os.path.join(OUT, f"{family}-circuit-tracer.safetensors"),
                graph_metadata(transformer_lens="2.16.1"))
    write_graph_json(graph, node_mask, edge_mask, cumulative, model.tokenizer, f"{family}-circuit-tracer-graph",
                     f"flexmodel-{family}-fixture")
    print(f"{family}: {len(graph.selected_features)} features, {graph.adjacency_matrix.shape[0]} nodes, "
          f"{len(graph.logit_targets)} logits, {int(node_mask.sum())} nodes / {int(edge_mask.sum())} edges kept",
          file=sys.stderr)


def replacement_model(family):
    cfg, weights = gpt2_model() if family == "gpt2" else llama_model()
    tset, _ = transcoders(cfg.d_model, cfg.n_layers, family)
    return tl_replacement_model(cfg, weights, tset, PROMPTS[family][0])


def make_interventions(family):
    model = replacement_model(family)
    prompt = torch.tensor(PROMPTS[family])
    clean, acts = model.feature_intervention(prompt, [], freeze_attention=False)
    acts = acts.to_dense() if acts.is_sparse else acts  # [L, T, d_sae]
    T = prompt.numel()
    # An active layer-0 feature at position 3 switched off, an inactive
    # layer-1 feature at position 6 switched on, an active layer-0 feature at
    # the last position tripled (layer 0's MLP input is the clean run's).
    on3 = int(acts[0, 3].nonzero()[0])
    off6 = int((acts[1, 6] == 0).nonzero()[0])
    on_last = int(acts[0, T - 1].nonzero()[0])
    ivs = [(0, 3, on3, 0.0), (1, 6, off6, 2.0), (0, T - 1, on_last, 3.0 * float(acts[0, T - 1, on_last]))]
    frozen, _ = model.feature_intervention(prompt, ivs, freeze_attention=True)
    unfrozen, _ = model.feature_intervention(prompt, ivs, freeze_attention=False)
    generated = {}
    for name, freeze in (("frozen", True),):
        # A fresh model; generate() masks pad tokens: none here.
        gen_model = replacement_model(family)
        gen_model.tokenizer.pad_token_id = -1
        ids, step_logits, _ = gen_model.feature_intervention_generate(
            prompt.unsqueeze(0), ivs[:2], freeze_attention=freeze, max_new_tokens=5, do_sample=False, verbose=False)
        generated[f"{name}_generated"] = ids.reshape(-1).to(torch.int64).contiguous()
        generated[f"{name}_step_logits"] = step_logits.float().contiguous()
    save_golden({**generated, **intervention_tensors(ivs, clean, frozen, unfrozen, T)},
                os.path.join(OUT, f"{family}-circuit-tracer-interventions.safetensors"),
                {"circuit_tracer": circuit_tracer.__version__, "torch": torch.__version__})
    print(f"{family}: interventions {ivs}; largest logit change frozen "
          f"{(frozen - clean).abs().max():.4g}, unfrozen {(unfrozen - clean).abs().max():.4g}", file=sys.stderr)


def main():
    args = sys.argv[1:]
    interventions = "--interventions" in args
    families = [a for a in args if a != "--interventions"] or ["gpt2", "llama"]
    for family in families:
        (make_interventions if interventions else make)(family)


if __name__ == "__main__":
    main()
