#!/usr/bin/env bash
# The build tools and libraries scripts/gpu/check.sh needs, fetched on a
# machine WITH a package registry, for a GPU machine without one.
#
#   bash scripts/gpu/offline-deps.sh [DIR]     (default: build-devdeps, ignored by git)
#
# Why: the H200 lent on 2026-11-28 had no network and no cmake, ninja, ccache,
# libpcre2-dev or libzip-dev, so check.sh's build stopped at install-deps.sh's
# apt-get after 18 s. DIR gets debs/ (Debian's libzip and PCRE2 packages,
# which build-gpu.sh unpacks into build-gpu/deps through FLEX_DEPS_DEBS; the
# binaries find them through their RUNPATH) and wheels/ (CMake 3.x and Ninja
# from PyPI: manylinux, no system libraries). check.sh uses DIR when it
# exists: it installs the wheels when cmake or ninja is missing and sets
# FLEX_DEPS_DEBS. Carry DIR to the GPU machine with the working tree (the
# device tool: carry ["build-devdeps"]; about 30 MB).
#
# Env: GPU_PYTHON_VERSION (3.12: the GPU machine's Python, for the wheels).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dir=${1:-$root/build-devdeps}
pyver=${GPU_PYTHON_VERSION:-3.12}
mkdir -p "$dir/debs" "$dir/wheels"
dir=$(cd "$dir" && pwd)
# The libraries flexmodel links that Ubuntu's CUDA images lack; their own
# dependencies (zlib, bzip2, OpenSSL 3, zstd, lzma) are on every such machine.
(cd "$dir/debs" && apt-get download libzip-dev libzip4 libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 \
  libpcre2-posix3 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
# CMake below 4 (4.x drops compatibility with cmake_minimum_required < 3.5,
# which libraries' config files still use), and Ninja.
python3 -m pip download "cmake>=3.25,<4" ninja --only-binary=:all: --python-version "$pyver" \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$dir/wheels" -q
ls -1 "$dir/debs" "$dir/wheels"
du -sh "$dir"
