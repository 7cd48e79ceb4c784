"""Golden data for flexmodel's ggml quantizer (quant/src/ggml_quantize.cpp):
a float32 matrix and gguf-py's own Q8_0 quantization of it
(gguf.quants.quantize), written to tests/data/gguf/q8_0_quantize.safetensors.
Run with the golden venv: PY=$(bash scripts/golden/setup.sh); $PY scripts/golden/make_ggml_quantize.py
"""
import os

import gguf
import numpy as np
from safetensors.numpy import save_file

here = os.path.dirname(os.path.abspath(__file__))
out = os.path.join(here, "..", "..", "tests", "data", "gguf", "q8_0_quantize.safetensors")

rng = np.random.default_rng(52)
w = rng.standard_normal((6, 96)).astype(np.float32)
w[1, :32] = 0.0                      # an all-zero block: d = 0
w[2, 40] = 25.0                      # an outlier setting its block's scale
w[3] = np.round(w[3] * 4) / 4 * 1.5  # values near .5 steps: rounding ties
w[4, 64:96] *= 1e-6                  # a tiny block (float16 d near subnormal)
q = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
assert q.dtype == np.uint8 and q.shape == (6, 96 // 32 * 34), q.shape
save_file({"weight": w, "q8_0": np.ascontiguousarray(q)}, out,
          metadata={"gguf": gguf.__version__ if hasattr(gguf, "__version__") else "0.19.0"})
print("wrote", out, q.shape)
try:
    gguf.quants.quantize(np.zeros((1, 256), np.float32), gguf.GGMLQuantizationType.Q6_K)
    print("gguf-py quantizes Q6_K")
except Exception as e:  # gguf-py 0.19 has no Q6_K quantizer: the tests check the bound only
    print("gguf-py Q6_K quantize:", type(e).__name__, e)
