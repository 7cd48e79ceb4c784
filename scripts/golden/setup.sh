#!/usr/bin/env bash
# The golden-data generator's own environment (not used by test.sh): a venv in
# scripts/golden/.venv that sees the pinned torch 2.13 installed by
# scripts/install-deps.sh and adds the pinned reference implementations.
# Prints the venv's python. A second run only checks the versions.
#
# `setup.sh --attribution` makes (or checks) scripts/golden/.venv-ct with
# circuit-tracer 0.5.0 (transformers 4.57.3, transformer-lens 2.16.1) for
# scripts/golden/make_attribution.py and bench/attribution.
#
# `setup.sh --sae` instead makes (or checks) a second venv, scripts/golden/.venv-sae,
# for the SAELens reference (scripts/golden/make_sae_fixtures.py) and prints its
# python. sae-lens 6.54.12 needs transformer-lens < 4 while the main interpreter
# keeps transformer-lens 4.x, so transformer-lens 3.9.0 lives in that venv's own
# site-packages (searched before the system ones); .venv and the main
# interpreter are not touched.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
venv=$here/.venv
torch_version=2.13.0
case "${1:-}" in
  "") mode=golden ;;
  --sae) mode=sae ;;
  --attribution) mode=attribution ;;
  *) echo "usage: $0 [--sae|--attribution]" >&2; exit 2 ;;
esac
if ! python3 -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$torch_version')" 2>/dev/null; then
  # Pinned and first: an unpinned dependency would pull a CUDA build of several GB.
  python3 -m pip install --quiet "torch==$torch_version" >&2
fi
# pinned_venv DIR WANT CHECK GUARDED: makes (or checks) a venv at DIR that sees
# the system's torch, installs WANT (torch pinned in it) unless the Python
# snippet CHECK already exits 0, and prints the venv's python. A dry run comes
# first: it refuses a resolver that would (re)install one of GUARDED (a
# space-separated list, lower case), so nothing moves the pinned torch.
pinned_venv() {
  local dir=$1 want=$2 check=$3 guarded=$4 report
  [ -x "$dir/bin/python" ] || python3 -m venv --system-site-packages "$dir"
  if ! "$dir/bin/python" -c "$check" 2>/dev/null; then
    report=$(mktemp)
    "$dir/bin/python" -m pip install --quiet --dry-run --report "$report" $want 2>/dev/null >&2
    if ! python3 -c "import json, sys; bad=[i['metadata']['name'] for i in json.load(open(sys.argv[1]))['install'] if i['metadata']['name'].lower() in sys.argv[2].split()]; print('would install', bad, file=sys.stderr) if bad else None; sys.exit(bool(bad))" "$report" "$guarded"; then
      rm -f "$report"; exit 1
    fi
    rm -f "$report"
    "$dir/bin/python" -m pip install --quiet $want >&2
    "$dir/bin/python" -c "$check"
  fi
  echo "$dir/bin/python"
}
if [ "$mode" = attribution ]; then
  # circuit-tracer 0.5.0, the attribution-graph reference (make_attribution.py,
  # bench/attribution): it pins transformers <= 4.57.3 and runs on
  # transformer-lens 2.x, so both live in scripts/golden/.venv-ct.
  # pyarrow 21: the newest that still takes the numpy 1.26 transformer-lens 2.16 pins.
  # nnsight 0.7.0 (and the cloudpickle 3 it imports from): circuit-tracer 0.5.0's nnsight
  # backend (make_attribution_gemma3.py) imports nnsight.intervention.tracing, gone in 0.8.
  pinned_venv "$here/.venv-ct" \
    "circuit-tracer==0.5.0 transformer-lens==2.16.1 transformers==4.57.3 pyarrow==21.0.0 nnsight==0.7.0 cloudpickle==3.1.1 torch==$torch_version" \
    "import circuit_tracer, transformer_lens, importlib.metadata as m, torch, transformers, sys; sys.exit((circuit_tracer.__version__, m.version('transformer-lens'), torch.__version__.split('+')[0], transformers.__version__, m.version('nnsight'), m.version('cloudpickle')) != ('0.5.0', '2.16.1', '$torch_version', '4.57.3', '0.7.0', '3.1.1'))" \
    "torch"
  exit 0
fi
if [ "$mode" = sae ]; then
  # torch and transformers pinned in the same command so nothing moves them.
  pinned_venv "$here/.venv-sae" \
    "sae-lens==6.54.12 transformer-lens==3.9.0 torch==$torch_version transformers==5.23.0 safetensors==0.8.0" \
    "import sae_lens, transformer_lens, importlib.metadata as m, torch, transformers, sys; sys.exit((sae_lens.__version__, m.version('transformer-lens'), torch.__version__.split('+')[0], transformers.__version__) != ('6.54.12', '3.9.0', '$torch_version', '5.23.0'))" \
    "torch transformers"
  exit 0
fi
[ -x "$venv/bin/python" ] || python3 -m venv --system-site-packages "$venv"
# bitsandbytes: the int8 / nf4 peers of bench/bench_decode (its CPU backend).
# gguf: gguf-py, the reference GGUF writer and dequantizer (make_gguf.py).
want="transformers==5.23.0 accelerate==1.15.0 safetensors==0.8.0 tokenizers==0.23.3 bitsandbytes==0.50.2 gguf==0.19.0"
if ! "$venv/bin/python" -c "import transformers, accelerate, safetensors, tokenizers, bitsandbytes, importlib.metadata as m, sys; sys.exit((transformers.__version__, accelerate.__version__, safetensors.__version__, tokenizers.__version__, bitsandbytes.__version__, m.version('gguf')) != ('5.23.0', '1.15.0', '0.8.0', '0.23.3', '0.50.2', '0.19.0'))" 2>/dev/null; then
  "$venv/bin/python" -m pip install --quiet $want "torch==$torch_version" >&2
fi
echo "$venv/bin/python"
