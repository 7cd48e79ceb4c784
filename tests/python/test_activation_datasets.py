"""Dataset-scale capture from Python: the stored activations of every token equal the same tokens'
activations in Transformers 5.23 (forward hooks on the same checkpoint, each context run alone), and the
loader hands out every stored token once per pass."""
import json

import pytest
import torch
from safetensors.torch import save_file

import flexmodel
from conftest import DATA, assert_close

transformers = pytest.importorskip("transformers")

HOOKS = ["transformer.h.1", "transformer.h.0.mlp"]


@pytest.fixture(scope="module")
def gpt2_dir():
    return DATA / json.loads((DATA / "golden" / "gpt2.json").read_text())["model_dir"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, gpt2_dir):
    vocab = json.loads((gpt2_dir / "config.json").read_text())["vocab_size"]
    g = torch.Generator().manual_seed(3)
    docs = torch.randint(0, vocab, (5, 23), generator=g)  # 115 tokens: 14 contexts of 8, 3 dropped
    path = tmp_path_factory.mktemp("corpus") / "ids.safetensors"
    save_file({"input_ids": docs}, str(path))
    return path, docs.reshape(-1)


def transformers_activations(model_dir, ids):
    """{hook: [n_contexts, T, d]} from Transformers' own forward hooks, one context per forward."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager").eval()
    got = {h: [] for h in HOOKS}
    handles = [hf.get_submodule(h).register_forward_hook(
        lambda m, i, o, h=h: got[h].append((o[0] if isinstance(o, tuple) else o).detach())) for h in HOOKS]
    with torch.no_grad():
        for row in ids:
            hf(row[None])
    for handle in handles:
        handle.remove()
    return {h: torch.cat(v) for h, v in got.items()}


def test_capture_dataset_equals_transformers_and_loader_covers_every_token(tmp_path, gpt2_dir, corpus):
    path, stream = corpus
    model = flexmodel.from_pretrained(gpt2_dir)
    seen = []
    result = flexmodel.capture_dataset(model, path, tmp_path / "acts", HOOKS, context_len=8, batch_size=4,
                                       shard_size=4096, progress=lambda p: seen.append(p["contexts"]))
    assert result["contexts"] == 14 and result["tokens_stored"] == 112 and result["tokens_dropped"] == 3, result
    assert seen and seen[-1] == 14, seen
    data = flexmodel.ActivationDataset(tmp_path / "acts")
    assert len(data) == 112 and data.num_contexts == 14 and data.num_shards > 1
    assert sorted(data.hooks) == sorted(HOOKS)
    assert data.settings["context_len"] == 8

    contexts = stream[:112].reshape(14, 8)
    want = transformers_activations(gpt2_dir, contexts)
    rows = [data.shard(i) for i in range(data.num_shards)]
    stored = {k: torch.cat([r[k] for r in rows]) for k in HOOKS + ["token_ids", "context", "offset"]}
    assert torch.equal(stored["token_ids"], contexts.reshape(-1))
    for h in HOOKS:
        expected = want[h][stored["context"], stored["offset"]]
        assert_close(stored[h], expected, 1e-4, f"stored {h} vs Transformers")

    # One pass of the loader: every stored token once, in order; a shuffled pass: the same tokens.
    batches = list(data.loader(batch_tokens=10))
    assert [b["token_ids"].shape[0] for b in batches] == [10] * 11 + [2]
    assert torch.equal(torch.cat([b["token_ids"] for b in batches]), stored["token_ids"])
    mixed = data.loader(batch_tokens=16, shuffle=True, seed=1, hooks=[HOOKS[0]])
    first = list(mixed)
    keys = lambda bs: sorted(zip(torch.cat([b["context"] for b in bs]).tolist(),  # noqa: E731
                                 torch.cat([b["offset"] for b in bs]).tolist()))
    assert keys(first) == sorted(zip(stored["context"].tolist(), stored["offset"].tolist()))
    assert set(first[0]) == {HOOKS[0], "token_ids", "document", "position", "context", "offset"}
    for b in first:  # each row still carries its own activation
        assert_close(b[HOOKS[0]], want[HOOKS[0]][b["context"], b["offset"]], 1e-4, "shuffled rows")


def test_capture_through_a_flex_model_keeps_its_hooks_and_draws_positions(tmp_path, gpt2_dir, corpus):
    path, _ = corpus
    model = flexmodel.from_pretrained(gpt2_dir)
    out = {}
    fm = flexmodel.FlexModel(model, out)
    calls = []
    fm.register_forward_hook(flexmodel.HookFunction("transformer.h.0", editing_function=lambda m, x, c, t: (
        calls.append(1), x)[1]))
    result = flexmodel.capture_dataset(fm, path, tmp_path / "k", ["transformer.h.1"], context_len=8, batch_size=7,
                                       positions=3, seed=5, max_tokens=40, store_dtype=torch.bfloat16)
    assert result["contexts"] == 5 and result["tokens_stored"] == 15, result
    assert len(calls) == 1, "the FlexModel's own hook ran once per batch"
    data = flexmodel.ActivationDataset(tmp_path / "k")
    shard = data.shard(0)
    assert shard["transformer.h.1"].dtype == torch.bfloat16
    per_context = torch.bincount(shard["context"])
    assert per_context.tolist() == [3] * 5


def test_bad_input_is_typed(tmp_path, gpt2_dir, corpus):
    path, _ = corpus
    model = flexmodel.from_pretrained(gpt2_dir)
    with pytest.raises(flexmodel.NotFoundError, match="transformer.h.9"):
        flexmodel.capture_dataset(model, path, tmp_path / "x", ["transformer.h.9"], context_len=8)
    with pytest.raises(flexmodel.ConfigError, match="positions"):
        flexmodel.capture_dataset(model, path, tmp_path / "x", ["transformer.h.1"], positions=0)
    with pytest.raises(flexmodel.IOError, match="nowhere"):
        flexmodel.ActivationDataset(tmp_path / "nowhere")
    with pytest.raises(flexmodel.IOError):
        flexmodel.capture_dataset(model, tmp_path / "missing.txt", tmp_path / "y", ["transformer.h.1"])
