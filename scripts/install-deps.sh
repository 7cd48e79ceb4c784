#!/usr/bin/env bash
# Installs what flexmodel needs, only what is missing (a second run costs a
# few dpkg queries and one Python import). Runs as root on a fresh Debian 12.
#   install-deps.sh [--tests] [--bench]
#     --tests adds what only the test suite uses: Chromium (the report's
#             browser test), clang, lld and compiler-rt (the sanitizer and fuzz
#             stages), valgrind, and pytest + Transformers for tests/python.
#     --bench adds the peers bench/python/bench_python.py compares with:
#             nnsight, TransformerLens, Accelerate and Vector Institute's
#             FlexModel (PyPI flex-model), with Transformers, all pinned;
#             and llama.cpp (llama-cpp-python, built here) with gguf-py for
#             bench_decode's GGUF comparison.
#
# libtorch comes from PyTorch's wheel, pinned: installed first and on its own,
# because any later package that asks for "torch" unpinned would otherwise
# pull the newest CUDA build (several GB). FLEX_TORCH_VERSION overrides the
# pin; FLEX_PYTHON names the interpreter (default python3).
set -euo pipefail
torch_version=${FLEX_TORCH_VERSION:-2.13.0}
python=${FLEX_PYTHON:-python3}
SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
tests=0; bench=0
for arg in "$@"; do
  case "$arg" in
    --tests) tests=1 ;;
    --bench) bench=1 ;;
    *) echo "usage: install-deps.sh [--tests] [--bench]" >&2; exit 2 ;;
  esac
done

pkgs=(build-essential cmake ninja-build ccache pkg-config
      libopenmpi-dev openmpi-bin
      nlohmann-json3-dev libpcre2-dev libzip-dev
      libgtest-dev libgmock-dev googletest libbenchmark-dev zlib1g-dev
      python3-pip)
if ((tests)); then pkgs+=(chromium clang lld libclang-rt-14-dev valgrind); fi
# A pyenv or venv interpreter brings its own pip: Debian's is then not needed.
if "$python" -m pip --version >/dev/null 2>&1; then pkgs=("${pkgs[@]/python3-pip}"); fi
missing=()
for p in "${pkgs[@]}"; do
  [ -n "$p" ] || continue
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "flexmodel: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# pip install, as root, into an interpreter whose site-packages Debian may
# mark externally managed.
pip_install() {
  local extra=()
  "$python" -m pip install --help 2>/dev/null | grep -q -- --break-system-packages && extra+=(--break-system-packages)
  "$python" -m pip install -q --root-user-action=ignore "${extra[@]}" "$@"
}

# PyTorch (its libtorch: headers, libraries, share/cmake/Torch).
have=$("$python" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)
if [ "${have%%+*}" != "$torch_version" ]; then
  echo "flexmodel: installing torch==$torch_version (found: ${have:-none})" >&2
  pip_install "torch==$torch_version"
fi

# `pip install --no-build-isolation .` builds a wheel with the setuptools
# found here: setuptools >= 70.1 can, an older one needs the wheel package.
if ! "$python" -c "import setuptools.command.bdist_wheel" 2>/dev/null && ! "$python" -c "import wheel" 2>/dev/null; then
  echo "flexmodel: installing wheel==0.45.1 (pip install . with this setuptools)" >&2
  pip_install "wheel==0.45.1"
fi

# The Python package's tests (tests/python): pytest, and Transformers as the
# reference they compare with. Pinned, with torch pinned in the same command so
# nothing upgrades it.
if ((tests)); then
  py_want="pytest==9.0.3 transformers==5.23.0 safetensors==0.8.0 tokenizers==0.23.3 nnsight==0.8.1"
  if ! "$python" -c "import pytest, transformers, safetensors, tokenizers, nnsight, sys; sys.exit((pytest.__version__, transformers.__version__, safetensors.__version__, tokenizers.__version__, nnsight.__version__) != ('9.0.3', '5.23.0', '0.8.0', '0.23.3', '0.8.1'))" 2>/dev/null; then
    echo "flexmodel: installing $py_want (Python tests)" >&2
    # shellcheck disable=SC2086
    pip_install $py_want "torch==$torch_version"
  fi
fi

# The Python bench's peers (bench/python): pinned, with Transformers and torch
# pinned in the same command, so that none of them can move either (an
# unpinned torch would be the newest CUDA build, several GB).
if ((bench)); then
  bench_want="nnsight==0.8.1 transformer-lens==4.3.0 accelerate==1.15.0 flex-model==0.1.0 transformers==5.23.0 safetensors==0.8.0 tokenizers==0.23.3"
  if ! "$python" -c "
import importlib.metadata as m, sys
want = dict(p.split('==') for p in sys.argv[1].split())
sys.exit(any(m.version(d) != v for d, v in want.items()))" "$bench_want" 2>/dev/null; then
    echo "flexmodel: installing $bench_want (Python bench)" >&2
    # shellcheck disable=SC2086
    pip_install $bench_want "torch==$torch_version"
  fi
  # llama.cpp, the GGUF peer of bench/bench_decode (bench/peers/llama_cpp_peer.py),
  # built natively from its sdist (the CPU's own vector units; a few minutes on
  # 2 cores), and gguf-py for bench/peers/make_bench_gguf.py.
  gguf_want="llama-cpp-python==0.3.36 gguf==0.19.0"
  if ! "$python" -c "
import importlib.metadata as m, sys
want = dict(p.split('==') for p in sys.argv[1].split())
sys.exit(any(m.version(d) != v for d, v in want.items()))" "$gguf_want" 2>/dev/null; then
    echo "flexmodel: installing $gguf_want (GGUF bench peer; builds llama.cpp)" >&2
    # shellcheck disable=SC2086
    CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) pip_install $gguf_want "torch==$torch_version"
  fi
fi
