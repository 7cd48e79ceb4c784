"""Builds the flexmodel package with CMake (see pyproject.toml).

FLEXMODEL_PIP_BUILD: the CMake build folder (default build/pip, reused by later installs).
"""
import os
import pathlib
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.dist import Distribution

ROOT = pathlib.Path(__file__).parent.resolve()


class CMakeBuild(build_ext):
    """Configures and builds the target flexmodel_python, then copies the package and its libraries.
    (build_ext, not build_py: setuptools runs build_ext for a distribution with extension modules.)"""

    def run(self):
        build = pathlib.Path(os.environ.get("FLEXMODEL_PIP_BUILD", ROOT / "build" / "pip"))
        subprocess.check_call(["bash", str(ROOT / "scripts" / "install-deps.sh")])
        subprocess.check_call([
            "cmake", "-S", str(ROOT), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
            "-DFLEX_BUILD_TESTS=OFF", "-DFLEX_BUILD_BENCH=OFF", f"-DFLEX_PYTHON={sys.executable}",
            # The installed layout: the extension finds the libraries in flexmodel/lib, they find each other.
            "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON"])
        subprocess.check_call(["ninja", "-C", str(build), f"-j{os.cpu_count() or 2}", "flexmodel_python"])
        pkg = pathlib.Path(self.build_lib) / "flexmodel"
        shutil.copytree(build / "python" / "flexmodel", pkg, dirs_exist_ok=True)
        (pkg / "lib").mkdir(exist_ok=True)
        for lib in build.glob("*/libflex_*.so"):
            shutil.copy2(lib, pkg / "lib" / lib.name)


class BinaryDistribution(Distribution):
    """The package holds a compiled extension: a platform wheel."""

    def has_ext_modules(self):
        return True


setup(packages=[], cmdclass={"build_ext": CMakeBuild}, distclass=BinaryDistribution)
