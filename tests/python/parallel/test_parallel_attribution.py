"""flexmodel.attribute on a FlexModel over a mesh (design decision 48) under mpirun: rank 0's
graph (nodes, adjacency, graph file) equals the one-process graph of the same model and
transcoders (tests/data/attribution/gpt2-transcoders); the other ranks get the nodes and no
rows; a data-parallel mesh is an UnsupportedError naming it. Run by CTest's python_mpirun_*
cases (tests/python/CMakeLists.txt); every rank runs every test."""
import os

import pytest
import torch

import flexmodel
from conftest import DATA

MESH = tuple(int(x) for x in os.environ.get("FLEX_TEST_MESH", "1,1,1").split(","))

pytestmark = pytest.mark.skipif(MESH == (1, 1, 1), reason="runs under mpirun with FLEX_TEST_MESH (CTest)")

TRANSCODERS = str(DATA.parent / "attribution" / "gpt2-transcoders")
IDS = torch.tensor([255, 17, 42, 7, 99, 5, 11, 64, 2, 8])


def test_rank_0_graph_equals_one_process():
    model = flexmodel.from_pretrained(DATA / "models" / "gpt2")
    tp, pp, dp = MESH
    fm = flexmodel.FlexModel(model, {}, tensor_parallel_size=tp, pipeline_parallel_size=pp, data_parallel_size=dp)
    if dp > 1:
        with pytest.raises(flexmodel.errors.UnsupportedError, match=r"mesh\(tp=.*data parallel"):
            flexmodel.attribute(fm, TRANSCODERS, IDS, batch_size=16)
        return
    got = flexmodel.attribute(fm, TRANSCODERS, IDS, batch_size=16)
    want = flexmodel.attribute(model, TRANSCODERS, IDS, batch_size=16)
    for key in ("active_features", "selected_features", "logit_tokens"):
        assert torch.equal(got[key], want[key]), key
    if fm.rank != 0:
        assert got["adjacency"] is None and got["json"] is None, f"rank {fm.rank} holds rows"
        return
    largest = want["adjacency"].abs().max().item()
    worst = (got["adjacency"] - want["adjacency"]).abs().max().item()
    print(f"mesh {MESH}: {want['adjacency'].shape[0]} nodes, largest edge difference {worst:.3g} of {largest:.3g}")
    assert worst <= 1e-5 * largest, f"largest edge difference {worst} (largest edge {largest})"
    assert [n["node_id"] for n in got["json"]["nodes"]] == [n["node_id"] for n in want["json"]["nodes"]]
    assert len(got["json"]["links"]) == len(want["json"]["links"])
