"""MLA verification-attention benchmark: `adaptive-verify bench attention --mla` (bench/attention.py routes here).

R requests, each verifying q_len tokens (the mix 1..4, max_query_len 4) of a DeepSeek-V3-class layer (H query heads
per rank over one 576-value latent row per token: 128 at TP1, 16 at TP8), against a paged latent cache of `context`
tokens (block size 64, FlashMLA's), bf16 or fp8 e4m3 with a per-tensor scale. Compared with a padded torch baseline:
gather each request's latent rows densely, pad the queries, and call scaled_dot_product_attention with keys the 576
values and values their first 512 (the cache dequantised to bf16 beforehand for fp8 rows, not timed). The figures:
time, the latent bytes that must be read (R x context x 576 x element bytes) over the time, and that bandwidth
against a plain copy's in the same process; tensor work (2 x rows x context x (576 + 512) flops per request) over the
time as TFLOP/s, since MLA with many heads is compute-heavy. On CUDA every implementation in ``kernels`` is timed (L2
flushed before each call); max |diff| is the largest against the baseline.

No FlashMLA / FlashInfer MLA column: neither is installed on the machines this project is lent (see attention.py),
so the padded baseline and the copy bandwidth stand in.
"""
from __future__ import annotations

import datetime

import torch

from ..attention_mla import verify_attention_mla
from .report import markdown_table
from .timing import copy_bandwidth_gbps

LAYERS = {"tp1": 128, "tp8": 16}  # query heads per rank
BLOCK_SIZE = 64
SCALE = 192 ** -0.5  # DeepSeek V3: 1 / sqrt(qk_nope_head_dim + qk_rope_head_dim)
FP8_SCALE = 0.5
KERNELS = ("rowwise", "mma")
CPU_CASES = (("tp8", 1, 512), ("tp8", 4, 1024))
CUDA_CASES = (("tp1", 1, 4096), ("tp1", 32, 4096), ("tp1", 128, 8192), ("tp8", 128, 8192), ("tp8", 256, 16384))


def make_inputs(R, context, layer, device, kv_dtype="bf16", seed=0) -> dict:
    H = LAYERS[layer]
    q_len = (torch.arange(R) % 4 + 1).to(torch.int32)
    qsl = torch.zeros(R + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(q_len, 0)
    blocks = -(-context // BLOCK_SIZE)
    g = torch.Generator().manual_seed(seed)
    block_table = torch.randperm(R * blocks, generator=g).to(torch.int32).view(R, blocks)
    gd = torch.Generator(device=device).manual_seed(seed)
    mk = lambda *s: (torch.randn(*s, generator=gd, device=device) * 0.5).to(torch.bfloat16)  # noqa: E731
    args = dict(q=mk(int(qsl[-1]), H, 576), kv_cache=mk(R * blocks, BLOCK_SIZE, 576),
                block_table=block_table.to(device), seq_lens=torch.full((R,), context, dtype=torch.int32, device=device),
                query_start_loc=qsl.to(device),
                max_query_len=4, scale=SCALE)
    if kv_dtype == "fp8":
        args["kv_cache"] = (args["kv_cache"].float() / FP8_SCALE).to(torch.float8_e4m3fn)
        args["kv_scale"] = FP8_SCALE
    return args


def padded_sdpa(q, kv_cache, block_table, seq_lens, query_start_loc, max_query_len, scale):
    """Dense baseline: gather the latent rows, pad queries, one SDPA call (values: the rows' first 512)."""
    rows = kv_cache
    R, blocks = block_table.shape
    T, H, _ = q.shape
    ctx = blocks * BLOCK_SIZE
    lat = rows[block_table.long()].reshape(R, 1, ctx, 576)  # one "head" shared by all H (broadcast by SDPA)
    qsl = query_start_loc.long()
    q_len = qsl[1:] - qsl[:-1]
    idx = qsl[:-1, None] + torch.arange(max_query_len, device=q.device)[None, :]
    valid = torch.arange(max_query_len, device=q.device)[None, :] < q_len[:, None]
    qp = q[idx.clamp(max=T - 1)].transpose(1, 2)  # [R, H, max_q, 576]
    limit = seq_lens.long()[:, None] - q_len[:, None] + torch.arange(max_query_len, device=q.device)[None, :]
    mask = torch.arange(ctx, device=q.device)[None, None, :] <= limit[:, :, None]
    out = torch.nn.functional.scaled_dot_product_attention(qp, lat.expand(R, H, ctx, 576),
                                                           lat[..., :512].expand(R, H, ctx, 512),
                                                           attn_mask=mask[:, None], scale=scale)
    return out.transpose(1, 2)[valid]  # [T, H, 512]


def bench_one(layer, R, context, device, min_time_s, kernels, kv_dtype) -> dict:
    args = make_inputs(R, context, layer, device, kv_dtype)
    base_args = dict(args)
    base_args.pop("kv_scale", None)
    if "kv_scale" in args:  # the baseline runs on the dequantised cache, made here (untimed)
        base_args["kv_cache"] = (args["kv_cache"].float() * args["kv_scale"]).to(torch.bfloat16)
    kernels = kernels if device.type == "cuda" else ("rowwise",)
    ours = {k: (lambda k=k: verify_attention_mla(**args, cuda_kernel=k)) for k in kernels}
    base = lambda: padded_sdpa(**base_args)  # noqa: E731
    H = LAYERS[layer]
    run_base = 2 * R * H * context * 576 * 2 <= 8e9  # the expanded dense K and V it materialises
    from .attention import time_against_baseline  # (imported here: attention.py imports this module)
    times, t_base, err = time_against_baseline(ours, base, run_base, device, min_time_s, max_iters=10)
    best = min(times, key=times.get)
    nbytes = R * context * 576 * args["kv_cache"].element_size()
    rows = int(args["query_start_loc"][-1]) * H
    flops = 2 * rows * context * (576 + 512)
    t = times[best]
    return dict(layer=layer, kv=kv_dtype, H=H, R=R, context=context, mbytes=nbytes / 1e6,
                **{f"{k}_us": times.get(k, float("nan")) for k in KERNELS},
                best=best if device.type == "cuda" else "cpu", baseline_us=t_base,
                speedup=t_base / t, gbps=nbytes / (t * 1e-6) / 1e9, tflops=flops / (t * 1e-6) / 1e12, max_abs_diff=err)


def run(*, device="auto", min_time_s=0.2, kernels=KERNELS, kv_dtypes=("bf16", "fp8"), cases=None) -> dict:
    dev = torch.device("cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu")
    cases = cases or (CUDA_CASES if dev.type == "cuda" else CPU_CASES)
    copy = copy_bandwidth_gbps(dev, nbytes=(1 << 30) if dev.type == "cuda" else (1 << 28))
    rows = [bench_one(layer, R, c, dev, min_time_s, tuple(kernels), kv) for kv in kv_dtypes for layer, R, c in cases]
    for r in rows:
        r["pct_copy"] = 100 * r["gbps"] / copy
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
            "copy_gbps": copy, "kernels": list(kernels), "mla_rows": rows}


def report(result: dict) -> str:
    cuda = result["device"] != "cpu"
    cols = ([("layer", "layer"), ("kv", "KV"), ("H", "H"), ("R", "R"), ("context", "context"), ("mbytes", "latent MB")]
            + ([(f"{k}_us", f"{k} us") for k in result["kernels"]] if cuda else [("rowwise_us", "ours us")])
            + [("best", "best"), ("baseline_us", "padded SDPA us"), ("speedup", "baseline / best"), ("gbps", "GB/s"),
               ("pct_copy", "% of copy BW"), ("tflops", "TFLOP/s"), ("max_abs_diff", "max |diff|")])
    return "\n".join([
        f"## MLA verification attention ({result['date']}, {result['device']}, torch {result['torch']})",
        "",
        f"Latent cache of 576 values per token, block size {BLOCK_SIZE}, q_len mix 1..4, scale 192^-0.5; bf16 or fp8 "
        f"(scale {FP8_SCALE}). Copy bandwidth in the same process: {result['copy_gbps']:.0f} GB/s.",
        "",
        markdown_table(result["mla_rows"], cols),
    ]) + "\n"
