"""Verification-attention benchmark: `adaptive-verify bench attention` (or `python benchmarks/bench_attention.py`).

R requests, each verifying q_len in 1..8 tokens (a fixed mix) against a paged bf16 KV cache of `context`
tokens, for a Llama-70B-class layer at TP1 (Hq=64, Hkv=8, D=128) and at TP8 (Hq=8, Hkv=1, D=128).
Compared with a padded torch baseline that an engine without a paged varlen kernel would run: gather each
request's pages into a dense KV tensor, pad the queries to the longest request, and call
scaled_dot_product_attention with a causal-in-block mask. The figure that matters is achieved bandwidth
over the KV bytes that must be read (2 x seq_len x Hkv x D x element bytes per request), against a plain
copy's bandwidth in the same process; on CUDA the L2 cache is flushed before every timed call.
On CUDA every implementation in ``kernels`` is timed (default all three: ``cuda_kernel="rowwise"``, the
default, and the tensor-core candidate ``"mma"`` and ``"mma_fused"``); the speedup and bandwidth columns are for the
fastest of them (named in the "best" column), max |diff| is the largest over all of them.

``--tree``: draft-tree masks instead. Every request verifies the same q_len tokens (16, 64) once as a chain
(tree_mask=None), once with the chain's own lower-triangular mask, and once as an EAGLE-2 style tree (4 nodes per
level, each under a random node of the level above), the same token count each time; the three are timed
alternately, and the figure is the tree's time over the chain's (a mask only removes positions, so it should cost
no more than its bit test). The chain mask must give the no-mask bits ("same bits").

No FlashInfer column: the H200 this project is lent has no flashinfer, reaches no registry, and takes at
most 64 MiB of carried wheels per call; flashinfer-python 0.7.2's wheel alone is 62 MB and needs
nvidia-cutlass-dsl, cuda-tile, apache-tvm-ffi and more (checked 2026-11-30), and its kernels JIT-compile on
first use, minutes of the 15 the session has. The padded SDPA baseline and the copy bandwidth stand in.
"""
from __future__ import annotations

import datetime
import statistics
import time
from typing import Optional

import torch

from ..attention import verify_attention, write_kv
from .report import cli_main, markdown_table
from .timing import copy_bandwidth_gbps, host_time_us

LAYERS = {"tp1": (64, 8, 128), "tp8": (8, 1, 128)}
R_VALUES = (1, 8, 32, 128, 256)
CONTEXTS = (512, 2048, 8192, 16384)
CPU_R_VALUES = (1, 8)
CPU_CONTEXTS = (512, 2048)
BLOCK_SIZE = 16


FP8_SCALE = 0.5  # per-tensor k_scale / v_scale of the fp8 rows (the timing does not depend on its value)


def make_inputs(R, context, layer, device, seed=0, q_len=None, kv_dtype="bf16", layers=None):
    """q_len None: the mix 1..8 (max_query_len 8); else every request verifies q_len tokens. kv_dtype "fp8": the
    caches are float8_e4m3fn holding the bf16 values / FP8_SCALE, and the dict carries k_scale / v_scale."""
    Hq, Hkv, D = (layers or LAYERS)[layer]
    g = torch.Generator().manual_seed(seed)
    fixed = q_len
    q_len = (torch.arange(R) % 8 + 1).to(torch.int32) if fixed is None else torch.full((R,), fixed, dtype=torch.int32)
    qsl = torch.zeros(R + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(q_len, 0)
    T = int(qsl[-1])
    blocks_per_req = (context + BLOCK_SIZE - 1) // BLOCK_SIZE
    num_blocks = R * blocks_per_req
    block_table = torch.randperm(num_blocks, generator=g).to(torch.int32).view(R, blocks_per_req)
    # Random data made on the device itself: the largest caches (R = 256, 16k contexts: 17 GB) would take
    # minutes to draw on the host.
    gd = torch.Generator(device=device).manual_seed(seed)
    mk = lambda *s: (torch.randn(*s, generator=gd, device=device) * 0.5).to(torch.bfloat16)  # noqa: E731
    args = dict(q=mk(T, Hq, D), k_cache=mk(num_blocks, BLOCK_SIZE, Hkv, D), v_cache=mk(num_blocks, BLOCK_SIZE, Hkv, D),
                block_table=block_table.to(device),
                seq_lens=torch.full((R,), context, dtype=torch.int32, device=device),
                query_start_loc=qsl.to(device), max_query_len=8 if fixed is None else fixed)
    if kv_dtype == "fp8":
        for name in ("k_cache", "v_cache"):
            args[name] = (args[name].float() / FP8_SCALE).to(torch.float8_e4m3fn)
        args.update(k_scale=FP8_SCALE, v_scale=FP8_SCALE)
    return args


def dequantised(args: dict) -> dict:
    """The padded baseline's inputs: an fp8 cache dequantised to bf16 beforehand (not timed)."""
    if "k_scale" not in args:
        return args
    out = {k: v for k, v in args.items() if k not in ("k_scale", "v_scale")}
    for name, scale in (("k_cache", args["k_scale"]), ("v_cache", args["v_scale"])):
        out[name] = (args[name].float() * scale).to(torch.bfloat16)
    return out


def padded_sdpa(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, max_query_len):
    """Dense baseline: gather pages, pad queries, one SDPA call with a causal-in-block mask."""
    R, blocks = block_table.shape
    T, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    ctx = blocks * BLOCK_SIZE
    k = k_cache[block_table.long()].reshape(R, ctx, Hkv, D).transpose(1, 2)  # [R, Hkv, ctx, D]
    v = v_cache[block_table.long()].reshape(R, ctx, Hkv, D).transpose(1, 2)
    k = k.repeat_interleave(Hq // Hkv, dim=1)
    v = v.repeat_interleave(Hq // Hkv, dim=1)
    qsl = query_start_loc.long()
    q_len = qsl[1:] - qsl[:-1]
    idx = qsl[:-1, None] + torch.arange(max_query_len, device=q.device)[None, :]  # [R, max_q]
    valid = torch.arange(max_query_len, device=q.device)[None, :] < q_len[:, None]
    qp = q[idx.clamp(max=T - 1)].transpose(1, 2)  # [R, Hq, max_q, D]
    limit = seq_lens.long()[:, None] - q_len[:, None] + torch.arange(max_query_len, device=q.device)[None, :]
    mask = torch.arange(ctx, device=q.device)[None, None, :] <= limit[:, :, None]  # [R, max_q, ctx]
    out = torch.nn.functional.scaled_dot_product_attention(qp, k, v, attn_mask=mask[:, None])
    return out.transpose(1, 2)[valid]  # [T, Hq, D]


def _cuda_cold_us(fn, reps=10) -> float:
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    fn()
    samples = []
    for _ in range(reps):
        flush.zero_()  # evict the KV cache from L2
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    return statistics.median(samples)


def time_against_baseline(ours: dict, base, run_base: bool, device, min_time_s: float, max_iters: int):
    """({name: us} of each of our implementations, the baseline's us (nan unless run_base), the largest |ours -
    baseline| (nan unless run_base)): cold L2 on CUDA, host batches on CPU."""
    if device.type == "cuda":
        times = {k: _cuda_cold_us(fn) for k, fn in ours.items()}
        t_base = _cuda_cold_us(base) if run_base else float("nan")
    else:
        times = {k: host_time_us(fn, min_time_s=min_time_s, warmup=1, max_iters=max_iters) for k, fn in ours.items()}
        t_base = host_time_us(base, min_time_s=min_time_s, warmup=1, max_iters=max_iters) if run_base else float("nan")
    err = float("nan")
    if run_base:
        want = base().float()
        err = max((fn().float() - want).abs().max().item() for fn in ours.values())
    return times, t_base, err


def bench_one(R, context, layer, device, min_time_s, kernels=None, kv_dtype="bf16") -> dict:
    args = make_inputs(R, context, layer, device, kv_dtype=kv_dtype)
    Hq, Hkv, D = LAYERS[layer]
    # The CPU kernel ignores cuda_kernel: time it once.
    kernels = (kernels or CUDA_KERNELS) if device.type == "cuda" else ("rowwise",)
    ours = {k: (lambda k=k: verify_attention(**args, cuda_kernel=k)) for k in kernels}
    base_args = dequantised(args)
    base = lambda: padded_sdpa(**base_args)  # noqa: E731
    # The padded baseline materialises K and V densely per query head: skip it where that alone would
    # exceed 8 GB (it would not fit, or would take the machine down), and say so with nan.
    dense_bytes = 2 * R * Hq * context * D * 2
    run_base = dense_bytes <= 8e9
    times, t_base, err = time_against_baseline(ours, base, run_base, device, min_time_s, max_iters=20)
    best = min(times, key=times.get)
    t_ours = times[best]
    nbytes = 2 * R * context * Hkv * D * args["k_cache"].element_size()
    nan = float("nan")
    return dict(layer=layer, kv=kv_dtype, R=R, context=context, ours_us=t_ours, best=best,
                **{f"{k}_us": times.get(k, nan) for k in CUDA_KERNELS}, baseline_us=t_base,
                speedup=t_base / t_ours, gbps=nbytes / (t_ours * 1e-6) / 1e9,
                mbytes=nbytes / 1e6, max_abs_diff=err)


TREE_Q_LENS = (16, 64)
# (layer, R, context). CPU: small, since the C++ kernel's scalar dot products take ~40 ms for one request of 16
# tokens at group 8 over 512 positions on the 2-core machine.
CPU_TREE_CASES = (("tp8", 1, 512), ("tp8", 4, 2048), ("tp1", 1, 512))
CUDA_TREE_CASES = (("tp1", 32, 2048), ("tp1", 128, 8192), ("tp8", 128, 2048))


def tree_masks(R, q_len, seed=0):
    """[R * q_len] int64: each request an EAGLE-2 style tree (offsets 1..4 under the anchor, each later offset
    under a random offset of the level above), the mask of a token its ancestors and itself."""
    g = torch.Generator().manual_seed(seed)
    masks = []
    for _ in range(R):
        row = [1]
        for j in range(1, q_len):
            level = (j - 1) // 4
            parent = 0 if level == 0 else 1 + 4 * (level - 1) + int(torch.randint(0, 4, (1,), generator=g))
            row.append(row[parent] | 1 << j)
        masks += [m - (1 << 64) if m >= 1 << 63 else m for m in row]
    return torch.tensor(masks, dtype=torch.int64)


def chain_masks(R, q_len):
    """[R * q_len] int64: bits 0..i for token i (a chain's lower-triangular mask)."""
    row = [(1 << (i + 1)) - 1 for i in range(q_len)]
    return torch.tensor([m - (1 << 64) if m >= 1 << 63 else m for m in row] * R, dtype=torch.int64)


def bench_tree(layer, R, context, q_len, device, min_time_s, kernels, rounds=None) -> list[dict]:
    """One row per kernel: no mask, the chain's mask and a tree's mask on the same inputs, timed alternately call
    by call (CPU; each call is milliseconds) or by medians of 5 cold calls (CUDA), so that drift in a shared
    machine's load hits every variant alike. Ratios of medians and of minimums (the least disturbed calls)."""
    del min_time_s  # rounds, not seconds: every variant gets the same number of calls
    args = make_inputs(R, context, layer, device, q_len=q_len)
    variants = {"none": None, "chain": chain_masks(R, q_len).to(device), "tree": tree_masks(R, q_len).to(device)}
    kernels = kernels if device.type == "cuda" else ("rowwise",)  # the CPU kernel ignores cuda_kernel
    rounds = rounds or (5 if device.type == "cuda" else 9)
    rows = []
    for k in kernels:
        fns = {v: (lambda m=m: verify_attention(**args, cuda_kernel=k, tree_mask=m)) for v, m in variants.items()}
        for fn in fns.values():  # warm-up
            fn()
        samples = {v: [] for v in variants}
        for _ in range(rounds):
            for v, fn in fns.items():
                if device.type == "cuda":
                    samples[v].append(_cuda_cold_us(fn, reps=5))
                else:
                    t0 = time.perf_counter()
                    fn()
                    samples[v].append((time.perf_counter() - t0) * 1e6)
        t = {v: statistics.median(x) for v, x in samples.items()}
        lo = {v: min(x) for v, x in samples.items()}
        same = torch.equal(fns["none"]().view(torch.int16), fns["chain"]().view(torch.int16))
        rows.append(dict(layer=layer, R=R, context=context, q_len=q_len, kernel=k if device.type == "cuda" else "cpu",
                         none_us=t["none"], chain_us=t["chain"], tree_us=t["tree"],
                         chain_ratio=t["chain"] / t["none"], tree_ratio=t["tree"] / t["none"],
                         chain_ratio_min=lo["chain"] / lo["none"], tree_ratio_min=lo["tree"] / lo["none"],
                         same_bits=same, rounds=rounds))
    return rows


TREE_COLUMNS = [("layer", "layer"), ("R", "R"), ("context", "context"), ("q_len", "q_len"), ("kernel", "kernel"),
                ("none_us", "no mask us"), ("chain_us", "chain mask us"), ("tree_us", "tree mask us"),
                ("chain_ratio", "chain mask / no mask"), ("tree_ratio", "tree / no mask"),
                ("chain_ratio_min", "chain / no mask (min)"), ("tree_ratio_min", "tree / no mask (min)"),
                ("same_bits", "chain mask same bits")]


def run_tree(*, device="auto", min_time_s=0.2, kernels=None, cases=None, q_lens=TREE_Q_LENS) -> dict:
    dev = torch.device("cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu")
    cases = cases or (CUDA_TREE_CASES if dev.type == "cuda" else CPU_TREE_CASES)
    kernels = tuple(kernels or CUDA_KERNELS)
    rows = [row for layer, R, c in cases for n in q_lens
            for row in bench_tree(layer, R, c, n, dev, min_time_s, kernels)]
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
            "kernels": list(kernels), "tree_rows": rows}


def report_tree(result: dict) -> str:
    rounds = result["tree_rows"][0]["rounds"] if result["tree_rows"] else 0
    how = (f"L2 flushed before each call, median of {rounds} alternating rounds of 5 calls" if result["device"] != "cpu"
           else f"{rounds} alternating rounds of one call per variant; times are medians")
    # ratios to 3 decimals: the differences that matter are a few percent
    rows = [{k: f"{v:.3f}" if k.endswith(("ratio", "ratio_min")) else v for k, v in r.items()}
            for r in result["tree_rows"]]
    return "\n".join([
        f"## Verification attention with draft-tree masks ({result['date']}, {result['device']}, "
        f"torch {result['torch']})",
        "",
        f"bf16 paged KV (block size {BLOCK_SIZE}); every request verifies q_len tokens: no mask (a chain), the "
        f"chain's own mask, an EAGLE-2 style tree's mask (same tokens); {how}.",
        "",
        markdown_table(rows, TREE_COLUMNS),
    ]) + "\n"


def bench_write_kv(device, min_time_s) -> list[dict]:
    """write_kv of T new tokens into a paged cache against torch's indexed assignment on a flat view."""
    rows = []
    for layer, T in (("tp1", 256), ("tp1", 2048), ("tp8", 2048)):
        _, Hkv, D = LAYERS[layer]
        g = torch.Generator().manual_seed(T)
        num_blocks = 4 * T // BLOCK_SIZE
        k = torch.randn(T, Hkv, D, generator=g).to(torch.bfloat16).to(device)
        v = torch.randn(T, Hkv, D, generator=g).to(torch.bfloat16).to(device)
        k_cache = torch.zeros(num_blocks, BLOCK_SIZE, Hkv, D, dtype=torch.bfloat16, device=device)
        v_cache = torch.zeros_like(k_cache)
        slots = torch.randperm(num_blocks * BLOCK_SIZE, generator=g)[:T].to(device)
        ours = lambda: write_kv(k, v, k_cache, v_cache, slots)  # noqa: E731

        def base():
            k_cache.view(-1, Hkv, D)[slots] = k
            v_cache.view(-1, Hkv, D)[slots] = v

        if device.type == "cuda":
            from .timing import cuda_graph_time_us

            t_ours, t_base = cuda_graph_time_us(ours), cuda_graph_time_us(base)
        else:
            t_ours = host_time_us(ours, min_time_s=min_time_s)
            t_base = host_time_us(base, min_time_s=min_time_s)
        nbytes = 2 * 2 * T * Hkv * D * 2  # read k, v and write them
        rows.append(dict(layer=layer, T=T, ours_us=t_ours, torch_us=t_base, speedup=t_base / t_ours,
                         gbps=nbytes / (t_ours * 1e-6) / 1e9))
    return rows


KV_COLUMNS = [("layer", "layer"), ("T", "tokens"), ("ours_us", "write_kv us"), ("torch_us", "torch index_put us"),
              ("speedup", "torch / ours"), ("gbps", "GB/s moved")]

COLUMNS = [("layer", "layer"), ("kv", "KV"), ("R", "R"), ("context", "context"), ("mbytes", "KV MB"),
           ("ours_us", "ours us"),
           ("baseline_us", "padded SDPA us"), ("speedup", "baseline / ours"), ("gbps", "GB/s"),
           ("pct_copy", "% of copy BW"), ("max_abs_diff", "max |diff|")]
CUDA_KERNELS = ("rowwise", "mma", "mma_fused")  # verify_attention(cuda_kernel=...)


def cuda_columns(kernels) -> list:
    """On CUDA: each timed kernel's time, then the other columns for the fastest ("best")."""
    return ([("layer", "layer"), ("kv", "KV"), ("R", "R"), ("context", "context"), ("mbytes", "KV MB")]
            + [(f"{k}_us", f"{k} us") for k in kernels]
            + [("best", "best"), ("baseline_us", "padded SDPA us"), ("speedup", "baseline / best"),
               ("gbps", "GB/s (best)"), ("pct_copy", "% of copy BW (best)"), ("max_abs_diff", "max |diff| (any)")])


def run(r_values=None, contexts=None, layers=tuple(LAYERS), *, device="auto", min_time_s=0.2, kernels=None,
        kv_dtypes=("bf16",)) -> dict:
    dev = torch.device("cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu")
    r_values = r_values or (R_VALUES if dev.type == "cuda" else CPU_R_VALUES)
    contexts = contexts or (CONTEXTS if dev.type == "cuda" else CPU_CONTEXTS)
    copy = copy_bandwidth_gbps(dev, nbytes=(1 << 30) if dev.type == "cuda" else (1 << 28))
    kernels = tuple(kernels or CUDA_KERNELS)
    rows = [bench_one(R, c, layer, dev, min_time_s, kernels, kv) for kv in kv_dtypes for layer in layers
            for R in r_values for c in contexts]
    for r in rows:
        r["pct_copy"] = 100 * r["gbps"] / copy
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
            "copy_gbps": copy, "kernels": list(kernels), "rows": rows, "write_kv": bench_write_kv(dev, min_time_s)}


def report(result: dict) -> str:
    cold = "L2 flushed before each call, median of 10" if result["device"] != "cpu" else "median of 5 batches"
    return "\n".join([
        f"## Verification attention ({result['date']}, {result['device']}, torch {result['torch']})",
        "",
        f"Paged KV (block size {BLOCK_SIZE}; bf16, or fp8 e4m3 with a per-tensor scale whose padded baseline runs on "
        f"the cache dequantised to bf16 beforehand), q_len mix 1..8; {cold}. Copy bandwidth in the same process: "
        f"{result['copy_gbps']:.0f} GB/s."
        + ("" if result["device"] == "cpu" else f" CUDA kernels timed: {', '.join(result['kernels'])} (rowwise is the "
           "default); the best columns are for the fastest."),
        "",
        markdown_table(result["rows"], COLUMNS if result["device"] == "cpu" else cuda_columns(result["kernels"])),
        "",
        "write_kv (bf16, random slots):",
        "",
        markdown_table(result["write_kv"], KV_COLUMNS),
    ]) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    def add_arguments(ap):
        ap.add_argument("--reqs", type=int, nargs="+", help="R values (default depends on the device)")
        ap.add_argument("--contexts", type=int, nargs="+", help="context lengths")
        ap.add_argument("--layers", nargs="+", choices=sorted(LAYERS), default=list(LAYERS))
        ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
        ap.add_argument("--min-time", type=float, default=0.2, help="seconds of timing per measurement")
        ap.add_argument("--kernels", nargs="+", choices=CUDA_KERNELS, default=list(CUDA_KERNELS),
                        help="CUDA implementations to time (CUDA only)")
        ap.add_argument("--kv-dtypes", nargs="+", choices=["bf16", "fp8"], default=["bf16"],
                        help="KV cache element types (fp8: float8_e4m3fn with a per-tensor scale)")
        ap.add_argument("--metadata", action="store_true",
                        help="flashinfer_plan against a torch builder (bench/attention_metadata.py)")
        ap.add_argument("--variants", action="store_true",
                        help="sinks, sliding windows and soft-capping against plain calls (bench/attention_variants.py)")
        ap.add_argument("--mla", action="store_true",
                        help="MLA (verify_attention_mla) over a latent cache instead (bench/attention_mla.py)")
        ap.add_argument("--tree", action="store_true",
                        help="draft-tree masks against chains of the same token count instead (see above)")

    def run_any(a):
        if a.metadata:
            from . import attention_metadata
            return attention_metadata.run(device=a.device, min_time_s=a.min_time)
        if a.variants:
            from . import attention_variants
            return attention_variants.run(device=a.device, min_time_s=a.min_time,
                                          kernel=a.kernels[0] if len(a.kernels) == 1 else None)
        if a.mla:
            from . import attention_mla
            kernels = [k for k in a.kernels if k in attention_mla.KERNELS] or list(attention_mla.KERNELS)
            return attention_mla.run(device=a.device, min_time_s=a.min_time, kernels=kernels,
                                     kv_dtypes=tuple(a.kv_dtypes))
        if not a.tree:
            return run(a.reqs, a.contexts, tuple(a.layers), device=a.device, min_time_s=a.min_time, kernels=a.kernels,
                       kv_dtypes=tuple(a.kv_dtypes))
        cases = None
        if a.reqs or a.contexts:
            cases = [(layer, R, c) for layer in a.layers for R in (a.reqs or (8,)) for c in (a.contexts or (2048,))]
        return run_tree(device=a.device, min_time_s=a.min_time, kernels=a.kernels, cases=cases)

    return cli_main(argv, prog="adaptive-verify bench attention", description=__doc__.split("\n\n")[0],
                    add_arguments=add_arguments, run=run_any,
                    report=_report_any)


def _report_any(result: dict) -> str:
    if "metadata_rows" in result:
        from .attention_metadata import report as report_metadata
        return report_metadata(result)
    if "variant_rows" in result:
        from .attention_variants import report as report_variants
        return report_variants(result)
    if "mla_rows" in result:
        from .attention_mla import report as report_mla
        return report_mla(result)
    return report_tree(result) if "tree_rows" in result else report(result)


if __name__ == "__main__":
    raise SystemExit(main())
