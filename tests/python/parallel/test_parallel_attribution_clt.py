"""flexmodel.attribute through a cross-layer transcoder on a FlexModel over a mesh (design decisions
44 and 48) under mpirun: rank 0's graph equals the one-process graph of the same model and CLT
(tests/data/attribution/FAMILY-clt: GPT-2's reads the MLP input, Llama's hook_resid_mid). Run by
CTest's python_mpirun_* cases; every rank runs every test; data-parallel meshes are refused (the
per-layer test checks that)."""
import os

import pytest
import torch

import flexmodel
from conftest import DATA

MESH = tuple(int(x) for x in os.environ.get("FLEX_TEST_MESH", "1,1,1").split(","))

pytestmark = pytest.mark.skipif(MESH == (1, 1, 1) or MESH[2] > 1,
                                reason="runs under mpirun with FLEX_TEST_MESH (CTest), tensor/pipeline meshes")


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_rank_0_clt_graph_equals_one_process(family):
    clt = str(DATA.parent / "attribution" / f"{family}-clt")
    ids = torch.tensor([255 if family == "gpt2" else 1, 17, 42, 7, 99, 5, 11, 64, 2, 8])
    model = flexmodel.from_pretrained(DATA / "models" / family)
    tp, pp, dp = MESH
    fm = flexmodel.FlexModel(model, {}, tensor_parallel_size=tp, pipeline_parallel_size=pp, data_parallel_size=dp)
    got = flexmodel.attribute(fm, clt, ids, batch_size=16)
    want = flexmodel.attribute(model, clt, ids, batch_size=16)
    for key in ("active_features", "selected_features", "logit_tokens"):
        assert torch.equal(got[key], want[key]), key
    if fm.rank != 0:
        assert got["adjacency"] is None, f"rank {fm.rank} holds rows"
        return
    largest = want["adjacency"].abs().max().item()
    worst = (got["adjacency"] - want["adjacency"]).abs().max().item()
    print(f"mesh {MESH} {family} CLT: largest edge difference {worst:.3g} of {largest:.3g}")
    assert worst <= 1e-5 * largest, f"largest edge difference {worst} (largest edge {largest})"
