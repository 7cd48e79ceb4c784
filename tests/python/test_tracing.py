"""nnsight-style tracing (fm.trace / fm.generate) over both engines, compared with nnsight 0.8.1 on the
same model (GPT-2- and Llama-shaped Transformers models built from a random config: no downloads), and
with plain PyTorch hooks where nnsight is not the reference."""
import copy

import pytest
import torch

import flexmodel
from conftest import assert_close

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

try:
    import nnsight
    from nnsight import NNsight
    HAVE_NNSIGHT = nnsight.__version__ == "0.8.1"
except ImportError:
    HAVE_NNSIGHT = False
needs_nnsight = pytest.mark.skipif(
    not HAVE_NNSIGHT, reason="needs nnsight==0.8.1 (scripts/install-deps.sh --tests installs it, pinned with torch)")

IDS = torch.tensor([[3, 17, 8, 41, 5, 22, 9], [11, 2, 30, 7, 19, 44, 1]])


def gpt2():
    cfg = transformers.GPT2Config(n_layer=3, n_embd=32, n_head=4, vocab_size=48, n_positions=32,
                                  bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg).eval()


def llama():
    cfg = transformers.LlamaConfig(num_hidden_layers=3, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=48, max_position_embeddings=32,
                                   bos_token_id=0, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


# Module paths of the two shapes: (blocks, mlp of a block).
PATHS = {"gpt2": ("transformer.h", "mlp"), "llama": ("model.layers", "mlp")}


def walk(root, path):
    for part in path.split("."):
        root = getattr(root, part)
    return root


def fm_for(engine, make, tmp_path):
    """(FlexModel, the Transformers model nnsight wraps): the torch engine wraps a Transformers model;
    flexmodel's engine loads what that model saved (same weights)."""
    hf = make()
    if engine == "torch":
        return flexmodel.FlexModel(copy.deepcopy(hf), {}, engine="torch"), hf
    hf.save_pretrained(tmp_path)
    return flexmodel.FlexModel(flexmodel.from_pretrained(tmp_path), {}), hf


def run_program(root, blocks, mlp, saved, stop=False):
    """The same tracing program, for nnsight's model or a FlexModel (root: what modules hang off);
    fills ``saved`` (a dict of the caller's: nnsight runs the body apart from the caller's frame)."""
    layers = walk(root, blocks)
    getattr(layers[0], mlp).output[:, -1] = 0                      # in place
    saved["h0"] = layers[0].output.save()
    saved["mlp1_in"] = getattr(layers[1], mlp).input.save()
    saved["mlp1_in_sum"] = getattr(layers[1], mlp).input.sum(dim=-1).save()
    layers[1].output = layers[1].output * 2                         # assignment
    saved["h1"] = layers[1].output.save()
    if stop:
        return saved
    saved["h2_norm"] = torch.nn.functional.layer_norm(layers[2].output, (32,)).save()
    saved["logits"] = root.lm_head.output.save()
    return saved


@needs_nnsight
@pytest.mark.parametrize("engine", ["torch", "flexmodel"])
@pytest.mark.parametrize("shape", ["gpt2", "llama"])
def test_saved_values_and_edited_logits_equal_nnsight(shape, engine, tmp_path):
    fm, hf = fm_for(engine, {"gpt2": gpt2, "llama": llama}[shape], tmp_path)
    blocks, mlp = PATHS[shape]
    nm = NNsight(hf)
    want, got = {}, {}
    with torch.no_grad():
        with nm.trace(IDS):
            run_program(nm, blocks, mlp, want)
        with fm.trace(IDS) as tracer:
            run_program(fm, blocks, mlp, got)
    # nnsight 0.8's convention: after the block the saved value is the value itself.
    tol = 0 if engine == "torch" else 1e-5
    for key in want:
        assert isinstance(got[key], torch.Tensor), f"{key}: {type(got[key]).__name__} after the block"
        assert_close(got[key], want[key], tol, f"{shape}/{engine} {key}")
    clean = hf(IDS).logits
    assert (want["logits"] - clean).abs().max() > 1e-3, "the edits changed nothing: a vacuous comparison"
    if engine == "torch":
        assert_close(tracer.output.logits, want["logits"], 0, "the model's output")
    else:
        assert_close(tracer.output, want["logits"], tol, "the model's output (logits)")


@needs_nnsight
@pytest.mark.parametrize("engine", ["torch", "flexmodel"])
def test_stop_ends_the_forward_like_nnsight(engine, tmp_path):
    fm, hf = fm_for(engine, gpt2, tmp_path)
    nm = NNsight(hf)
    calls = []
    handle = walk(fm.module if engine == "torch" else hf, "transformer.h.2").register_forward_hook(
        lambda m, a, o: calls.append(1))
    want, got = {}, {}
    with torch.no_grad():
        with nm.trace(IDS) as tracer:
            run_program(nm, "transformer.h", "mlp", want, stop=True)
            tracer.stop()
        with fm.trace(IDS) as tracer:
            run_program(fm, "transformer.h", "mlp", got, stop=True)
            tracer.stop()
            later = fm.transformer.h[2].output.save()
    handle.remove()
    assert tracer.stopped and tracer.output is None
    if engine == "torch":
        assert calls == [], "the forward went on past tracer.stop()"
    for key in want:
        assert_close(got[key], want[key], 0 if engine == "torch" else 1e-5, f"{engine} {key} before stop")
    with pytest.raises(flexmodel.NotFoundError, match="never computed"):
        later.value  # noqa: B018


def test_trace_at_module_level_and_value_attribute():
    fm = flexmodel.FlexModel(gpt2(), {}, engine="torch")
    with torch.no_grad(), fm.trace(IDS):
        h = fm.transformer.h[-1].output.save()
        unsaved = fm.transformer.h[0].output
    ref = {}
    hook = fm.module.transformer.h[2].register_forward_hook(lambda m, a, o: ref.update(h=o.clone()))
    with torch.no_grad():
        fm.module(IDS)
    hook.remove()
    assert_close(h, ref["h"], 0, "h[-1] is h[2]")
    with pytest.raises(flexmodel.NotFoundError, match="not saved"):
        unsaved.value  # noqa: B018


def test_tracing_misuse_is_typed():
    fm = flexmodel.FlexModel(gpt2(), {}, engine="torch")
    with pytest.raises(flexmodel.ConfigError, match="only available inside"):
        fm.transformer.h[0].output  # noqa: B018
    with pytest.raises(AttributeError, match="closest"):
        fm.transformer.hh  # noqa: B018
    with pytest.raises(flexmodel.NotFoundError):
        fm.transformer.h[7]  # noqa: B018
    with pytest.raises(flexmodel.UnsupportedError, match="truth value"):
        with fm.trace(IDS):
            if fm.transformer.h[0].output.sum() > 0:
                pass
    # an edit that needs a later module's value cannot be applied where it is written
    with pytest.raises(flexmodel.NotFoundError, match="never computed"):
        with torch.no_grad(), fm.trace(IDS):
            fm.transformer.h[0].output = fm.transformer.h[1].output
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in fm.module.modules()), "hooks left behind"
    with torch.no_grad():
        assert_close(fm.module(IDS).logits, gpt2()(IDS).logits, 0, "model unchanged after failed traces")


def test_trace_over_a_custom_module_equals_plain_hooks():
    from tiny_modules import TinyViT
    torch.manual_seed(0)
    vit = TinyViT().eval()
    images = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    fm = flexmodel.FlexModel(vit, {})
    with torch.no_grad(), fm.trace(images) as tracer:
        attn_w = fm.blocks[0].attn.output[1].save()           # a tuple output, indexed as in nnsight
        fm.blocks[1].mlp[0].output[..., :4] = 0
        inp = fm.blocks[1].input.save()
    ref = {}
    hs = [vit.blocks[0].attn.register_forward_hook(lambda m, a, o: ref.update(w=o[1].clone())),
          vit.blocks[1].register_forward_pre_hook(lambda m, a: ref.update(inp=a[0].clone())),
          vit.blocks[1].mlp[0].register_forward_hook(lambda m, a, o: torch.cat([o[..., :4] * 0, o[..., 4:]], -1))]
    with torch.no_grad():
        want = vit(images)
    for h in hs:
        h.remove()
    assert_close(attn_w, ref["w"], 0, "attention weights")
    assert_close(inp, ref["inp"], 0, "blocks.1 input")
    assert_close(tracer.output, want, 1e-6, "logits with the edit")


@pytest.mark.parametrize("engine", ["torch", "flexmodel"])
def test_generate_applies_edits_every_step_and_saves_each_step(engine, tmp_path):
    fm, hf = fm_for(engine, gpt2, tmp_path)
    prompt = IDS[:1]
    steer = torch.linspace(-2, 2, 32)
    with torch.no_grad(), fm.generate(prompt, max_new_tokens=4, do_sample=False) as tracer:
        fm.transformer.h[1].output = fm.transformer.h[1].output + steer
        hs = fm.transformer.h[1].output.save()
    # The reference: Transformers' own generate with a plain forward hook doing the same edit.
    seen = []

    def edit(m, a, o):
        seen.append(o + steer)
        return o + steer
    handle = hf.transformer.h[1].register_forward_hook(edit)
    with torch.no_grad():
        want = hf.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0)
    handle.remove()
    with torch.no_grad():
        plain = hf.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert not torch.equal(want, plain), "the steering changed no token: a vacuous comparison"
    assert torch.equal(tracer.output[:, :want.shape[1]], want), f"{tracer.output} vs {want}"
    assert isinstance(hs, list) and len(hs) == len(seen) == 4
    for i, (g, w) in enumerate(zip(hs, seen)):
        # flexmodel's engine may run the cached steps on the new token only, as Transformers does
        assert_close(g, w, 0 if engine == "torch" else 1e-5, f"step {i}")


@needs_nnsight
@pytest.mark.parametrize("engine", ["torch", "flexmodel"])
def test_generate_per_step_values_equal_nnsight(engine, tmp_path):
    import pathlib
    from nnsight import LanguageModel
    tokenizers = pathlib.Path(__file__).resolve().parents[1] / "data" / "tokenizers" / "gpt2"
    tok = transformers.GPT2TokenizerFast(vocab_file=str(tokenizers / "vocab.json"),
                                         merges_file=str(tokenizers / "merges.txt"))
    fm, hf = fm_for(engine, gpt2, tmp_path)
    lm = LanguageModel(copy.deepcopy(hf), tokenizer=tok)   # a local tokenizer: nothing is downloaded
    prompt = IDS[:1]
    steer = torch.linspace(-2, 2, 32)
    want = []
    with torch.no_grad():
        with lm.generate({"input_ids": prompt, "attention_mask": torch.ones_like(prompt)}, max_new_tokens=4,
                         do_sample=False, pad_token_id=0) as tracer:
            hs = list().save()
            for _ in tracer.iter[:]:
                lm.transformer.h[1].output = lm.transformer.h[1].output + steer
                hs.append(lm.transformer.h[1].output)
        want.extend(hs)
        with fm.generate(prompt, max_new_tokens=4, do_sample=False) as tracer:
            fm.transformer.h[1].output = fm.transformer.h[1].output + steer
            got = fm.transformer.h[1].output.save()
    assert len(want) == 4 and len(got) == 4, (len(want), len(got))
    for i, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, 0 if engine == "torch" else 1e-5, f"{engine} step {i}")
