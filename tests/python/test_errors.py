"""Bad input from Python: typed exceptions naming the module; the model stays usable afterwards."""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import torch

import flexmodel
from conftest import DATA, assert_close

IDS = torch.tensor([[5, 9, 2, 7]])


@pytest.fixture(scope="module")
def model():
    return flexmodel.from_pretrained(DATA / "models" / "gpt2")


def hooked(model, name, **kw):
    fm = flexmodel.FlexModel(model, {})
    fm.register_forward_hook(flexmodel.HookFunction(name, **kw))
    return fm


def still_usable(model, clean):
    with torch.no_grad():
        assert_close(model(IDS), clean, 0, "logits after the error")


def test_errors_are_typed_and_name_the_culprit(model):
    with torch.no_grad():
        clean = model(IDS)
    with pytest.raises(flexmodel.NotFoundError, match="transformer.h.7.mlp") as e:
        hooked(model, "transformer.h.7.mlp")
    assert isinstance(e.value, LookupError) and "transformer.h.1" in str(e.value)  # close names listed

    fm = hooked(model, "transformer.h.0.mlp", expected_shape=(1, 4, 65))
    with pytest.raises(flexmodel.ShapeError, match=r"transformer.h.0.mlp.*\[1, 4, 64\].*\[1, 4, 65\]") as e:
        fm(IDS)
    assert isinstance(e.value, ValueError)
    fm.restore()
    still_usable(model, clean)

    def raises(m, x, ctx, mods):
        raise KeyError("no such feature")
    fm = hooked(model, "transformer.h.1.attn", editing_function=raises)
    with pytest.raises(flexmodel.EditingFunctionError, match="transformer.h.1.attn.*KeyError") as e:
        fm(IDS)
    assert isinstance(e.value.__cause__, KeyError)
    fm.restore()
    still_usable(model, clean)

    fm = hooked(model, "transformer.h.1", editing_function=lambda m, x, ctx, mods: x[:, :2])
    with pytest.raises(flexmodel.ShapeError, match="transformer.h.1.*returned shape"):
        fm(IDS)
    fm.restore()
    still_usable(model, clean)

    fm = hooked(model, "transformer.h.1", editing_function=lambda m, x, ctx, mods: "not a tensor")
    with pytest.raises(flexmodel.EditingFunctionError, match="transformer.h.1.*returned a str"):
        fm(IDS)
    # The same FlexModel keeps working once its bad hook is gone.
    fm.restore()
    still_usable(model, clean)

    with pytest.raises(flexmodel.ConfigError, match="callable"):
        hooked(model, "transformer.h.1", editing_function=3)
    with pytest.raises(flexmodel.NotFoundError, match="no hook group named 'nope'"):
        flexmodel.FlexModel(model, {})(IDS, groups="nope")


def test_loading_errors():
    with pytest.raises(flexmodel.IOError) as e:
        flexmodel.from_pretrained(DATA / "models" / "no-such-model")
    assert isinstance(e.value, OSError) and "no-such-model" in str(e.value)
    with pytest.raises(flexmodel.ConfigError, match="torch_dtype"):
        flexmodel.from_pretrained(DATA / "models" / "gpt2", torch_dtype="int3")
    with pytest.raises(flexmodel.DeviceMapError):
        flexmodel.from_pretrained(DATA / "models" / "gpt2", device_map={"transformer": "mps"})


def test_import_with_another_torch_is_an_import_error_naming_both(tmp_path):
    pkg = pathlib.Path(flexmodel.__file__).parent
    copy = tmp_path / "flexmodel"
    shutil.copytree(pkg, copy)
    (copy / "_build_info.py").write_text('torch_version = "1.2.3+other"\npython = ""\n')
    r = subprocess.run([sys.executable, "-c", "import flexmodel"], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert r.returncode != 0
    assert "ImportError" in r.stderr and "1.2.3+other" in r.stderr and torch.__version__ in r.stderr, r.stderr
