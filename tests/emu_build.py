"""Builds a host-emulator driver from tests/emu (see tests/emu/cuda_emu.h) into a shared library for ctypes,
once per test session and source hash."""
import ctypes
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EMU_DIR = Path(__file__).resolve().parent / "emu"
_INCLUDE = ROOT / "csrc" / "include"


# AV_SANITIZE=1 (tests/sanitize.sh): the emulated kernels are built with the sanitized extension's flags, so
# AddressSanitizer and UndefinedBehaviorSanitizer check the CUDA sources as the emulator runs them.
SANITIZE_FLAGS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g"]


def build(name: str, tmp_path_factory) -> ctypes.CDLL:
    """tests/emu/<name>.cpp, compiled with the host compiler (the one that builds the package) exactly as the
    library's host code is: C++17, -O2, -ffp-contract=off (no fused multiply-add); sanitized under AV_SANITIZE=1."""
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    assert cxx, "a host C++ compiler is needed to build the emulator (it also builds the package)"
    sources = [EMU_DIR / f"{name}.cpp", EMU_DIR / "cuda_emu.h"] + sorted(_INCLUDE.rglob("*.[ch]*"))
    extra = SANITIZE_FLAGS if os.environ.get("AV_SANITIZE") == "1" else []
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources) + " ".join(extra).encode()).hexdigest()[:16]
    lib = tmp_path_factory.getbasetemp() / f"{name}_{digest}.so"
    if not lib.exists():
        cmd = [cxx, "-std=c++17", "-O2", "-ffp-contract=off", "-shared", "-fPIC", *extra, f"-I{_INCLUDE}",
               f"-I{EMU_DIR}", str(EMU_DIR / f"{name}.cpp"), "-o", str(lib)]
        subprocess.run(cmd, check=True)
    return ctypes.CDLL(str(lib))


class EmulatedC:
    """adaptive_verify._C with some entry points replaced by emulated ones: `replacements` maps a name to a
    function taking the real entry point's arguments and returning its status. Counts the calls, so a test
    can check the emulator really ran."""

    def __init__(self, real, replacements):
        self._real, self._replacements, self.calls = real, replacements, 0

    def __getattr__(self, name):
        if name in self._replacements:
            def call(*args):
                self.calls += 1
                return self._replacements[name](*args)
            return call
        return getattr(self._real, name)


def emulated_runner(monkeypatch, module, proxy: EmulatedC):
    """run(fn): fn() with `module`'s _C replaced by `proxy`; asserts that exactly one emulated call ran."""

    def run(fn):
        calls = proxy.calls
        with monkeypatch.context() as m:
            m.setattr(module, "_C", proxy)
            out = fn()
        assert proxy.calls == calls + 1, "the emulated kernel did not run"
        return out

    return run


def status_of(fn, *args) -> int:
    """Calls an emulator entry point with a trailing (error buffer, length); fails with its message."""
    err = ctypes.create_string_buffer(512)
    status = fn(*args, err, len(err))
    assert status == 0, f"emulator: {err.value.decode()}"
    return 0
