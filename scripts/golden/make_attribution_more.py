"""Golden Gemma 2 and Qwen3 attribution graphs from circuit-tracer 0.5.0 (tests/data/attribution).

Run with the venv of `bash scripts/golden/setup.sh --attribution`:

    PY=$(bash scripts/golden/setup.sh --attribution)
    $PY scripts/golden/make_attribution_more.py [gemma2] [qwen3]

circuit-tracer's TransformerLens backend (TransformerLens 2.16.1 has Gemma 2
and Qwen3 weight conversions) on the golden5 models tests/data/golden5/gemma2
(3 layers, d 32, vocab 96, sliding window 5 on layers 0 and 2, attention
score soft cap 5, final logit soft cap 3, query_pre_attn_scalar 24) and
tests/data/golden5/qwen3 (3 layers, d 32, q/k norms, grouped-query attention).
Their configs are 5.x's (rope_parameters); they are rewritten in Transformers
4.57's fields (rope_theta) to load the weights, and the TransformerLens config
is written here from the HF config (as its get_pretrained_model_config does
for the hub models; its Gemma 2 entries are per hub model, so the fixture's
window, layer pattern, caps and attention scale sqrt(24) are set here). The
TransformerLens model's logits are checked against the HF model's before the
graph is made.

Transcoders: make_attribution.py's (seed 51, d_sae 16, skip, layer 1 JumpReLU,
the rest ReLU), reading blocks.L.mlp.hook_in (the pre-feedforward norm's
output with its weight: flexmodel's MLP input). Gemma 2's write
blocks.L.hook_mlp_out (after the post-feedforward norm, as Gemma 3's), Qwen3's
blocks.L.mlp.hook_out. Written, for FAMILY in gemma2, qwen3:

  FAMILY-transcoders/layer_{0..2}/   cfg.json + sae_weights.safetensors
  FAMILY-circuit-tracer.safetensors  as make_attribution.py's FAMILY file
"""

import json
import os
import sys
import tempfile

import torch

import circuit_tracer
import transformer_lens
from circuit_tracer.transcoder.single_layer_transcoder import TranscoderSet
from transformer_lens import HookedTransformerConfig
from transformer_lens.pretrained.weight_conversions import convert_gemma_weights, convert_qwen3_weights
from transformers import AutoConfig, AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_attribution import (OUT, ROOT, attribute_and_prune, graph_metadata, graph_tensors,  # noqa: E402
                              save_golden, tl_replacement_model, transcoders, write_saelens_folders)

assert circuit_tracer.__version__ == "0.5.0", circuit_tracer.__version__

PROMPT = [2, 17, 42, 7, 91, 5, 11, 60, 33, 8]  # 10 tokens (past Gemma 2's window of 5); vocab 96


def hf_model(family, tmp):
    """The golden5 model in Transformers 4.57 (its config's rope_parameters as rope_theta)."""
    src = os.path.join(ROOT, "tests/data/golden5", family)
    with open(os.path.join(src, "config.json")) as f:
        c = json.load(f)
    rope = c.pop("rope_parameters")
    assert rope["rope_type"] == "default", rope
    c["rope_theta"] = rope["rope_theta"]
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(c, f)
    os.symlink(os.path.join(src, "model.safetensors"), os.path.join(tmp, "model.safetensors"))
    config = AutoConfig.from_pretrained(tmp)
    return AutoModelForCausalLM.from_pretrained(tmp, config=config, dtype=torch.float32,
                                                attn_implementation="eager").eval()


def common(c, name):
    return dict(d_model=c.hidden_size, d_head=c.head_dim, n_heads=c.num_attention_heads,
                n_key_value_heads=c.num_key_value_heads, d_mlp=c.intermediate_size, n_layers=c.num_hidden_layers,
                n_ctx=c.max_position_embeddings, eps=c.rms_norm_eps, d_vocab=c.vocab_size, normalization_type="RMS",
                positional_embedding_type="rotary", rotary_dim=c.head_dim, rotary_base=c.rope_theta,
                rotary_adjacent_pairs=False, gated_mlp=True, final_rms=True, model_name=name,
                default_prepend_bos=False, dtype=torch.float32, device="cpu")


def gemma2_cfg(c):
    types = {"sliding_attention": "local", "full_attention": "global"}
    return HookedTransformerConfig(
        **common(c, "gemma2-fixture"), act_fn=c.hidden_activation, use_attn_scale=True,
        attn_scale=float(c.query_pre_attn_scalar) ** 0.5, window_size=c.sliding_window, use_local_attn=True,
        attn_types=[types[t] for t in c.layer_types], attn_scores_soft_cap=c.attn_logit_softcapping,
        output_logits_soft_cap=c.final_logit_softcapping, use_normalization_before_and_after=True,
        original_architecture="Gemma2ForCausalLM")


def qwen3_cfg(c):
    return HookedTransformerConfig(**common(c, "qwen3-fixture"), act_fn=c.hidden_act, use_attn_scale=True,
                                   use_qk_norm=True, original_architecture="Qwen3ForCausalLM")


def make(family):
    with tempfile.TemporaryDirectory() as tmp:
        hf = hf_model(family, tmp)
        cfg = (gemma2_cfg if family == "gemma2" else qwen3_cfg)(hf.config)
        weights = (convert_gemma_weights if family == "gemma2" else convert_qwen3_weights)(hf, cfg)
        weights.setdefault("unembed.b_U", torch.zeros(cfg.d_vocab))
        made, saelens = transcoders(cfg.d_model, cfg.n_layers, family)
        out_hook = "hook_mlp_out" if family == "gemma2" else "mlp.hook_out"
        tset = TranscoderSet({i: t for i, t in enumerate(made.transcoders)}, feature_input_hook="mlp.hook_in",
                             feature_output_hook=out_hook, scan=f"flexmodel-{family}-fixture")
        model = tl_replacement_model(cfg, weights, tset, PROMPT[0])
        model.tokenizer.vocab_size = cfg.d_vocab
        with torch.no_grad():
            ids = torch.tensor([PROMPT])
            theirs = hf(ids).logits
            ours = model(ids, return_type="logits")
        diff = (ours - theirs).abs().max().item()
        assert diff < 1e-4, f"{family}: TransformerLens logits differ from HF's by {diff}"
        graph, node_mask, edge_mask, cumulative = attribute_and_prune(model, PROMPT)

    for layer, (c, _) in enumerate(saelens):
        c["metadata"]["hook_name_out"] = f"blocks.{layer}.{out_hook}"
    write_saelens_folders(f"{family}-transcoders", saelens)
    save_golden(graph_tensors(graph, node_mask, edge_mask, cumulative),
                os.path.join(OUT, f"{family}-circuit-tracer.safetensors"),
                graph_metadata(backend="transformerlens",
                               transformer_lens=getattr(transformer_lens, "__version__", "2.16.1")))
    print(f"{family}: TL vs HF logits {diff:.3g}; {len(graph.selected_features)} features, "
          f"{graph.adjacency_matrix.shape[0]} nodes, {len(graph.logit_targets)} logits, "
          f"{int(node_mask.sum())} nodes / {int(edge_mask.sum())} edges kept", file=sys.stderr)


def main():
    for family in sys.argv[1:] or ["gemma2", "qwen3"]:
        make(family)


if __name__ == "__main__":
    main()
