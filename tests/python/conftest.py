"""Shared fixtures for the Python package's tests (run by CTest: tests/python/CMakeLists.txt)."""
import os
import pathlib

import pytest
import torch

DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "fixtures"


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
