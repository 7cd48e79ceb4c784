"""Shared fixtures for the Python package's tests (run by CTest: tests/python/CMakeLists.txt)."""
import os
import pathlib
import re

import pytest
import torch

DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "fixtures"


def transformers5_name(name):
    """A first-wave fixture name (recorded with Transformers 4.47) under the name Transformers 5.23 (and
    flexmodel) gives the module: Mixtral's block_sparse_moe is mlp, GPT-NeoX's embed_out is lm_head.
    The same rule as tests/common/transformers5_names.h."""
    name = name.replace(".block_sparse_moe", ".mlp")
    if name == "embed_out" or name.startswith(("embed_out.", "embed_out#")):
        name = "lm_head" + name[len("embed_out"):]
    return name


def transformers5_names(obj):
    """transformers5_name on every string (values and keys) of a fixture json."""
    if isinstance(obj, str):
        return transformers5_name(obj)
    if isinstance(obj, list):
        return [transformers5_names(x) for x in obj]
    if isinstance(obj, dict):
        return {transformers5_name(k): transformers5_names(v) for k, v in obj.items()}
    return obj


def transformers5_tensor_names(keys, rank, gemma2=False):
    """A first-wave golden file's tensor names as 5.23 names them ({stored: name}); the same rule as
    tests/common/transformers5_names.h: renamed, and where 4.47 computed RoPE per layer (no model.rotary_emb),
    layer 0's [1, T, D] rotary outputs read as model.rotary_emb's and the other layers' left out.
    rank(key) gives a stored tensor's number of dims; gemma2: its (4.47, unscaled) embed_tokens output left out."""
    per_layer = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb")
    names = {k: transformers5_name(k) for k in keys}
    moved = any(per_layer.fullmatch(n.split("#")[0]) for n in names.values())
    model_level = "model.rotary_emb" in names.values()
    out = {}
    for k, n in names.items():
        if gemma2 and n == "model.embed_tokens":
            continue
        module, _, element = n.partition("#")
        if moved and not model_level and per_layer.fullmatch(module):
            if module != "model.layers.0.self_attn.rotary_emb" or rank(k) != 3:
                continue
            n = "model.rotary_emb" + ("#" + element if element else "")
        out[k] = n
    return out


def max_diff(actual, expected):
    """(largest |difference|, the index where it is) — for messages."""
    d = (actual.detach().double() - expected.detach().double()).abs()
    flat = int(d.argmax())
    return float(d.max()), tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), d.shape))


def assert_close(actual, expected, atol, what=""):
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} vs {tuple(expected.shape)}"
    worst, where = max_diff(actual, expected)
    assert worst <= atol, f"{what}: largest |difference| {worst:.3g} at {where} (tolerance {atol})"


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "gpu: needs a CUDA device and skips itself without one (CTest runs them as python_gpu, label gpu)")


def pytest_sessionfinish(session, exitstatus):
    """With FLEX_PYTEST_ALL_SKIPPED_RC=N (python_gpu), a run in which every test was skipped and none failed
    exits N, which CTest (SKIP_RETURN_CODE) reports as skipped rather than passed."""
    rc = os.environ.get("FLEX_PYTEST_ALL_SKIPPED_RC")
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if not rc or exitstatus != 0 or reporter is None:
        return
    stats = reporter.stats
    if stats.get("skipped") and not any(stats.get(k) for k in ("passed", "failed", "error", "xpassed", "xfailed")):
        session.exitstatus = int(rc)


@pytest.fixture(scope="session")
def data():
    return DATA


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield
