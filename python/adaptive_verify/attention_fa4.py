"""verify_attention through FlashAttention-4 (flash-attn-4, on the CUTLASS CuTe DSL) on SM100-class GPUs: the
dispatch decision, the glue and the packaging (docs/design.md, "SM100 attention through FlashAttention-4").

Why: this package's tensor-core kernel is mma.sync, a fraction of Blackwell's tcgen05 throughput; FA4's SM100 forward
uses tcgen05, tensor memory and TMA, and takes exactly the verification shape (varlen queries, a paged KV cache
through a page table, GQA, causal aligned to the end of the keys, learnable sinks, soft-capping, a left window).

Packaging (decided): the optional extra ``adaptive-verify[sm100]`` installs pinned ``flash-attn-4==4.0.0b36`` and
``nvidia-cutlass-dsl==4.8.1`` from PyPI (FA4's dependency quack-kernels imports triton, which a CUDA torch brings).
FA4 compiles each variant on first use (the DSL's JIT, 2-5 s a kernel) into FA4's persistent cache, which this
module turns on before FA4's first import unless the environment already says otherwise:
``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1`` and
``FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=$XDG_CACHE_HOME/adaptive_verify/fa4`` (default_cache_dir(); XDG_CACHE_HOME
defaults to ``~/.cache``), each only where unset, and only when that directory can be made and written (else the
cache stays off). They are process environment variables: child processes and any other FA4 user in the process
see them too. FA4 keys entries by its sources, the DSL and Python versions, so a restarted engine loads its
kernels instead of compiling them, and an upgrade never loads stale ones; engines compile during their warm-up runs,
before serving. Not shipped: compiled objects. They link NVIDIA's DSL runtime (proprietary license, so not ours to
copy into a wheel), depend on the exact DSL / Python versions, and FA4 sizes some of its choices by the GPU's SM
count; a cache built on the serving machine has none of those problems. (A GPU-less machine can fill a cache for a
known GPU: benchmarks/fa4_aot_check.py shows how, for checking, not as a supported route.) Without the extra, or off
SM100, every call runs this package's kernels.

Dispatch (``backend=`` of verify_attention): "auto" (default) runs FA4 only when :func:`attention_backend` says
"fa4": a CUDA device of compute capability 10.x or 11.x, the pinned FA4 importable, q and both caches bf16 or fp16 of
one dtype (no fp8 caches: their paged descaling is not FA4's), head dim 64 or 128 (FA4's SM100 range without the
2-CTA hd256 path), a page size of 16, 64 or 128, no draft-tree mask (FA4 accepts a ``mask_mod`` with varlen and a
page table, but no upstream test combines them, so trees stay on this package's kernels), and no ``max_seq_len``
below the table's width (FA4 derives its bounds itself); and not sinks together with soft-capping
(:func:`auto_declines`: FA4's kernel for the pair spills registers). "ours" never uses FA4; "fa4" requires it
(ValueError naming ``backend`` with the reason otherwise), which is also how an SM90 GPU runs FA4's SM90 kernel for
validation.
:func:`attention_backend` is public: call it to know which ran (on an SM100-class device its first call imports
FA4; :func:`fa4_import_error` says why FA4 cannot be used, on any machine).

Splits: FA4 runs with ``num_splits=1`` (its default): each tile of work (a request, a KV head's packed query rows,
128 of them) reads all of the request's keys in one pass, so a request's output never depends on the rest of the
batch, as with this package's kernels. The cost: fewer tiles than SMs for a few requests with long contexts.
FA4's fixed-length splits (``seqlen_k_per_split``, which it documents as bitwise reproducible) would fill the GPU;
that waits for an SM100 GPU to measure it.

Semantic differences, documented: FA4 loads whole 128-row pages by TMA, so rows past a request's length in its last
page must be finite (a NaN there reaches the output as 0 x NaN); this package's kernels never read them. Outputs are
not bit-identical to this package's kernels (another summation order); both are within the float64 reference's
tolerance. Nothing here has run on an SM100 GPU (none is reachable); the arguments are checked on CPU against the
reference (tests/test_attention_fa4.py), and in CI (tests/integration/test_peer_fa4.py) FA4 loads on a GPU-less
machine, and the dispatcher's variants (every dtype, head dim, page size and option combination; three GQA shapes)
compile ahead of time for sm_100a and sm_103a into SASS with tcgen05 MMAs and tensor-memory traffic, and the
persistent cache serves a second process (benchmarks/fa4_aot_check.py; benchmarks/results/2026-12-06-fa4-aot.md).
"""
from __future__ import annotations

import functools
import os
import sys
from typing import Optional

import torch

FA4_VERSION = "4.0.0b36"
DTYPES = (torch.bfloat16, torch.float16)  # verify_attention's q dtypes (it validates them), all handed to FA4
PAGE_SIZES = (16, 64, 128)
HEAD_DIMS = (64, 128)
BACKENDS = ("auto", "ours", "fa4")


@functools.lru_cache(maxsize=1)
def _fa4_interface():
    """FA4's interface module, or (None, why not); looked up once per process (an install does not change under a
    running engine), so the per-call decision costs no package-metadata read."""
    try:
        from importlib.metadata import version
        found = version("flash-attn-4")
    except Exception:  # noqa: BLE001 - not installed, or no metadata
        return None, "flash-attn-4 is not installed (pip install 'adaptive-verify[sm100]')"
    if found != FA4_VERSION:
        return None, f"flash-attn-4 {found} is installed; this package is pinned to {FA4_VERSION}"
    if "flash_attn.cute.cache_utils" not in sys.modules:  # FA4 reads these once, at import
        cache_dir = os.environ.get("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR") or default_cache_dir()
        if _writable_dir(cache_dir):  # (FA4 creates it at import: an unwritable home must not fail the import)
            os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")
            os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", cache_dir)
    try:
        from flash_attn.cute import interface
    except Exception as e:  # noqa: BLE001 - its import pulls the DSL and CUDA
        return None, f"flash_attn.cute does not import: {type(e).__name__}: {e}"[:200]
    return interface, None


def _writable_dir(path: str) -> bool:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return False
    return os.access(path, os.W_OK)


def fa4_import_error() -> Optional[str]:
    """Why the pinned FA4 cannot be used in this process (not installed, another version, its import fails), or
    None when it imports. Needs no GPU; the first call imports FA4 (seconds) and turns its compile cache on where
    the cache directory can be written (module docstring)."""
    return _fa4_interface()[1]


def default_cache_dir() -> str:
    """Where FA4's compiled kernels persist unless FLASH_ATTENTION_CUTE_DSL_CACHE_DIR says otherwise."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "adaptive_verify", "fa4")


def fa4_unsupported(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor, *,
                    tree_mask=None, max_seq_len=None, allow_sm90: bool = False) -> Optional[str]:
    """Why FA4 cannot run this (already validated) call, or None when it can (module docstring's conditions)."""
    if q.device.type != "cuda":
        return "FA4 runs on CUDA devices only"
    major = torch.cuda.get_device_capability(q.device)[0]
    if major not in (10, 11) and not (allow_sm90 and major == 9):
        return f"compute capability {major}.x: FA4's tcgen05 path needs SM100-class (10.x / 11.x)"
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        return "fp8 caches run on this package's kernels"
    if q.shape[-1] not in HEAD_DIMS:
        return f"head dim {q.shape[-1]}: FA4 glue covers {HEAD_DIMS}"
    if k_cache.shape[1] not in PAGE_SIZES:
        return f"block_size {k_cache.shape[1]}: FA4 pages of {PAGE_SIZES}"
    if tree_mask is not None:
        return "draft-tree masks run on this package's kernels (FA4's mask_mod with a page table is untested upstream)"
    if max_seq_len is not None and max_seq_len < block_table.shape[1] * k_cache.shape[1]:
        return "max_seq_len below the table's width: FA4 would not honour the bound"
    _, why = _fa4_interface()
    return why


def auto_declines(*, sinks: bool, softcap: bool) -> Optional[str]:
    """Why "auto" keeps an option combination FA4 can run on this package's kernels, or None. Sinks together with
    soft-capping: FA4 4.0.0b36 compiles that kernel with 387 to 539 register spill instructions in its SASS (every
    dtype, head dim and page size; the others spill at most 27; benchmarks/results/2026-12-06-fa4-aot.md).
    backend="fa4" still runs it."""
    if sinks and softcap:
        return "sinks with soft-capping: FA4's kernel for the pair spills registers (hundreds of SASS instructions)"
    return None


def attention_backend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor, *,
                      backend: str = "auto", tree_mask=None, max_seq_len=None, sinks=None, softcap: float = 0.0
                      ) -> str:
    """Which implementation verify_attention runs for these arguments: "fa4" or "ours" (never raises for "auto")."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "ours":
        return "ours"
    if backend == "auto" and auto_declines(sinks=sinks is not None, softcap=bool(softcap)):
        return "ours"
    why = fa4_unsupported(q, k_cache, v_cache, block_table, tree_mask=tree_mask, max_seq_len=max_seq_len,
                          allow_sm90=backend == "fa4")
    if why is None:
        return "fa4"
    if backend == "fa4":
        raise ValueError(f"backend='fa4': {why}")
    return "ours"


def fa4_arguments(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, max_query_len, *, scale, sinks=None,
                  window_left=-1, softcap=0.0) -> dict:
    """The keyword arguments of flash_attn_varlen_func for a verification batch: the plan in FlashAttention form
    (flash_attn_plan), causal (aligned to the end of each request's keys: token i sees its context and block tokens
    0..i), a left window of window_left positions and none to the right, the sinks as learnable_sink (FA4's, like
    ours, in units of the scaled scores), soft-capping."""
    return dict(q=q, k=k_cache, v=v_cache, cu_seqlens_q=query_start_loc, seqused_k=seq_lens, page_table=block_table,
                max_seqlen_q=max_query_len, softmax_scale=scale, causal=True,
                window_size=(window_left if window_left >= 0 else None, 0 if window_left >= 0 else None),
                learnable_sink=sinks, softcap=softcap, return_lse=True)


def run_fa4(out, lse, q, k_cache, v_cache, block_table, seq_lens, query_start_loc, max_query_len, *, scale,
            sinks=None, window_left=-1, softcap=0.0) -> None:
    """FA4's forward into out [T, Hq, D] (and lse [T, Hq] when given): tokens no request owns get zeros and -inf, as
    this package's kernels write them (FA4 writes only rows inside cu_seqlens_q)."""
    interface, why = _fa4_interface()
    if interface is None:
        raise RuntimeError(why)
    o, l = interface.flash_attn_varlen_func(**fa4_arguments(
        q, k_cache, v_cache, block_table, seq_lens, query_start_loc, max_query_len, scale=scale, sinks=sinks,
        window_left=window_left, softcap=softcap))
    valid = torch.arange(out.shape[0], device=out.device) < query_start_loc[-1]  # [T]: owned tokens (no sync)
    out.copy_(torch.where(valid[:, None, None], o, 0.0))  # (scalars: no host-to-device copy)
    if lse is not None:  # FA4's lse is [Hq, T]
        lse.copy_(torch.where(valid[:, None], l.transpose(0, 1), float("-inf")))
