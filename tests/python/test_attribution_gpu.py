"""flexmodel.attribute / intervene on a model loaded onto a CUDA device (marked gpu: CTest runs these as
python_gpu under the gpu label; each skips itself without CUDA): the graph and the intervened logits equal
the CPU model's on the circuit-tracer fixtures (tests/data/attribution), and come back as CPU tensors."""
import pytest
import torch
from safetensors.torch import load_file

import flexmodel
from conftest import DATA, assert_close

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (torch.cuda.is_available() is False)"),
]

ATTR = DATA.parent / "attribution"
CASES = {"gpt2": DATA / "models" / "gpt2", "llama": DATA / "models" / "llama",
         "gemma3": DATA.parent / "golden5" / "gemma3_text"}


@pytest.mark.parametrize("family", sorted(CASES))
def test_graph_and_interventions_equal_the_cpu_models(family):
    ids = load_file(str(ATTR / f"{family}-circuit-tracer.safetensors"))["input_ids"]
    tc = ATTR / f"{family}-transcoders"
    cpu = flexmodel.from_pretrained(CASES[family])
    gpu = flexmodel.from_pretrained(CASES[family], device_map={"": 0})
    want = flexmodel.attribute(cpu, tc, ids, batch_size=16)
    got = flexmodel.attribute(gpu, tc, ids.cuda(), batch_size=16)
    for k in ("active_features", "selected_features", "logit_tokens", "adjacency"):
        assert got[k].device.type == "cpu", k
    assert torch.equal(got["active_features"], want["active_features"])
    assert torch.equal(got["logit_tokens"], want["logit_tokens"])
    assert_close(got["adjacency"], want["adjacency"], 1e-4 * want["adjacency"].abs().max().item(), family)
    f = want["active_features"][0].tolist()
    edits = [(f[0], f[1], f[2], 0.0), (0, ids.numel() - 1, f[2], 2.0)]
    a = flexmodel.intervene(cpu, tc, ids, edits)
    b = flexmodel.intervene(gpu, tc, ids, edits)
    assert b.device.type == "cpu"
    assert_close(b, a, 1e-4 * a.abs().max().item(), f"{family} intervened logits")
