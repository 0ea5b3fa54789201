"""Trains the engine's TinyTarget and DSparkDrafter on the Python standard library's sources.

    python -m adaptive_verify.engine.train --out python/adaptive_verify/engine/weights --minutes 22

Stages (seeded; the number of optimiser steps is fitted to the time budget after a few timed steps, so a
faster machine trains longer):
1. target: next-byte LM, AdamW, windows of 256 bytes, cosine schedule; held-out bits per byte;
2. drafter, target frozen: each anchor p of a window gets h = target hidden at p - 1 and anchor = byte p;
   draft j is trained (cross-entropy) towards the target's greedy prediction at p + j along the text
   (teacher forcing), i.e. towards what greedy verification accepts;
3. confidence head: logistic regression of "draft j accepted" on [conf_hidden_j, markov_j] over the
   drafts whose predecessors were all accepted (exact acceptance from ``verify.draft_and_verify``);
4. STS temperatures (``adaptive_verify.fit_sts``) on the survival of held-in drafts.
Weights are stored in fp16 (the confidence head in fp32) and every reported number is measured after
the fp16 round trip, on held-out files.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import time

import torch
import torch.nn.functional as F

import adaptive_verify as av

from .data import load_stdlib, sample_windows
from .drafter import DrafterConfig, DSparkDrafter
from .metrics import acceptance_report, auc, ece
from .model import TargetConfig, TinyTarget
from .verify import draft_and_verify, tree_mask

SEQ_LEN = 256


def _lr(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def _fit_steps(step_fn, seconds: float, probe: int = 3) -> int:
    """Runs ``probe`` steps (they count) and returns the total steps that fit in ``seconds``."""
    t0 = time.time()
    for i in range(probe):
        step_fn(i, None)
    per_step = (time.time() - t0) / probe
    return max(probe + 1, int(seconds / per_step))


def train_loop(params, loss_fn, seconds: float, peak_lr: float, log_name: str, warmup: int = 30):
    """AdamW over ``params`` with loss_fn(step) for as many steps as fit in ``seconds``."""
    opt = torch.optim.AdamW(params, lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.1)
    state = {"total": 10**9}

    def step_fn(step, total):
        for g in opt.param_groups:
            g["lr"] = _lr(step, state["total"] if total is None else total, peak_lr, warmup)
        loss = loss_fn(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss.item()

    probe = 3
    state["total"] = total = _fit_steps(step_fn, seconds, probe)
    t0, avg = time.time(), None
    for step in range(probe, total):
        loss = step_fn(step, total)
        avg = loss if avg is None else 0.98 * avg + 0.02 * loss
        if step % 50 == 0 or step == total - 1:
            print(f"[{log_name}] step {step}/{total} loss {avg:.4f} ({time.time() - t0:.0f} s)", flush=True)
    return total


@torch.no_grad()
def bits_per_byte(target: TinyTarget, data: torch.Tensor, windows: int = 64, seed: int = 1) -> float:
    """Mean next-byte cross-entropy in bits over ``windows`` fixed held-out windows of SEQ_LEN + 1 bytes."""
    ids = sample_windows(data, windows, SEQ_LEN + 1, torch.Generator().manual_seed(seed))
    total = 0.0
    for chunk in ids.split(16):
        logits, _ = target.forward_dense(chunk[:, :-1])
        total += F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum").item()
    return total / (ids.shape[0] * SEQ_LEN) / math.log(2)


def drafter_loss(target: TinyTarget, drafter: DSparkDrafter, ids: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of every anchor's K drafts against the target's greedy predictions (ids [B, L])."""
    K = drafter.config.num_drafts
    L = ids.shape[1]
    with torch.no_grad():
        logits, hidden = target.forward_dense(ids)  # [B, L, V], [B, L, d]
        greedy = logits.argmax(-1)  # [B, L]: greedy[:, i] = the target's token for position i + 1
    anchors = torch.arange(1, L - K + 1)  # [P]
    h = hidden[:, anchors - 1].flatten(0, 1)  # [B*P, d]
    anchor_ids = ids[:, anchors].flatten()  # [B*P]
    targets = greedy[:, anchors[:, None] + torch.arange(K)].flatten(0, 1)  # [B*P, K]
    prev = torch.cat([anchor_ids[:, None], targets[:, :-1]], 1)  # teacher-forced previous tokens
    _, bb_logits = drafter.backbone(h, anchor_ids)
    logits = drafter.draft_logits(bb_logits, prev)  # [B*P, K, V]
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def collect(target, drafter, data, windows: int, seed: int, length: int = SEQ_LEN):
    """Drafts and exact acceptance at every anchor of ``windows`` random windows: (conf_hidden [N, K, H],
    markov [N, K, Q], accepted [N, K] bool)."""
    K = drafter.config.num_drafts
    anchors = torch.arange(1, length - K + 1)
    mask, pos = tree_mask(length, anchors, K)
    ids = sample_windows(data, windows, length, torch.Generator().manual_seed(seed))
    out = [draft_and_verify(target, drafter, chunk, anchors, mask, pos)[1:] for chunk in ids.split(4)]
    hid, mar, acc = (torch.cat([o[i] for o in out]).flatten(0, 1) for i in range(3))
    return hid, mar, acc


def fit_confidence(drafter: DSparkDrafter, hid, mar, acc, l2: float = 1e-3) -> None:
    """Logistic regression of acc[:, j] on [hid_j, mar_j] over rows whose drafts < j were accepted; the
    feature standardisation is folded into the stored weight and bias."""
    x = torch.cat([hid, mar], -1).float()  # [N, K, H + Q]
    eligible = torch.cat([torch.ones_like(acc[:, :1]), acc[:, :-1]], 1)  # [N, K]
    X, y = x[eligible], acc[eligible].float()  # [M, H + Q], [M]
    mu, sd = X.mean(0), X.std(0).clamp_min(1e-4)
    Xs = (X - mu) / sd
    w = torch.zeros(X.shape[1], requires_grad=True)
    b = torch.zeros((), requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(Xs @ w + b, y) + l2 * w.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        drafter.conf_weight.copy_(w / sd)
        drafter.conf_bias.copy_(b - (w * mu / sd).sum())


def _round_trip(model: torch.nn.Module) -> dict:
    """fp16 state_dict (buffers of the confidence head kept fp32); loads it back into ``model``."""
    state = {k: (v.half() if v.is_floating_point() and not k.startswith("conf_") else v)
             for k, v in model.state_dict().items()}
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    return state


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory for target.pt, drafter.pt, report.json")
    ap.add_argument("--minutes", type=float, default=22.0, help="total time budget")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--num-drafts", type=int, default=6)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    start = time.time()
    budget = args.minutes * 60
    held_in, held_out, data_desc = load_stdlib()
    print(json.dumps(data_desc), flush=True)

    # 1. target
    target = TinyTarget(TargetConfig())
    gen = torch.Generator().manual_seed(args.seed + 1)

    def target_loss(step):
        ids = sample_windows(held_in, 16, SEQ_LEN + 1, gen)
        logits, _ = target.forward_dense(ids[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())

    target_steps = train_loop(list(target.parameters()), target_loss, 0.58 * budget - (time.time() - start),
                              peak_lr=2e-3, log_name="target")
    target.eval().requires_grad_(False)
    target_state = _round_trip(target)
    bpb = bits_per_byte(target, held_out)
    print(f"target held-out bits/byte {bpb:.3f}", flush=True)
    target_seconds = time.time() - start

    # 2. drafter
    drafter = DSparkDrafter(DrafterConfig(target_dim=target.config.d_model, num_drafts=args.num_drafts))
    gen = torch.Generator().manual_seed(args.seed + 2)
    drafter_steps = train_loop(
        list(drafter.parameters()), lambda step: drafter_loss(target, drafter, sample_windows(held_in, 8, SEQ_LEN, gen)),
        0.88 * budget - (time.time() - start), peak_lr=2e-3, log_name="drafter")
    drafter.eval().requires_grad_(False)
    _round_trip(drafter)

    # 3. confidence head on held-in drafts; 4. STS temperatures on the same rows
    hid, mar, acc = collect(target, drafter, held_in, windows=32, seed=args.seed + 3)
    fit_confidence(drafter, hid, mar, acc)
    logits_in = drafter.confidence_logits(hid, mar)  # [N, K]
    drafter.conf_temperature.copy_(av.fit_sts(logits_in, acc.sum(1)))
    drafter_state = _round_trip(drafter)

    # held-out evaluation
    hid, mar, acc = collect(target, drafter, held_out, windows=32, seed=args.seed + 4)
    conf = drafter.confidence(hid, mar, calibrated=False)  # [N, K] conditional
    surv_raw = drafter.confidence(hid, mar, survival=True, calibrated=False)
    surv_sts = drafter.confidence(hid, mar, survival=True)
    eligible = torch.cat([torch.ones_like(acc[:, :1]), acc[:, :-1]], 1)
    report = {
        "target": {"config": target.config.to_dict(), "parameters": sum(p.numel() for p in target.parameters()),
                   "steps": target_steps, "batch": [16, SEQ_LEN], "held_out_bits_per_byte": round(bpb, 4)},
        "drafter": {"config": drafter.config.to_dict(), "parameters": sum(p.numel() for p in drafter.parameters()),
                    "steps": drafter_steps, "held_out_anchors": int(acc.shape[0]),
                    **acceptance_report(acc)},
        "confidence": {
            "auc_conditional": round(auc(conf[eligible], acc[eligible]), 4),
            "ece_conditional": round(ece(conf[eligible], acc[eligible]), 4),
            "ece_survival_raw": round(ece(surv_raw.flatten(), acc.flatten()), 4),
            "ece_survival_sts": round(ece(surv_sts.flatten(), acc.flatten()), 4),
            "sts_temperatures": [round(t, 4) for t in drafter.conf_temperature.tolist()],
            "note": "conditional: drafts whose predecessors were accepted; survival: P(drafts 0..j accepted) "
                    "vs the event, all drafts; ECE with 15 equal-width bins; held-out files",
        },
        "evaluation": "greedy verification on 32 held-out windows of 256 bytes, every anchor p in 1..256-K: "
                      "h = target hidden at p - 1, anchor = byte p (teacher-forced context)",
        "training_seconds": round(time.time() - start, 1),
        "target_seconds": round(target_seconds, 1),
        "threads": args.threads, "seed": args.seed,
        "torch_version": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "data": data_desc,
    }
    os.makedirs(args.out, exist_ok=True)
    torch.save({"config": target.config.to_dict(), "state_dict": target_state}, os.path.join(args.out, "target.pt"))
    torch.save({"config": drafter.config.to_dict(), "state_dict": drafter_state}, os.path.join(args.out, "drafter.pt"))
    with open(os.path.join(args.out, "report.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2), flush=True)


if __name__ == "__main__":
    main()
