"""Builds adaptive_verify._C with CMake + ninja (see CMakeLists.txt for the options).

Environment:
  AV_CUDA=0             CPU-only build (also automatic when nvcc is not found)
  AV_CUDA_ARCHS="90a"   CUDA architectures, ';' or ',' separated (default 90a;100a;103a)
  AV_BUILD_DIR=path     keep the CMake build tree there for incremental rebuilds
  AV_PTXAS_VERBOSE=1    print registers, shared memory and spills of every kernel
  AV_SANITIZE=1         ASan + UBSan build of the C++ (needs AV_CUDA=0; tests/sanitize.sh uses it)
  MAX_JOBS=N            parallel compile jobs (default: all cores)
"""
import os
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        import pybind11

        out_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build_dir = Path(os.environ.get("AV_BUILD_DIR") or (Path(self.build_temp).resolve() / "cmake"))
        build_dir.mkdir(parents=True, exist_ok=True)
        args = [
            "cmake", "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
            f"-DAV_OUTPUT_DIR={out_dir}",
            "-DCMAKE_BUILD_TYPE=Release",
        ]
        subprocess.check_call(args)
        build = ["cmake", "--build", str(build_dir)]
        if os.environ.get("MAX_JOBS"):
            build += ["-j", os.environ["MAX_JOBS"]]
        subprocess.check_call(build)


setup(ext_modules=[CMakeExtension("adaptive_verify._C")], cmdclass={"build_ext": CMakeBuild})
