#!/usr/bin/env bash
# Build-tree mode for the Python package: makes FLEX_PYTHON (default python3)
# import flexmodel from <build>/python (the extension and Python files CMake
# puts there) through a .pth file in its site-packages, so `import flexmodel`
# works after scripts/build.sh without installing anything; a rebuild is seen
# at the next import. `pip install --no-build-isolation .` installs a copy instead.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FLEXMODEL_BUILD:-$root/build}
python=${FLEX_PYTHON:-python3}
if ! ls "$build"/python/flexmodel/_C*.so >/dev/null 2>&1; then
  echo "python-dev.sh: no extension in $build/python/flexmodel (build target flexmodel_python first)" >&2
  exit 1
fi
site=$("$python" -c 'import site, sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$build/python" > "$site/flexmodel-build-tree.pth"
"$python" -c 'import flexmodel, torch; print("flexmodel: importable from", flexmodel.__path__[0], "with torch", torch.__version__)'
