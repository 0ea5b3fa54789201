"""Differential harness: this library's budget and allocation against the installed vLLM's adaptive
verification (vllm/v1/worker/gpu/spec_decode/adaptive_verification.py), called directly, on random batches.

What is compared, per batch (``run``):

- cost tables: ``CostTable.from_points`` on the profiled curves vs vLLM's ``build_cost_tables_from_curves``;
- budget: ``choose_budget(prefix_survival(stale), ..., mode="global")`` vs ``AdaptiveVerificationManager.get_num_tokens``
  (the real method on a manager instance holding only the host state it reads), once with our table built from
  the curves ("curves") and once with vLLM's own dense tables (``cost_table_from_vllm``, "dense": the budget
  logic alone);
- allocation at vLLM's budget: ``plan_verification(..., mode="fixed").verify_lens`` vs ``_assign_draft_token_budget``
  (the uncompiled function; vLLM wraps it in torch.compile) on the live confidences.

Every disagreement is put in a class by re-running with the cause removed (sanitised confidences, vLLM's tables,
vLLM's numerator) or by checking the tie that explains it; a disagreement no class explains is "unexplained" and
fails the test. Run as a script to print the counts for docs/integrations/vllm.md::

    PYTHONPATH=python python tests/integration/vllm_differential.py --batches 4000 --seed 0
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import types

import numpy as np
import torch

import adaptive_verify as av
from adaptive_verify.integrations import vllm as avv

# Confidence kinds of a batch; the first three are the semantics both sides share, the rest the edge values.
KINDS = ("continuous", "quantised", "joining", "above_one", "nan", "negative")
EDGE = {"above_one", "nan", "negative"}

CLASSES = {
    "agree": "same integers",
    "rounding": "Theta(B) of both budgets within 1e-6 relative (float32 survival and verify costs here, float64 in vLLM)",
    "prefill_not_sampling": "a prompt chunk that does not finish counts as an emitted token here, not in vLLM",
    "cost_draft_above_graph_limit": "vLLM interpolates the drafter curve past the token graph limit (its cudagraph_limit is applied to request counts too)",
    "tie_order": "equal survivals at the budget's edge: canonical order here, torch.topk's unspecified order in vLLM",
    "above_one": "confidence > 1: clamped to 1 here; vLLM's survival grows along the row",
    "nan": "NaN confidence: survival 0 from there on here (prefix_survival); vLLM sorts NaN first (budget) and topk ranks it first (allocation)",
    "negative": "negative confidence: clamped to 0 here; vLLM's products change sign",
    "unexplained": "no class explains it (a bug on one side)",
}


@dataclasses.dataclass
class Config:
    """One deployment: profiled curves, capacities, vLLM's tables and ours."""

    K: int
    max_num_reqs: int
    max_tokens: int
    capture_sizes: list
    verify_curve: list
    draft_curve: list
    tables: tuple  # vLLM's (draft_table, verify_table)
    ours_curves: av.CostTable
    ours_dense: av.CostTable
    draft_above_limit: bool  # vLLM's drafter table is interpolated between points past the capture limit


def make_config(rng, vllm_av) -> Config:
    """A random deployment profiled the way vLLM profiles (batches_to_profile): every capture size, then an
    eager tail at 1.5x and doubling sizes up to the capacity (or none when the capacity is the last graph)."""
    limit = int(rng.choice([32, 64, 128, 256, 512]))
    sizes = [s for s in (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512) if s <= limit]
    eager = rng.random() < 0.7
    max_tokens = int(rng.choice([2, 4, 8])) * limit if eager else limit
    tail = set()
    if eager:
        s = limit
        tail.add(min(s + s // 2, max_tokens))
        while s < max_tokens:
            s = min(2 * s, max_tokens)
            tail.add(s)
        tail -= set(sizes)
    xs = sizes + sorted(tail)
    base, slope = rng.uniform(2.0, 20.0), rng.uniform(0.002, 0.05)
    ys = [base + slope * x * rng.uniform(0.9, 1.1) + (rng.uniform(0.5, 3.0) if x > limit else 0.0) for x in xs]
    if rng.random() < 0.3:  # a dip (tile effect): both sides take the running max
        i = int(rng.integers(1, len(ys)))
        ys[i] = ys[i - 1] * 0.97
    verify_curve = [(int(x), float(y)) for x, y in zip(xs, ys)]
    max_num_reqs = int(rng.choice([16, 64, 256, 1024]))
    r_pts = sorted({int(x) for x in rng.choice([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024],
                                               size=int(rng.integers(1, 6)), replace=False)})
    if rng.random() < 0.25:  # a drafter profiled at request counts past the token graph limit
        max_num_reqs, r_pts = 1024, [1, 8, 64, 256, 1024]
    d0, d1 = rng.uniform(0.2, 2.0), rng.uniform(0.0005, 0.01)
    draft_curve = [(r, float(d0 + d1 * r * rng.uniform(0.9, 1.1))) for r in r_pts]
    tables = vllm_av.build_cost_tables_from_curves(draft_curve, verify_curve, max_num_reqs, max_tokens, limit)
    K = int(rng.integers(1, 9))
    ours_curves = av.CostTable.from_points(dict(verify_curve), dict(draft_curve), graph_sizes=sizes,
                                           max_tokens=max_tokens)
    return Config(K=K, max_num_reqs=max_num_reqs, max_tokens=max_tokens, capture_sizes=sizes,
                  verify_curve=verify_curve, draft_curve=draft_curve, tables=tables, ours_curves=ours_curves,
                  ours_dense=avv.cost_table_from_vllm(tables),
                  draft_above_limit=sum(r > limit for r, _ in draft_curve) >= 2)


def make_confidences(rng, shape, kind) -> np.ndarray:
    """float32 confidences of one kind; "joining" rows hold vLLM's prior (1.0) for requests with no history."""
    c = rng.beta(3.0, 1.0, shape).astype(np.float32)
    if kind == "quantised":
        q = int(rng.choice([2, 4, 8, 16]))
        c = (rng.integers(1, q + 1, shape) / q).astype(np.float32)
    elif kind == "joining":
        c[rng.random(shape[0]) < 0.4] = 1.0
    elif kind == "above_one":
        m = rng.random(shape) < 0.15
        c[m] = rng.uniform(1.001, 1.5, int(m.sum())).astype(np.float32)
    elif kind == "nan":
        c[rng.random(shape) < 0.08] = np.nan
    elif kind == "negative":
        m = rng.random(shape) < 0.08
        c[m] = -rng.uniform(0.01, 1.0, int(m.sum())).astype(np.float32)
    return c


@dataclasses.dataclass
class Step:
    """One scheduled step as vLLM's runner describes it: decode requests (with drafts) and prompt chunks."""

    req_ids: list
    drafts: np.ndarray  # [R] int32, 0 for prompt chunks
    non_draft: np.ndarray  # [R] scheduled tokens that are not drafts
    sampling: np.ndarray  # [R] bool: the request samples a token this step
    stale: np.ndarray  # [R, K] float32 confidences the budget ranks (a step old)
    live: np.ndarray  # [R, K] float32 confidences the allocation ranks
    max_total_logits: int
    kind: str
    prefill: bool


def make_step(rng, cfg: Config, kind: str) -> Step:
    K = cfg.K
    R_dec = int(rng.integers(1, min(256 if rng.random() < 0.15 else 64, cfg.max_num_reqs, cfg.max_tokens // 2) + 1))
    drafts = np.full(R_dec, K, dtype=np.int32)
    short = rng.random(R_dec) < 0.2
    drafts[short] = rng.integers(0, K + 1, int(short.sum()))
    non_draft = np.ones(R_dec, dtype=np.int64)
    sampling = np.ones(R_dec, dtype=bool)
    prefill = rng.random() < 0.3 and R_dec < min(cfg.max_num_reqs, cfg.max_tokens // 2)
    if prefill:
        P = int(rng.integers(1, min(3, cfg.max_num_reqs - R_dec, cfg.max_tokens // 2 - R_dec) + 1))
        drafts = np.concatenate([drafts, np.zeros(P, dtype=np.int32)])
        non_draft = np.concatenate([non_draft, rng.integers(1, 200, P)])
        sampling = np.concatenate([sampling, rng.random(P) < 0.5])
    # The scheduler never schedules past the token capacity: trim drafts, then prompt chunks, to fit.
    while non_draft.sum() + drafts.sum() > cfg.max_tokens:
        if drafts.sum():
            drafts[int(np.argmax(drafts))] -= 1
        else:
            non_draft[int(np.argmax(non_draft))] = max(1, int(non_draft.max()) // 2)
    R = drafts.shape[0]
    stale, live = make_confidences(rng, (R, K), kind), make_confidences(rng, (R, K), kind)
    full = R + int(drafts.sum())
    max_total_logits = int(rng.integers(R, full + 1)) if rng.random() < 0.3 else full + int(rng.integers(0, 64))
    return Step(req_ids=[f"r{i}" for i in range(R)], drafts=drafts, non_draft=non_draft, sampling=sampling,
                stale=stale, live=live, max_total_logits=max_total_logits, kind=kind, prefill=prefill)


def vllm_manager(vllm_av, cfg: Config, step: Step, stale: np.ndarray):
    """A real AdaptiveVerificationManager holding just the host state get_num_tokens reads (its constructor
    needs CUDA streams and events): cost tables, request slots, stale confidences, capacities."""
    m = vllm_av.AdaptiveVerificationManager.__new__(vllm_av.AdaptiveVerificationManager)
    R = len(step.req_ids)
    # Every request has 0 computed tokens here; it samples iff its scheduled tokens reach its prompt's end.
    prefill_len = np.where(step.sampling, step.non_draft, step.non_draft + 10 ** 6)
    m.req_states = types.SimpleNamespace(
        req_id_to_index={r: i for i, r in enumerate(step.req_ids)},
        num_computed_tokens_np=np.zeros(R, dtype=np.int32),
        prefill_len=types.SimpleNamespace(np=prefill_len.astype(np.int64)))
    m.num_speculative_steps = cfg.K
    m.num_bonus_tokens = 1
    m._max_total_logits = step.max_total_logits
    m.cost_tables = cfg.tables
    m._stale_confidences = [types.SimpleNamespace(np=stale)]
    m._stale_idx = 0
    m._batch_budget = None
    return m


def vllm_budget(vllm_av, cfg: Config, step: Step) -> int:
    m = vllm_manager(vllm_av, cfg, step, step.stale)
    num_tokens_per_req = {r: int(n + d) for r, n, d in zip(step.req_ids, step.non_draft, step.drafts)}
    draft_tokens = {r: [0] * int(d) for r, d in zip(step.req_ids, step.drafts) if d}
    m.get_num_tokens(num_tokens_per_req, draft_tokens)
    return int(m._batch_budget[2])


def our_budget(table: av.CostTable, step: Step) -> int:
    c, d = torch.from_numpy(step.stale), torch.from_numpy(step.drafts)
    kw = avv.budget_kwargs(len(step.req_ids), int(step.non_draft.sum()), step.max_total_logits, 1, table.max_tokens)
    return int(av.choose_budget(av.prefix_survival(c, d), d, table, mode="global", **kw))


def vllm_allocation(vllm_av, step: Step, budget: int) -> list:
    conf = torch.from_numpy(step.live)
    R, K = conf.shape
    caps = torch.from_numpy(step.drafts.copy())
    if budget < int(caps.sum()):  # vLLM calls the kernel only when the budget binds
        vllm_av._assign_draft_token_budget(conf, torch.arange(R), caps, budget, K)
    return caps.tolist()


def our_allocation(step: Step, budget: int) -> list:
    c, d = torch.from_numpy(step.live), torch.from_numpy(step.drafts)
    return av.plan_verification(av.prefix_survival(c, d), d, mode="fixed", budget=budget).verify_lens.tolist()


def sanitised(step: Step, which: str) -> Step:
    """The step as this library reads its ``which`` ("stale" or "live") confidences: clamped to [0, 1], NaN as
    0 (``prefix_survival`` counts a NaN confidence as 0, so that draft and the request's later ones survive
    with 0 and rank last). vLLM run on this is vLLM without the edge values."""
    clean = np.nan_to_num(np.clip(getattr(step, which), 0.0, 1.0), nan=0.0)
    return dataclasses.replace(step, **{which: np.ascontiguousarray(clean, dtype=np.float32)})


def thetas(cfg: Config, step: Step, numerator: float) -> np.ndarray:
    """vLLM's objective at every budget 0..B_max, in float64 from this library's survivals (the float32
    kernel's, sorted), for a step without edge values."""
    s = av.prefix_survival(torch.from_numpy(step.stale), torch.from_numpy(step.drafts)).double().numpy()
    valid = np.arange(cfg.K)[None, :] < step.drafts[:, None]
    b_max = min(int(step.drafts.sum()), max(0, step.max_total_logits - len(step.req_ids)))
    p = np.concatenate([[0.0], np.cumsum(np.sort(s[valid])[::-1])])[: b_max + 1]
    dt, vt = cfg.tables
    nd = int(step.non_draft.sum())
    return (numerator + p) / (dt[len(step.req_ids)] + vt[nd: nd + b_max + 1])


def classify_budget(vllm_av, cfg: Config, step: Step, table: av.CostTable, ours: int, theirs: int) -> str:
    """The causes of a budget disagreement, each confirmed by removing it ("+"-joined when several)."""
    if ours == theirs:
        return "agree"
    causes = []
    if step.kind in EDGE:
        step = sanitised(step, "stale")
        clean = vllm_budget(vllm_av, cfg, step)
        if clean != theirs:
            causes.append(step.kind)
            theirs = clean
        if ours == theirs:
            return "+".join(causes)
    if table is cfg.ours_curves and our_budget(cfg.ours_dense, step) == theirs:
        # Only the cost tables differ; the one known difference is vLLM's drafter past the graph limit.
        R = len(step.req_ids)
        known = R > cfg.capture_sizes[-1] and cfg.ours_curves.draft_cost(R) != cfg.tables[0][R]
        return "+".join(causes + ["cost_draft_above_graph_limit" if known else "unexplained"])
    n_sampling = float(step.sampling.sum())
    if n_sampling != len(step.req_ids):
        # vLLM's budget maximises Theta with its numerator (sampling requests) and ours with ours (every row):
        # the numerator is the whole difference.
        # (Up to float rounding: each budget within 1e-6 relative of its objective's maximum.)
        t_v, t_o = thetas(cfg, step, n_sampling), thetas(cfg, step, float(len(step.req_ids)))
        if max(ours, theirs) < t_v.shape[0] and t_v[theirs] >= t_v.max() * (1 - 1e-6) and \
                t_o[ours] >= t_o.max() * (1 - 1e-6):
            return "+".join(causes + ["prefill_not_sampling"])
    t = thetas(cfg, step, n_sampling)
    if max(ours, theirs) < t.shape[0] and abs(t[ours] - t[theirs]) <= 1e-6 * max(abs(t[ours]), abs(t[theirs])):
        return "+".join(causes + ["rounding"])
    return "+".join(causes + ["unexplained"])


def classify_allocation(vllm_av, step: Step, budget: int, ours: list, theirs: list) -> str:
    if ours == theirs:
        return "agree"
    causes = []
    if step.kind in EDGE:
        step = sanitised(step, "live")
        clean = vllm_allocation(vllm_av, step, budget)
        if clean != theirs:
            causes.append(step.kind)
            theirs = clean
        if ours == theirs:
            return "+".join(causes)
    # Ties: both sides took survivals of equal multiset; only who among equals differs.
    s = torch.from_numpy(step.live).cumprod(dim=1).numpy()

    def taken(lens):
        return sorted(float(s[r, j]) for r, L in enumerate(lens) for j in range(L))

    if sum(ours) == sum(theirs) and taken(ours) == taken(theirs):
        return "+".join(causes + ["tie_order"])
    return "+".join(causes + ["unexplained"])


def run(vllm_av, batches: int, seed: int = 0, configs: int = 12):
    """Counts {(level, kind, prefill): Counter(class)} and the first example of each class."""
    rng = np.random.default_rng(seed)
    cfgs = [make_config(rng, vllm_av) for _ in range(configs)]
    counts: dict = collections.defaultdict(collections.Counter)
    examples: dict = {}
    for i in range(batches):
        cfg = cfgs[i % len(cfgs)]
        kind = KINDS[i % len(KINDS)]
        step = make_step(rng, cfg, kind)
        theirs = vllm_budget(vllm_av, cfg, step)
        for level, table in (("budget/dense", cfg.ours_dense), ("budget/curves", cfg.ours_curves)):
            ours = our_budget(table, step)
            cls = classify_budget(vllm_av, cfg, step, table, ours, theirs)
            counts[(level, kind, step.prefill)][cls] += 1
            examples.setdefault((level, cls), dict(kind=kind, ours=ours, vllm=theirs, drafts=step.drafts.tolist(),
                                                   sampling=step.sampling.tolist(), config=i % len(cfgs)))
        if 0 < theirs < int(step.drafts.sum()):
            ours_a, theirs_a = our_allocation(step, theirs), vllm_allocation(vllm_av, step, theirs)
            cls = classify_allocation(vllm_av, step, theirs, ours_a, theirs_a)
            counts[("allocation", kind, step.prefill)][cls] += 1
            examples.setdefault(("allocation", cls), dict(kind=kind, budget=theirs, ours=ours_a, vllm=theirs_a,
                                                          live=step.live.tolist()))
    return counts, examples, cfgs


def table_differences(cfgs) -> collections.Counter:
    """Per-count agreement of the cost tables (ours from the curves vs vLLM's), float32-exact."""
    out = collections.Counter()
    for cfg in cfgs:
        dt, vt = cfg.tables
        ours_v = cfg.ours_curves.verify_array(cfg.max_tokens).double().numpy()
        close_v = np.isclose(ours_v[1:], vt[1:], rtol=1e-6, atol=0)
        out["verify counts equal"] += int(close_v.sum())
        out["verify counts different"] += int((~close_v).sum())
        ours_d = np.array([cfg.ours_curves.draft_cost(r) for r in range(1, cfg.max_num_reqs + 1)])
        close_d = np.isclose(ours_d, dt[1:], rtol=1e-12, atol=0)
        out["draft counts equal"] += int(close_d.sum())
        out["draft counts different"] += int((~close_d).sum())
        past = np.arange(1, cfg.max_num_reqs + 1) > cfg.capture_sizes[-1]
        out["draft counts different past the graph limit"] += int((~close_d & past).sum())
    return out


def summary(counts) -> dict:
    """{level: Counter(class)} over kinds, and {(level, kind): Counter} for the docs' table."""
    by_level: dict = collections.defaultdict(collections.Counter)
    by_kind: dict = collections.defaultdict(collections.Counter)
    for (level, kind, prefill), c in counts.items():
        by_level[level].update(c)
        by_kind[(level, kind + (" +prefill" if prefill else ""))].update(c)
    return by_level, by_kind


def main():
    import importlib
    import logging
    import os

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    logging.disable(logging.WARNING)
    vllm_av = importlib.import_module("vllm.v1.worker.gpu.spec_decode.adaptive_verification")
    counts, examples, cfgs = run(vllm_av, args.batches, args.seed)
    by_level, by_kind = summary(counts)
    for level in sorted(by_level):
        print(level, dict(by_level[level]))
    for key in sorted(by_kind):
        print("  ", key, dict(by_kind[key]))
    print("tables", dict(table_differences(cfgs)))
    for (level, cls), ex in sorted(examples.items()):
        if cls != "agree":
            print("example", level, cls, {k: v for k, v in ex.items() if k != "live"})


if __name__ == "__main__":
    main()
