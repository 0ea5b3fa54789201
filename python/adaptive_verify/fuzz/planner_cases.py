"""Fuzz cases of the planner ops: prefix_survival, choose_budget, choose_draft_depth, plan_verification, and their
prepared calls (run again after one change: of a tensor they hold, a run() argument, a rebound input)."""
from __future__ import annotations

import dataclasses

import torch

from .. import reference as ref
from ..planner import (MAX_CONTEXT_LEN, MAX_REQS, VerifyPlan, choose_budget, choose_draft_depth, plan_verification,
                       prefix_survival)
from ..planner.step import MetadataInputs, PlanStep
from ..prepared import prepare
from .core import Case, counts, same
from .guards import Guards
from .tables import random_table
from .values import floats, int_arg, ints, maybe, pick, small_int, sprinkle, tensor_variants

SPECIALS = (float("nan"), 1.5, -0.5, float("inf"), float("-inf"), 0.0, 1.0)


def _survival(rng, R, K) -> torch.Tensor:
    """[R, K] float32: decreasing rows, ties, out-of-range values and NaNs, each sometimes."""
    s = floats(rng, (R, K), 0.0, 1.0)
    if maybe(rng, 0.5):
        s = torch.sort(s, dim=1, descending=True).values
    if maybe(rng, 0.3):
        s = (s * 4).round() / 4  # ties across requests and positions
    if maybe(rng, 0.3):
        s = sprinkle(rng, s, 0.1, SPECIALS)
    return s


def _nan_rows(survival, drafts, max_verify, draft_tokens) -> int:
    """Requests whose candidates a NaN survival cuts (docs: NaNs past the first invalid draft, max_verify or
    drafts[r] are never looked at)."""
    n = 0
    for r in range(survival.shape[0]):
        cap = min(int(drafts[r]), max_verify)
        if draft_tokens is not None:
            bad = (draft_tokens[r, :cap] < 0).nonzero()
            if bad.numel():
                cap = int(bad[0])
        n += bool(torch.isnan(survival[r, :cap]).any())
    return n


@dataclasses.dataclass
class PlanInputs:
    """Valid planner arguments (unguarded), with what the checks need."""

    R: int
    K: int
    survival: torch.Tensor
    conf: torch.Tensor
    drafts: torch.Tensor
    table: object
    kw: dict
    use_conf: bool


def plan_inputs(rng, *, metadata: bool) -> PlanInputs:
    R = small_int(rng, 40, edge=[2, 3, 7])
    K = int(pick(rng, [1, 2, 3, 4, 5, 7, 8, 16, 31, 32]))
    table = random_table(rng)
    mode = pick(rng, ["greedy", "global", "fixed", "all"])
    max_verify = None if maybe(rng, 0.6) else small_int(rng, K)
    mv = K if max_verify is None else max_verify
    kw = dict(mode=mode, max_verify=max_verify, min_verify=small_int(rng, mv) if maybe(rng, 0.4) else 0)
    if mode == "fixed":
        kw["budget"] = pick(rng, [small_int(rng, R * K + 5), 2**31 - 1, 2**40,
                                  torch.tensor(small_int(rng, R * K + 5), dtype=pick(rng, [torch.int32, torch.int64]))])
    extra = small_int(rng, 60) if maybe(rng, 0.4) else 0
    kw["extra_tokens"] = extra
    kw["extra_emitting"] = pick(rng, [0, 0, 1, 5, MAX_REQS])
    limit = table.token_limit
    if R + extra > limit:
        kw["extra_tokens"] = extra = 0
        if R > limit:
            R = limit
    if maybe(rng, 0.3):
        kw["capacity"] = int(rng.integers(R + extra, min(limit, R + extra + R * K + 10) + 1))
    conf = floats(rng, (R, K), -0.2, 1.2)
    if maybe(rng, 0.3):
        conf = sprinkle(rng, conf, 0.1, SPECIALS)
    drafts = ints(rng, 0, K, (R,))
    if metadata:
        bs = int(pick(rng, [1, 2, 16, 64, 2**31 - 1]))
        near = MAX_CONTEXT_LEN - 500 if maybe(rng, 0.1) else 0
        ctx = ints(rng, near, near + 500, (R,))
        kw["context_lens"] = ctx
        if maybe(rng, 0.7):
            need = int(((ctx.long() + mv) // bs).max()) + 1 if R else 1
            blocks = need + small_int(rng, 2) if need < 4096 else None
            if blocks is not None:
                kw["block_size"] = bs
                kw["block_table"] = ints(rng, 0, 10_000, (R, blocks))
        if maybe(rng, 0.7):
            width = mv + small_int(rng, 3)
            kw["draft_tokens"] = ints(rng, 0, 50_000, (R, width))
            if maybe(rng, 0.3) and R and width:  # an invalidated draft
                kw["draft_tokens"][int(rng.integers(0, R)), int(rng.integers(0, width))] = -1
            if maybe(rng, 0.8):
                kw["anchor_tokens"] = ints(rng, 0, 50_000, (R,))
    elif maybe(rng, 0.2):
        kw["draft_tokens"] = ints(rng, -1, 3, (R, mv + 1))
    if maybe(rng, 0.3):
        kw["token_offset"] = int(pick(rng, [small_int(rng, 100), 2**30]))
    if maybe(rng, 0.3):
        kw["num_reqs_padded"] = R + small_int(rng, 5)
    if maybe(rng, 0.3):
        kw["num_tokens_padded"] = R + small_int(rng, R * mv + 8)
    survival = _survival(rng, R, K)
    return PlanInputs(R, K, survival, conf, drafts, table, kw, use_conf=maybe(rng, 0.4))


def _guard_inputs(rng, g: Guards, p: PlanInputs) -> tuple:
    """The tensors of p placed in guarded buffers (2-D ones sometimes with gaps between rows)."""
    gap = lambda: int(pick(rng, [0, 0, 1, 5]))  # noqa: E731
    survival = g.tensor("survival", p.survival, row_gap=gap())
    conf = g.tensor("conf", p.conf, row_gap=gap())
    drafts = g.tensor("drafts", p.drafts)
    kw = dict(p.kw)
    for name in ("context_lens", "block_table", "anchor_tokens", "draft_tokens", "budget"):
        v = kw.get(name)
        if isinstance(v, torch.Tensor):
            kw[name] = g.tensor(name, v, row_gap=gap() if v.dim() == 2 else 0)
    return survival, conf, drafts, kw


def _guarded_plan(g: Guards, Rp: int, Tp: int, kw) -> VerifyPlan:
    meta = kw.get("context_lens") is not None
    i32 = torch.int32
    return VerifyPlan(
        verify_lens=g.empty("out.verify_lens", (Rp,), i32), budget=g.empty("out.budget", (), i32),
        expected_tokens=g.empty("out.expected_tokens", (), torch.float32), num_tokens=g.empty("out.num_tokens", (), i32),
        query_start_loc=g.empty("out.query_start_loc", (Rp + 1,), i32), token_req=g.empty("out.token_req", (Tp,), i32),
        seq_lens=g.empty("out.seq_lens", (Rp,), i32) if meta else None,
        positions=g.empty("out.positions", (Tp,), i32) if meta else None,
        slot_mapping=g.empty("out.slot_mapping", (Tp,), torch.int64) if kw.get("block_table") is not None else None,
        input_ids=g.empty("out.input_ids", (Tp,), i32) if kw.get("anchor_tokens") is not None else None,
    )


def _padded_sizes(p: PlanInputs) -> tuple[int, int]:
    """(R_pad, T_pad) the op will use, from the reference's own resolution (for sizing out= buffers)."""
    kw = {k: v for k, v in p.kw.items() if k in ("mode", "max_verify", "extra_tokens", "capacity", "num_tokens_padded",
                                                "num_reqs_padded", "budget", "min_verify", "extra_emitting")}
    a = ref.resolve_args(p.survival, p.drafts, p.table, **kw)
    return a.num_reqs_padded, a.num_tokens_padded


def _expected_counts(p: PlanInputs, survival_in, max_verify) -> dict:
    if p.use_conf:
        mask = torch.arange(p.K)[None, :] < p.drafts.long()[:, None]
        return {"nan_survival": int((torch.isnan(p.conf) & mask).sum())}
    return {"nan_survival": _nan_rows(survival_in, p.drafts, max_verify, p.kw.get("draft_tokens"))}


def plan_case(rng) -> Case:
    r = rng.random()
    if r < 0.6:
        return _plan_valid(rng)
    return _plan_adversarial(rng, rng.random() < 0.5)


def grouped(rng, kw: dict) -> dict:
    """kw with a random part of its fields moved into step=PlanStep(...) / metadata=MetadataInputs(...) (the ops'
    grouped form, which must give the same call), or kw itself."""
    if not maybe(rng, 0.4):
        return kw
    kw = dict(kw)
    for cls, name in ((PlanStep, "step"), (MetadataInputs, "metadata")):
        moved = {f.name: kw.pop(f.name) for f in dataclasses.fields(cls) if f.name in kw and maybe(rng, 0.7)}
        if moved:
            kw[name] = cls(**moved)
    return kw


def _plan_valid(rng) -> Case:
    p = plan_inputs(rng, metadata=maybe(rng, 0.6))
    g = Guards()
    survival, conf, drafts, kw = _guard_inputs(rng, g, p)
    Rp, Tp = _padded_sizes(p)
    out = _guarded_plan(g, Rp, Tp, kw) if maybe(rng, 0.6) else None
    kw = grouped(rng, kw)  # (out= is sized from the keywords' view of the call)
    survival_out = g.empty("survival_out", (p.R, p.K), torch.float32) if p.use_conf and maybe(rng, 0.7) else None
    mv = p.K if p.kw.get("max_verify") is None else p.kw["max_verify"]

    def call():
        if p.use_conf:
            return plan_verification(None, drafts, p.table, conf=conf, survival_out=survival_out, out=out,
                                     verification="onehot", **kw)
        return plan_verification(survival, drafts, p.table, out=out, verification="onehot", **kw)

    def check(plan):
        s_in = ref.prefix_survival(p.conf, p.drafts) if p.use_conf else p.survival
        if survival_out is not None:
            same("survival_out", survival_out, s_in)
        want = ref.plan_verification(s_in, p.drafts, p.table, **p.kw)
        for f in dataclasses.fields(VerifyPlan):
            same(f.name, getattr(plan, f.name), getattr(want, f.name))
        counts(_expected_counts(p, s_in, mv))

    # A request whose positions the block table cannot hold is the CPU's documented ValueError.
    bt = p.kw.get("block_table")
    if bt is not None and p.R and int((p.kw["context_lens"].long() + mv).max()) // p.kw["block_size"] >= bt.shape[1]:
        return Case("invalid", call, names=("block_table",), guards=g, what="block table too short")
    return Case("valid", call, check, guards=g, what=f"R={p.R} K={p.K} {p.kw.get('mode')} conf={p.use_conf}")


# Arguments and their documented ranges (lo, hi, heavy: values near hi allocate in proportion).
_PLAN_INTS = {
    "min_verify": (0, 2**31 - 1, False), "max_verify": (0, 32, False), "extra_tokens": (0, 2**31 - 1, True),
    "extra_emitting": (0, MAX_REQS, False), "capacity": (0, 2**31 - 1, True), "block_size": (1, 2**31 - 1, False),
    "token_offset": (0, 2**31 - 1, False), "num_reqs_padded": (0, MAX_REQS, True),
    "num_tokens_padded": (0, 2**30, True), "budget": (0, 2**200, False),
}


def _plan_adversarial(rng, choose: bool, depth: bool = False) -> Case:
    """One argument replaced by an adversarial value (every other argument valid). depth: choose_draft_depth's call
    (choose's arguments without a mode, which it does not take)."""
    p = plan_inputs(rng, metadata=not choose and maybe(rng, 0.6))
    g = Guards()
    survival, conf, drafts, kw = _guard_inputs(rng, g, p)
    args = {"survival": survival, "drafts": drafts}
    if p.use_conf:
        args = {"survival": None, "drafts": drafts, "conf": conf}
    if choose:
        kw = {k: v for k, v in kw.items() if k in ("mode", "min_verify", "max_verify", "extra_tokens", "extra_emitting",
                                                   "capacity", "draft_tokens")}
        if kw["mode"] == "fixed":
            kw["mode"] = "global"
    target = pick(rng, ["scalar", "scalar", "tensor", "tensor", "table", "mode", "out", "values"])
    names, kind, what = (), "maybe", target
    if target == "scalar":
        name = pick(rng, [n for n in _PLAN_INTS if not choose or n in kw or n in ("capacity", "extra_tokens")])
        lo, hi, heavy = _PLAN_INTS[name]
        value, kind = int_arg(rng, lo, hi, heavy=heavy, none_ok=name in ("max_verify", "capacity"))
        if name == "budget" and kw.get("mode") != "fixed":
            kind = "invalid" if value is not None else "maybe"
        if name == "block_size" and kw.get("block_table") is None and value is None:
            kind = "maybe"
        kw[name] = value
        names, what = (name,), f"{name}={value!r}"
        if name == "block_size":  # a smaller valid block size can leave the block table too short: named there
            names += ("block_table",)
    elif target == "tensor":
        present = [n for n in ("survival", "drafts", "conf") if args.get(n) is not None] + \
            [n for n in ("context_lens", "block_table", "anchor_tokens", "draft_tokens") if kw.get(n) is not None]
        name = pick(rng, present)
        base = args[name] if name in args else kw[name]
        allowed = (torch.float32,) if name in ("survival", "conf") else (torch.int32, torch.int64)
        desc, value, kind = pick(rng, tensor_variants(base, allowed_dtypes=allowed))
        if name in args:
            args[name] = value
        else:
            kw[name] = value
        names, what = (name, "drafts", "survival", "conf", "survival_out"), f"{name}: {desc}"
        if name in ("anchor_tokens", "draft_tokens"):
            names += ("anchor_tokens", "draft_tokens")
        if name == "context_lens":
            names += ("block_table",)
    elif target == "table":
        value = pick(rng, [None, {1: 1.0}, "table", 3, p.table.to_dict()])
        args["table"] = value
        kind = "invalid" if value is not None or kw.get("mode") in ("greedy", "global") or depth else "maybe"
        names, what = ("cost_table",), f"cost_table={type(value).__name__}"
    elif target == "mode":
        kw["mode"] = pick(rng, ["GREEDY", "", None, 1, "fixed" if choose else "lagged", b"greedy", ["greedy"]])
        kind, names, what = "invalid", ("mode",), f"mode={kw['mode']!r}"
    elif target == "values":
        # Values the kernel reads: drafts out of [0, K], context lengths out of [0, MAX_CONTEXT_LEN].
        if kw.get("context_lens") is not None and maybe(rng, 0.5):
            bad = pick(rng, [-1, -(2**31), MAX_CONTEXT_LEN + 1, 2**31 - 1])
            ctx = kw["context_lens"].clone()
            if p.R:
                ctx[int(rng.integers(0, p.R))] = bad
            kw["context_lens"] = g.tensor("context_lens2", ctx)
            kind = "invalid" if p.R else "maybe"
            names, what = ("context_lens",), f"context_lens holds {bad}"
        else:
            bad = pick(rng, [-1, p.K + 1, 2**31 - 1, -(2**31)])
            d = p.drafts.clone()
            if p.R:
                d[int(rng.integers(0, p.R))] = bad
            args["drafts"] = g.tensor("drafts2", d)
            kind = "invalid" if p.R else "maybe"
            names, what = ("drafts",), f"drafts holds {bad}"
    else:  # out
        if choose:
            args["out"] = pick(rng, [torch.empty((), dtype=torch.int64), torch.empty(1, dtype=torch.int32), [0], "x"])
            kind, names, what = "invalid", ("out",), "out of the wrong kind"
        else:
            Rp, Tp = _padded_sizes(p)
            out = _guarded_plan(g, Rp, Tp, kw)
            field = pick(rng, ["verify_lens", "budget", "token_req", "query_start_loc", "expected_tokens", "positions",
                               "slot_mapping", "input_ids", "seq_lens"])
            cur = getattr(out, field)
            bad = pick(rng, ["list", "short", "dtype", "strided", "None", "meta"])
            if bad == "list":
                new = [0]
            elif bad == "short":
                new = cur[:-1] if cur is not None and cur.dim() and cur.shape[0] else torch.empty(0, dtype=torch.int32)
            elif bad == "dtype":
                new = None if cur is None else cur.to(torch.int16)
            elif bad == "strided":
                new = cur if cur is None or cur.dim() == 0 else \
                    g.tensor(f"out.{field}.strided", torch.zeros(cur.numel() * 2, dtype=cur.dtype))[::2]
            elif bad == "meta":
                new = None if cur is None else cur.to("meta")
            else:
                new = None
            args["out"] = dataclasses.replace(out, **{field: new})
            kind = "maybe"
            names, what = (f"out.{field}", "out"), f"out.{field}: {bad}"

    def call():
        table = args.get("table", p.table)
        rest = {k: v for k, v in args.items() if k not in ("survival", "drafts", "table")}
        if depth:  # (a mode is the adversarial value only where the target was the mode)
            kw_d = {k: v for k, v in kw.items() if k != "mode" or target == "mode"}
            return choose_draft_depth(args["survival"], args["drafts"], table, **rest, **kw_d)
        if choose:
            return choose_budget(args["survival"], args["drafts"], table, **rest, **kw)
        return plan_verification(args["survival"], args["drafts"], table, verification="onehot", **rest, **kw)

    return Case(kind, call, guards=g, names=names, what=what)


def choose_case(rng) -> Case:
    if rng.random() < 0.4:
        return _plan_adversarial(rng, True)
    p = plan_inputs(rng, metadata=False)
    g = Guards()
    survival, conf, drafts, kw = _guard_inputs(rng, g, p)
    mode = pick(rng, ["greedy", "global", "all"])
    keep = ("min_verify", "max_verify", "extra_tokens", "extra_emitting", "capacity", "draft_tokens")
    kw = {k: v for k, v in kw.items() if k in keep}
    ref_kw = {k: v for k, v in p.kw.items() if k in keep}
    out = g.empty("out", (), torch.int32) if maybe(rng, 0.5) else None
    mv = p.K if kw.get("max_verify") is None else kw["max_verify"]

    def call():
        if p.use_conf:
            return choose_budget(None, drafts, p.table, conf=conf, mode=mode, out=out, **kw)
        return choose_budget(survival, drafts, p.table, mode=mode, out=out, **kw)

    def check(budget):
        s_in = ref.prefix_survival(p.conf, p.drafts) if p.use_conf else p.survival
        same("budget", budget, ref.choose_budget(s_in, p.drafts, p.table, mode=mode, **ref_kw))
        pp = dataclasses.replace(p, kw=ref_kw)
        counts(_expected_counts(pp, s_in, mv))

    return Case("valid", call, check, guards=g, what=f"R={p.R} K={p.K} {mode}")


def depth_case(rng) -> Case:
    """choose_draft_depth on valid inputs (a level-by-level or a block drafter's table), against the reference's brute
    force over (D, B)."""
    if rng.random() < 0.4:
        return _plan_adversarial(rng, True, depth=True)
    p = plan_inputs(rng, metadata=False)
    table = random_table(rng, levels=p.K) if maybe(rng, 0.6) else p.table
    g = Guards()
    survival, conf, drafts, kw = _guard_inputs(rng, g, p)
    keep = ("min_verify", "max_verify", "extra_tokens", "extra_emitting", "capacity", "draft_tokens")
    kw = {k: v for k, v in kw.items() if k in keep}
    ref_kw = {k: v for k, v in p.kw.items() if k in keep}
    if "capacity" in kw and table.max_tokens is not None and kw["capacity"] > table.max_tokens:
        kw["capacity"] = ref_kw["capacity"] = table.max_tokens
    if p.R + kw.get("extra_tokens", 0) > min(table.token_limit, kw.get("capacity", table.token_limit)):
        return choose_case(rng)  # (the other table leaves these requests no room: a case of another kind)
    mv = p.K if kw.get("max_verify") is None else kw["max_verify"]
    min_depth = small_int(rng, mv) if maybe(rng, 0.3) else 0
    out = (g.empty("out_depth", (), torch.int32), g.empty("out_budget", (), torch.int32)) if maybe(rng, 0.5) else None

    def call():
        if p.use_conf:
            return choose_draft_depth(None, drafts, table, conf=conf, min_depth=min_depth, out=out, **kw)
        return choose_draft_depth(survival, drafts, table, min_depth=min_depth, out=out, **kw)

    def check(result):
        s_in = ref.prefix_survival(p.conf, p.drafts) if p.use_conf else p.survival
        depth, budget, _ = ref.choose_draft_depth(s_in, p.drafts, table, min_depth=min_depth, **ref_kw)
        same("depth", result[0], depth)
        same("budget", result[1], budget)
        counts(_expected_counts(dataclasses.replace(p, kw=ref_kw), s_in, mv))

    return Case("valid", call, check, guards=g, what=f"R={p.R} K={p.K} levels={table.draft_levels}")


def survival_case(rng) -> Case:
    R, K = small_int(rng, 50, edge=[3]), int(pick(rng, [1, 4, 8, 32]))
    conf = sprinkle(rng, floats(rng, (R, K), -0.3, 1.3), 0.1 if maybe(rng, 0.4) else 0.0, SPECIALS)
    drafts = ints(rng, 0, K, (R,))
    g = Guards()
    c = g.tensor("conf", conf, row_gap=int(pick(rng, [0, 3])))
    d = g.tensor("drafts", drafts)
    out = g.empty("out", (R, K), torch.float32) if maybe(rng, 0.6) else None
    r = rng.random()
    if r < 0.6:
        def check(got):
            same("survival", got, ref.prefix_survival(conf, drafts))
            mask = torch.arange(K)[None, :] < drafts.long()[:, None]
            counts({"nan_survival": int((torch.isnan(conf) & mask).sum())})

        return Case("valid", lambda: prefix_survival(c, d, out=out), check, guards=g, what=f"R={R} K={K}")
    if r < 0.75 and R:
        bad = drafts.clone()
        bad[int(rng.integers(0, R))] = pick(rng, [-1, K + 1, 2**31 - 1])
        d2 = g.tensor("drafts2", bad)
        return Case("invalid", lambda: prefix_survival(c, d2, out=out), guards=g, names=("drafts",), what="drafts out")
    name = pick(rng, ["conf", "drafts", "out"])
    base = {"conf": c, "drafts": d, "out": out if out is not None else g.empty("out", (R, K), torch.float32)}[name]
    desc, value, kind = pick(rng, tensor_variants(base, allowed_dtypes=(torch.float32,) if name != "drafts" else
                                                  (torch.int32, torch.int64)))
    args = {"conf": c, "drafts": d, "out": out}
    args[name] = value
    return Case(kind, lambda: prefix_survival(args["conf"], args["drafts"], out=args["out"]), guards=g,
                names=(name, "conf", "drafts"), what=f"{name}: {desc}")


def prepared_case(rng) -> Case:
    """A decode loop's prepared call (adaptive_verify.prepare), run once, then one change (an in-place change of a
    tensor it holds, a per-step scalar of another type, an input rebound with the same or another layout, a setting
    that is not a run argument), then run again: a change must be refused by name, never reach the kernel."""
    p = plan_inputs(rng, metadata=maybe(rng, 0.5))
    p.kw.pop("budget", None)
    p.kw["mode"] = pick(rng, ["fixed", "greedy", "all"])
    if p.kw["mode"] == "fixed":
        p.kw["budget"] = small_int(rng, p.R * p.K)
    g = Guards()
    survival, conf, drafts, kw = _guard_inputs(rng, g, p)
    Rp, Tp = _padded_sizes(p)
    out = _guarded_plan(g, Rp, Tp, kw)
    spare = g.tensor("spare", torch.zeros(max(2 * Tp, 8), dtype=torch.int32))
    change = pick(rng, ["as_strided", "scalar type", "resize", "values", "transpose", "set", "budget float",
                        "min_verify", "extra_tokens float", "rebind", "rebind other layout", "nothing"])
    case = Case("maybe", lambda: None, guards=g, what=f"prepared, then {change}")

    def mutate(run_kw: dict) -> tuple[tuple, str]:
        """Applies the change (to the tensors, or as run() arguments); returns (argument names an error may name,
        kind of the second run)."""
        if change == "as_strided":
            field = pick(rng, ["token_req", "verify_lens", "query_start_loc"])
            t = getattr(out, field)
            if 1 < t.numel() <= 60:  # the guard margin holds the strided view's extent
                t.as_strided_(t.shape, (2,))  # same pointer and shape: only the stride says it
                return (f"out.{field}",), "invalid"
        elif change == "scalar type":
            key = pick(rng, ["token_offset", "capacity", "extra_emitting"])
            value = int(rng.integers(0, 3))
            run_kw[key] = float(value) if maybe(rng, 0.5) else bool(value)
            return (key,), "invalid"
        elif change == "budget float" and kw.get("mode") == "fixed":
            run_kw["budget"] = float(kw["budget"])
            return ("budget",), "invalid"
        elif change == "min_verify":  # a setting of the prepared call, not a run() argument
            run_kw["min_verify"] = 1
            return ("min_verify",), "invalid"
        elif change == "extra_tokens float":
            run_kw["extra_tokens"] = float(kw.get("extra_tokens", 0))
            return ("extra_tokens",), "invalid"
        elif change == "resize":
            survival.resize_(survival.shape[0], survival.shape[1] + 33)  # K past 32
            return ("survival",), "invalid"
        elif change == "transpose" and survival.shape[0] > 1 and survival.shape[1] > 1:
            survival.transpose_(0, 1)
            return ("survival", "drafts"), "invalid"
        elif change == "set" and Tp != 1:
            out.token_req.set_(spare.untyped_storage(), spare.storage_offset(), (1,), (1,))
            return ("out.token_req",), "invalid"
        elif change == "values" and p.R:
            drafts[int(rng.integers(0, p.R))] = p.K + 1
            return ("drafts",), "invalid"
        elif change == "rebind":  # the same values in a new tensor of the same layout
            run_kw["survival"] = torch.empty_strided(survival.shape, survival.stride()).copy_(survival)
        elif change == "rebind other layout" and not survival.is_contiguous():
            run_kw["survival"] = survival.contiguous()
            return ("survival",), "invalid"
        return (), "valid"

    def call():
        handle = prepare(plan_verification, survival, drafts, p.table, out=out, verification="onehot", **kw)
        handle.run()
        run_kw: dict = {}
        case.names, case.kind = mutate(run_kw)
        return handle.run(**run_kw)

    def check(result):  # an unchanged call: the validating call's integers
        want = ref.plan_verification(p.survival, p.drafts, p.table, **p.kw)
        for f in dataclasses.fields(VerifyPlan):
            same(f.name, getattr(result, f.name), getattr(want, f.name))

    case.call, case.check = call, check
    return case


__all__ = ["choose_case", "plan_case", "prepared_case", "survival_case"]
