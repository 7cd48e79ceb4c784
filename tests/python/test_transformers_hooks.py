"""Side by side with Transformers 5.23 on the same checkpoint: its own forward hooks see what ours capture,
and editing functions give the logits that the same edit gives in Transformers (an independent computation)."""
import pytest
import torch
import transformers

import flexmodel
from conftest import DATA, assert_close

CASES = {"gpt2": ("transformer.h.1.mlp", "transformer.h.0"), "llama": ("model.layers.1.mlp", "model.layers.0")}


def hf_model(name):
    m = transformers.AutoModelForCausalLM.from_pretrained(DATA / "models" / name, attn_implementation="eager",
                                                          dtype=torch.float32)
    return m.eval()


def first_tensor(v):
    if isinstance(v, torch.Tensor):
        return v
    for x in (v.values() if isinstance(v, dict) else v):
        t = first_tensor(x)
        if t is not None:
            return t
    return None


def test_transformers_version():
    assert transformers.__version__ == "5.23.0"


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_module_equals_transformers_hooks(name):
    hf = hf_model(name)
    seen = {}
    handles = [m.register_forward_hook(lambda mod, args, out, n=n: seen.__setitem__(n, first_tensor(out).detach()))
               for n, m in hf.named_modules() if n]
    ids = torch.randint(0, hf.config.vocab_size, (2, 7))
    with torch.no_grad():
        hf_logits = hf(input_ids=ids, use_cache=False).logits
    for h in handles:
        h.remove()
    out = {}
    fm = flexmodel.FlexModel(flexmodel.from_pretrained(DATA / "models" / name), out)
    fm.create_hook_group("every", "")
    with torch.no_grad():
        logits = fm(ids)
    assert_close(logits, hf_logits, 1e-4, f"{name} logits")
    common = [n for n in seen if n in out and seen[n] is not None]
    assert len(common) >= 0.9 * len(seen), f"{name}: only {len(common)} of {len(seen)} HF modules captured"
    for n in common:
        got = out[n] if not isinstance(out[n], list) else out[n][0]
        assert_close(got, seen[n], 1e-4, f"{name} {n}")


def hf_edited_logits(name, module, edit, ids):
    hf = hf_model(name)
    h = hf.get_submodule(module).register_forward_hook(
        lambda mod, args, out: (edit(out[0]),) + tuple(out[1:]) if isinstance(out, tuple) else edit(out))
    with torch.no_grad():
        logits = hf(input_ids=ids, use_cache=False).logits
    h.remove()
    return logits


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("kind", ["zero", "add", "patch"])
def test_editing_function_matches_the_same_edit_in_transformers(name, kind):
    mlp, block = CASES[name]
    model = flexmodel.from_pretrained(DATA / "models" / name)
    d = model.config.get("hidden_size", model.config.get("n_embd"))
    ids = torch.randint(0, model.config["vocab_size"], (2, 6))
    other = torch.randint(0, model.config["vocab_size"], (2, 6))
    vec = torch.randn(d)
    out = {}
    if kind == "patch":
        # Capture the block's output on the other prompt, then patch positions 0..2 with it.
        fm = flexmodel.FlexModel(model, out)
        fm.register_forward_hook(flexmodel.HookFunction(block))
        with torch.no_grad():
            fm(other)
        source = out[block].clone()
        fm.restore()
        module = block

        def edit(x):
            y = x.clone()
            y[:, :3] = source[:, :3]
            return y
    elif kind == "zero":
        module, edit = mlp, torch.zeros_like
    else:
        module = block

        def edit(x):
            return x + 3.0 * vec
    fm = flexmodel.FlexModel(model, out)
    fm.register_forward_hook(flexmodel.HookFunction(module, editing_function=lambda m, x, ctx, mods: edit(x)))
    with torch.no_grad():
        ours = fm(ids)
    assert_close(ours, hf_edited_logits(name, module, edit, ids), 1e-4, f"{name} {kind} at {module}")
    fm.restore()
    with torch.no_grad():
        assert_close(model(ids), hf_edited_logits(name, module, lambda x: x, ids), 1e-4, "restored")


@pytest.mark.parametrize("name", sorted(CASES))
def test_steered_generation_matches_transformers_generate_with_the_same_hook(name):
    _, block = CASES[name]
    model = flexmodel.from_pretrained(DATA / "models" / name)
    d = model.config.get("hidden_size", model.config.get("n_embd"))
    vec = torch.randn(d) * 4
    ids = torch.randint(0, model.config["vocab_size"], (1, 5))
    ours = model.generate(ids, max_new_tokens=8, steer={block: (vec, 1.5)}, eos_token_id=[])
    hf = hf_model(name)
    h = hf.get_submodule(block).register_forward_hook(
        lambda mod, args, out: (out[0] + 1.5 * vec,) + tuple(out[1:]) if isinstance(out, tuple) else out + 1.5 * vec)
    with torch.no_grad():
        theirs = hf.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)
    h.remove()
    assert torch.equal(ours, theirs), f"{name}: ours {ours.tolist()} vs Transformers {theirs.tolist()}"
    plain = model.generate(ids, max_new_tokens=8, eos_token_id=[])
    assert not torch.equal(plain, ours), "the steering vector changed nothing: the test would not see a lost edit"
