"""A Transformers model already in memory, run by flexmodel's engine (flexmodel.from_transformers,
flexmodel.FlexModel(hf_model, out)): for every architecture of tests/data/contract (saved by Transformers
5.23), every module's capture equals Transformers' own forward hooks and flexmodel.from_pretrained's on the
same folder, the C++ model's parameters are the Transformers model's storage (data pointers), restore()
gives the Transformers model back as it was, and a fresh process's peak resident memory with the wrapped
model is that of the Transformers model alone (no second copy of the weights)."""
import json
import os
import re
import subprocess
import sys

import pytest
import torch
import transformers

import flexmodel
from conftest import max_diff
from test_contract import CONTRACT, KNOWN, MANIFEST

TOL = 1e-5  # absolute, and relative to the output's largest value where that is above 1 (float32 rounding)
WORST = {}  # case -> (difference, module, against what): printed by the last test


def hf_model(case, dtype=torch.float32):
    transformers.logging.set_verbosity_error()
    return transformers.AutoModelForCausalLM.from_pretrained(
        CONTRACT / case, dtype=dtype, attn_implementation="eager", experts_implementation="eager").eval()


def first_tensor(v):
    if isinstance(v, torch.Tensor):
        return v
    if isinstance(v, (tuple, list, dict)):
        for x in (v.values() if isinstance(v, dict) else v):
            t = first_tensor(x)
            if t is not None:
                return t
    return None


def hf_captures(hf, ids):
    """{module: [first output tensor per call]} from Transformers' own forward hooks, and the logits."""
    seen = {}

    def record(name):
        def hook(module, args, out):
            t = first_tensor(out)
            if t is not None:
                seen.setdefault(name, []).append(t.detach().clone())
        return hook
    handles = [m.register_forward_hook(record(n)) for n, m in hf.named_modules() if n]
    try:
        with torch.no_grad():
            logits = hf(input_ids=ids, use_cache=False).logits
    finally:
        for h in handles:
            h.remove()
    return seen, logits


def deliberate(module):
    return any("match" in r and re.fullmatch(r["match"], module) for r in KNOWN["deliberate"])


def compare_calls(got, want, what):
    """Largest difference over the calls of one module, each of ours matched to its closest call of theirs
    (a per-layer-type rotary module runs once per type, in either order), divided by the reference's
    largest value where that is above 1: (difference, where)."""
    got = got if isinstance(got, list) else [got]
    assert len(got) == len(want), f"{what}: called {len(got)}x, {len(want)}x in the reference"
    worst, wants = (0.0, ()), list(want)
    for g in got:
        best = None
        for j, w in enumerate(wants):
            if w is None or tuple(g.shape) != tuple(w.shape) or g.is_complex() != w.is_complex():
                continue
            d = max_diff(g, w) if w.numel() else (0.0, ())
            d = (d[0] / max(1.0, float(w.abs().max())), d[1]) if w.numel() else d
            if best is None or d[0] < best[0][0]:
                best = (d, j)
        assert best is not None, f"{what}: shape {tuple(g.shape)}, the reference's {[tuple(w.shape) for w in want]}"
        wants[best[1]] = None
        worst = max(worst, best[0])
    return worst


@pytest.mark.parametrize("case", sorted(MANIFEST["cases"]))
def test_wrapped_transformers_model_equals_transformers_hooks_and_from_pretrained(case):
    hf = hf_model(case)
    vocab = hf.config.vocab_size
    ids = torch.randint(3, min(vocab, 96), (2, 9), generator=torch.Generator().manual_seed(7))
    seen, hf_logits = hf_captures(hf, ids)
    before = {n: (p.data_ptr(), p.requires_grad, p.detach().clone()) for n, p in hf.named_parameters()}

    out = {}
    fm = flexmodel.FlexModel(hf, out)
    assert fm.engine == "flexmodel"
    fm.create_hook_group("every", "")
    with torch.no_grad():
        logits = fm(ids)
    ref_out = {}
    ref = flexmodel.FlexModel(flexmodel.from_pretrained(CONTRACT / case), ref_out)
    ref.create_hook_group("every", "")
    with torch.no_grad():
        ref_logits = ref(ids)

    worst = [compare_calls(logits, [hf_logits], "logits") + ("logits vs Transformers",)]
    assert set(out) == set(ref_out), f"{case}: captured {sorted(set(out) ^ set(ref_out))} in only one of the two"
    for name in out:
        d = compare_calls(out[name], ref_out[name] if isinstance(ref_out[name], list) else [ref_out[name]], name)
        worst.append(d + (f"{name} vs from_pretrained",))
    compared = 0
    for name, want in seen.items():
        if name not in out:
            assert deliberate(name), f"{case}: Transformers' {name} ran, flexmodel has no capture of it"
            continue
        if want[0].is_complex() or deliberate(name):
            continue
        worst.append(compare_calls(out[name], want, name) + (f"{name} vs Transformers' hook",))
        compared += 1
    assert compared >= 0.8 * len(seen), f"{case}: only {compared} of {len(seen)} Transformers modules compared"
    d, where, what = max(worst, key=lambda w: w[0])
    WORST[case] = (d, where, what)
    assert d <= TOL, f"{case}: {what} differs by {d:.3g} (relative above 1) at {where} (tolerance {TOL})"

    # Same storage: same-named parameters at the same address, per-expert weights inside the fused tensors.
    hf_params = dict(hf.named_parameters(remove_duplicate=False))
    storages = {p.untyped_storage().data_ptr() for p in hf_params.values()}
    model = fm._adopted
    for name, p in model.named_parameters():
        if name in hf_params:
            assert p.data_ptr() == hf_params[name].data_ptr(), f"{case}: {name} is a copy"
        else:
            assert p.untyped_storage().data_ptr() in storages, f"{case}: {name} is not in any Transformers tensor"
        assert p.dtype == torch.float32 and p.device.type == "cpu"

    # restore() gives the Transformers model back as it was: the same tensors, requires_grad, values, outputs.
    assert fm.restore() is hf
    for n, p in hf.named_parameters():
        ptr, requires_grad, value = before[n]
        assert (p.data_ptr(), p.requires_grad) == (ptr, requires_grad) and torch.equal(p, value), n
    with torch.no_grad():
        assert torch.equal(hf(input_ids=ids, use_cache=False).logits, hf_logits)


def test_bfloat16_model_stays_bfloat16_and_shared():
    hf = hf_model("llama", torch.bfloat16)
    model = flexmodel.from_transformers(hf)
    assert model.dtype == torch.bfloat16
    hf_params = dict(hf.named_parameters(remove_duplicate=False))
    assert all(p.data_ptr() == hf_params[n].data_ptr() for n, p in model.named_parameters())
    ids = torch.randint(3, 96, (1, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(input_ids=ids, use_cache=False).logits.float()
        got = model(ids).float()
    d, where = max_diff(got, want)
    assert d <= 0.05 * float(want.abs().max()), f"bfloat16 logits differ by {d:.3g} at {where}"


def test_unknown_model_type_runs_on_the_torch_engine_and_from_transformers_says_why():
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32)
    bert = transformers.BertModel(cfg).eval()
    assert flexmodel.FlexModel(bert, {}).engine == "torch"
    with pytest.raises(flexmodel.UnsupportedError, match="BertModel.*'bert'.*torch engine"):
        flexmodel.from_transformers(bert)


def test_parameters_without_a_place_are_named_and_fall_back_to_the_torch_engine():
    hf = hf_model("llama")
    hf.model.layers[0].mlp.register_parameter("lora_A", torch.nn.Parameter(torch.zeros(2, 2)))
    with pytest.raises(flexmodel.UnsupportedError, match="model.layers.0.mlp.lora_A"):
        flexmodel.from_transformers(hf)
    with pytest.warns(UserWarning, match="torch engine.*lora_A"):
        fm = flexmodel.FlexModel(hf, {})
    assert fm.engine == "torch"


MEMORY_SCRIPT = """
import resource, sys, torch, transformers, flexmodel
torch.manual_seed(0)
cfg = transformers.LlamaConfig(vocab_size=16384, hidden_size=512, intermediate_size=1536, num_hidden_layers=6,
                               num_attention_heads=8, num_key_value_heads=8, tie_word_embeddings=False)
model = transformers.LlamaForCausalLM(cfg).eval()
ids = torch.randint(0, 16384, (1, 32))
with torch.no_grad():
    if sys.argv[1] == "transformers":
        model(input_ids=ids, use_cache=False)
    else:
        out = {}
        fm = flexmodel.FlexModel(model, out)
        assert fm.engine == "flexmodel"
        fm.create_hook_group("layers", "model.layers.", regex=False)
        fm(ids)
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(int(hwm) * 1024, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
      sum(p.numel() * p.element_size() for p in model.parameters()))
"""


def peak(mode):
    """(VmHWM, ru_maxrss, weight bytes) of a fresh interpreter (spawned, not forked) that builds the model and
    runs it, alone or wrapped."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, mode], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return [int(x) for x in done.stdout.split()[-3:]]


def test_wrapped_model_peak_memory_is_the_transformers_models():
    alone, wrapped = peak("transformers"), peak("flexmodel")
    weights = alone[2]
    assert weights > 140e6  # big enough that a second copy would show: ~150 MB of float32 weights
    ratio = wrapped[0] / alone[0]
    print(f"\npeak resident memory (VmHWM): Transformers alone {alone[0] / 2**20:.0f} MiB, wrapped + forward "
          f"{wrapped[0] / 2**20:.0f} MiB ({ratio:.3f}x; weights {weights / 2**20:.0f} MiB; ru_maxrss "
          f"{alone[1] / 2**20:.0f} / {wrapped[1] / 2**20:.0f} MiB)")
    assert ratio <= 1.10, f"wrapping costs {ratio:.3f}x the Transformers model's peak memory (a weight copy?)"


def test_worst_differences_reported():
    """Prints the largest difference of each case (run after the cases, in file order)."""
    for case, (d, where, what) in sorted(WORST.items()):
        print(f"{case}: worst {d:.3g} (relative above 1) at {where}: {what}")
