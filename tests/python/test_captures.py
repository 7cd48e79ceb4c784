"""Every module's capture from Python equals the golden fixtures (captured by Transformers' own forward hooks)."""
import json

import pytest
import torch
from safetensors import safe_open

import flexmodel
from conftest import DATA, assert_close, transformers5_tensor_names

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
    names = transformers5_tensor_names(golden.keys(), lambda k: len(golden.get_slice(k).get_shape()), name == "gemma2")
    for key, module in names.items():
        if key in ("input_ids", "logits") or "#" in key or key == "":
            continue
        assert module in out, f"{name}: no capture for module {module!r}; captured {sorted(out)[:8]}..."
        got = out[module][0] if isinstance(out[module], list) else out[module]
        assert got.device.type == "cpu"
        assert_close(got, golden.get_tensor(key), 1e-4, f"{name} {module}")
        compared += 1
    assert compared >= 10, f"{name}: only {compared} modules compared"


def test_inference_mode_and_output_ptr_holds_this_forwards_captures():
    meta = json.loads((DATA / "golden" / "llama.json").read_text())
    golden = safe_open(str(DATA / "golden" / "llama.safetensors"), "pt")
    model = flexmodel.from_pretrained(DATA / meta["model_dir"])
    ids = golden.get_tensor("input_ids")
    out = {"mine": 1}
    fm = flexmodel.FlexModel(model, out)
    fm.create_hook_group("mlps", "mlp")
    fm.register_forward_hook(flexmodel.HookFunction("model.layers.0"))
    with torch.inference_mode():  # inference tensors have no version counter: captures are copied
        assert_close(fm(ids), golden.get_tensor("logits"), 1e-4, "logits under inference_mode")
        assert_close(model(ids), golden.get_tensor("logits"), 1e-4, "plain call under inference_mode")
    assert_close(out["model.layers.0"], golden.get_tensor("model.layers.0"), 1e-4, "capture under inference_mode")
    kept = out["model.layers.0"]
    direct = fm.take_captures()  # the direct model(ids) call ran the attached hooks too
    assert_close(direct["model.layers.0"][0], golden.get_tensor("model.layers.0"), 1e-4, "capture of a direct call")
    with torch.no_grad():
        fm(ids, groups="mlps")
    # The last forward ran only the mlps group: the earlier capture of model.layers.0 is gone from
    # output_ptr (a reference kept by the caller stays valid), the caller's own entry stays.
    assert "model.layers.0" not in out and "model.layers.0.mlp" in out and out["mine"] == 1
    assert_close(kept, golden.get_tensor("model.layers.0"), 1e-4, "a kept capture")
