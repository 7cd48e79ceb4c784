"""from_pretrained(prefetch_depth=...): offloaded blocks read ahead by a reader thread give the same
logits, bit for bit, as no prefetch, and those match Transformers' golden logits (design decision 41)."""
import json

import pytest
import torch
from safetensors import safe_open

import flexmodel
from conftest import DATA, assert_close

MAP = {"model.embed_tokens": "cpu", "model.layers.0": "disk", "model.layers.1": "disk", "model.norm": "cpu",
       "model.rotary_emb": "cpu", "lm_head": "disk"}


def golden_llama():
    meta = json.loads((DATA / "golden" / "llama.json").read_text())
    g = safe_open(str(DATA / "golden" / "llama.safetensors"), "pt")
    return DATA / meta["model_dir"], g.get_tensor("input_ids"), g.get_tensor("logits")


def logits(model_dir, ids, depth):
    model = flexmodel.from_pretrained(model_dir, device_map=MAP, prefetch_depth=depth)
    with torch.no_grad():
        return [model(ids) for _ in range(3)]  # later forwards start on blocks read ahead


def test_prefetch_depths_bit_equal_and_golden():
    model_dir, ids, want = golden_llama()
    off = logits(model_dir, ids, 0)
    assert_close(off[0], want, 1e-4, "llama with disk blocks, prefetch 0")
    for depth in (1, 2):
        on = logits(model_dir, ids, depth)
        for i, (a, b) in enumerate(zip(on, off)):
            assert torch.equal(a, b), f"prefetch {depth}, forward {i}: max diff {(a - b).abs().max().item()}"


def test_negative_prefetch_depth_is_a_config_error():
    model_dir, _, _ = golden_llama()
    with pytest.raises(flexmodel.errors.ConfigError, match="prefetch_depth"):
        flexmodel.from_pretrained(model_dir, device_map=MAP, prefetch_depth=-1)
