"""The extension's build contract: torch-free, importable without a GPU, honest about CUDA."""
import pathlib
import subprocess
import sys

import torch

import adaptive_verify as av
from adaptive_verify import _ext


def _extension_path() -> pathlib.Path:
    return pathlib.Path(_ext._C.__file__)


def _needed_libraries(path: pathlib.Path) -> list[str]:
    """DT_NEEDED entries of an ELF shared object, read with the standard library only."""
    import struct

    data = path.read_bytes()
    assert data[:4] == b"\x7fELF", f"{path} is not an ELF file"
    assert data[4] == 2 and data[5] == 1, "expected a 64-bit little-endian ELF"
    e_shoff, = struct.unpack_from("<Q", data, 0x28)
    e_shentsize, e_shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, e_shoff + i * e_shentsize) for i in range(e_shnum)]
    needed = []
    for _name, sh_type, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
        if sh_type != 6:  # SHT_DYNAMIC
            continue
        strtab = sections[link]
        str_off = strtab[4]
        for i in range(size // entsize):
            tag, val = struct.unpack_from("<qQ", data, offset + i * entsize)
            if tag == 0:
                break
            if tag == 1:  # DT_NEEDED
                end = data.index(b"\0", str_off + val)
                needed.append(data[str_off + val:end].decode())
    return needed


def test_extension_does_not_link_torch():
    needed = _needed_libraries(_extension_path())
    assert needed, "could not read the extension's dynamic section"
    bad = [lib for lib in needed if "torch" in lib or "c10" in lib]
    assert not bad, f"_C must not link libtorch/libc10, but needs {bad}"
    # CUDA is linked statically (cudart_static), so the module imports without the CUDA toolkit.
    assert not any(lib.startswith("libcudart") for lib in needed), needed


def test_extension_imports_without_torch():
    """The module is torch-free: it imports in a fresh interpreter that never imports torch."""
    code = (
        "import importlib.util, sys;"
        f"spec = importlib.util.spec_from_file_location('_C', {str(_extension_path())!r});"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m);"
        "assert 'torch' not in sys.modules; print(m.build_info()['with_cuda'])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() in ("True", "False")


def test_build_info_and_cuda_available_agree():
    info = av.build_info()
    for key in ("with_cuda", "cuda_archs", "cuda_compiler_version", "cuda_unusable_reason", "compiler"):
        assert key in info, key
    if info["with_cuda"]:
        assert info["cuda_archs"], "a CUDA build must say which architectures it targets"
        assert info["cuda_compiler_version"]
    else:
        assert info["cpu_only_reason"], "a CPU-only build must say why"
    if av.cuda_available():
        assert info["cuda_unusable_reason"] == ""
        assert torch.cuda.is_available()
    else:
        assert info["cuda_unusable_reason"], "cuda_available() is False, so build_info must say why"


def test_unsupported_device_gives_clear_error():
    fake = torch.empty(2, 3, device="meta")
    import pytest

    with pytest.raises(ValueError, match="survival"):
        av.plan_verification(fake, torch.zeros(2, dtype=torch.int32, device="meta"), mode="all")


def test_cuda_was_compiled_when_required():
    """CI sets AV_REQUIRE_CUDA_BUILD=1 where nvcc exists: the CUDA sources must then have been compiled."""
    import os

    if os.environ.get("AV_REQUIRE_CUDA_BUILD") != "1":
        import pytest

        pytest.skip("AV_REQUIRE_CUDA_BUILD is not set")
    info = av.build_info()
    assert info["with_cuda"], f"expected a CUDA build, got CPU-only: {info['cpu_only_reason']}"
    assert info["cuda_archs"]


def test_cpu_only_build_says_so_and_works(tmp_path):
    """AV_CUDA=0 (and a machine without nvcc) gives a CPU-only build that says why, and still works."""
    import os
    import shutil

    import pytest

    pybind11 = pytest.importorskip("pybind11")
    cmake = shutil.which("cmake")
    if cmake is None or shutil.which("ninja") is None:
        pytest.skip("cmake and ninja are needed (pip install '.[test]' brings them)")
    root = pathlib.Path(__file__).resolve().parents[1]
    env = dict(os.environ, AV_CUDA="0")
    cfg = subprocess.run(
        [cmake, "-S", str(root), "-B", str(tmp_path / "build"), "-G", "Ninja", f"-DPython_EXECUTABLE={sys.executable}",
         f"-Dpybind11_DIR={pybind11.get_cmake_dir()}", f"-DAV_OUTPUT_DIR={tmp_path / 'out'}"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert cfg.returncode == 0, cfg.stderr
    assert "building the C++ CPU kernels only (disabled by AV_CUDA=0)" in cfg.stderr + cfg.stdout
    build = subprocess.run([cmake, "--build", str(tmp_path / "build")], capture_output=True, text=True, env=env,
                           timeout=600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    code = (
        "import importlib.util, glob;"
        f"path = glob.glob({str(tmp_path / 'out' / '_C*.so')!r})[0];"
        "spec = importlib.util.spec_from_file_location('_C', path);"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m);"
        "info = m.build_info(); assert not info['with_cuda'] and info['cpu_only_reason'] == 'disabled by AV_CUDA=0';"
        "assert m.device_count() == (0, 'built without CUDA')"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
