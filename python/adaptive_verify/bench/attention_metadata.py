"""Backend-metadata benchmark: `adaptive-verify bench attention --metadata` (bench/attention.py routes here).

flashinfer_plan on R requests (q_len 1..8, contexts of 1k-4k tokens in pages of 16), with and without a draft tree's
packed custom mask, against the torch code an engine's FlashInfer builder runs (a cumsum of pages and a boolean
gather of the block table, which needs the data-dependent output size: a host sync on CUDA), in the same process.
The custom mask's bytes (q_len x kv_len bits per request) are the work that grows: reported as GB/s written.
"""
from __future__ import annotations

import datetime

import torch

from ..attention_metadata import flashinfer_plan
from .report import markdown_table
from .timing import host_time_us

PAGE = 16
CPU_R = (8, 64)
CUDA_R = (8, 64, 256)


def _inputs(R, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    q_len = torch.arange(R) % 8 + 1
    seq = q_len + torch.randint(1024, 4096, (R,), generator=g)
    qsl = torch.zeros(R + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(q_len, 0)
    max_pages = int((seq.max() + PAGE - 1) // PAGE)
    table = torch.randperm(R * max_pages, generator=g).to(torch.int32).view(R, max_pages)
    masks = torch.cat([torch.tensor([(1 << (i + 1)) - 1 for i in range(n)], dtype=torch.int64) for n in q_len.tolist()])
    return qsl.to(device), seq.to(torch.int32).to(device), table.to(device), masks.to(device)


def torch_builder(qsl, seq, table):
    """What an engine's builder does with torch ops: pages, their cumsum, the used block-table entries gathered."""
    pages = (seq + PAGE - 1) // PAGE
    indptr = torch.nn.functional.pad(torch.cumsum(pages, 0, dtype=torch.int32), (1, 0))
    used = torch.arange(table.shape[1], device=table.device)[None, :] < pages[:, None]
    return indptr, table[used], seq - (pages - 1) * PAGE


def run(*, device="auto", min_time_s=0.2) -> dict:
    dev = torch.device("cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu")

    def timed(fn):
        if dev.type == "cuda":
            from .attention import _cuda_cold_us  # (imported here: attention.py imports this module)
            return _cuda_cold_us(fn)
        return host_time_us(fn, min_time_s=min_time_s, warmup=1, max_iters=50)

    rows = []
    for R in (CUDA_R if dev.type == "cuda" else CPU_R):
        qsl, seq, table, masks = _inputs(R, dev)
        plain = timed(lambda: flashinfer_plan(qsl, seq, table, PAGE))
        tree = timed(lambda: flashinfer_plan(qsl, seq, table, PAGE, tree_mask=masks, max_query_len=8,
                                             max_seq_len=table.shape[1] * PAGE))
        base = timed(lambda: torch_builder(qsl, seq, table))
        q_len = (qsl[1:] - qsl[:-1]).long().cpu()
        mask_bytes = int(((q_len * seq.long().cpu() + 7) // 8).sum())
        rows.append(dict(R=R, plain_us=plain, torch_us=base, ratio=base / plain, tree_us=tree,
                         mask_mb=mask_bytes / 1e6, mask_gbps=mask_bytes / (tree * 1e-6) / 1e9))
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
            "metadata_rows": rows}


COLUMNS = [("R", "R"), ("plain_us", "flashinfer_plan us"), ("torch_us", "torch builder us"),
           ("ratio", "torch / ours"), ("tree_us", "with tree mask us"), ("mask_mb", "mask MB"),
           ("mask_gbps", "mask GB/s")]


def report(result: dict) -> str:
    return "\n".join([
        f"## Backend metadata ({result['date']}, {result['device']}, torch {result['torch']})",
        "",
        f"flashinfer_plan, pages of {PAGE}, q_len 1..8, contexts 1k-4k; the torch builder in the same process.",
        "",
        markdown_table(result["metadata_rows"], COLUMNS),
    ]) + "\n"
