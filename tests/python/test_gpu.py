"""The Python package on a CUDA device (marked gpu: CTest runs these as python_gpu under the gpu label; each
skips itself without CUDA): from_pretrained(device_map={"": 0}) computes every fixture's logits and every
module's capture as the CPU does (captures are CPU tensors either way), and infer_auto_device_map plans with
a GPU present (it crashed the whole pytest process on the first GPU run, an H200, inside
test_infer_auto_device_map_equals_accelerate: here it runs in a child process, so a crash is this test's
failure, with the child's Python and, where gdb exists, native backtraces)."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open

import flexmodel
from conftest import DATA, assert_close

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (torch.cuda.is_available() is False)"),
]

MODELS = sorted(p.stem for p in (DATA / "golden").glob("*.json") if p.stem != "inputs")


def every_module(model, ids):
    out = {}
    fm = flexmodel.FlexModel(model, out)
    fm.create_hook_group("every", "")
    with torch.no_grad():
        logits = fm(ids)
    return logits, {k: (v[0] if isinstance(v, list) else v) for k, v in out.items()}


@pytest.mark.parametrize("name", MODELS)
def test_device_map_cuda0_captures_equal_cpu(name):
    meta = json.loads((DATA / "golden" / f"{name}.json").read_text())
    golden = safe_open(str(DATA / "golden" / f"{name}.safetensors"), "pt")
    ids = golden.get_tensor("input_ids")
    cpu = flexmodel.from_pretrained(DATA / meta["model_dir"])
    gpu = flexmodel.from_pretrained(DATA / meta["model_dir"], device_map={"": 0})
    devices = {p.device for _, p in gpu.named_parameters()}
    assert devices == {torch.device("cuda", 0)}, f"{name}: parameters on {devices}"
    lc, oc = every_module(cpu, ids)
    lg, og = every_module(gpu, ids.to("cuda:0"))  # the model is wholly on GPU 0: its inputs go there too
    assert lg.device.type == "cuda", lg.device
    assert_close(lg.cpu(), lc, 1e-4, f"{name} logits, GPU vs CPU")
    assert_close(lg.cpu(), golden.get_tensor("logits"), 1e-4, f"{name} logits on the GPU vs golden")
    assert set(og) == set(oc), f"{name}: captured only on one side: {sorted(set(og) ^ set(oc))[:8]}"
    worst = (0.0, "")
    for key, want in oc.items():
        got = og[key]
        assert got.device.type == "cpu", f"{name} {key}: capture on {got.device}"
        if not want.is_floating_point():
            assert torch.equal(got, want), f"{name} {key}"
            continue
        assert_close(got, want, 1e-4, f"{name} {key}, GPU vs CPU capture")
        if got.numel():
            worst = max(worst, (float((got.double() - want.double()).abs().max()), key))
    print(f"{name}: {len(oc)} captures, largest |GPU - CPU| {worst[0]:.3g} at {worst[1]}")


PLAN = r"""
import json, sys
import flexmodel
with flexmodel.init_empty_weights():
    model = flexmodel.from_config(sys.argv[1])
size = sum(p.numel() * p.element_size() for _, p in model.named_parameters())
print(json.dumps(flexmodel.infer_auto_device_map(model, max_memory={0: "1GiB", "cpu": "1GiB"})), flush=True)
print(json.dumps(flexmodel.infer_auto_device_map(model, max_memory={0: size // 3, "cpu": size // 3})), flush=True)
print(json.dumps(flexmodel.infer_auto_device_map(model)), flush=True)  # this machine's free memory
"""


def run_child(args, timeout=180):
    """Runs python args in a child with faulthandler on; on a crash, again under gdb for a native backtrace."""
    cmd = [sys.executable, "-X", "faulthandler"] + args
    env = {k: v for k, v in os.environ.items() if k != "FLEX_PYTEST_ALL_SKIPPED_RC"}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode >= 0 or not shutil.which("gdb"):
        return r, ""
    g = subprocess.run(["gdb", "-q", "-batch", "-ex", "run", "-ex", "bt 40", "--args"] + cmd,
                       capture_output=True, text=True, timeout=timeout, env=env)
    return r, g.stdout[-6000:]


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_infer_auto_device_map_with_cuda_present(name):
    meta = json.loads((DATA / "golden" / f"{name}.json").read_text())
    r, native = run_child(["-c", PLAN, str(DATA / meta["model_dir"])])
    assert r.returncode == 0, (f"infer_auto_device_map with CUDA present: exit {r.returncode} (negative: the signal)\n"
                               f"stderr:\n{r.stderr[-4000:]}\nnative backtrace (gdb):\n{native}")
    roomy, tight, free = (json.loads(line) for line in r.stdout.strip().splitlines()[-3:])
    assert set(roomy.values()) == {0}, roomy  # 1 GiB holds the whole fixture on GPU 0
    assert set(tight.values()) - {0} and set(tight.values()) <= {0, "cpu", "disk"}, tight  # a third each: offloads
    assert 0 in set(free.values()), free


def test_infer_auto_device_map_scenarios_with_cuda_present():
    """test_big_modeling.py's Accelerate scenarios (the crash on the H200), in a child process."""
    test = os.path.join(os.path.dirname(__file__), "test_big_modeling.py")
    r, native = run_child(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", test, "-k",
                           "infer_auto_device_map_equals_accelerate"], timeout=300)
    assert r.returncode == 0, (f"exit {r.returncode}\nstdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}\n"
                               f"native backtrace (gdb):\n{native}")
