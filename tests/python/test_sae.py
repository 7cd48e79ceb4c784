"""Sparse dictionaries from Python: encode / decode / forward equal sae-lens 6.54's outputs
(tests/data/sae golden files), splicing into a FlexModel leaves or changes the logits exactly as
patching the hand-computed activation does, feature edits and steering, TransformerLens names."""
import json

import pytest
import torch
from safetensors import safe_open

import flexmodel
from conftest import DATA, assert_close

SAE = DATA.parent / "sae"
ARCHS = ["standard", "gated", "jumprelu", "topk", "batchtopk", "transcoder", "skip_transcoder",
         "standard_layer_norm", "standard_constant_norm_rescale", "legacy_pre6"]
IDS = torch.tensor([[3, 17, 42, 7, 99], [5, 11, 64, 2, 8]])


@pytest.mark.parametrize("name", ARCHS)
def test_encode_decode_forward_equal_sae_lens(name):
    sae = flexmodel.sae.load_sae(SAE / name)
    golden = safe_open(str(SAE / name / "golden.safetensors"), "pt")
    x = golden.get_tensor("x")
    with torch.no_grad():
        f = sae.encode(x)
        assert_close(f, golden.get_tensor("encode"), 1e-5, f"{name} encode")
        assert_close(sae.decode(f), golden.get_tensor("decode"), 1e-5, f"{name} decode")
        assert_close(sae(x), golden.get_tensor("forward"), 1e-5, f"{name} forward")
    assert sae.cfg["d_sae"] == f.shape[-1]


def gpt2():
    return flexmodel.from_pretrained(DATA / "models" / "gpt2")


def capture(model, name, kind="forward"):
    out = {}
    fm = flexmodel.FlexModel(model, out)
    hook = flexmodel.HookFunction(name)
    (fm.register_forward_hook if kind == "forward" else fm.register_forward_pre_hook)(hook)
    with torch.no_grad():
        fm.forward(IDS)
    return out[name + ("#input" if kind != "forward" else "")]


def patched_logits(model, name, value):
    fm = flexmodel.FlexModel(model, {})
    fm.register_forward_hook(flexmodel.HookFunction(name, editing_function=flexmodel.edits.patch(value)))
    with torch.no_grad():
        return fm.forward(IDS)


def features_by_hand(sae_dir, x):
    w = safe_open(str(sae_dir / "sae_weights.safetensors"), "pt")
    cfg = json.loads((sae_dir / "cfg.json").read_text())
    k = cfg["k"]
    pre = (x.double() - w.get_tensor("b_dec").double()) @ w.get_tensor("W_enc").double() + w.get_tensor("b_enc").double()
    v, i = pre.topk(k, -1)
    return torch.zeros_like(pre).scatter(-1, i, v.relu()), w.get_tensor("W_dec").double(), w.get_tensor("b_dec").double()


PLACE = "transformer.h.1.hook_resid_post"


def test_splice_modes_against_patching_by_hand():
    model = gpt2()
    with torch.no_grad():
        plain = model(IDS)
    x = capture(model, PLACE)
    f, W_dec, b_dec = features_by_hand(SAE / "topk", x)
    recon = (f @ W_dec + b_dec).float()
    sae = flexmodel.sae.load_sae(SAE / "topk")
    assert flexmodel.sae.resolve_hook_name(model, sae.cfg["hook_name"]) == (PLACE, False, False)

    for mode, want in [("observe", plain), ("replace_with_error", plain), ("replace", patched_logits(model, PLACE, recon))]:
        out = {}
        fm = flexmodel.FlexModel(model, out)
        splice = flexmodel.sae.splice_sae(fm, sae, mode=mode)
        assert splice.module == PLACE
        fm.register_forward_hook(flexmodel.HookFunction(PLACE + ".sae.hook_sae_acts_post"))
        with torch.no_grad():
            got = fm.forward(IDS)
        assert_close(got, want, 2e-5, f"{mode} logits")
        assert_close(out[PLACE + ".sae.hook_sae_acts_post"], f.float(), 1e-5, f"{mode} features")
        splice.remove()

    # Clamping a feature in replace-with-error mode: the activation plus (value - f) * W_dec row.
    feature = int((f[0, 2] == 0).nonzero()[0])
    fm = flexmodel.FlexModel(model, {})
    splice = flexmodel.sae.splice_sae(fm, sae, mode="replace_with_error")
    fm.register_forward_hook(flexmodel.HookFunction(PLACE + ".sae.hook_sae_acts_post",
                                                    editing_function=flexmodel.edits.clamp_feature(feature, 5.0, [2])))
    with torch.no_grad():
        got = fm.forward(IDS)
    edited = x.double().clone()
    edited[:, 2] += (5.0 - f[:, 2, feature]).unsqueeze(-1) * W_dec[feature]
    assert_close(got, patched_logits(model, PLACE, edited.float()), 2e-5, "clamp")
    assert (got - plain).abs().max() > 1e-3, "the clamp changed nothing: the test would prove nothing"

    # Steering: + alpha * W_dec row where the dictionary writes.
    fm = flexmodel.FlexModel(model, {})
    flexmodel.sae.splice_sae(fm, sae, mode="replace_with_error")
    fm.register_forward_hook(flexmodel.HookFunction(PLACE, editing_function=flexmodel.edits.steer_feature(sae, 7, 3.0)))
    with torch.no_grad():
        got = fm.forward(IDS)
    assert_close(got, patched_logits(model, PLACE, (x.double() + 3.0 * W_dec[7]).float()), 2e-5, "steer")


def test_sparse_codes_and_errors():
    acts = torch.tensor([[0.0, 2.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [3.0, 0.0, 0.5, 0.0]])
    indptr, indices, values = flexmodel.sae.sparse_code(acts)
    assert indptr.tolist() == [0, 2, 2, 4] and indices.tolist() == [1, 3, 0, 2]
    assert values.tolist() == [2.0, 1.0, 3.0, 0.5]
    idx, val, l0 = flexmodel.sae.strongest_features(acts, 1)
    assert idx.tolist() == [[1], [-1], [0]] and val.tolist() == [[2.0], [0.0], [3.0]] and l0.tolist() == [2, 0, 2]
    with pytest.raises(flexmodel.NotFoundError, match="hook_resid_pre"):
        flexmodel.sae.resolve_hook_name(gpt2(), "blocks.0.hook_nothing")
    with pytest.raises(flexmodel.IOError):
        flexmodel.sae.load_sae(SAE / "no-such-dictionary")


def test_train_sae_from_a_captured_dataset(tmp_path):
    """flexmodel.sae.train_sae on activations captured from the fixture GPT-2: the folder it writes
    is read back by load_sae as the dictionary it returned, and its held-out numbers are the ones
    computed here from the dataset's last tokens."""
    gpt2_dir = DATA / json.loads((DATA / "golden" / "gpt2.json").read_text())["model_dir"]
    vocab = json.loads((gpt2_dir / "config.json").read_text())["vocab_size"]
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(5)
    save_file({"input_ids": torch.randint(0, vocab, (40, 64), generator=g)}, str(tmp_path / "ids.safetensors"))
    model = flexmodel.from_pretrained(gpt2_dir)
    hook = "transformer.h.1"
    flexmodel.capture_dataset(model, tmp_path / "ids.safetensors", tmp_path / "acts", [hook], context_len=32,
                              batch_size=8)
    r = flexmodel.sae.train_sae(tmp_path / "acts", hook, "topk", 64, tmp_path / "sae", k=8, lr=3e-3,
                                batch_tokens=128, total_tokens=128 * 120, eval_tokens=512)
    assert r["steps"] == 120 and r["tokens"] == 128 * 120 and r["eval_tokens"] == 512
    sae = flexmodel.sae.load_sae(tmp_path / "sae")
    ds = flexmodel.ActivationDataset(tmp_path / "acts")
    x = torch.cat([ds.shard(i)[hook] for i in range(ds.num_shards)])[-512:].float()
    assert_close(sae.encode(x), r["sae"].encode(x), 0, "the folder holds the returned dictionary")
    y = sae.decode(sae.encode(x))
    ev = 1 - ((y - x) ** 2).sum() / ((x - x.mean(0)) ** 2).sum()
    assert abs(ev.item() - r["explained_variance"]) < 1e-4
    assert (sae.encode(x) != 0).sum(-1).float().mean().item() == pytest.approx(r["l0"])
    assert r["explained_variance"] > 0.5
    with pytest.raises(flexmodel.NotFoundError, match="no hook 'nope'"):
        flexmodel.sae.train_sae(tmp_path / "acts", "nope", "topk", 64, tmp_path / "x", total_tokens=256)


def test_train_sae_on_the_fly_from_the_model(tmp_path):
    """train_sae with model + dataset: trained from the forward, evaluated on the corpus's first
    contexts, with the next-token losses (the clean one recomputed here with the model)."""
    gpt2_dir = DATA / json.loads((DATA / "golden" / "gpt2.json").read_text())["model_dir"]
    vocab = json.loads((gpt2_dir / "config.json").read_text())["vocab_size"]
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(6)
    ids = torch.randint(0, vocab, (24, 32), generator=g)
    save_file({"input_ids": ids}, str(tmp_path / "ids.safetensors"))
    model = flexmodel.from_pretrained(gpt2_dir)
    r = flexmodel.sae.train_sae(None, "transformer.h.1", "topk", 64, tmp_path / "sae", k=8, lr=3e-3,
                                batch_tokens=64, total_tokens=64 * 30, eval_tokens=128, model=model,
                                dataset=tmp_path / "ids.safetensors", context_len=32, buffer_tokens=256)
    assert r["steps"] == 30 and r["eval_tokens"] == 128
    # cfg.json names the hook as TransformerLens does (a block's output: its hook_resid_post), as SAELens looks it up
    assert json.loads((tmp_path / "sae" / "cfg.json").read_text())["metadata"]["hook_name"] == "blocks.1.hook_resid_post"
    held = r["held_out_ids"]  # the corpus's first contexts
    assert held.shape == (4, 32)
    with torch.no_grad():
        logits = flexmodel.FlexModel(model, {})(held)
    want = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                             held[:, 1:].reshape(-1)).item()
    assert r["next_token_loss_clean"] == pytest.approx(want, rel=1e-5)
    assert r["ce_loss_recovered"] == pytest.approx(
        (r["next_token_loss_zeroed"] - r["next_token_loss_with_sae"])
        / (r["next_token_loss_zeroed"] - r["next_token_loss_clean"]))
    with pytest.raises(flexmodel.ConfigError, match="not both"):
        flexmodel.sae.train_sae(tmp_path / "x", "transformer.h.1", "topk", 64, tmp_path / "y", total_tokens=64,
                                model=model, dataset=tmp_path / "ids.safetensors")
