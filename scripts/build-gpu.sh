#!/usr/bin/env bash
# (Prepared for issue 18 without a GPU machine: the Open MPI relocation under
# OPAL_PREFIX was checked on Debian 12; the whole script has not yet run on a
# GPU machine.)
# Builds flexmodel against the libtorch of the Python PyTorch on this machine
# (on a GPU machine: a CUDA 2.x build) into build-gpu/, everything unless
# targets are named. One command:
#
#   bash scripts/build-gpu.sh [TARGET...]
#
# Torch_DIR comes from `python3 -c 'import torch; print(torch.utils.cmake_prefix_path)'`;
# NCCL from /usr/local/cuda or else PyTorch's own nvidia-nccl wheel. The other
# libraries are Debian's: installed with apt-get when missing (install-deps.sh),
# or, on a machine without a package registry, unpacked from the .deb files in
# FLEX_DEPS_DEBS into build-gpu/deps (dpkg -x; nothing outside the build folder
# changes). build-gpu/env.sh then holds the environment that the tests and the
# tools need (library path, Open MPI's relocated prefix): `. build-gpu/env.sh`.
#
# Env: PYTHON (python3), FLEXMODEL_BUILD (build-gpu), FLEX_DEPS_DEBS,
#      FLEX_NINJA_ARGS (e.g. -k0), FLEXMODEL_CMAKE_ARGS.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FLEXMODEL_BUILD:-$root/build-gpu}
py=${PYTHON:-python3}
start=$SECONDS
mkdir -p "$build"

echo "flexmodel gpu build: [1/4] PyTorch"
torch_prefix=$($py -c 'import torch; print(torch.utils.cmake_prefix_path)')
$py -c 'import torch; print("  torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())'

echo "flexmodel gpu build: [2/4] libraries"
env_file=$build/env.sh
: > "$env_file"
cmake_args=(-DTorch_DIR="$torch_prefix/Torch")
if [ -n "${FLEX_DEPS_DEBS:-}" ]; then
  deps=$build/deps
  if [ ! -f "$deps/.unpacked" ]; then
    rm -rf "$deps" && mkdir -p "$deps"
    for f in "$FLEX_DEPS_DEBS"/*.deb; do dpkg -x "$f" "$deps"; done
    touch "$deps/.unpacked"
  fi
  arch_lib=$deps/usr/lib/x86_64-linux-gnu
  cat >> "$env_file" <<EOF
export OPAL_PREFIX=$deps/usr
export PATH=$deps/usr/bin:\$PATH
export LD_LIBRARY_PATH=$arch_lib:$arch_lib/openmpi/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
EOF
  cmake_args+=(-DCMAKE_PREFIX_PATH="$deps/usr"
               -DMPI_CXX_COMPILER="$deps/usr/bin/mpicxx.openmpi"
               -DMPIEXEC_EXECUTABLE="$deps/usr/bin/mpirun.openmpi")
else
  bash "$root/scripts/install-deps.sh"
fi
if [ ! -f /usr/local/cuda/include/nccl.h ]; then
  nccl=$($py -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)
  if [ -n "$nccl" ] && [ -f "$nccl/include/nccl.h" ]; then
    cmake_args+=(-DFLEX_NCCL_INCLUDE_DIR="$nccl/include" -DFLEX_NCCL_LIBRARY="$(ls "$nccl"/lib/libnccl.so* | head -1)")
  fi
fi
# shellcheck disable=SC1090
. "$env_file"

echo "flexmodel gpu build: [3/4] configure $build"
# shellcheck disable=SC2086
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cmake_args[@]}" ${FLEXMODEL_CMAKE_ARGS:-} \
  > "$build/configure.log" 2>&1 || { tail -60 "$build/configure.log"; exit 1; }
grep -E "flexmodel:|flex::parallel" "$build/configure.log" | sed 's/^/  /' || true

echo "flexmodel gpu build: [4/4] compile ${*:-everything} on $(nproc) cores"
# shellcheck disable=SC2086
ninja -C "$build" -j"$(nproc)" ${FLEX_NINJA_ARGS:-} "$@"
echo "flexmodel gpu build: done in $((SECONDS - start)) s"
