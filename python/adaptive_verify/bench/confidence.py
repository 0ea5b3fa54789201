"""Confidence-head benchmark: `adaptive-verify bench confidence` (or `python benchmarks/bench_confidence.py`).

Times ``adaptive_verify.confidence`` (fused dot product + bias + temperature + sigmoid + survival) against
a torch fp32 chain doing the same job the way an engine would write it (upcast, matmuls, sigmoid,
cumprod), for the large shape R=256, K=8, H=7168, Q=256 and smaller ones, in bf16. The op is a stream
over hidden (and markov): the figure that matters is achieved GB/s over the bytes that must be read,
against a plain copy's bandwidth measured in the same process.
"""
from __future__ import annotations

import datetime
from typing import Optional

import torch

from ..confidence import confidence
from .report import cli_main, markdown_table
from .timing import copy_bandwidth_gbps, cuda_graph_time_us, host_time_us

SHAPES = [(256, 8, 7168, 256), (64, 8, 4096, 0), (16, 4, 4096, 256), (1, 8, 7168, 256)]


def _inputs(R, K, H, Q, dtype, device):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(R, K, H, generator=g).to(dtype).to(device)
    markov = torch.randn(R, K, Q, generator=g).to(dtype).to(device) if Q else None
    weight = (torch.randn(H + Q, generator=g) / (H + Q) ** 0.5).to(device)
    temperature = (torch.rand(K, generator=g) + 0.5).to(device)
    return hidden, markov, weight, temperature


def torch_chain(hidden, markov, weight, temperature, bias=0.1):
    H = hidden.shape[-1]
    z = hidden.float() @ weight[:H]
    if markov is not None:
        z = z + markov.float() @ weight[H:]
    return torch.cumprod(torch.sigmoid((z + bias) / temperature), dim=1)


def bench_one(R, K, H, Q, dtype, device, min_time_s) -> dict:
    hidden, markov, weight, temperature = _inputs(R, K, H, Q, dtype, device)
    out = torch.empty(R, K, device=device)
    ours = lambda: confidence(hidden, weight, bias=0.1, markov=markov, temperature=temperature, survival=True, out=out)  # noqa: E731
    chain = lambda: torch_chain(hidden, markov, weight, temperature)  # noqa: E731
    nbytes = hidden.numel() * hidden.element_size() + (0 if markov is None else markov.numel() * markov.element_size())
    nbytes += weight.numel() * 4 + R * K * 4
    if device.type == "cuda":
        t_ours = cuda_graph_time_us(ours)
        t_chain = cuda_graph_time_us(chain)
    else:
        t_ours = host_time_us(ours, min_time_s=min_time_s, max_iters=2000)
        t_chain = host_time_us(chain, min_time_s=min_time_s, max_iters=2000)
    err = (ours() - chain()).abs().max().item()
    return dict(R=R, K=K, H=H, Q=Q, dtype=str(dtype).replace("torch.", ""), ours_us=t_ours, chain_us=t_chain,
                speedup=t_chain / t_ours, gbps=nbytes / (t_ours * 1e-6) / 1e9, mbytes=nbytes / 1e6, max_abs_diff=err)


def bench_small_ops(device, min_time_s) -> list[dict]:
    """The other ops of the area against their torch equivalents: confidence_from_logits, draft_margin
    (a stream over draft logits) and AcceptanceStats.update."""
    from ..confidence import confidence_from_logits, draft_margin
    from ..stats import AcceptanceStats

    g = torch.Generator().manual_seed(1)
    R, K = 256, 8
    logits = torch.randn(R, K, generator=g).to(device)
    temperature = (torch.rand(K, generator=g) + 0.5).to(device)
    conf = torch.rand(R, K, generator=g).to(device)
    vl = torch.randint(0, K + 1, (R,), generator=g, dtype=torch.int32).to(device)
    na = torch.minimum(vl, torch.randint(0, K + 1, (R,), generator=g, dtype=torch.int32).to(device))
    stats = AcceptanceStats(K, device=device)
    bins = torch.zeros(K, 16, dtype=torch.int64, device=device)

    def torch_stats():  # the same counts with torch ops: masks, bin ids, index_add_ (no boolean indexing: graph-safe)
        j = torch.arange(K, device=device)[None, :]
        trial = (j < vl[:, None]) & (j <= na[:, None])
        b = (conf * 16).long().clamp(0, 15)
        bins.view(-1).index_add_(0, (j * 16 + b).flatten(), trial.flatten().long())

    cases = [("confidence_from_logits", f"[{R}, {K}]", lambda: confidence_from_logits(logits, temperature, survival=True),
              lambda: torch.cumprod(torch.sigmoid(logits / temperature), 1), R * K * 4),
             ("AcceptanceStats.update", f"[{R}, {K}]", lambda: stats.update(conf, vl, na), torch_stats, R * K * 4)]
    for V in (32000, 151936):
        x = torch.randn(64, K, V, generator=g).to(torch.bfloat16).to(device)
        cases.append(("draft_margin", f"[64, {K}, {V}] bf16", lambda x=x: draft_margin(x),
                      lambda x=x: (lambda t: t[..., 0] - t[..., 1])(torch.topk(x.float(), 2, dim=-1).values),
                      x.numel() * 2))
    rows = []
    for name, shape, ours, base, nbytes in cases:
        if device.type == "cuda":
            t_ours, t_base = cuda_graph_time_us(ours), cuda_graph_time_us(base)
        else:
            t_ours = host_time_us(ours, min_time_s=min_time_s, max_iters=2000)
            t_base = host_time_us(base, min_time_s=min_time_s, max_iters=2000)
        rows.append(dict(op=name, shape=shape, ours_us=t_ours, torch_us=t_base, speedup=t_base / t_ours,
                         gbps=nbytes / (t_ours * 1e-6) / 1e9))
    return rows


SMALL_COLUMNS = [("op", "op"), ("shape", "shape"), ("ours_us", "ours us"), ("torch_us", "torch us"),
                 ("speedup", "torch / ours"), ("gbps", "GB/s read")]

COLUMNS = [("R", "R"), ("K", "K"), ("H", "H"), ("Q", "Q"), ("dtype", "dtype"), ("mbytes", "MB read"),
           ("ours_us", "ours us"), ("chain_us", "torch chain us"), ("speedup", "chain / ours"), ("gbps", "GB/s"),
           ("pct_copy", "% of copy BW")]


def run(shapes=SHAPES, *, device: str = "auto", min_time_s: float = 0.2) -> dict:
    dev = torch.device("cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu")
    copy = copy_bandwidth_gbps(dev, nbytes=(1 << 30) if dev.type == "cuda" else (1 << 28))
    rows = [bench_one(*s, torch.bfloat16, dev, min_time_s) for s in shapes]
    for r in rows:
        r["pct_copy"] = 100 * r["gbps"] / copy
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
            "torch": torch.__version__, "copy_gbps": copy, "rows": rows, "small": bench_small_ops(dev, min_time_s)}


def report(result: dict) -> str:
    timing = ("per call inside a CUDA graph (median)" if result["device"] != "cpu"
              else "host wall time per call (median of 5 batches)")
    return "\n".join([
        f"## Confidence head ({result['date']}, {result['device']}, torch {result['torch']})",
        "",
        f"bf16 hidden/markov, fp32 weight, survival=True; {timing}. Copy bandwidth measured in the same "
        f"process: {result['copy_gbps']:.0f} GB/s (read + write). The torch chain upcasts and uses matmuls.",
        "",
        markdown_table(result["rows"], COLUMNS),
        "",
        "The area's other ops against their torch equivalents (same timing):",
        "",
        markdown_table(result["small"], SMALL_COLUMNS),
    ]) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    def add_arguments(ap):
        ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
        ap.add_argument("--min-time", type=float, default=0.2, help="seconds of timing per measurement")

    return cli_main(argv, prog="adaptive-verify bench confidence", description=__doc__.split("\n\n")[0],
                    add_arguments=add_arguments, report=report,
                    run=lambda a: run(device=a.device, min_time_s=a.min_time))

if __name__ == "__main__":
    raise SystemExit(main())
