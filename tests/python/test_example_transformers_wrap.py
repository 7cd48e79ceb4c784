"""examples/python/transformers_wrap.py runs to the end (each of its steps asserts against Transformers itself)."""
import os
import pathlib
import subprocess
import sys

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / "transformers_wrap.py"


def test_transformers_wrap_example_runs():
    run = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
    assert "held-out accuracy" in run.stdout and "done in" in run.stdout, run.stdout
