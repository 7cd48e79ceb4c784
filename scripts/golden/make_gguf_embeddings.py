"""Writes tests/data/gguf/embeddings.gguf and embeddings.dequant.safetensors:
one [24, 256] table per quantized ggml type flexmodel keeps an embedding in
(Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 quantized by gguf-py from random normals;
Q4_K, Q5_K, Q6_K as random blocks with moderate fp16 scales, which gguf-py
cannot quantize), and gguf-py's `gguf.quants.dequantize` of each table: the
rows a quantized embedding lookup must return bit for bit (design decision 52).

Run:  PY=$(bash scripts/golden/setup.sh); $PY scripts/golden/make_gguf_embeddings.py
"""

import os

import numpy as np

import gguf
from gguf import GGMLQuantizationType as T
from safetensors.numpy import save_file

from make_gguf import OUT, random_blocks, write_and_close

ROWS, COLS = 12, 256


def main():
    rng = np.random.default_rng(5252)
    path = os.path.join(OUT, "embeddings.gguf")
    w = gguf.GGUFWriter(path, "flextest")
    w.add_name("flexmodel quantized embedding tables")
    refs = {}
    for qt in (T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1):
        raw = gguf.quants.quantize(rng.standard_normal((ROWS, COLS)).astype(np.float32), qt)
        w.add_tensor(qt.name.lower(), raw, raw_dtype=qt)
        refs[qt.name.lower()] = gguf.quants.dequantize(raw, qt).reshape(ROWS, COLS)
    for qt in (T.Q4_K, T.Q5_K, T.Q6_K):
        raw = random_blocks(rng, qt, ROWS, COLS)
        w.add_tensor(qt.name.lower(), raw, raw_dtype=qt)
        refs[qt.name.lower()] = gguf.quants.dequantize(raw, qt).reshape(ROWS, COLS)
    write_and_close(w)
    for v in refs.values():
        assert v.dtype == np.float32 and np.isfinite(v).all()
    save_file({k: np.ascontiguousarray(v) for k, v in refs.items()}, os.path.join(OUT, "embeddings.dequant.safetensors"))


if __name__ == "__main__":
    main()
