#!/usr/bin/env bash
# Installs the Debian 12 packages flexmodel needs, only when one is missing
# (so a second run costs a few dpkg queries). Must run as root on a fresh machine.
#   install-deps.sh [--tests]   --tests adds what only the test suite uses
#                               (Chromium, for the report's browser test)
set -euo pipefail
pkgs=(build-essential cmake ninja-build ccache pkg-config
      libtorch-dev libopenblas0-pthread
      libopenmpi-dev openmpi-bin
      nlohmann-json3-dev libfmt-dev libpcre2-dev
      libgtest-dev libgmock-dev googletest libbenchmark-dev zlib1g-dev)
if [ "${1:-}" = "--tests" ]; then pkgs+=(chromium); fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "flexmodel: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
