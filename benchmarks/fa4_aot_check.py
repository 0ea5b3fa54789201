"""Compiles, on a machine without a GPU, every FlashAttention-4 variant that verify_attention's dispatcher can choose
(adaptive_verify/attention_fa4.py), for sm_100a and sm_103a, and inspects what came out:

    python -m venv /tmp/fa4v && /tmp/fa4v/bin/pip install torch==2.13.0 'nvidia-cutlass-dsl==4.8.1' \
        einops 'apache-tvm-ffi<0.2,>=0.1.11' torch-c-dlpack-ext
    /tmp/fa4v/bin/pip install --no-deps flash-attn-4==4.0.0b36 quack-kernels==0.6.5
    /tmp/fa4v/bin/python benchmarks/fa4_aot_check.py --markdown benchmarks/results/DATE-fa4-aot.md

How: FA4's forward under torch's FakeTensorMode with tensors on "cuda" (a CPU torch is enough): FA4 compiles the
kernel through the CuTe DSL and skips the launch for fake tensors. FLASH_ATTENTION_ARCH / CUTE_DSL_ARCH pick the
target, FLASH_ATTENTION_NUM_SMS and a stand-in cutlass.utils.HardwareInfo answer for the absent GPU's SM count (148,
a B200's; it only shapes the persistent grid), and quack-kernels' unconditional `import triton` (about 1 GB, never
used by the forward) is answered by an empty stand-in module. Checks per variant: it compiles; its PTX holds tcgen05 MMA, tensor-memory loads/stores and
allocation (the SM100 path, not an sm_80 fallback); the local ptxas (the CUDA toolkit's, which may differ from the
DSL's own) reports registers and spills for the same PTX. The machine's CUDA 13.0 has no nvdisasm, so SASS itself is
not inspected here.

Variants: q / KV dtype (bf16, fp16) x head dim (64, 128) x page size (16, 64, 128) x options (plain causal; sinks +
a 128-position window; soft-capping 30), GQA 8:1, varlen queries up to 8 tokens, for each architecture.
"""
from __future__ import annotations

import argparse
import datetime
import glob
import itertools
import os
import re
import subprocess
import sys
import tempfile
import time
import types

ARCHS = ("sm_100a", "sm_103a")
DTYPES = ("bfloat16", "float16")
HEAD_DIMS = (64, 128)
PAGES = (16, 64, 128)
OPTIONS = {"causal": {}, "sinks+window128": {"sinks": True, "window_left": 128}, "softcap30": {"softcap": 30.0}}


def _stand_in_triton() -> None:
    class Any(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            if name[:1].isupper():  # a class someone subclasses at import time
                value = type(name, (), {"__init__": lambda self, *a, **k: None})
            else:
                value = Any(f"{self.__name__}.{name}")
                value.__path__ = []
                sys.modules[value.__name__] = value
            setattr(self, name, value)
            return value

        def __call__(self, *a, **k):  # used as a decorator at import time
            return a[0] if a and callable(a[0]) else (lambda f: f)

    for name in ("triton", "triton.language", "triton.runtime", "triton.runtime.cache", "triton.testing",
                 "triton.backends", "triton.backends.compiler", "triton.compiler", "triton.compiler.compiler"):
        module = Any(name)
        module.__path__ = []
        sys.modules[name] = module


def _stand_in_hardware_info() -> None:
    """cutlass.utils.HardwareInfo asks the CUDA driver about the device while FA4 builds its tile scheduler; without
    a GPU it answers for a B200 (148 SMs), the same number FLASH_ATTENTION_NUM_SMS gives."""
    import cutlass.utils

    class HardwareInfo:
        def __init__(self, *a, **k):
            pass

        def __getattr__(self, name):
            return lambda *a, **k: 148

    cutlass.utils.HardwareInfo = HardwareInfo


def compile_variant(arch, dtype_name, head_dim, page, options, dump_dir):
    """Compiles one variant in this process (the arch is read from the environment at import: one arch per
    process); returns (seconds, ptx path)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    import flash_attn.cute.interface as fi
    dtype = getattr(torch, dtype_name)
    R, T, Hq, Hkv, pages = 4, 20, 8, 1, 8
    started = time.time()
    with FakeTensorMode(allow_non_fake_inputs=True):
        q = torch.empty(T, Hq, head_dim, dtype=dtype, device="cuda")
        k = torch.empty(R * pages, page, Hkv, head_dim, dtype=dtype, device="cuda")
        v = torch.empty_like(k)
        kw = dict(cu_seqlens_q=torch.empty(R + 1, dtype=torch.int32, device="cuda"),
                  seqused_k=torch.empty(R, dtype=torch.int32, device="cuda"),
                  page_table=torch.empty(R, pages, dtype=torch.int32, device="cuda"), max_seqlen_q=8,
                  softmax_scale=head_dim ** -0.5, causal=True, return_lse=True, softcap=options.get("softcap"))
        if options.get("sinks"):
            kw["learnable_sink"] = torch.empty(Hq, dtype=torch.float32, device="cuda")
        if "window_left" in options:
            kw.update(window_size_left=options["window_left"], window_size_right=0)
        t0 = time.time()
        fi._flash_attn_fwd(q, k, v, **kw)
        seconds = time.time() - t0
    # the DSL names its dump after the kernel's signature (truncated), so variants overwrite one file: take the one
    # written by this compile, if any (none when FA4's compile cache already held the same kernel)
    new = [f for f in glob.glob(os.path.join(dump_dir, "*.ptx")) if os.path.getmtime(f) >= started]
    return seconds, (max(new, key=os.path.getmtime) if new else None)


def inspect_ptx(path, arch):
    text = open(path).read()
    counts = {op: len(re.findall(rf"\btcgen05\.{op}\b", text)) for op in ("mma", "ld", "st", "alloc")}
    out = subprocess.run(["ptxas", f"-arch={arch}", "-v", "--warn-on-spills", path, "-o", os.devnull],
                         capture_output=True, text=True)
    log = out.stdout + out.stderr
    regs = re.findall(r"Used (\d+) registers", log)
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return counts, (max(map(int, regs)) if regs else None), spills, out.returncode


def worker(arch, dump_dir, results_path):
    """All variants of one arch, in one process; one result line per variant."""
    os.environ.update(FLASH_ATTENTION_ARCH=arch[:-1] if arch.endswith("a") else arch, CUTE_DSL_ARCH=arch,
                      FLASH_ATTENTION_NUM_SMS="148", CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=dump_dir)
    _stand_in_triton()
    _stand_in_hardware_info()
    with open(results_path, "a") as results:
        for dtype_name, head_dim, page, (opt_name, options) in itertools.product(DTYPES, HEAD_DIMS, PAGES,
                                                                                 OPTIONS.items()):
            name = f"{arch} {dtype_name} D{head_dim} page{page} {opt_name}"
            try:
                seconds, ptx = compile_variant(arch, dtype_name, head_dim, page, options, dump_dir)
                if ptx is None:  # FA4's cache: the kernel of an earlier variant serves this one too
                    results.write(f"| {name} | compiled (the same kernel as an earlier variant: FA4's cache) | "
                                  "(above) | | |\n")
                    continue
                counts, regs, spills, rc = inspect_ptx(ptx, arch)
                sm100 = all(counts.get(op, 0) > 0 for op in ("mma", "ld", "alloc"))
                spill = max((int(s) + int(l) for s, l in spills), default=0)
                results.write(f"| {name} | compiled, {seconds:.1f} s | {'yes' if sm100 else 'NO'} "
                              f"(mma {counts.get('mma', 0)}, ld {counts.get('ld', 0)}, st {counts.get('st', 0)}) | "
                              f"{regs} | {spill} B (local ptxas rc {rc}) |\n")
            except Exception as e:  # noqa: BLE001 - recorded as the variant's result
                results.write(f"| {name} | FAILED: {type(e).__name__}: {str(e)[:120]} | | | |\n")
            results.flush()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--markdown", help="write the table here")
    ap.add_argument("--archs", nargs="+", default=list(ARCHS))
    ap.add_argument("--worker", nargs=3, metavar=("ARCH", "DUMP_DIR", "RESULTS"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        worker(*a.worker)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        results = os.path.join(tmp, "rows.md")
        for arch in a.archs:  # one process per arch: the DSL reads its target at import
            dump = os.path.join(tmp, arch)
            os.makedirs(dump)
            subprocess.run([sys.executable, __file__, "--worker", arch, dump, results], check=False)
        rows = open(results).read() if os.path.exists(results) else ""
    from importlib.metadata import version
    text = "\n".join([
        f"# FlashAttention-4 variants compiled ahead of time without a GPU ({datetime.date.today()})",
        "",
        f"flash-attn-4 {version('flash-attn-4')}, nvidia-cutlass-dsl {version('nvidia-cutlass-dsl')}, torch "
        f"{version('torch')}; `python benchmarks/fa4_aot_check.py` (its docstring has the setup).",
        "",
        "| variant | compile | tcgen05 in the PTX | registers | spills (local ptxas) |",
        "|---|---|---|---:|---|",
        rows.rstrip(),
    ]) + "\n"
    print(text)
    if a.markdown:
        open(a.markdown, "w").write(text)
    return 0 if rows and "FAILED" not in rows and "| NO" not in rows else 1


if __name__ == "__main__":
    raise SystemExit(main())
