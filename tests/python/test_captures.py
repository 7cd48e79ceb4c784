"""Every module's capture from Python equals the golden fixtures (captured by Transformers' own forward hooks)."""
import json

import pytest
import torch
from safetensors import safe_open

import flexmodel
from conftest import DATA, assert_close

MODELS = sorted(p.stem for p in (DATA / "golden").glob("*.json") if p.stem != "inputs")


@pytest.mark.parametrize("name", MODELS)
def test_every_module_capture_equals_golden(name):
    meta = json.loads((DATA / "golden" / f"{name}.json").read_text())
    golden = safe_open(str(DATA / "golden" / f"{name}.safetensors"), "pt")
    model = flexmodel.from_pretrained(DATA / meta["model_dir"])
    out = {}
    fm = flexmodel.FlexModel(model, out)
    fm.create_hook_group("every", "")
    with torch.no_grad():
        logits = fm(golden.get_tensor("input_ids"))
    assert_close(logits, golden.get_tensor("logits"), 1e-4, f"{name} logits")
    compared = 0
    for key in golden.keys():
        if key in ("input_ids", "logits") or "#" in key or key == "":
            continue
        assert key in out, f"{name}: no capture for module {key!r}; captured {sorted(out)[:8]}..."
        got = out[key][0] if isinstance(out[key], list) else out[key]
        assert got.device.type == "cpu"
        assert_close(got, golden.get_tensor(key), 1e-4, f"{name} {key}")
        compared += 1
    assert compared >= 10, f"{name}: only {compared} modules compared"
