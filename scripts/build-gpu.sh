#!/usr/bin/env bash
# Builds flexmodel against the libtorch of the Python PyTorch on this machine
# (on a GPU machine: a CUDA 2.x build) into build-gpu/, everything unless
# targets are named. First run on a GPU machine (H200, Ubuntu 24.04) on
# 2026-11-27; the CUDA build itself also compiles and runs its CPU suite on
# every CI run (scripts/ci-cuda.sh). One command:
#
#   bash scripts/build-gpu.sh [TARGET...]
#   bash scripts/build-gpu.sh --plan     prints the choices below and the
#                                        configure arguments, builds nothing
#
# Torch_DIR comes from `python3 -c 'import torch; print(torch.utils.cmake_prefix_path)'`;
# NCCL from /usr/local/cuda or else PyTorch's own nvidia-nccl wheel. MPI is the
# machine's own when it has one (mpicxx on PATH; FLEX_MPICXX names another).
# The other libraries are Debian's: installed with apt-get when missing
# (install-deps.sh), or, on a machine without a package registry, unpacked
# from the .deb files in FLEX_DEPS_DEBS into build-gpu/deps (dpkg -x; nothing
# outside the build folder changes), Open MPI's packages only where the
# machine has no MPI. The binaries find the unpacked libraries through their
# RUNPATH, installed ones included; with the packages' Open MPI,
# build-gpu/env.sh holds what its mpirun needs (Open MPI's relocated prefix,
# library path): `. build-gpu/env.sh`.
#
# Env: PYTHON (python3), FLEXMODEL_BUILD (build-gpu), FLEX_DEPS_DEBS,
#      FLEX_MPICXX, FLEX_NINJA_ARGS (e.g. -k0), FLEXMODEL_CMAKE_ARGS.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FLEXMODEL_BUILD:-$root/build-gpu}
py=${PYTHON:-python3}
start=$SECONDS
plan=0
if [ "${1:-}" = --plan ]; then plan=1; shift; fi
mkdir -p "$build"

# The Open MPI stack of Debian's packages (libopenmpi-dev's dependencies):
# left packed where the machine's own MPI is used.
is_mpi_stack() {
  case "$1" in
    *openmpi*|*pmix*|*prrte*|*hwloc*|libevent*|libfabric*|*ibverbs*|librdmacm*|rdma-*|libnl-*|libpsm*|libucx*|\
    mpi-default-*|libnuma*|libmunge*|libcaf-*|libcoarrays-*|libjs-jquery*) return 0 ;;
  esac
  return 1
}

echo "flexmodel gpu build: [1/4] PyTorch"
torch_prefix=$($py -c 'import torch; print(torch.utils.cmake_prefix_path)')
$py -c 'import torch; print("  torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())'

echo "flexmodel gpu build: [2/4] libraries"
env_file=$build/env.sh
((plan)) && env_file=/dev/null
: > "$env_file"
cmake_args=(-DTorch_DIR="$torch_prefix/Torch")
deps=$build/deps
# MPI: the machine's own where it has one (mpicxx on PATH, or FLEX_MPICXX), so
# that its mpirun, PMIx and launcher plugins are the ones it was built with;
# Open MPI from the .deb packages only where the machine has none.
# (Debian's Open MPI from the packages next to the GPU machine's own PMIx:
# "pmix_mca_pcompress_zlib.so: undefined symbol: pmix_output_info" and
# crashed mpirun tests, 2026-11-27.) FLEX_MPICXX= (empty) takes the packages'.
mpicxx=${FLEX_MPICXX-$(command -v mpicxx || true)}
case "$mpicxx" in "$deps"/*) mpicxx="" ;; esac   # a PATH left from an earlier env.sh
if [ -n "$mpicxx" ]; then
  mpirun=$(dirname "$(readlink -f "$mpicxx")")/mpirun
  [ -x "$mpirun" ] || mpirun=$(dirname "$mpicxx")/mpirun
  [ -x "$mpirun" ] || mpirun=$(command -v mpirun || command -v mpiexec || true)
  echo "  MPI: the machine's ($mpicxx, ${mpirun:-no mpirun})"
  cmake_args+=(-DMPI_CXX_COMPILER="$mpicxx")
  [ -n "$mpirun" ] && cmake_args+=(-DMPIEXEC_EXECUTABLE="$mpirun")
fi
if [ -n "${FLEX_DEPS_DEBS:-}" ]; then
  # The packages' libraries (libzip, PCRE2, ...), unpacked with dpkg -x; with
  # the machine's MPI, none of the Open MPI stack, whose libraries (libmpi.so.40,
  # libpmix.so.2 in the same folder) would shadow the machine's.
  mode=$([ -n "$mpicxx" ] && echo without-mpi || echo with-mpi)
  if ((plan)); then
    for f in "$FLEX_DEPS_DEBS"/*.deb; do
      pkg=$(dpkg-deb -f "$f" Package)
      if [ "$mode" = without-mpi ] && is_mpi_stack "$pkg"; then echo "  skip   $pkg"; else echo "  unpack $pkg"; fi
    done
  elif [ "$(cat "$deps/.unpacked" 2>/dev/null)" != "$mode" ]; then
    rm -rf "$deps" && mkdir -p "$deps"
    skipped=()
    for f in "$FLEX_DEPS_DEBS"/*.deb; do
      pkg=$(dpkg-deb -f "$f" Package)
      if [ "$mode" = without-mpi ] && is_mpi_stack "$pkg"; then skipped+=("$pkg"); continue; fi
      dpkg -x "$f" "$deps"
    done
    if ((${#skipped[@]})); then echo "  not unpacked (the machine's MPI instead): ${skipped[*]}"; fi
    echo "$mode" > "$deps/.unpacked"
  fi
  arch_lib=$deps/usr/lib/x86_64-linux-gnu
  rpath=$arch_lib
  if [ "$mode" = with-mpi ]; then
    echo "  MPI: Open MPI from $FLEX_DEPS_DEBS (relocated with OPAL_PREFIX)"
    cat >> "$env_file" <<EOF
export OPAL_PREFIX=$deps/usr
export PATH=$deps/usr/bin:\$PATH
export LD_LIBRARY_PATH=$arch_lib:$arch_lib/openmpi/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
EOF
    cmake_args+=(-DMPI_CXX_COMPILER="$deps/usr/bin/mpicxx.openmpi"
                 -DMPIEXEC_EXECUTABLE="$deps/usr/bin/mpirun.openmpi")
    rpath="$rpath;$arch_lib/openmpi/lib"
  fi
  # Every binary finds the unpacked libraries through its RUNPATH, without
  # LD_LIBRARY_PATH; the installed ones too (CMake leaves folders inside the
  # build tree out of the install RPATH: FLEX_INSTALL_RPATH names them).
  cmake_args+=(-DCMAKE_PREFIX_PATH="$deps/usr" -DFLEX_INSTALL_RPATH="$rpath")
  # The packages' .pc files name /usr: read them relative to the unpacked
  # tree where the machine has no libzip of its own.
  if ! pkg-config --exists libzip 2>/dev/null; then
    export PKG_CONFIG_SYSROOT_DIR=$deps PKG_CONFIG_LIBDIR=$arch_lib/pkgconfig:$deps/usr/share/pkgconfig
    echo "  pkg-config: the packages' .pc files (PKG_CONFIG_SYSROOT_DIR=$deps)"
  fi
elif ((plan)); then
  echo "  install-deps.sh installs what is missing"
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

if ((plan)); then
  echo "flexmodel gpu build: would configure $build with"
  # shellcheck disable=SC2086
  printf ' %q' cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cmake_args[@]}" ${FLEXMODEL_CMAKE_ARGS:-}; echo
  [ -n "${PKG_CONFIG_SYSROOT_DIR:-}" ] && echo "  (env PKG_CONFIG_SYSROOT_DIR=$PKG_CONFIG_SYSROOT_DIR PKG_CONFIG_LIBDIR=$PKG_CONFIG_LIBDIR)"
  exit 0
fi
echo "flexmodel gpu build: [3/4] configure $build"
# shellcheck disable=SC2086
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cmake_args[@]}" ${FLEXMODEL_CMAKE_ARGS:-} \
  > "$build/configure.log" 2>&1 || { tail -60 "$build/configure.log"; exit 1; }
grep -E "flexmodel:|flex::parallel" "$build/configure.log" | sed 's/^/  /' || true

echo "flexmodel gpu build: [4/4] compile ${*:-everything} on $(nproc) cores"
# shellcheck disable=SC2086
ninja -C "$build" -j"$(nproc)" ${FLEX_NINJA_ARGS:-} "$@"
echo "flexmodel gpu build: done in $((SECONDS - start)) s"
