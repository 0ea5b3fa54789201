"""FlashAttention-4's SM100 path, checked on a machine without a GPU (issue 36; adaptive_verify/attention_fa4.py):
the pinned FA4 loads, its compile cache persists where the package says, verify_attention's FA4 arguments compile
for sm_100a and sm_103a into tcgen05 SASS across the dispatcher's dtypes, head dims, page sizes and options
(benchmarks/fa4_aot_check.py, about 7 minutes on 2 cores), and a second process loads a compiled kernel instead of
compiling it. Nothing here launches a kernel: no SM100 GPU is reachable."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from peers import PINS, require_peers

require_peers("flash-attn-4", "quack-kernels", "nvidia-cutlass-dsl", "triton", "nvidia-cuda-nvdisasm",
              "nvidia-cuda-cuobjdump")

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "benchmarks" / "fa4_aot_check.py"
CACHE_VARS = ("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR")


def _python(code: str, tmp_path: Path, **env) -> str:
    """Runs code in a fresh interpreter (FA4 and the DSL read their settings at import) with XDG_CACHE_HOME under
    tmp_path and none of FA4's cache variables unless given; returns its stdout."""
    base = {k: v for k, v in os.environ.items() if k not in CACHE_VARS}
    base.update(XDG_CACHE_HOME=str(tmp_path / "xdg"), **env)
    done = subprocess.run([sys.executable, "-c", code], env=base, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_pins_agree():
    """The [sm100] extra, the dispatcher's version check and these tests use one FA4 and one DSL."""
    from adaptive_verify import attention_fa4

    extra = re.search(r"^sm100 = \[(.*)\]$", (REPO / "pyproject.toml").read_text(), flags=re.M).group(1)
    pins = dict(p.strip().strip('"').split("==") for p in extra.split(","))
    assert pins == {"flash-attn-4": PINS["flash-attn-4"], "nvidia-cutlass-dsl": PINS["nvidia-cutlass-dsl"]}
    assert attention_fa4.FA4_VERSION == PINS["flash-attn-4"]


def test_fa4_loads_without_a_gpu_and_caches_its_kernels_under_the_users_cache(tmp_path):
    out = _python("from adaptive_verify import attention_fa4 as f\n"
                  "print(f.fa4_import_error())\n"
                  "import flash_attn.cute.cache_utils as c\n"
                  "print(c.CUTE_DSL_CACHE_ENABLED, c.get_cache_path())\n", tmp_path)
    assert out.splitlines() == ["None", f"True {tmp_path / 'xdg' / 'adaptive_verify' / 'fa4'}"]


def test_no_cache_where_the_cache_directory_cannot_be_made(tmp_path):
    """A read-only or odd home (here XDG_CACHE_HOME is a file) leaves FA4's cache off instead of failing its
    import (FA4 creates its cache directory at import)."""
    (tmp_path / "xdg").write_text("not a directory")
    out = _python("from adaptive_verify import attention_fa4 as f\n"
                  "print(f.fa4_import_error())\n"
                  "import flash_attn.cute.cache_utils as c\n"
                  "print(c.CUTE_DSL_CACHE_ENABLED)\n", tmp_path)
    assert out.splitlines() == ["None", "False"]


def test_the_callers_cache_settings_win(tmp_path):
    code = ("from adaptive_verify import attention_fa4 as f\nassert f.fa4_import_error() is None\n"
            "import flash_attn.cute.cache_utils as c\nprint(c.CUTE_DSL_CACHE_ENABLED, c.CUTE_DSL_CACHE_DIR)\n")
    assert _python(code, tmp_path, FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED="0").split()[0] == "False"
    mine = tmp_path / "mine"
    assert _python(code, tmp_path, FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=str(mine)).split() == ["True", str(mine)]


def test_a_second_process_loads_the_compiled_kernel_instead_of_compiling_it(tmp_path):
    """The first process compiles verify_attention's FA4 call for sm_100a into the default persistent cache; the
    second, with a fresh dump directory, compiles nothing (no cubin dumped) and still gets the kernel."""
    code = (f"import sys, os, glob, torch\nsys.path.insert(0, {str(CHECK.parent)!r})\n"
            "import fa4_aot_check as c\n"
            "dump = os.environ['DUMP']\n"
            "os.environ.update(c.target_environment('sm_100a', dump))\n"
            "c.stand_in_hardware_info()\n"
            "c.compile_through_glue(torch.bfloat16, 128, 64, {}, 8, 8)\n"
            "print(len(glob.glob(os.path.join(dump, '*.cubin'))))\n")
    runs = []
    for i in range(2):
        dump = tmp_path / f"dump{i}"
        dump.mkdir()
        runs.append(_python(code, tmp_path, DUMP=str(dump)).split()[-1])
    assert runs == ["1", "0"]
    objects = list((tmp_path / "xdg" / "adaptive_verify" / "fa4").rglob("*.o"))
    assert objects, "nothing persisted"


def test_the_dispatchers_variants_compile_for_sm100_into_tcgen05_code(tmp_path):
    """benchmarks/fa4_aot_check.py over every dtype, head dim and page size the dispatcher accepts, every combination
    of its options (sinks, window, soft-capping), three shapes (other GQA ratios compile other kernels of the same
    code), for both architectures; every kernel compiled is inspected."""
    from adaptive_verify import attention_fa4

    sys.path.insert(0, str(CHECK.parent))
    try:
        import fa4_aot_check as check
    finally:
        sys.path.remove(str(CHECK.parent))
    rows_path = tmp_path / "rows.json"
    proc = subprocess.Popen([sys.executable, str(CHECK), "--json", str(rows_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=1800)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the check and its workers
        raise
    assert proc.returncode == 0, output[-4000:]
    rows = json.loads(rows_path.read_text())
    expected = {(arch, *v) for arch in check.ARCHS for v in check.variants()}
    got = {(r["arch"], r["dtype"], r["head_dim"], r["page"], r["options"], r["shape"]) for r in rows}
    assert got == expected and len(rows) == len(expected)
    assert {str(d).replace("torch.", "") for d in attention_fa4.DTYPES} == {r["dtype"] for r in rows}
    assert {(r["head_dim"], r["page"]) for r in rows} == {(d, p) for d in attention_fa4.HEAD_DIMS
                                                          for p in attention_fa4.PAGE_SIZES}
    assert set(check.OPTIONS) == {r["options"] for r in rows} and len(check.OPTIONS) == 8
    bad = [r for r in rows if r["verdict"] != "ok"]
    assert not bad, json.dumps(bad[:5], indent=1)
    # Inspected, not assumed: only pages of 64 reuse a kernel, page 16's (FA4's cp.async path does not key on it)
    assert all(not r.get("same_as_earlier") for r in rows if r["page"] != 64)
    kernels = [r for r in rows if not r.get("same_as_earlier")]
    assert all(r["utc_mma"] > 0 and r["ldtm"] > 0 for r in kernels)
    # what "auto" declines, it declines for a reason that still holds (a new pin that fixes it fails here)
    declined = [r for r in kernels if not r["auto"]]
    assert declined and all(r["spill_ops"] > check.SPILL_ALLOWANCE for r in declined)
    # pages of 128 load K/V by TMA, smaller ones by cp.async: the page size reaches FA4 as the glue means it
    assert all(r["tma_loads"] > 0 and r["cp_async"] == 0 for r in kernels if r["page"] == 128)
    assert all(r["cp_async"] > 0 for r in kernels if r["page"] != 128)
