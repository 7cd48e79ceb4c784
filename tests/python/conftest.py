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


@pytest.fixture(scope="session")
def data():
    return DATA


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield
