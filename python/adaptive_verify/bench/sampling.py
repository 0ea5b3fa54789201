"""Rejection-sampling benchmark: `adaptive-verify bench sampling` (or `python benchmarks/bench_sampling.py`).

For R requests verifying K = 7 drafts each over a vocabulary of V, times ``rejection_sample`` against a
torch baseline that materialises probabilities the way engines commonly do (softmax over every verified
row, gather p(draft), uniforms, residual distributions with the draft zeroed, multinomial for every row,
first-rejection bookkeeping). Greedy and probabilistic (temperature 1, one-hot drafts). Drafts equal the
target's argmax with probability 0.75 (greedy) / are the target's most likely token (probabilistic), so
acceptance is realistic and rows past each request's first rejection need not be read. A third mode adds
the sampling parameters engines pass most (top_k = 50, top_p = 0.9, every request): ours finds each row's kept
set by exact histograms (no sort); the baseline sorts every verified row, as engines' torch fallbacks do.

The figure that matters: achieved GB/s over the logit bytes that must be read (the rows of each request up
to and including its last emitted token, once), against a plain copy's bandwidth in the same process.
On CUDA both sampler kernels are timed (cuda_kernel="v1", the default, and the candidate "splitv"); splitv may
also read rows past a request's first rejection (those whose blocks start before the rejection is known), and is
still charged only the bytes that must be read.

``--tree`` benchmarks tree_rejection_sample instead (bench/sampling_tree.py): trees against chains of the same token
count, and the torch reference.
"""
from __future__ import annotations

import datetime
from typing import Optional

import torch

from ..sampling import rejection_sample
from .report import cli_main, markdown_table
from .timing import copy_bandwidth_gbps, cuda_graph_time_us, host_time_us

R_VALUES = (1, 64, 256)
V_VALUES = (32000, 129280, 151936)
K = 7


def make_inputs(R: int, V: int, device, greedy: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    T = R * (K + 1)
    logits = (torch.randn(T, V, generator=g) * 2).to(torch.bfloat16)  # [T, V]
    qsl = torch.arange(0, T + 1, K + 1, dtype=torch.int32)  # every request verifies all K drafts
    top = logits.float().argmax(-1).view(R, K + 1)[:, :K].to(torch.int32)  # [R, K]
    if greedy:
        wrong = torch.rand(R, K, generator=g) > 0.75
        drafts = torch.where(wrong, torch.randint(0, V, (R, K), generator=g, dtype=torch.int32), top)
        temperature = torch.zeros(R)
    else:
        drafts = top
        temperature = torch.ones(R)
    seeds = torch.arange(R, dtype=torch.int64)
    return [t.to(device) for t in (logits, qsl, drafts, temperature, seeds)]


def torch_baseline(logits, qsl, drafts, temperature, greedy: bool):
    """Engine-style: probabilities for every row, recovered tokens for every position, then the prefix."""
    R, Kd = drafts.shape
    rows = logits.view(R, Kd + 1, -1)  # every request has K + 1 rows in this benchmark
    if greedy:
        target = rows.argmax(-1)  # [R, K + 1]
        match = (target[:, :Kd] == drafts).int()
        accepted = torch.cumprod(match, 1).sum(1)  # [R]
        final = target.gather(1, accepted[:, None]).squeeze(1)
    else:
        probs = torch.softmax(rows.float() / temperature[:, None, None], -1)  # [R, K + 1, V] materialised
        p_x = probs[:, :Kd].gather(2, drafts.long()[..., None]).squeeze(2)  # [R, K]
        accept = (torch.rand_like(p_x) < p_x).int()  # one-hot q: u * 1 < p(x)
        accepted = torch.cumprod(accept, 1).sum(1)
        residual = probs[:, :Kd].scatter(2, drafts.long()[..., None], 0.0)  # max(p - onehot, 0)
        residual = residual / residual.sum(-1, keepdim=True)
        recovered = torch.multinomial(residual.view(R * Kd, -1), 1).view(R, Kd)
        bonus = torch.multinomial(probs[:, Kd], 1).squeeze(1)
        final = torch.where(accepted < Kd, recovered.gather(1, accepted.clamp(max=Kd - 1)[:, None]).squeeze(1), bonus)
    out = torch.full((R, Kd + 1), -1, dtype=torch.int32, device=logits.device)
    keep = torch.arange(Kd, device=logits.device)[None, :] < accepted[:, None]
    out[:, :Kd] = torch.where(keep, drafts, out[:, :Kd])
    out.scatter_(1, accepted[:, None].long(), final[:, None].int())
    return out, accepted + 1


TOP_K, TOP_P = 50, 0.9  # the "top-k/top-p" mode


def top_k_top_p_logits(rows, top_k: int, top_p: float):
    """Engine-style torch truncation: sort each row, mask past the k-th and past the top-p prefix, unsort."""
    srt, idx = torch.sort(rows.float(), -1, descending=True)
    srt[..., top_k:] = float("-inf")
    cum = torch.softmax(srt, -1).cumsum(-1)
    srt[(cum - torch.softmax(srt, -1)) >= top_p] = float("-inf")
    return torch.full_like(srt, float("-inf")).scatter(-1, idx, srt)


def bench_one(R, V, mode, device, min_time_s) -> dict:
    greedy, truncated = mode == "greedy", mode == "top-k/top-p"
    logits, qsl, drafts, temperature, seeds = make_inputs(R, V, device, greedy)
    out = (torch.empty(R, K + 1, dtype=torch.int32, device=device), torch.empty(R, dtype=torch.int32, device=device))
    trunc = {}
    if truncated:
        trunc = dict(top_k=torch.full((R,), TOP_K, dtype=torch.int32, device=device),
                     top_p=torch.full((R,), TOP_P, device=device))

    def ours(kernel="v1"):
        return rejection_sample(logits, qsl, drafts, temperature=temperature, seeds=seeds, out=out, cuda_kernel=kernel,
                                **trunc)

    if truncated:
        base = lambda: torch_baseline(top_k_top_p_logits(logits, TOP_K, TOP_P), qsl, drafts, temperature,  # noqa: E731
                                      False)
    else:
        base = lambda: torch_baseline(logits, qsl, drafts, temperature, greedy)  # noqa: E731
    t_v2, v2_agrees = float("nan"), ""
    if device.type == "cuda" and truncated:  # splitv does not implement truncation: v1 runs for both names
        t_ours = cuda_graph_time_us(ours, calls_per_graph=10, replays=10)
        from .timing import cuda_time_us

        t_base = cuda_time_us(base, iters=5, warmup=2)
    elif device.type == "cuda":
        t_ours = cuda_graph_time_us(ours, calls_per_graph=10, replays=10)
        t_v2 = cuda_graph_time_us(lambda: ours("splitv"), calls_per_graph=10, replays=10)
        want = ours()
        want = (want[0].clone(), want[1].clone())
        got = ours("splitv")
        # A disagreement is reported in the table (and fails the CUDA tests), not raised: v1's figures
        # must survive a candidate kernel that is wrong.
        v2_agrees = "yes" if torch.equal(want[0], got[0]) and torch.equal(want[1], got[1]) else "NO"
        t_base = cuda_graph_time_us(base, calls_per_graph=3, replays=5) if greedy else float("nan")
        if not greedy:  # multinomial is not capturable on every torch version: time it eagerly
            from .timing import cuda_time_us

            t_base = cuda_time_us(base, iters=5, warmup=2)
    else:
        t_ours = host_time_us(ours, min_time_s=min_time_s, warmup=1, max_iters=50)
        t_base = host_time_us(base, min_time_s=min_time_s, warmup=1, max_iters=50)
    _, emitted = ours()
    rows_read = int(emitted.sum())
    nbytes = rows_read * V * logits.element_size()
    return dict(R=R, K=K, V=V, mode=mode, mean_emitted=rows_read / R, ours_us=t_ours,
                baseline_us=t_base, speedup=t_base / t_ours, gbps=nbytes / (t_ours * 1e-6) / 1e9, mbytes=nbytes / 1e6,
                v2_us=t_v2, v2_speedup=t_ours / t_v2, v2_gbps=nbytes / (t_v2 * 1e-6) / 1e9, v2_agrees=v2_agrees)


COLUMNS = [("R", "R"), ("K", "K"), ("V", "V"), ("mode", "mode"), ("mean_emitted", "tokens/request"),
           ("mbytes", "MB must read"), ("ours_us", "ours us"), ("baseline_us", "torch baseline us"),
           ("speedup", "baseline / ours"), ("gbps", "GB/s"), ("pct_copy", "% of copy BW"), ("v2_us", "splitv us"),
           ("v2_speedup", "v1 / splitv"), ("v2_pct_copy", "splitv % of copy BW"), ("v2_agrees", "splitv == v1")]


def run(r_values=R_VALUES, v_values=V_VALUES, *, device: str = "auto", min_time_s: float = 0.2) -> dict:
    dev = torch.device("cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu")
    copy = copy_bandwidth_gbps(dev, nbytes=(1 << 30) if dev.type == "cuda" else (1 << 28))
    rows = [bench_one(R, V, mode, dev, min_time_s) for mode in ("greedy", "T=1", "top-k/top-p") for R in r_values
            for V in v_values]
    for r in rows:
        r["pct_copy"] = 100 * r["gbps"] / copy
        r["v2_pct_copy"] = 100 * r["v2_gbps"] / copy
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
            "torch": torch.__version__, "copy_gbps": copy, "rows": rows}


def report(result: dict) -> str:
    timing = ("per call inside a CUDA graph (median)" if result["device"] != "cpu"
              else "host wall time per call (median of 5 batches)")
    return "\n".join([
        f"## Rejection sampling ({result['date']}, {result['device']}, torch {result['torch']})",
        "",
        f"bf16 logits, K = {K}, one-hot drafts; {timing}. 'MB must read': the rows up to each request's last "
        f"emitted token, once. Copy bandwidth in the same process: {result['copy_gbps']:.0f} GB/s. 'ours': "
        f"cuda_kernel='v1' (the default); 'splitv': the split-vocabulary candidate (CUDA only).",
        "",
        markdown_table(result["rows"], COLUMNS),
    ]) + "\n"


def _run(a) -> dict:
    if not a.tree:
        return run(a.reqs or R_VALUES, a.vocab or V_VALUES, device=a.device, min_time_s=a.min_time)
    from . import sampling_tree

    return sampling_tree.run(a.reqs or sampling_tree.R_VALUES, a.vocab or sampling_tree.V_VALUES,
                             a.nodes or sampling_tree.N_VALUES, device=a.device, min_time_s=a.min_time)


def _report(result: dict) -> str:
    if result.get("tree"):
        from . import sampling_tree

        return sampling_tree.report(result)
    return report(result)


def main(argv: Optional[list[str]] = None) -> int:
    def add_arguments(ap):
        ap.add_argument("--reqs", type=int, nargs="+", default=None,
                        help=f"R values (default {' '.join(map(str, R_VALUES))}; with --tree 1 16 64)")
        ap.add_argument("--vocab", type=int, nargs="+", default=None,
                        help=f"V values (default {' '.join(map(str, V_VALUES))}; with --tree 32000)")
        ap.add_argument("--nodes", type=int, nargs="+", default=None,
                        help="with --tree: N, verified nodes per request (default 16 40)")
        ap.add_argument("--tree", action="store_true", help="tree_rejection_sample (draft trees) instead")
        ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
        ap.add_argument("--min-time", type=float, default=0.2, help="seconds of timing per measurement")

    return cli_main(argv, prog="adaptive-verify bench sampling", description=__doc__.split("\n\n")[0],
                    add_arguments=add_arguments, report=_report, run=_run)

if __name__ == "__main__":
    raise SystemExit(main())
