"""generate(cuda_graph=True) / static_step=True from Python (design decision 51). On the CPU: the static step
gives the normal decode's tokens and taps within 1e-4; cuda_graph on a CPU model is refused naming the device;
a Python editing function makes generation fall back to eager decode with a warning, with the eager result.
Marked gpu (skipped without CUDA): the recorded graph bit-equal to the eager static step, same tokens as the CPU."""
import pytest
import torch

import flexmodel
from conftest import DATA

LLAMA = DATA / "models" / "llama"
PROMPT = torch.tensor([[42, 171, 17, 111, 214, 244, 94, 193]])
TAPS = ["model.layers.1", "model.layers.1.mlp", "lm_head"]


def run(model, ids, **kw):
    return model.generate(ids, max_new_tokens=6, eos_token_id=[], static_capacity=32, taps=TAPS, **kw)


def test_static_step_equals_normal_decode():
    m = flexmodel.from_pretrained(LLAMA)
    seq, taps = run(m, PROMPT)
    sseq, staps = run(m, PROMPT, static_step=True)
    assert torch.equal(seq, sseq)
    for name in TAPS:
        assert len(taps[name]) == len(staps[name]) == 6
        for c, (a, b) in enumerate(zip(staps[name], taps[name])):
            d = (a - b).abs()
            assert d.max() <= 1e-4, f"{name} call {c}: largest difference {d.max():.3g} at {d.argmax()}"


def test_cuda_graph_on_a_cpu_model_names_the_device():
    m = flexmodel.from_pretrained(LLAMA)
    with pytest.raises(flexmodel.errors.UnsupportedError, match="cpu"):
        m.generate(PROMPT, max_new_tokens=2, cuda_graph=True)


def test_python_editing_function_falls_back_to_eager_with_a_warning():
    m = flexmodel.from_pretrained(LLAMA)
    double = {"model.layers.0.mlp": lambda a: a * 2.0}
    expected = m.generate(PROMPT, max_new_tokens=5, eos_token_id=[], edits=double)
    plain = m.generate(PROMPT, max_new_tokens=5, eos_token_id=[])
    with pytest.warns(RuntimeWarning, match=r"Python editing functions \(on model.layers.0.mlp\).*decoding eagerly"):
        got = m.generate(PROMPT, max_new_tokens=5, eos_token_id=[], edits=double, cuda_graph=True)
    assert torch.equal(got, expected)
    assert not torch.equal(expected, plain), "the edit changed nothing: the comparison would be vacuous"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (torch.cuda.is_available() is False)")
def test_cuda_graph_bit_equal_to_eager_static_step_on_gpu():
    gpu = flexmodel.from_pretrained(LLAMA, device_map={"": 0})
    cpu = flexmodel.from_pretrained(LLAMA)
    ids = PROMPT.to("cuda:0")
    steer = {"model.layers.0": flexmodel.edits.steer(torch.linspace(-2, 2, 64), 3.0)}  # a CPU vector, as users pass it
    gseq, gtaps = run(gpu, ids, cuda_graph=True, edits=steer)
    eseq, etaps = run(gpu, ids, static_step=True, edits=steer)
    assert torch.equal(gseq.cpu(), eseq.cpu())
    for name in TAPS:
        for c, (a, b) in enumerate(zip(gtaps[name], etaps[name])):
            assert torch.equal(a.cpu(), b.cpu()), f"{name} call {c}: largest {(a - b).abs().max():.3g}"
    cseq = run(cpu, PROMPT, edits={"model.layers.0": flexmodel.edits.steer(torch.linspace(-2, 2, 64), 3.0)})[0]
    assert torch.equal(gseq.cpu(), cseq)
