"""Tree sampling benchmark: `adaptive-verify bench sampling --tree`.

For R requests each verifying a draft tree of N nodes (EAGLE-2 style: 4 nodes per level, each under a random node of
the level above) over a vocabulary of V, times ``tree_rejection_sample`` against the same op on a chain of the same
token count (1 + N tokens, parents = previous token), and against the torch reference
(``adaptive_verify.reference.tree_rejection_sample``). Each token's row raises one random child's logit to the row's
max + ``BOOST`` (the drafter guessed well there), so greedy paths run to a leaf and sampled paths stop where the draw
misses; chains get the same treatment, so both emit comparable tokens per request.

The figure that matters: time per row read (rows read = tokens emitted: only the accepted path's rows), which should
not depend on how many tokens the tree verified; 'tree / chain' compares whole calls of equal token counts.
On CUDA it also times the CUDA kernel inside a CUDA graph.
"""
from __future__ import annotations

import datetime
import platform

import torch

from .. import reference
from ..sampling import tree_rejection_sample
from .report import markdown_table
from .timing import cuda_graph_time_us, host_time_us

R_VALUES = (1, 16, 64)
V_VALUES = (32000,)
N_VALUES = (16, 40)
LEVEL_WIDTH = 4
BOOST = 4.0


def tree_parents(R: int, N: int, g: torch.Generator, chain: bool) -> torch.Tensor:
    """[R, 1 + N] offsets' parents (-1 for the anchor): a chain, or levels of LEVEL_WIDTH under random parents."""
    j = torch.arange(1, N + 1)
    if chain:
        return torch.cat([torch.full((R, 1), -1), (j - 1).expand(R, -1)], 1)
    level = (j - 1) // LEVEL_WIDTH  # node j's level (0: children of the anchor)
    first = 1 + (level - 1) * LEVEL_WIDTH  # first offset of the level above
    pick = torch.randint(0, LEVEL_WIDTH, (R, N), generator=g)
    parent = torch.where(level == 0, torch.zeros(R, N, dtype=torch.long), first + pick)
    return torch.cat([torch.full((R, 1), -1), parent.minimum(j - 1)], 1)


def make_inputs(R: int, N: int, V: int, device, chain: bool, seed: int = 0):
    """(logits [R (1 + N), V] bf16, qsl, token_parent, input_ids, max_query_len) of R equal-shaped requests."""
    g = torch.Generator().manual_seed(seed)
    Q = 1 + N
    parent = tree_parents(R, N, g, chain)  # [R, Q]
    ids = torch.randint(0, V, (R, Q), generator=g)
    logits = torch.randn(R, Q, V, generator=g) * 2
    for r in range(R):
        for t in range(Q):
            kids = (parent[r] == t).nonzero().flatten()
            if kids.numel():
                kid = int(kids[int(torch.randint(0, kids.numel(), (1,), generator=g))])
                logits[r, t, ids[r, kid]] = logits[r, t].max() + BOOST
    qsl = torch.arange(0, R * Q + 1, Q, dtype=torch.int32)
    tensors = (logits.view(R * Q, V).to(torch.bfloat16), qsl, parent.flatten().to(torch.int32),
               ids.flatten().to(torch.int32))
    return [t.to(device) for t in tensors] + [Q]


def bench_one(R: int, N: int, V: int, mode: str, device, min_time_s: float, with_reference: bool) -> dict:
    row = dict(R=R, N=N, V=V, mode=mode, reference_us=float("nan"), reference_over_ours=float("nan"),
               reference_agrees="")  # the reference is timed for small R only
    temperature = None if mode == "greedy" else torch.ones(R, device=device)
    seeds = torch.arange(R, dtype=torch.int64, device=device)
    for name, chain in (("tree", False), ("chain", True)):
        logits, qsl, parent, ids, W = make_inputs(R, N, V, device, chain)
        out = (torch.empty(R, W, dtype=torch.int32, device=device), torch.empty(R, dtype=torch.int32, device=device),
               torch.empty(R, W, dtype=torch.int32, device=device))

        def ours():
            return tree_rejection_sample(logits, qsl, parent, ids, W, temperature=temperature, seeds=seeds, out=out)

        _, emitted, _ = ours()
        row[f"{name}_emitted"] = float(emitted.double().mean())
        if device.type == "cuda":
            row[f"{name}_us"] = cuda_graph_time_us(ours, calls_per_graph=10, replays=10)
        else:
            row[f"{name}_us"] = host_time_us(ours, min_time_s=min_time_s, warmup=1, max_iters=200)
        row[f"{name}_us_per_row"] = row[f"{name}_us"] / float(emitted.sum())
        if name == "tree" and with_reference:
            want = reference.tree_rejection_sample(logits, qsl, parent, ids, W, temperature=temperature, seeds=seeds)
            row["reference_agrees"] = "yes" if all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(want, ours())) else "NO"
            row["reference_us"] = host_time_us(
                lambda: reference.tree_rejection_sample(logits, qsl, parent, ids, W, temperature=temperature,
                                                        seeds=seeds), min_time_s=min_time_s, warmup=0, max_iters=3)
            row["reference_over_ours"] = row["reference_us"] / row["tree_us"]
    row["tree_over_chain"] = row["tree_us"] / row["chain_us"]
    return row


COLUMNS = [("R", "R"), ("N", "N nodes"), ("V", "V"), ("mode", "mode"), ("tree_emitted", "tree tokens/request"),
           ("tree_us", "tree us"), ("tree_us_per_row", "tree us/row read"), ("chain_emitted", "chain tokens/request"),
           ("chain_us", "chain us"), ("chain_us_per_row", "chain us/row read"), ("tree_over_chain", "tree / chain"),
           ("reference_us", "reference us"), ("reference_over_ours", "reference / ours"),
           ("reference_agrees", "== reference")]


def run(r_values=R_VALUES, v_values=V_VALUES, n_values=N_VALUES, *, device: str = "auto",
        min_time_s: float = 0.2, reference_max_r: int = 16) -> dict:
    dev = torch.device("cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu")
    rows = [bench_one(R, N, V, mode, dev, min_time_s, with_reference=R <= reference_max_r)
            for mode in ("greedy", "T=1") for R in r_values for N in n_values for V in v_values]
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
            "host": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "tree": True, "rows": rows}


def report(result: dict) -> str:
    timing = ("per call inside a CUDA graph (median)" if result["device"] != "cpu"
              else f"host wall time per call (median of 5 batches, {result['threads']} torch threads)")
    return "\n".join([
        f"## Tree sampling ({result['date']}, {result['device']}, torch {result['torch']})",
        "",
        f"bf16 logits; trees of N nodes in levels of {LEVEL_WIDTH} (EAGLE-2 style) against chains of the same token "
        f"count (1 + N), one random child per token favoured by the row's max + {BOOST}; {timing}. Rows read = "
        "tokens emitted. 'reference': the torch oracle (only for small R).",
        "",
        markdown_table(result["rows"], COLUMNS),
    ]) + "\n"
