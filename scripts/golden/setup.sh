#!/usr/bin/env bash
# The golden-data generator's own environment (not used by test.sh): a venv in
# scripts/golden/.venv that sees the pinned torch 2.13 installed by
# scripts/install-deps.sh and adds the pinned reference implementations.
# Prints the venv's python. A second run only checks the versions.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
venv=$here/.venv
torch_version=2.13.0
if ! python3 -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$torch_version')" 2>/dev/null; then
  # Pinned and first: an unpinned dependency would pull a CUDA build of several GB.
  python3 -m pip install --quiet "torch==$torch_version" >&2
fi
[ -x "$venv/bin/python" ] || python3 -m venv --system-site-packages "$venv"
# bitsandbytes: the int8 / nf4 peers of bench/bench_decode (its CPU backend).
want="transformers==5.23.0 accelerate==1.15.0 safetensors==0.8.0 tokenizers==0.23.3 bitsandbytes==0.50.2"
if ! "$venv/bin/python" -c "import transformers, accelerate, safetensors, tokenizers, bitsandbytes, sys; sys.exit((transformers.__version__, accelerate.__version__, safetensors.__version__, tokenizers.__version__, bitsandbytes.__version__) != ('5.23.0', '1.15.0', '0.8.0', '0.23.3', '0.50.2'))" 2>/dev/null; then
  "$venv/bin/python" -m pip install --quiet $want "torch==$torch_version" >&2
fi
echo "$venv/bin/python"
