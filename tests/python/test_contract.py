"""The hook contract from Python: every named module of every case of tests/data/contract captured through
flexmodel.FlexModel has the shape and values Transformers 5.23's own forward hooks recorded (a left-padded
batch; values compared on the unpadded row), except the differences tests/data/contract/known_differences.json
lists (deliberate by rule, or still open: those must go on differing). The C++ side is
tests/models/contract_check.h."""
import json
import pathlib
import re

import pytest
import torch
from safetensors import safe_open

import flexmodel
from conftest import max_diff

CONTRACT = pathlib.Path(__file__).resolve().parents[1] / "data" / "contract"
MANIFEST = json.loads((CONTRACT / "manifest.json").read_text())
KNOWN = json.loads((CONTRACT / "known_differences.json").read_text())
OPEN = {(c, d["module"]) for d in KNOWN["open"] for c in d["cases"]}


def deliberate(module, entry):
    for rule in KNOWN["deliberate"]:
        if "dtype" in rule and entry.get("dtype") != rule["dtype"]:
            continue
        if re.fullmatch(rule.get("match", ".*"), module):
            return rule["rule"]
    return None


def per_row(want, b, t):
    return want.dim() >= 2 and want.shape[0] == b and (want.shape[1] == t or want.dim() >= 3)


@pytest.mark.parametrize("case", sorted(MANIFEST["cases"]))
def test_every_module_has_transformers_shape_and_values(case):
    info = MANIFEST["cases"][case]
    golden = safe_open(str(CONTRACT / f"{case}.contract.safetensors"), "pt")
    ids, mask = golden.get_tensor("input_ids"), golden.get_tensor("attention_mask")
    b, t = ids.shape
    out = {}
    fm = flexmodel.FlexModel(flexmodel.from_pretrained(CONTRACT / case), out)
    hooked, differing = [], {}
    for module, entry in info["modules"].items():
        if "shape" not in entry or (entry.get("dtype") == "complex64" and deliberate(module, entry)):
            continue
        try:
            fm.register_forward_hook(flexmodel.HookFunction(module))
            hooked.append(module)
        except flexmodel.NotFoundError:
            if not deliberate(module, entry):
                differing[module] = f"Transformers has it ({entry['class']}), flexmodel does not"
    with torch.no_grad():
        fm(ids, attention_mask=mask)
    for module in hooked:
        entry = info["modules"][module]
        calls = entry["calls"]
        got = out.get(module)
        if got is None:
            if not deliberate(module, entry):
                differing[module] = f"not called by flexmodel, {calls}x by Transformers"
            continue
        got = got if isinstance(got, list) else [got]
        if len(got) != calls:
            differing[module] = f"called {len(got)}x, by Transformers {calls}x"
            continue
        wants = [golden.get_tensor("out." + (module if j == 0 else f"{module}@{j}")) for j in range(calls)]
        for g in got:  # matched call for call in any order (per-layer-type rotary tables)
            best = None
            for j, w in enumerate(wants):
                if w is None or tuple(g.shape) != tuple(w.shape):
                    continue
                a, e = (g[0], w[0]) if per_row(w, b, t) else (g, w)
                d, where = max_diff(a, e) if e.numel() else (0.0, ())
                if best is None or d < best[0]:
                    best = (d, j, where, float(e.abs().max()) if e.numel() else 0.0)
            if best is None:
                differing[module] = f"shape {tuple(g.shape)} where Transformers has {[tuple(w.shape) for w in wants if w is not None]}"
                continue
            d, j, where, scale = best
            wants[j] = None
            if d > 1e-5 + 1e-4 * scale:
                differing[module] = f"differs by {d:.3g} at {where} (values up to {scale:.3g})"
    unexpected = {m: why for m, why in differing.items() if (case, m) not in OPEN}
    assert not unexpected, f"{case}: modules not as Transformers 5.23 gives them: {unexpected}"
    fixed = sorted(m for (c, m) in OPEN if c == case and m not in differing)
    assert not fixed, f"{case}: {fixed} listed as open differences but now match Transformers: take them off the list"
