"""Compiles, on a machine without a GPU, the FlashAttention-4 variants that verify_attention's dispatcher can hand
FA4 (adaptive_verify/attention_fa4.py), for sm_100a and sm_103a, through the package's own glue, and inspects the
SASS that came out. tests/integration/test_peer_fa4.py runs it in CI (the peers, tests/integration/peers.txt, hold
FA4, the CuTe DSL and NVIDIA's nvdisasm / cuobjdump wheels); by hand:

    bash tests/integration/install_peers.sh
    python benchmarks/fa4_aot_check.py --markdown benchmarks/results/DATE-fa4-aot.md [--json rows.json]

How: `flash_attn_varlen_func(**attention_fa4.fa4_arguments(...))` (the arguments verify_attention passes) under
torch's FakeTensorMode with tensors on "cuda" (a CPU torch is enough): FA4 compiles the kernel through the CuTe DSL
and skips the launch for fake tensors. FLASH_ATTENTION_ARCH / CUTE_DSL_ARCH pick the target; FLASH_ATTENTION_NUM_SMS
and a stand-in cutlass.utils.HardwareInfo answer for the absent GPU's SM count (148, a B200's; it shapes FA4's grid
heuristics, not the code). CUTE_DSL_KEEP=cubin keeps the DSL's own cubin (the binary a GPU would run), which
NVIDIA's nvdisasm disassembles and cuobjdump -res-usage summarises.

Checks per distinct kernel: tcgen05 tensor-core MMAs (UTC*MMA) and tensor-memory loads/stores (LDTM / STTM) in the
SASS, that is the SM100 path and not an sm_80 fallback; register spills, the local loads / stores nvdisasm marks
"SpillRefill", at most SPILL_ALLOWANCE per kernel. Recorded: registers, stack, other local memory (small arrays the
compiler could not keep in registers: per-row page offsets in FA4's cp.async producer when two Q tiles are staged),
K/V loads by TMA (UTMALDG) or cp.async (LDGSTS).
What 4.0.0b36 gives (benchmarks/results/2026-12-06-fa4-aot.md): of the 128 kernels "auto" may hand FA4, 15 spill,
2 to 27 instructions (8 to 56 B of stack), mostly fp16 and page-128 TMA kernels, which FA4 compiles with a
128-register budget per thread; none of the bf16 kernels with pages of 16 / 64 does. The 64 kernels with sinks and
soft-capping together spill 387 to 539 instructions: "auto" declines that pair (attention_fa4.auto_declines), and
the check records them instead of failing. FA4's code is not ours to change (we pin it, never fork it), so the
allowance guards against a new pin making this worse; it does not call the spills free.

Variants: every dtype, head dim and page size the dispatcher accepts (attention_fa4.DTYPES / HEAD_DIMS /
PAGE_SIZES) x architectures x, at GQA 8:1 with up to 8 query tokens, every combination of the dispatcher's options
(sinks, a 128-position left window, soft-capping 30: each is its own part of FA4's compile key), and two more shapes
that change FA4's kernel with none and with all of the options: GQA 8:1 with 32 query tokens (the packed rows exceed
one 128-row tile, so FA4 stages two Q tiles) and MHA. The GQA ratio is part of FA4's compile key too: other ratios
compile other kernels of the same code, not checked here.
"""
from __future__ import annotations

import argparse
import datetime
import glob
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings
from importlib import metadata

HERE = os.path.dirname(os.path.abspath(__file__))
ARCHS = ("sm_100a", "sm_103a")
# The dispatcher's options, each on or off (each is its own part of FA4's compile key): every combination
OPTIONS = {"+".join(name for name, on in zip(("sinks", "window128", "softcap30"), bits) if on) or "causal":
           {k: v for k, v, on in zip(("sinks", "window_left", "softcap"), (True, 128, 30.0), bits) if on}
           for bits in itertools.product((False, True), repeat=3)}
SHAPES = {"gqa8 q8": (8, 8), "gqa8 q32": (8, 32), "mha q8": (1, 8)}  # name: (Hq / Hkv, max_query_len)
FIRST_SHAPE = "gqa8 q8"  # every option combination; the other shapes with none and with all of them
OTHER_SHAPE_OPTIONS = ("causal", "sinks+window128+softcap30")
NUM_SMS = 148
# SpillRefill instructions per kernel "auto" hands FA4 (4.0.0b36: at most 27); sinks with soft-capping, which "auto"
# declines for this reason (attention_fa4.auto_declines), spill 387 to 539 and are recorded, not failed
SPILL_ALLOWANCE = 48


def nvidia_tool(name: str) -> str:
    """Path of nvdisasm / cuobjdump from NVIDIA's PyPI wheels (nvidia-cuda-nvdisasm, nvidia-cuda-cuobjdump), else
    from the PATH (this machine's CUDA 13.0 has neither)."""
    try:
        files = metadata.distribution(f"nvidia-cuda-{name}").files or []
        for f in files:
            if f.name == name:
                return str(f.locate())
    except metadata.PackageNotFoundError:
        pass
    return name


def stand_in_hardware_info() -> None:
    """cutlass.utils.HardwareInfo asks the CUDA driver about the device while FA4 builds its tile scheduler; without
    a GPU it answers NUM_SMS, the number FLASH_ATTENTION_NUM_SMS gives FA4's heuristics."""
    import cutlass.utils

    class HardwareInfo:
        def __init__(self, *a, **k):
            pass

        def __getattr__(self, name):
            return lambda *a, **k: NUM_SMS

    cutlass.utils.HardwareInfo = HardwareInfo


def target_environment(arch: str, dump_dir: str) -> dict:
    """What FA4 and the DSL read at import to cross-compile for arch without a GPU."""
    return dict(FLASH_ATTENTION_ARCH=arch.rstrip("a"), CUTE_DSL_ARCH=arch, FLASH_ATTENTION_NUM_SMS=str(NUM_SMS),
                CUTE_DSL_KEEP="cubin", CUTE_DSL_DUMP_DIR=dump_dir)


def compile_through_glue(dtype, head_dim, page, options, ratio, max_query_len):
    """verify_attention's FA4 call (attention_fa4.fa4_arguments) on fake CUDA tensors: compiles, launches nothing."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from adaptive_verify import attention_fa4

    interface, why = attention_fa4._fa4_interface()
    if interface is None:
        raise RuntimeError(why)
    R, Hkv, pages = 4, 2, 8
    Hq, T = ratio * Hkv, R * max_query_len
    i32 = dict(dtype=torch.int32, device="cuda")
    with FakeTensorMode(allow_non_fake_inputs=True):
        q = torch.empty(T, Hq, head_dim, dtype=dtype, device="cuda")
        k = torch.empty(R * pages, page, Hkv, head_dim, dtype=dtype, device="cuda")
        sinks = torch.empty(Hq, dtype=torch.float32, device="cuda") if options.get("sinks") else None
        kw = attention_fa4.fa4_arguments(
            q, k, torch.empty_like(k), torch.empty(R, pages, **i32), torch.empty(R, **i32), torch.empty(R + 1, **i32),
            max_query_len, scale=head_dim ** -0.5, sinks=sinks, window_left=options.get("window_left", -1),
            softcap=options.get("softcap", 0.0))
        interface.flash_attn_varlen_func(**kw)


def inspect_cubin(path: str) -> dict:
    """SASS instruction counts (nvdisasm) and resource usage (cuobjdump -res-usage) of one cubin."""
    sass = subprocess.run([nvidia_tool("nvdisasm"), "-c", path], capture_output=True, text=True, check=True).stdout
    lines = re.findall(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(.*)$", sass, flags=re.M)
    ops = [op for op, _ in lines]
    count = lambda pred: sum(1 for op in ops if pred(op))  # noqa: E731
    spills = sum(1 for op, rest in lines if op in ("LDL", "STL") and "SpillRefill" in rest)
    usage = subprocess.run([nvidia_tool("cuobjdump"), "-res-usage", path], capture_output=True, text=True,
                           check=True).stdout
    res = {k.lower(): int(v) for k, v in re.findall(r"\b(REG|STACK|LOCAL|SHARED):(\d+)", usage)}
    return dict(instructions=len(ops), utc_mma=count(lambda o: o.startswith("UTC") and "MMA" in o),
                ldtm=count(lambda o: o == "LDTM"), sttm=count(lambda o: o == "STTM"),
                tma_loads=count(lambda o: o == "UTMALDG"), cp_async=count(lambda o: o == "LDGSTS"),
                spill_ops=spills, local_array_ops=count(lambda o: o in ("LDL", "STL")) - spills, **res)


def verdict(row: dict) -> str:
    """'ok', or what is wrong with a compiled variant."""
    if row.get("error"):
        return row["error"].split(":")[0] + " failed"
    if row.get("same_as_earlier"):
        return "ok"
    bad = [what for what, failed in (
        ("no tcgen05 MMA", row["utc_mma"] == 0), ("no tensor-memory loads", row["ldtm"] == 0),
        (f"{row['spill_ops']} spill instructions (allowed {SPILL_ALLOWANCE})",
         row["auto"] and row["spill_ops"] > SPILL_ALLOWANCE),
        # a stack frame that no local load or store touches: nvdisasm's SpillRefill marks (or the parse) went missing
        ("stack without local accesses", row.get("stack", 0) > 0 and row["spill_ops"] + row["local_array_ops"] == 0),
    ) if failed]
    return "; ".join(bad) or "ok"


def variants():
    """(dtype name, head dim, page, options, shape) of every variant checked (per architecture)."""
    from adaptive_verify import attention_fa4
    for dtype, head_dim, page, shape, opt in itertools.product(attention_fa4.DTYPES, attention_fa4.HEAD_DIMS,
                                                              attention_fa4.PAGE_SIZES, SHAPES, OPTIONS):
        if shape == FIRST_SHAPE or opt in OTHER_SHAPE_OPTIONS:
            yield str(dtype).replace("torch.", ""), head_dim, page, opt, shape


def worker(arch: str, dump_dir: str, rows_path: str) -> None:
    """Every variant for one arch, in this process (the DSL reads its target at import); a JSON line each."""
    os.environ.update(target_environment(arch, dump_dir))
    os.environ["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] = "0"  # every kernel compiled here, none read from disk
    warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")  # FA4 reads fake pointers
    stand_in_hardware_info()
    import torch
    from adaptive_verify import attention_fa4
    with open(rows_path, "a") as rows:
        for dtype_name, head_dim, page, opt, shape in variants():
            options = OPTIONS[opt]
            row = dict(arch=arch, dtype=dtype_name, head_dim=head_dim, page=page, options=opt, shape=shape,
                       auto=attention_fa4.auto_declines(sinks="sinks" in options, softcap="softcap" in options) is None)
            started = time.time()
            try:
                compile_through_glue(getattr(torch, dtype_name), head_dim, page, options, *SHAPES[shape])
                row["seconds"] = round(time.time() - started, 2)
            except Exception as e:  # noqa: BLE001 - recorded as the variant's result
                row["error"] = f"compile: {type(e).__name__}: {str(e)[:300]}"
            # Every cubin is removed once inspected (the DSL names dumps after a truncated signature, so variants
            # would collide): whatever is there now came from this compile.
            cubins = glob.glob(os.path.join(dump_dir, "*.cubin"))
            if not row.get("error"):
                try:
                    if len(cubins) == 1:
                        row.update(inspect_cubin(cubins[0]))
                    elif not cubins:  # FA4's in-memory cache: an earlier variant's kernel serves this one
                        row["same_as_earlier"] = True
                    else:
                        row["error"] = f"inspect: {len(cubins)} cubins from one compile"
                except Exception as e:  # noqa: BLE001 - recorded as the variant's result
                    row["error"] = f"inspect: {type(e).__name__}: {str(e)[:300]}"
            for f in cubins:
                os.remove(f)
            row["verdict"] = verdict(row)
            rows.write(json.dumps(row) + "\n")
            rows.flush()


def run(archs) -> list[dict]:
    """All archs, one worker process each, concurrently; the rows in order."""
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for arch in archs:
            dump, rows = os.path.join(tmp, arch), os.path.join(tmp, f"{arch}.jsonl")
            os.makedirs(dump)
            procs.append((rows, subprocess.Popen([sys.executable, __file__, "--worker", arch, dump, rows])))
        out = []
        try:
            for rows, proc in procs:
                if proc.wait() != 0:  # a worker that died: its missing variants fail the run (main, the test)
                    print(f"fa4_aot_check: worker {proc.args[3]} exited with {proc.returncode}", file=sys.stderr)
                out += [json.loads(line) for line in open(rows)] if os.path.exists(rows) else []
        finally:
            for _, proc in procs:
                if proc.poll() is None:
                    proc.kill()
    return out


def markdown(rows: list[dict]) -> str:
    kernels = [r for r in rows if not r.get("same_as_earlier") and not r.get("error")]
    lines = [f"# FlashAttention-4 variants compiled ahead of time without a GPU ({datetime.date.today()})", "",
             f"flash-attn-4 {metadata.version('flash-attn-4')}, nvidia-cutlass-dsl "
             f"{metadata.version('nvidia-cutlass-dsl')}, torch {metadata.version('torch')}; "
             "`python benchmarks/fa4_aot_check.py` (its docstring has the setup and the checks). "
             f"{len(rows)} variants, {len(kernels)} distinct kernels, "
             f"{sum(r['verdict'] != 'ok' for r in rows)} failing.", "",
             "| arch | dtype | D | page | options | shape | auto | compile s | SASS: UTC*MMA / LDTM / STTM "
             "| UTMALDG / LDGSTS | regs | stack B | spill / other local instructions | verdict |",
             "|---|---|---:|---:|---|---|---|---:|---|---|---:|---:|---|---|"]
    for r in rows:
        head = (f"| {r['arch']} | {r['dtype']} | {r['head_dim']} | {r['page']} | {r['options']} | {r['shape']} | "
                f"{'yes' if r.get('auto') else 'no'} |")
        if r.get("error"):
            lines.append(f"{head} | {r['error'][:120]} | | | | | | {r['verdict']} |")
        elif r.get("same_as_earlier"):
            lines.append(f"{head} {r['seconds']} | (an earlier variant's kernel: FA4's cache) | | | | | ok |")
        else:
            loads = f"{r['tma_loads']} / {r['cp_async']}"
            lines.append(f"{head} {r['seconds']} | {r['utc_mma']} / {r['ldtm']} / {r['sttm']} | {loads} | "
                         f"{r.get('reg')} | {r.get('stack')} | {r['spill_ops']} / {r['local_array_ops']} | "
                         f"{r['verdict']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--markdown", help="write the table here")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--archs", nargs="+", default=list(ARCHS))
    ap.add_argument("--worker", nargs=3, metavar=("ARCH", "DUMP_DIR", "ROWS"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        worker(*a.worker)
        return 0
    rows = run(a.archs)
    text = markdown(rows)
    print(text)
    if a.markdown:
        open(a.markdown, "w").write(text)
    if a.json:
        json.dump(rows, open(a.json, "w"), indent=1)
    expected = len(list(variants())) * len(a.archs)
    return 0 if len(rows) == expected and all(r["verdict"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
