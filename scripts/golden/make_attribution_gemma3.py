"""Golden Gemma 3 attribution graph from circuit-tracer 0.5.0 (tests/data/attribution).

Run with the venv of `bash scripts/golden/setup.sh --attribution`:

    PY=$(bash scripts/golden/setup.sh --attribution)
    $PY scripts/golden/make_attribution_gemma3.py

circuit-tracer's TransformerLens backend cannot take Gemma 3: TransformerLens
2.16.1 has no Gemma3ForCausalLM (no weight conversion, no model name) and its
config has one rotary_base for every layer and no RoPE scaling, where Gemma 3
uses base 1e4 on its sliding layers and 1e6 with linear scaling on the full
ones. Its nnsight backend (NNSightReplacementModel, nnsight 0.8.1 on
Transformers 4.57.3) maps Gemma3ForCausalLM, so that backend makes this file.

The model is tests/data/golden5/gemma3_text (7 layers, d 32, vocab 96, window
6, one full layer), its config rewritten in Transformers 4.57's fields (the
fixture's rope_parameters are 5.x's: rope_theta 1e6 with rope_scaling linear x8
for the full layers, rope_local_base_freq 1e4). Transcoders: make_attribution.py's
(seeded, skip, layer 1 JumpReLU, 16 features), reading mlp.hook_in (the
pre-feedforward norm's output) and writing hook_mlp_out (after the
post-feedforward norm), saved as SAELens folders with those hook names.

  gemma3-transcoders/layer_{0..6}/   cfg.json + sae_weights.safetensors
  gemma3-circuit-tracer.safetensors  as make_attribution.py's FAMILY file
"""

import json
import os
import sys
import tempfile

import torch

import circuit_tracer
from circuit_tracer.replacement_model.replacement_model_nnsight import NNSightReplacementModel
from circuit_tracer.transcoder.single_layer_transcoder import TranscoderSet
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_attribution import (OUT, ROOT, IdTokenizer, attribute_and_prune, graph_metadata,  # noqa: E402
                              graph_tensors, save_golden, transcoders, write_saelens_folders)

assert circuit_tracer.__version__ == "0.5.0", circuit_tracer.__version__

MODEL = os.path.join(ROOT, "tests/data/golden5/gemma3_text")
PROMPT = [2, 17, 42, 7, 91, 5, 11, 60, 33, 8]  # 2: the fixture's bos token; 10 tokens, past the window of 6


def gemma3_model(tmp):
    with open(os.path.join(MODEL, "config.json")) as f:
        c = json.load(f)
    rope = c.pop("rope_parameters")
    assert rope["full_attention"]["rope_type"] == "linear" and rope["sliding_attention"]["rope_type"] == "default"
    c["rope_theta"] = rope["full_attention"]["rope_theta"]
    c["rope_scaling"] = {"rope_type": "linear", "factor": rope["full_attention"]["factor"]}
    c["rope_local_base_freq"] = rope["sliding_attention"]["rope_theta"]
    c["sliding_window_pattern"] = c.pop("_sliding_window_pattern")
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(c, f)
    os.symlink(os.path.join(MODEL, "model.safetensors"), os.path.join(tmp, "model.safetensors"))
    config = Gemma3TextConfig.from_pretrained(tmp)
    config._attn_implementation = "eager"
    hf = Gemma3ForCausalLM.from_pretrained(tmp, config=config, dtype=torch.float32, attn_implementation="eager").eval()
    return config, hf


def main():
    with tempfile.TemporaryDirectory() as tmp:
        config, hf = gemma3_model(tmp)
        d, n = config.hidden_size, config.num_hidden_layers
        made, saelens = transcoders(d, n, "gemma3")
        tset = TranscoderSet({i: t for i, t in enumerate(made.transcoders)}, feature_input_hook="mlp.hook_in",
                             feature_output_hook="hook_mlp_out", scan="flexmodel-gemma3-fixture")
        tok = IdTokenizer(PROMPT[0])
        tok.vocab_size = config.vocab_size
        model = NNSightReplacementModel(hf, tokenizer=tok, dispatch=True)
        model._hf_config = config
        model._configure_replacement_model(tset)
        graph, node_mask, edge_mask, cumulative = attribute_and_prune(model, PROMPT)

    for layer, (c, _) in enumerate(saelens):
        c["metadata"]["hook_name_out"] = f"blocks.{layer}.hook_mlp_out"
    write_saelens_folders("gemma3-transcoders", saelens)
    import nnsight
    import transformers
    save_golden(graph_tensors(graph, node_mask, edge_mask, cumulative),
                os.path.join(OUT, "gemma3-circuit-tracer.safetensors"),
                graph_metadata(backend="nnsight", nnsight=nnsight.__version__, transformers=transformers.__version__))
    print(f"gemma3: {len(graph.selected_features)} features, {graph.adjacency_matrix.shape[0]} nodes, "
          f"{len(graph.logit_targets)} logits, {int(node_mask.sum())} nodes / {int(edge_mask.sum())} edges kept",
          file=sys.stderr)


if __name__ == "__main__":
    main()
