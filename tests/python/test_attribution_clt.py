"""flexmodel.attribute / intervene through a cross-layer transcoder against circuit-tracer 0.5.0
(tests/data/attribution/FAMILY-clt, written by its CrossLayerTranscoder.to_safetensors;
scripts/golden/make_attribution_clt.py): the same nodes, edges within 1e-4, the same pruned
graph, the same intervened logits and generated tokens; a mis-shaped CLT is a ConfigError naming the file."""

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import flexmodel
from conftest import DATA, assert_close

ATTR = DATA.parent / "attribution"


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_clt_graph_and_interventions_equal_circuit_tracers(family):
    model = flexmodel.from_pretrained(DATA / "models" / family)
    golden = load_file(str(ATTR / f"{family}-clt-circuit-tracer.safetensors"))
    g = flexmodel.attribute(model, ATTR / f"{family}-clt", golden["input_ids"], batch_size=16)
    assert torch.equal(g["active_features"], golden["active_features"])
    assert torch.equal(g["selected_features"], golden["selected_features"])
    assert torch.equal(g["logit_tokens"], golden["logit_tokens"])
    theirs = golden["adjacency"]
    assert_close(g["adjacency"], theirs, 1e-4 * theirs.abs().max().item(), "adjacency")
    assert torch.equal(g["node_mask"].to(torch.uint8), golden["node_mask"])
    assert torch.equal(g["edge_mask"].to(torch.uint8), golden["edge_mask"])
    ivs = [(int(l), int(p), int(f), float(v)) for l, p, f, v in golden["interventions"].tolist()]
    for frozen, name in ((True, "frozen_logits"), (False, "unfrozen_logits")):
        got = flexmodel.intervene(model, ATTR / f"{family}-clt", golden["input_ids"], ivs, frozen_attention=frozen)
        want = golden[name]
        assert (want - golden["clean_logits"]).abs().max() > 0.5
        assert_close(got, want, 1e-4 * want.abs().max().item(), name)
    # Its greedy KV-cached generation with both edits and frozen attention.
    out, steps = flexmodel.intervene_generate(model, ATTR / f"{family}-clt", golden["input_ids"], ivs, 5)
    assert torch.equal(out, golden["frozen_generated"])
    assert_close(steps, golden["frozen_step_logits"], 1e-4 * golden["frozen_step_logits"].abs().max().item(),
                 "step logits")


def test_mis_shaped_clt_is_a_config_error(tmp_path):
    model = flexmodel.from_pretrained(DATA / "models" / "gpt2")
    clt = tmp_path / "clt"
    shutil.copytree(ATTR / "gpt2-clt", clt)
    save_file({"W_dec_1": torch.zeros(16, 2, 64)}, str(clt / "W_dec_1.safetensors"))
    with pytest.raises(flexmodel.errors.ConfigError, match=r"W_dec_1\.safetensors.*\[16, 2, 64\]"):
        flexmodel.attribute(model, clt, torch.tensor([1, 2, 3]))


def test_streamed_clt_graph_is_the_in_memory_one():
    # max_memory (design decision 45) with a CLT: the same nodes and the same pruned edges and
    # weights as the dense graph, whose pruning equals circuit-tracer's (above).
    model = flexmodel.from_pretrained(DATA / "models" / "llama")
    ids = load_file(str(ATTR / "llama-clt-circuit-tracer.safetensors"))["input_ids"]
    dense = flexmodel.attribute(model, ATTR / "llama-clt", ids, batch_size=16)
    streamed = flexmodel.attribute(model, ATTR / "llama-clt", ids, batch_size=16, max_memory="2MB")
    assert streamed["adjacency"] is None
    assert torch.equal(streamed["node_mask"], dense["node_mask"])
    kept = dense["edge_mask"]
    assert set(map(tuple, streamed["edges"].tolist())) == set(map(tuple, kept.nonzero().tolist()))
    want = {tuple(e): dense["adjacency"][e[0], e[1]].item() for e in kept.nonzero().tolist()}
    worst = max(abs(w - want[tuple(e)]) for e, w in zip(streamed["edges"].tolist(), streamed["edge_weights"].tolist()))
    assert worst <= 1e-6 * dense["adjacency"].abs().max().item(), worst
