"""Inputs go where the model takes them, from Python too, checked without a GPU on the meta device.

A model whose every tensor (weights and buffers) is on meta takes a CPU batch through FlexModel and
through the model's own call: the batch is placed where the model takes it, and any tensor the model
code makes on the CPU in the middle of a forward (a mask, a position table, a rotary table) fails on
meta exactly as it does on a GPU ("Expected all tensors to be on the same device"). This runs every
dense architecture of tests/data/golden5 and tests/data/fixtures (Python has PyTorch's meta kernels;
a C++ program lacks some, so the C++ side of these checks is tests/datasets/test_batch_runner.cpp).
Mixture-of-experts blocks route rows by value, which meta cannot compute."""
import json
import pathlib

import pytest
import torch

import flexmodel
from conftest import DATA

GOLDEN5 = pathlib.Path(__file__).resolve().parents[1] / "data" / "golden5"


def dense_models():
    dirs = []
    for manifest in ("manifest.json", "manifest_zoo3.json"):
        dirs += [GOLDEN5 / name for name in json.loads((GOLDEN5 / manifest).read_text())["cases"]]
    dirs += [DATA / "models" / n for n in ("gpt2", "llama", "gpt-neox", "mistral", "gemma2", "phi3", "olmo2", "qwen2",
                                           "llama3-rope-tied")]
    out = []
    for d in dirs:
        cfg = json.loads((d / "config.json").read_text())
        if any(cfg.get(k) for k in ("num_experts", "num_local_experts", "n_routed_experts")):
            continue
        out.append(pytest.param(d, id=f"{d.parent.name}/{d.name}"))
    return out


def meta_model(path):
    with flexmodel.init_empty_weights(include_buffers=True):
        return flexmodel.from_config(path)


@pytest.mark.parametrize("path", dense_models())
def test_a_meta_model_takes_a_cpu_batch(path):
    # (No capture hooks: a capture copies values to the CPU, and meta has none.)
    model = meta_model(path)
    fm = flexmodel.FlexModel(model, {})
    ids = torch.tensor([[0, 5, 9, 2], [3, 4, 1, 7]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    logits = fm(ids, attention_mask=mask)
    assert logits.is_meta and logits.shape[:2] == (2, 4)
    assert model(ids, attention_mask=mask).is_meta


def test_the_model_call_places_its_inputs_too():
    for name in ["gpt2", "llama"]:
        logits = meta_model(DATA / "models" / name)(torch.tensor([[1, 2, 3]]))
        assert logits.is_meta and logits.shape[:2] == (1, 3), name


def test_device_error_is_a_device_map_error():
    # Raised by the module that gets a tensor on another device than its weights (C++ tests:
    # tests/datasets/test_batch_runner.cpp); from Python it is caught as either.
    assert issubclass(flexmodel.DeviceError, flexmodel.DeviceMapError)
    assert issubclass(flexmodel.DeviceError, ValueError)
