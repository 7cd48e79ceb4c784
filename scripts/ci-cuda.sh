#!/usr/bin/env bash
# The CUDA build on a machine without a GPU: test.sh's "cuda" stage
# (FLEX_CUDA_STAGE=1; .ci/run turns it on), issue 48.
#
#   scripts/ci-cuda.sh
#
# Builds flexmodel against PyTorch's CUDA wheel, so the code compiled only for
# a CUDA libtorch (FLEX_TORCH_CUDA: c10/cuda streams, the NCCL backend on
# PyTorch's stream) compiles and links on every CI run, and runs the test
# suite of that build on the CPU, with no GPU and no driver (libcuda.so): a
# CUDA build must work where no device is, and a bug of that kind fails here
# instead of on a GPU machine.
#
#   1. The venv FLEX_CUDA_VENV (default /opt/flexmodel-cuda-venv), made when
#      missing: torch==$FLEX_CUDA_TORCH_VERSION (2.14.1, the cu130 wheel with
#      its nvidia-* wheels, about 5.5 GB) and what tests/python needs (pytest,
#      Transformers; the same pins as install-deps.sh --tests).
#   2. nvcc: libtorch's CMake config enables CMake's CUDA language, so it needs
#      a CUDA toolkit of the wheel's major version (nvcc, the runtime headers
#      and library) although nothing here is compiled by nvcc. FLEX_CUDA_HOME,
#      else the toolkit of the nvcc on PATH, else /usr/local/cuda; when none is
#      there, NVIDIA's toolkit wheels (nvcc, cccl, crt, nvvm, runtime) are
#      unpacked into the venv. nvrtc and NCCL come from the torch's wheels.
#   3. build-cuda/ (FLEX_CUDA_BUILD): Release, unity batches, ccache, gold, as
#      scripts/build.sh; everything but the benchmarks (libraries, the
#      flexmodel tool, the Python extension, every test program, the examples).
#   4. ctest -j2 --timeout 600 over the whole suite but the valgrind run of
#      the CLI (FLEX_CUDA_CTEST_ARGS, default "-LE valgrind", replaces the
#      selection). Under the CUDA wheel valgrind reports only the wheel's own
#      code: libtorch_cuda's static initializers (24 bytes "definitely lost"
#      in CachingHostAllocator.cpp), ld.so's strncmp reading past the RPATH
#      strings of the nvidia-* libraries it dlopens, and an uninitialised
#      optional inside at::native::to (t.to(at::kCPU)); the main suite runs
#      it over the same code (libtorch 2.13 CPU), clean.
#
# The build uses C++20 (libtorch 2.14's headers need it; cmake/FindTorchFromPython.cmake).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${FLEX_CUDA_VENV:-/opt/flexmodel-cuda-venv}
torch_version=${FLEX_CUDA_TORCH_VERSION:-2.14.1}
build=${FLEX_CUDA_BUILD:-$root/build-cuda}
jobs=${FLEX_JOBS:-$(nproc)}
py=$venv/bin/python
start=$SECONDS
say() { echo "cuda stage: $*"; }

# ---- 1. the venv -------------------------------------------------------------
bash "$root/scripts/install-deps.sh"   # Debian's build dependencies (a few dpkg queries when present)
have=$("$py" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)
if [ "$have" != "$torch_version" ]; then
  say "installing torch==$torch_version (CUDA wheel, several GB) into $venv (found: ${have:-none})"
  if [ ! -x "$py" ]; then
    python3 -c 'import ensurepip' 2>/dev/null || { apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null; }
    python3 -m venv "$venv"
  fi
  "$py" -m pip install -q "torch==$torch_version"
fi
py_want="pytest==9.0.3 transformers==5.23.0 safetensors==0.8.0 tokenizers==0.23.3"
if ! "$py" -c "import pytest, transformers, safetensors, tokenizers, sys; sys.exit((pytest.__version__, transformers.__version__, safetensors.__version__, tokenizers.__version__) != ('9.0.3', '5.23.0', '0.8.0', '0.23.3'))" 2>/dev/null; then
  say "installing $py_want into $venv (tests/python)"
  # shellcheck disable=SC2086
  "$py" -m pip install -q $py_want "torch==$torch_version"
fi
read -r torch_cuda torch_prefix site < <("$py" -c 'import torch, torch.utils, sysconfig; print(torch.version.cuda, torch.utils.cmake_prefix_path, sysconfig.get_paths()["purelib"])')
[ "$torch_cuda" != None ] || { echo "cuda stage: $venv's torch $have is not a CUDA build" >&2; exit 1; }
say "torch $torch_version (CUDA $torch_cuda) in $venv"

# ---- 2. nvcc -------------------------------------------------------------------
cuda_major=${torch_cuda%%.*}
toolkit_ok() {  # dir: has nvcc of the wheel's major version, cuda_runtime.h and libcudart.so
  [ -x "$1/bin/nvcc" ] && [ -f "$1/include/cuda_runtime.h" ] && ls "$1"/lib*/libcudart.so >/dev/null 2>&1 &&
    "$1/bin/nvcc" --version 2>/dev/null | grep -q "release $cuda_major\."
}
cuda_home=${FLEX_CUDA_HOME:-}
if [ -n "$cuda_home" ]; then
  toolkit_ok "$cuda_home" || { echo "cuda stage: FLEX_CUDA_HOME=$cuda_home has no CUDA $cuda_major nvcc, cuda_runtime.h and libcudart.so" >&2; exit 1; }
else
  for c in "$(dirname "$(dirname "$(readlink -f "$(command -v nvcc || echo /nonexistent)")")")" /usr/local/cuda "$venv/cuda-toolkit/nvidia/cu$cuda_major"; do
    if toolkit_ok "$c"; then cuda_home=$c; break; fi
  done
fi
if [ -z "$cuda_home" ]; then
  # NVIDIA's toolkit wheels of the runtime's version (nvidia-cuda-runtime in the venv).
  runtime=$("$py" -c 'import importlib.metadata as m; print(m.version("nvidia-cuda-runtime"))')
  nvcc_want=${FLEX_CUDA_NVCC_VERSION:-$cuda_major.0.88}
  say "no CUDA $cuda_major toolkit found; installing NVIDIA's nvcc $nvcc_want wheels into $venv/cuda-toolkit"
  "$py" -m pip install -q --no-deps --target "$venv/cuda-toolkit" "nvidia-cuda-nvcc==$nvcc_want" \
    "nvidia-cuda-crt==$nvcc_want" "nvidia-nvvm==$nvcc_want" "nvidia-cuda-cccl~=$cuda_major.0.0" "nvidia-cuda-runtime==$runtime"
  cuda_home=$venv/cuda-toolkit/nvidia/cu$cuda_major
  ln -sfn "libcudart.so.$cuda_major" "$cuda_home/lib/libcudart.so"
  ln -sfn lib "$cuda_home/lib64"
  toolkit_ok "$cuda_home" || { echo "cuda stage: the toolkit in $cuda_home is incomplete" >&2; exit 1; }
fi
say "CUDA toolkit $cuda_home ($("$cuda_home/bin/nvcc" --version | grep -o 'release [0-9.]*'))"
nvrtc=$(ls "$site/nvidia/cu$cuda_major/lib/libnvrtc.so."* 2>/dev/null | grep -v builtins | head -1 || true)
nccl=$site/nvidia/nccl

# ---- 3. configure and build ----------------------------------------------------
# No GPU to detect: name one architecture, so libtorch's config does not try.
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
cmake_args=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DFLEX_BUILD_BENCH=OFF
            -DFLEX_PYTHON="$py" -DTorch_DIR="$torch_prefix/Torch"
            -DCUDA_TOOLKIT_ROOT_DIR="$cuda_home" -DCMAKE_CUDA_COMPILER="$cuda_home/bin/nvcc")
[ -n "$nvrtc" ] && cmake_args+=(-DCUDA_nvrtc_LIBRARY="$nvrtc")
[ -f "$nccl/include/nccl.h" ] && cmake_args+=(-DFLEX_NCCL_INCLUDE_DIR="$nccl/include"
                                              -DFLEX_NCCL_LIBRARY="$(ls "$nccl"/lib/libnccl.so.* | head -1)")
mkdir -p "$build"
# shellcheck disable=SC2086
cmake -S "$root" -B "$build" "${cmake_args[@]}" ${FLEXMODEL_CMAKE_ARGS:-} > "$build/configure.log" 2>&1 ||
  { tail -60 "$build/configure.log"; exit 1; }
grep -E "^-- (flexmodel|flex::parallel):" "$build/configure.log" | sed 's/^-- /  /'
grep -q "flexmodel: CUDA libtorch" "$build/configure.log" ||
  { echo "cuda stage: CMake did not see a CUDA libtorch (FLEX_TORCH_CUDA off)" >&2; exit 1; }
build_start=$SECONDS
say "compile on $jobs core(s)"
ninja -C "$build" -j"$jobs"
say "build took $((SECONDS - build_start)) s"
# The binaries are CUDA builds that see no device.
"$build/tools/flexmodel" --version | sed 's/^/  /'
"$build/tools/flexmodel" --version | grep -q "CUDA build" ||
  { echo "cuda stage: build-cuda/tools/flexmodel does not report a CUDA build" >&2; exit 1; }

# ---- 4. the suite on the CPU ---------------------------------------------------
test_start=$SECONDS
cd "$build"
# No device, even on a machine that has one: this is the suite of a CUDA build on the CPU.
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=2 CUDA_VISIBLE_DEVICES=
# shellcheck disable=SC2086
ctest --output-on-failure -j"$jobs" --timeout 600 ${FLEX_CUDA_CTEST_ARGS--LE valgrind} 2>&1 | tee "$build/ctest.log"
rc=${PIPESTATUS[0]}
say "tests took $((SECONDS - test_start)) s; whole stage $((SECONDS - start)) s"
exit "$rc"
