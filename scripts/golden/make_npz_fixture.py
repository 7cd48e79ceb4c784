"""tests/data/sae/npz/arrays.npz: the .npy cases read_npz must handle (deflated members, C and Fortran
order, the supported dtypes). Values are arange(6).reshape(2, 3) in each dtype, so a test can rebuild them.

    python3 scripts/golden/make_npz_fixture.py
"""
import pathlib

import numpy as np

out = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "sae" / "npz"
out.mkdir(parents=True, exist_ok=True)
base = np.arange(6).reshape(2, 3)
np.savez_compressed(out / "arrays.npz",
                    f32=base.astype(np.float32),
                    f64_fortran=np.asfortranarray(base.astype(np.float64)),
                    f16=base.astype(np.float16),
                    i64=base.astype(np.int64),
                    u8=base.astype(np.uint8),
                    b1=(base % 2).astype(bool),
                    scalar=np.float32(7.0))
print("wrote", out / "arrays.npz")
