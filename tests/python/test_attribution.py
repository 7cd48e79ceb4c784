"""flexmodel.attribute against circuit-tracer 0.5.0 on the same model and transcoders
(tests/data/attribution, scripts/golden/make_attribution.py): the same nodes, edges within
1e-4, the same pruned graph and graph file; typed errors."""

import json

import pytest
import torch
from safetensors.torch import load_file

import flexmodel
from conftest import DATA, assert_close

ATTR = DATA.parent / "attribution"


@pytest.fixture(scope="module")
def gpt2():
    return flexmodel.from_pretrained(DATA / "models" / "gpt2")


@pytest.fixture(scope="module")
def golden():
    return load_file(str(ATTR / "gpt2-circuit-tracer.safetensors"))


def test_graph_equals_circuit_tracers(gpt2, golden):
    g = flexmodel.attribute(gpt2, ATTR / "gpt2-transcoders", golden["input_ids"], batch_size=16,
                            slug="gpt2-circuit-tracer-graph")
    assert torch.equal(g["active_features"], golden["active_features"])
    assert torch.equal(g["selected_features"], golden["selected_features"])
    assert torch.equal(g["logit_tokens"], golden["logit_tokens"])
    assert_close(g["activations"], golden["activation_values"], 1e-4, "activations")
    theirs = golden["adjacency"]
    assert_close(g["adjacency"], theirs, 1e-4 * theirs.abs().max().item(), "adjacency")
    assert torch.equal(g["node_mask"].to(torch.uint8), golden["node_mask"])
    assert torch.equal(g["edge_mask"].to(torch.uint8), golden["edge_mask"])
    ct = json.loads((ATTR / "gpt2-circuit-tracer-graph.json").read_text())
    assert [n["node_id"] for n in g["json"]["nodes"]] == [n["node_id"] for n in ct["nodes"]]
    assert [(l["source"], l["target"]) for l in g["json"]["links"]] == [(l["source"], l["target"]) for l in ct["links"]]
    assert g["json"]["metadata"]["prompt_tokens"] == ct["metadata"]["prompt_tokens"]


def test_transcoder_objects_and_the_folder_agree(gpt2, golden):
    tcs = [flexmodel.sae.load_sae(ATTR / "gpt2-transcoders" / f"layer_{l}") for l in range(2)]
    a = flexmodel.attribute(gpt2, tcs, golden["input_ids"], max_feature_nodes=20, batch_size=8)
    b = flexmodel.attribute(gpt2, ATTR / "gpt2-transcoders", golden["input_ids"], max_feature_nodes=20, batch_size=8)
    assert a["selected_features"].numel() == 20
    assert torch.equal(a["adjacency"], b["adjacency"])


def test_max_memory_streams_the_same_graph(gpt2, golden, tmp_path, monkeypatch):
    """max_memory= (decision 45): the adjacency streamed through a file under $TMPDIR; the same
    pruned graph, kept edges and graph file as in memory; the file gone after; too small a bound
    is a ConfigError naming the size needed."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    args = (gpt2, ATTR / "gpt2-transcoders", golden["input_ids"])
    dense = flexmodel.attribute(*args, batch_size=16)
    g = flexmodel.attribute(*args, batch_size=16, max_memory="200MB")
    assert g["adjacency"] is None and g["edge_mask"] is None
    assert 0 < g["peak_working_memory"] <= 200e6
    assert torch.equal(g["node_mask"], dense["node_mask"])
    kept = dense["edge_mask"].nonzero()
    assert torch.equal(g["edges"], kept) and torch.equal(dense["edges"], kept)
    assert torch.equal(g["edge_weights"], dense["adjacency"][kept[:, 0], kept[:, 1]])
    assert g["json"] == dense["json"]
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(flexmodel.ConfigError, match="below what a batch of two target rows needs"):
        flexmodel.attribute(*args, max_memory=10_000)
    with pytest.raises(flexmodel.ConfigError, match="max_memory"):
        flexmodel.attribute(*args, max_memory=0)


def test_token_strings_from_a_tokenizer(gpt2, golden):
    class Tok:
        def decode(self, ids):
            return f"<{ids[0]}>"

    g = flexmodel.attribute(gpt2, ATTR / "gpt2-transcoders", golden["input_ids"], tokenizer=Tok(), prompt="p")
    meta = g["json"]["metadata"]
    assert meta["prompt"] == "p"
    assert meta["prompt_tokens"] == [f"<{i}>" for i in golden["input_ids"].tolist()]
    logits = [n for n in g["json"]["nodes"] if n["feature_type"] == "logit"]
    assert logits and all(n["clerp"].startswith(f'Output "<{n["feature"]}>"') for n in logits)


def test_typed_errors(gpt2, golden):
    with pytest.raises(flexmodel.ConfigError, match="node_threshold"):
        flexmodel.attribute(gpt2, ATTR / "gpt2-transcoders", golden["input_ids"], node_threshold=2.0)
    with pytest.raises(flexmodel.ShapeError, match="65 tokens"):
        flexmodel.attribute(gpt2, ATTR / "gpt2-transcoders", torch.full((65,), 3))
    with pytest.raises(flexmodel.ConfigError, match="1 transcoders"):
        flexmodel.attribute(gpt2, [flexmodel.sae.load_sae(ATTR / "gpt2-transcoders" / "layer_0")], golden["input_ids"])


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("frozen", [True, False])
def test_interventions_equal_circuit_tracers_feature_intervention(family, frozen):
    # scripts/golden/make_attribution.py --interventions: circuit-tracer 0.5.0's logits with
    # freeze_attention True / False for three edits (off, on, tripled: given here as a scale).
    gold = load_file(str(ATTR / f"{family}-circuit-tracer-interventions.safetensors"))
    m = fixture_model(family)
    ids = load_file(str(ATTR / f"{family}-circuit-tracer.safetensors"))["input_ids"]
    iv = gold["interventions"].tolist()
    edits = [(int(l), int(p), int(f), v) for l, p, f, v in iv[:2]]
    tripled = (int(iv[2][0]), int(iv[2][1]) - ids.numel(), int(iv[2][2]), 3.0, True)  # the last position, scaled
    logits = flexmodel.intervene(m, ATTR / f"{family}-transcoders", ids, edits + [tripled], frozen_attention=frozen)
    theirs = gold["frozen_logits" if frozen else "unfrozen_logits"]
    moved = (theirs - gold["clean_logits"]).abs().max().item()
    assert moved > 0.1, "the edits barely move circuit-tracer's logits"
    assert_close(logits, theirs, 1e-5 * theirs.abs().max().item(), f"{family} logits (frozen={frozen})")
    # The string form is the same intervention.
    text = [f"{l}:{p}:{f}={v!r}" for l, p, f, v in edits] + [f"{tripled[0]}:{tripled[1]}:{tripled[2]}*3"]
    assert torch.equal(flexmodel.intervene(m, ATTR / f"{family}-transcoders", ids, text, frozen_attention=frozen), logits)


_MODELS = {}


def fixture_model(family):
    if family not in _MODELS:
        _MODELS[family] = flexmodel.from_pretrained(DATA / "models" / family)
    return _MODELS[family]


def test_intervention_out_of_range_is_a_config_error(gpt2):
    with pytest.raises(flexmodel.errors.ConfigError, match="layer 5"):
        flexmodel.intervene(gpt2, ATTR / "gpt2-transcoders", torch.arange(1, 8), [(5, 0, 0, 1.0)])
    with pytest.raises(flexmodel.errors.ConfigError, match="LAYER:POS:FEATURE"):
        flexmodel.intervene(gpt2, ATTR / "gpt2-transcoders", torch.arange(1, 8), ["1:2=3"])


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_generation_equals_circuit_tracers_feature_intervention_generate(family):
    # Its greedy KV-cached generation with the first two edits and frozen attention (the first
    # step's patterns the clean run's): the same tokens and each step's logits.
    gold = load_file(str(ATTR / f"{family}-circuit-tracer-interventions.safetensors"))
    ids = load_file(str(ATTR / f"{family}-circuit-tracer.safetensors"))["input_ids"]
    edits = [(int(l), int(p), int(f), v) for l, p, f, v in gold["interventions"].tolist()[:2]]
    out, steps = flexmodel.intervene_generate(fixture_model(family), ATTR / f"{family}-transcoders", ids, edits, 5)
    assert torch.equal(out, gold["frozen_generated"])
    theirs = gold["frozen_step_logits"]
    assert_close(steps, theirs, 1e-5 * theirs.abs().max().item(), f"{family} step logits")


def test_gemma3_graph_equals_circuit_tracers_nnsight_backend():
    # scripts/golden/make_attribution_gemma3.py: circuit-tracer 0.5.0's nnsight backend, whose
    # token columns are the direct effects over sqrt(d) (it values a token at the unscaled
    # embedding row): ours divided by the model's float32 sqrt(32) before comparing.
    m = flexmodel.from_pretrained(DATA.parent / "golden5" / "gemma3_text")
    gold = load_file(str(ATTR / "gemma3-circuit-tracer.safetensors"))
    g = flexmodel.attribute(m, ATTR / "gemma3-transcoders", gold["input_ids"], batch_size=16)
    assert torch.equal(g["active_features"], gold["active_features"])
    assert torch.equal(g["logit_tokens"], gold["logit_tokens"])
    adj = g["adjacency"].clone()
    n_feat, T = g["selected_features"].numel(), gold["input_ids"].numel()
    tokens = n_feat + m.config["num_hidden_layers"] * T
    adj[:, tokens:tokens + T] /= torch.tensor(32.0).sqrt().item()
    theirs = gold["adjacency"]
    assert_close(adj, theirs, 1e-4 * theirs.abs().max().item(), "gemma3 adjacency")


def test_gemma3_takes_transcoders_of_its_width_only():
    # Gemma 3 is attributed (its graph checked against the float64 reference in
    # sae_attribution); a transcoder of another model's width is a ShapeError naming it.
    m = flexmodel.from_pretrained(DATA.parent / "contract" / "gemma3_text")
    t = flexmodel.sae.load_sae(ATTR / "gpt2-transcoders" / "layer_0")
    with pytest.raises(flexmodel.ShapeError, match="W_enc"):
        flexmodel.attribute(m, [t] * m.config["num_hidden_layers"], torch.arange(1, 6))
