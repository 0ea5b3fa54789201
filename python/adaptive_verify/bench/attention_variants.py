"""Attention variants benchmark: `adaptive-verify bench attention --variants` (bench/attention.py routes here).

What sinks, a sliding window and soft-capping cost verify_attention, against the same call without them (the
baseline run alternately in the same process): a gpt-oss-class layer (Hq 64 over 8 KV heads of dim 64 at TP1; 8
over 1 at TP8) with sinks and a 128-position window, and soft-capping at 50 (Gemma 2) with a 4096-position window.
Sinks and soft-capping should cost little (one term per row and head; a tanh per score); a window shorter than the
context should make the call cheaper, since splits wholly outside every token's window are skipped and pages below
it are never read. Per row: the variant's time over the plain call's (median of alternating rounds) and the
fraction of the context a window leaves.
"""
from __future__ import annotations

import datetime
import statistics

import torch

from ..attention import verify_attention
from .report import markdown_table
from .timing import host_time_us

LAYERS = {"tp1": (64, 8, 64), "tp8": (8, 1, 64)}  # gpt-oss: (Hq, Hkv, D)
VARIANTS = {"sinks+window128": dict(window_left=128, sinks=True), "softcap50": dict(softcap=50.0),
            "softcap50+window4096": dict(softcap=50.0, window_left=4096)}
CPU_CASES = (("tp8", 1, 2048), ("tp8", 4, 4096))
CUDA_CASES = (("tp1", 32, 8192), ("tp1", 128, 32768), ("tp8", 256, 8192))


def _inputs(layer, R, context, device):
    from .attention import make_inputs  # (imported here: attention.py imports this module)
    return make_inputs(R, context, layer, device, layers=LAYERS)


def _timer(device, min_time_s):
    if device.type == "cuda":
        from .attention import _cuda_cold_us
        return _cuda_cold_us
    return lambda fn: host_time_us(fn, min_time_s=min_time_s, warmup=1, max_iters=10)


def run(*, device="auto", min_time_s=0.2, cases=None, rounds=5, kernel=None) -> dict:
    dev = torch.device("cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu")
    cases = cases or (CUDA_CASES if dev.type == "cuda" else CPU_CASES)
    timer = _timer(dev, min_time_s)
    rows = []
    for layer, R, context in cases:
        args = _inputs(layer, R, context, dev)
        Hq = LAYERS[layer][0]
        plain = lambda: verify_attention(**args, cuda_kernel=kernel)  # noqa: E731
        for name, spec in VARIANTS.items():
            kw = {k: v for k, v in spec.items() if k != "sinks"}
            if spec.get("sinks"):
                kw["sinks"] = torch.linspace(-1.0, 3.0, Hq, device=dev)
            fn = lambda kw=kw: verify_attention(**args, cuda_kernel=kernel, **kw)  # noqa: E731
            base_t, var_t = [], []
            for _ in range(rounds):  # alternate, so drift hits both alike
                base_t.append(timer(plain))
                var_t.append(timer(fn))
            window = kw.get("window_left", -1)
            rows.append(dict(layer=layer, R=R, context=context, variant=name, plain_us=statistics.median(base_t),
                             variant_us=statistics.median(var_t),
                             ratio=statistics.median(var_t) / statistics.median(base_t),
                             window_fraction=min(1.0, (window + 8) / context) if window >= 0 else 1.0))
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
            "kernel": kernel or "default", "variant_rows": rows}


COLUMNS = [("layer", "layer"), ("R", "R"), ("context", "context"), ("variant", "variant"), ("plain_us", "plain us"),
           ("variant_us", "variant us"), ("ratio", "variant / plain"), ("window_fraction", "context in window")]


def report(result: dict) -> str:
    return "\n".join([
        f"## Attention variants ({result['date']}, {result['device']}, torch {result['torch']}, "
        f"kernel {result['kernel']})",
        "",
        "gpt-oss-class layers (head dim 64), bf16 paged KV (block size 16), q_len mix 1..8; the variant against the "
        "same call without it, alternating rounds, medians.",
        "",
        markdown_table([{k: f"{v:.3f}" if k in ("ratio", "window_fraction") else v for k, v in r.items()}
                        for r in result["variant_rows"]], COLUMNS),
    ]) + "\n"
