"""Fuzz cases of the draft-tree ops: tree_survival, choose_budget(parents=...), plan_tree_verification and
commit_tree_kv. Valid trees of every shape (chains, stars, levels, random topological parents) are compared with
the reference; malformed trees (parents not topological or out of range, sizes past N, duplicate sibling tokens,
accepted paths that leave their blocks) must be refused by name on the CPU."""
from __future__ import annotations

import dataclasses

import torch

from .. import reference as ref
from ..attention import commit_tree_kv
from ..planner import (MAX_TREE_NODES, TreeVerifyPlan, choose_budget, choose_tree_shape, plan_tree_verification,
                       tree_survival)
from .core import Case, counts, same
from .planner_cases import _guarded_plan
from .guards import Guards
from .tables import random_table
from .values import floats, int_arg, ints, maybe, pick, small_int, sprinkle, tensor_variants

SHAPES = ("chain", "star", "levels", "random")


def _parents(rng, R: int, N: int) -> torch.Tensor:
    """[R, N] int32 topological parents (parents[r, j] in [-1, j)), one shape per request."""
    rows = []
    for _ in range(R):
        shape = pick(rng, SHAPES)
        if shape == "chain":
            row = [j - 1 for j in range(N)]
        elif shape == "star":
            row = [-1] * N
        elif shape == "levels":  # a few nodes per level, each under one of the previous level's
            w = int(pick(rng, [2, 3, 4]))
            row = [-1 if j < w else (j // w - 1) * w + int(rng.integers(0, w)) for j in range(N)]
        else:
            row = [int(rng.integers(-1, j)) if j else -1 for j in range(N)]
        rows.append(row)
    return torch.tensor(rows, dtype=torch.int32).reshape(R, N)


def _distinct_tokens(rng, R: int, N: int) -> torch.Tensor:
    """[R, N] int32 draft ids, distinct within a request (so siblings never repeat a token)."""
    return torch.from_numpy(rng.permuted(rng.integers(0, 2**31 - 1, (R, 4 * N + 4)), axis=1)[:, :N].copy()).to(
        torch.int32) if R and N else torch.zeros(R, N, dtype=torch.int32)


@dataclasses.dataclass
class TreeInputs:
    R: int
    N: int
    conf: torch.Tensor
    parents: torch.Tensor
    sizes: torch.Tensor
    survival: torch.Tensor
    kw: dict


def tree_inputs(rng, *, metadata: bool) -> TreeInputs:
    R = small_int(rng, 24, edge=[2, 3])
    N = int(pick(rng, [1, 2, 3, 5, 8, 16, 31, 32, 63]))
    parents = _parents(rng, R, N)
    sizes = ints(rng, 0, N, (R,))
    conf = floats(rng, (R, N), -0.2, 1.2)
    if maybe(rng, 0.3):
        conf = sprinkle(rng, conf, 0.1, (float("nan"), 0.0, 1.0, 1.5))
    survival = ref.tree_survival(conf, parents, sizes)
    if maybe(rng, 0.2):
        survival = sprinkle(rng, survival, 0.05, (float("nan"),))
    mode = pick(rng, ["greedy", "global", "fixed", "all"])
    kw = dict(mode=mode)
    if maybe(rng, 0.3):
        kw["max_verify"] = small_int(rng, N)
    kw["min_verify"] = small_int(rng, kw.get("max_verify", N)) if maybe(rng, 0.3) else 0
    if mode == "fixed":
        kw["budget"] = small_int(rng, R * N + 3)
    if maybe(rng, 0.3):
        kw["extra_tokens"] = small_int(rng, 40)
    if metadata:
        bs = int(pick(rng, [1, 4, 16, 64]))
        ctx = ints(rng, 0, 500, (R,))
        kw["context_lens"] = ctx
        if maybe(rng, 0.7):
            kw["block_size"] = bs
            kw["block_table"] = ints(rng, 0, 50_000, (R, (500 + N + 1) // bs + 1 + small_int(rng, 2)))
        if maybe(rng, 0.7):
            kw["anchor_tokens"] = ints(rng, 0, 50_000, (R,))
            kw["draft_tokens"] = _distinct_tokens(rng, R, N)
            if maybe(rng, 0.3) and R:  # an invalidated draft removes its subtree
                kw["draft_tokens"][int(rng.integers(0, R)), int(rng.integers(0, N))] = -1
    if maybe(rng, 0.3):
        kw["token_offset"] = small_int(rng, 100)
    if maybe(rng, 0.3):
        kw["num_reqs_padded"] = R + small_int(rng, 4)
    if maybe(rng, 0.3):
        kw["num_tokens_padded"] = R + small_int(rng, R * N + 6)
    return TreeInputs(R, N, conf, parents, sizes, survival, kw)


def _nan_requests(t: TreeInputs) -> int:
    """Requests a NaN survival cuts: a NaN on a node the walk reaches (a candidate's child, j below the caps)."""
    mv = t.kw.get("max_verify", t.N)
    ids = t.kw.get("draft_tokens")
    n = 0
    for r in range(t.R):
        reach = set()
        cut = False
        for j in range(min(int(t.sizes[r]), mv)):
            p = int(t.parents[r, j])
            if (ids is not None and int(ids[r, j]) < 0) or (p >= 0 and p not in reach):
                continue
            if torch.isnan(t.survival[r, j]):
                cut = True
                continue
            reach.add(j)
        n += cut
    return n


# ----------------------------------------------------------------------------------------------------
# tree_survival
# ----------------------------------------------------------------------------------------------------


def survival_case(rng) -> Case:
    t = tree_inputs(rng, metadata=False)
    g = Guards()
    conf = g.tensor("conf", t.conf, row_gap=int(pick(rng, [0, 2])))
    parents = g.tensor("parents", t.parents)
    sizes = g.tensor("tree_sizes", t.sizes)
    out = g.empty("out", (t.R, t.N), torch.float32) if maybe(rng, 0.5) else None
    r = rng.random()
    if r < 0.6:
        def check(got):
            same("survival", got, ref.tree_survival(t.conf, t.parents, t.sizes))
            mask = torch.arange(t.N)[None, :] < t.sizes.long()[:, None]
            counts({"nan_survival": int((torch.isnan(t.conf) & mask).sum())})

        nan = bool(torch.isnan(t.conf).any())
        return Case("safe" if nan else "valid", lambda: tree_survival(conf, parents, sizes, out=out), check,
                    guards=g, what=f"R={t.R} N={t.N}")
    if r < 0.8 and t.R:
        return _bad_tree_values(rng, g, t, lambda p, s: tree_survival(conf, p, s, out=out), t.N)
    args = {"conf": conf, "parents": parents, "tree_sizes": sizes}
    name = pick(rng, list(args))
    allowed = {"conf": (torch.float32,), "parents": (torch.int32, torch.int64), "tree_sizes": (torch.int32,)}[name]
    desc, value, kind = pick(rng, tensor_variants(args[name], allowed_dtypes=allowed))
    args[name] = value
    return Case(kind, lambda: tree_survival(args["conf"], args["parents"], args["tree_sizes"], out=out), guards=g,
                names=("conf", "parents", "tree_sizes", "out"), what=f"{name}: {desc}")


def _bad_tree_values(rng, g: Guards, t: TreeInputs, call, window: int) -> Case:
    """A parent outside [-1, j) (not topological or out of range) on a node within its tree, or a size outside
    [0, N]: the CPU kernel refuses it by name. The planner looks only at nodes below ``window`` (max_verify):
    a bad parent past it is never read (documented), so that call may succeed."""
    r = int(rng.integers(0, t.R))
    if maybe(rng, 0.6) and int(t.sizes[r]):
        j = int(rng.integers(0, int(t.sizes[r])))
        p = t.parents.clone()
        p[r, j] = pick(rng, [j, j + 1, -2, t.N, 2**31 - 1, -(2**31)])
        bad_p, ok_s = g.tensor("parents2", p), g.tensor("tree_sizes.ok", t.sizes)
        return Case("invalid" if j < window else "maybe", lambda: call(bad_p, ok_s), guards=g, names=("parents",),
                    what=f"parents[{r}, {j}] = {int(p[r, j])}")
    s = t.sizes.clone()
    s[r] = pick(rng, [-1, t.N + 1, 2**31 - 1, -(2**31)])
    bad_s, ok_p = g.tensor("tree_sizes2", s), g.tensor("parents.ok", t.parents)
    return Case("invalid", lambda: call(ok_p, bad_s), guards=g, names=("tree_sizes",),
                what=f"tree_sizes[{r}] = {int(s[r])}")


# ----------------------------------------------------------------------------------------------------
# choose_budget(parents=...) and plan_tree_verification
# ----------------------------------------------------------------------------------------------------


def _guarded_tree_plan(g: Guards, Rp: int, Tp: int, kw) -> TreeVerifyPlan:
    """The chain plan's guarded buffers, and the tree's four [Tp] fields."""
    chain = _guarded_plan(g, Rp, Tp, kw)
    i32 = torch.int32
    return TreeVerifyPlan(
        **{f.name: getattr(chain, f.name) for f in dataclasses.fields(chain)},
        tree_mask=g.empty("out.tree_mask", (Tp,), torch.int64), token_parent=g.empty("out.token_parent", (Tp,), i32),
        token_node=g.empty("out.token_node", (Tp,), i32), token_depth=g.empty("out.token_depth", (Tp,), i32),
    )


def _padded(t: TreeInputs, table) -> tuple:
    kw = {k: v for k, v in t.kw.items() if k in ("mode", "max_verify", "extra_tokens", "num_tokens_padded",
                                                "num_reqs_padded", "budget", "min_verify")}
    a = ref.resolve_args(t.survival, t.sizes, table, **kw)
    return a.num_reqs_padded, a.num_tokens_padded


def plan_case(rng) -> Case:
    t = tree_inputs(rng, metadata=maybe(rng, 0.6))
    table = random_table(rng)
    limit = table.token_limit
    if t.R + t.kw.get("extra_tokens", 0) + t.R * t.N > limit:
        return survival_case(rng)  # the table cannot price this batch: its bound is the planner fuzzer's business
    g = Guards()
    survival = g.tensor("survival", t.survival, row_gap=int(pick(rng, [0, 3])))
    parents, sizes = g.tensor("parents", t.parents), g.tensor("tree_sizes", t.sizes)
    kw = {k: g.tensor(k, v) if isinstance(v, torch.Tensor) else v for k, v in t.kw.items()}
    r = rng.random()
    if r < 0.6:
        Rp, Tp = _padded(t, table)
        out = _guarded_tree_plan(g, Rp, Tp, kw) if maybe(rng, 0.5) else None
        bt = t.kw.get("block_table")
        if bt is not None and t.R and \
                int((t.kw["context_lens"].long() + t.sizes.long()).max()) // t.kw["block_size"] >= bt.shape[1]:
            return Case("invalid", lambda: plan_tree_verification(survival, parents, sizes, table, out=out, **kw),
                        names=("block_table",), guards=g, what="block table too short")

        def check(plan):
            want = ref.plan_tree_verification(t.survival, t.parents, t.sizes, table, **t.kw)
            for f in dataclasses.fields(TreeVerifyPlan):
                same(f.name, getattr(plan, f.name), getattr(want, f.name))
            counts({"nan_survival": _nan_requests(t)})

        return Case("valid", lambda: plan_tree_verification(survival, parents, sizes, table, out=out, **kw), check,
                    guards=g, what=f"R={t.R} N={t.N} {t.kw['mode']} meta={'context_lens' in t.kw}")
    if r < 0.7 and t.kw["mode"] != "fixed":
        choose_kw = {k: v for k, v in kw.items() if k in ("mode", "min_verify", "max_verify", "extra_tokens")}

        def check_budget(b):
            want = ref.choose_budget(t.survival, t.sizes, table, parents=t.parents,
                                     **{k: v for k, v in t.kw.items() if k in choose_kw})
            same("budget", b, want)

        return Case("valid", lambda: choose_budget(survival, sizes, table, parents=parents, **choose_kw),
                    check_budget, guards=g, what=f"choose_budget R={t.R} N={t.N} {t.kw['mode']}")
    if r < 0.8 and t.R:
        return _bad_tree_values(rng, g, t, lambda p, s: plan_tree_verification(survival, p, s, table, **kw),
                                t.kw.get("max_verify", t.N))
    if r < 0.85 and t.R and t.N > 1 and kw.get("draft_tokens") is not None:
        # Two children of one node with the same token: the CPU refuses the tree (sample-and-match needs distinct
        # siblings), naming draft_tokens.
        ids = t.kw["draft_tokens"].clone()
        row = int(rng.integers(0, t.R))
        n = int(t.sizes[row])
        pairs = [(i, j) for j in range(min(n, t.N)) for i in range(j) if int(t.parents[row, i]) == int(t.parents[row, j])]
        if pairs:
            i, j = pairs[int(rng.integers(0, len(pairs)))]
            ids[row, j] = ids[row, i] = abs(int(ids[row, i]))
            kw["draft_tokens"] = g.tensor("draft_tokens2", ids)
            mv = t.kw.get("max_verify", t.N)
            kind = "invalid" if j < mv else "maybe"  # nodes past max_verify are never looked at
            return Case(kind, lambda: plan_tree_verification(survival, parents, sizes, table, **kw), guards=g,
                        names=("draft_tokens",), what=f"duplicate siblings {i}, {j} of request {row}")
    target = pick(rng, ["tensor", "scalar", "N"])
    args = {"survival": survival, "parents": parents, "tree_sizes": sizes}
    if target == "N":  # more nodes than a 64-bit mask holds
        N = MAX_TREE_NODES + int(pick(rng, [1, 2, 65]))
        return Case("invalid", lambda: plan_tree_verification(torch.zeros(t.R, N), torch.full((t.R, N), -1,
                                                               dtype=torch.int32), sizes, table, **kw), guards=g,
                    names=("survival", "parents", "N"), what=f"N={N}")
    if target == "scalar":
        name = pick(rng, ["min_verify", "max_verify", "extra_tokens", "token_offset", "num_reqs_padded", "budget"])
        value, kind = int_arg(rng, 0, {"max_verify": 63, "num_reqs_padded": 2**26, "budget": 2**200}.get(name, 2**31 - 1),
                              none_ok=name == "max_verify")
        if name == "budget" and kw["mode"] != "fixed":
            kind = "invalid" if value is not None else "maybe"
        kw[name] = value
        return Case(kind, lambda: plan_tree_verification(survival, parents, sizes, table, **kw), guards=g,
                    names=(name,), what=f"{name}={value!r}")
    present = list(args) + [k for k in ("context_lens", "block_table", "anchor_tokens", "draft_tokens")
                            if kw.get(k) is not None]
    name = pick(rng, present)
    base = args.get(name, kw.get(name))
    allowed = (torch.float32,) if name == "survival" else (torch.int32, torch.int64)
    desc, value, kind = pick(rng, tensor_variants(base, allowed_dtypes=allowed))
    if name in args:
        args[name] = value
    else:
        kw[name] = value
    names = (name, "survival", "parents", "tree_sizes", "draft_tokens", "anchor_tokens", "block_table")
    return Case(kind, lambda: plan_tree_verification(args["survival"], args["parents"], args["tree_sizes"], table,
                                                     **kw), guards=g, names=names, what=f"{name}: {desc}")


# ----------------------------------------------------------------------------------------------------
# commit_tree_kv
# ----------------------------------------------------------------------------------------------------


def commit_case(rng) -> Case:
    R = small_int(rng, 6)
    W = int(pick(rng, [1, 2, 5, 17, 64]))
    bs = int(pick(rng, [1, 2, 16]))
    Hkv, D = int(pick(rng, [1, 2])), int(pick(rng, [1, 8]))
    dtype = pick(rng, [torch.float32, torch.float16, torch.bfloat16])
    ctx = ints(rng, 0, 40, (R,))
    max_blocks = (40 + W + 8 + bs) // bs + 1  # room for every path below: context + offset < 40 + W + 8
    num_blocks = R * max_blocks + 1
    # Each request owns distinct blocks (as a paged cache does): moves of one never land in another's.
    bt = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(int(rng.integers(0, 2**31))))[
        : R * max_blocks].to(torch.int32).reshape(R, max_blocks)
    acc = torch.zeros(R, W, dtype=torch.int32)
    num = torch.zeros(R, dtype=torch.int32)
    for r in range(R):
        n = small_int(rng, min(W - 1, 63))
        offs = sorted(rng.choice(range(1, min(64, W + 8)), size=min(n, min(63, W + 7)), replace=False).tolist())
        num[r] = len(offs)
        acc[r, 1:1 + len(offs)] = torch.tensor(offs, dtype=torch.int32)
    k = floats(rng, (num_blocks, bs, Hkv, D), -2, 2, dtype)
    v = floats(rng, (num_blocks, bs, Hkv, D), -2, 2, dtype)
    g = Guards()
    kc, vc = g.tensor("k_cache", k), g.tensor("v_cache", v)
    args = dict(block_table=g.tensor("block_table", bt, row_gap=int(pick(rng, [0, 2]))),
                context_lens=g.tensor("context_lens", ctx), accepted_offsets=g.tensor("accepted_offsets", acc),
                num_accepted=g.tensor("num_accepted", num))
    call = lambda: commit_tree_kv(kc, vc, args["block_table"], args["context_lens"],  # noqa: E731
                                  args["accepted_offsets"], args["num_accepted"])
    r = rng.random()
    if r < 0.5:
        def check(_):
            wk, wv = ref.commit_tree_kv(k, v, bt, ctx, acc, num)
            same("k_cache", kc, wk)
            same("v_cache", vc, wv)
            counts({})

        return Case("valid", call, check, guards=g, what=f"R={R} W={W} bs={bs} {dtype}")
    if r < 0.8 and R:
        row = int(rng.integers(0, R))
        a2, n2, c2 = acc.clone(), num.clone(), ctx.clone()
        what = pick(rng, ["num", "order", "range", "ctx"])
        if what == "num":
            n2[row] = pick(rng, [-1, W, 64, 2**31 - 1])
            name = "num_accepted"
        elif what == "ctx":
            c2[row] = pick(rng, [-1, -(2**31), max_blocks * bs, 2**31 - 1])
            name = "context_lens"
        elif W > 2:
            n2[row] = 2
            a2[row, 1], a2[row, 2] = (3, 3) if what == "order" else (1, pick(rng, [64, 2**31 - 1, -1, 0]))
            name = "accepted_offsets"
        else:
            n2[row] = pick(rng, [W, 2**31 - 1])
            name = "num_accepted"
        args.update(accepted_offsets=g.tensor("accepted_offsets2", a2), num_accepted=g.tensor("num_accepted2", n2),
                    context_lens=g.tensor("context_lens2", c2))
        # (a context length whose path still fits the request's blocks is valid: the call may succeed)
        kind = "maybe" if name == "context_lens" else "invalid"
        return Case(kind, call, guards=g, names=("accepted_offsets", "num_accepted", "context_lens", "block_table"),
                    what=f"{what} of request {row}")
    name = pick(rng, ["k_cache", "v_cache", "block_table", "context_lens", "accepted_offsets", "num_accepted"])
    base = {"k_cache": kc, "v_cache": vc, **args}[name]
    allowed = (dtype,) if name in ("k_cache", "v_cache") else (torch.int32,)
    desc, value, kind = pick(rng, tensor_variants(base, allowed_dtypes=allowed))
    if name == "k_cache":
        kc = value
    elif name == "v_cache":
        vc = value
    else:
        args[name] = value
    return Case(kind, call, guards=g, names=("k_cache", "v_cache", "block_table", "context_lens", "accepted_offsets",
                                             "num_accepted"), what=f"{name}: {desc}")


__all__ = ["commit_case", "plan_case", "survival_case"]


# ----------------------------------------------------------------------------------------------------
# choose_tree_shape
# ----------------------------------------------------------------------------------------------------


def shape_case(rng) -> Case:
    """choose_tree_shape on valid random trees and a level-by-level drafter's random table (capacity, prompt
    tokens, emitting prefills, invalidated drafts, weights, a latency target, the depth range, conf=), against the
    reference's brute force over (W, D, B); no error counted (the survivals are NaN-free)."""
    t = tree_inputs(rng, metadata=False)
    table = random_table(rng, levels=int(pick(rng, [1, 2, 4, 6])))
    conf = torch.nan_to_num(t.conf, nan=0.5)
    survival = ref.tree_survival(conf, t.parents, t.sizes)
    kw = {k: v for k, v in t.kw.items() if k in ("max_verify", "extra_tokens")}
    if maybe(rng, 0.3):
        kw["extra_emitting"] = small_int(rng, 4)
    if maybe(rng, 0.3):
        kw["capacity"] = t.R + kw.get("extra_tokens", 0) + small_int(rng, t.R * t.N + 2)
    if maybe(rng, 0.3):
        kw["draft_tokens"] = _distinct_tokens(rng, t.R, t.N)
        if t.R and t.N:
            kw["draft_tokens"][int(rng.integers(0, t.R)), int(rng.integers(0, t.N))] = -1
    if maybe(rng, 0.3):
        kw["weights"] = floats(rng, (t.R,), 0.0, 3.0)
    if maybe(rng, 0.2):
        kw["max_step_ms"] = float(rng.uniform(0.5, 30.0))
    if kw.get("capacity") is not None and table.max_tokens is not None:
        kw["capacity"] = min(kw["capacity"], table.max_tokens)
    if t.R + kw.get("extra_tokens", 0) > min(table.token_limit, kw.get("capacity") or table.token_limit):
        return plan_case(rng)  # (this table leaves these requests no room: a case of another kind)
    levels = table.draft_levels
    if maybe(rng, 0.35):
        return _bad_shape_case(rng, t, survival, table, kw)
    max_width = int(pick(rng, [1, 2, 3, 4, 8]))
    max_depth = small_int(rng, levels) if maybe(rng, 0.3) else None
    min_depth = small_int(rng, levels if max_depth is None else max_depth) if maybe(rng, 0.3) else 0
    shape = dict(max_width=max_width, max_depth=max_depth, min_depth=min_depth)
    width_shape = ()
    if maybe(rng, 0.4):  # per-level widths: random profiles (any order, not only non-increasing)
        d_hi = levels if max_depth is None else max_depth
        n = min(int(rng.integers(1, 7)), 128 // (d_hi + 1))
        shape = dict(widths=[tuple(int(x) for x in rng.integers(1, max_width + 1, max(d_hi - 1, 0)))
                             for _ in range(n)], max_depth=max_depth, min_depth=min_depth)
        width_shape = (d_hi,)
    out = (torch.full((), -3, dtype=torch.int32), torch.full(width_shape, -3, dtype=torch.int32),
           torch.full((), -3, dtype=torch.int32)) if maybe(rng, 0.4) else None
    use_conf = maybe(rng, 0.3)

    def call():
        if use_conf:
            return choose_tree_shape(None, t.parents, t.sizes, table, conf=conf, out=out, **shape, **kw)
        return choose_tree_shape(survival, t.parents, t.sizes, table, out=out, **shape, **kw)

    def check(result):
        want = ref.choose_tree_shape(survival, t.parents, t.sizes, table, **shape, **kw)
        for name, got, exp in zip(("depth", "width", "budget"), result, want):
            same(name, got, exp)
        counts({})

    return Case("valid", call, check, what=f"R={t.R} N={t.N} levels={levels} shape={shape} kw={sorted(kw)}")


def _bad_shape_case(rng, t: TreeInputs, survival, table, kw) -> Case:
    """choose_tree_shape with one argument bad (the rest valid): a clear error naming it."""
    name = str(pick(rng, ["max_width", "max_depth", "min_depth", "cost_table", "parents", "survival", "out", "widths"]))
    args = dict(survival=survival, parents=t.parents, tree_sizes=t.sizes, cost_table=table)
    shape = dict(max_width=int(pick(rng, [1, 2, 4])))
    if name == "max_width":
        shape["max_width"] = int(pick(rng, [0, -1, 17, 1000]))
    elif name == "max_depth":
        shape["max_depth"] = int(pick(rng, [-1, table.draft_levels + 1, 40]))
    elif name == "min_depth":
        shape["min_depth"] = int(pick(rng, [-1, table.draft_levels + 1]))
    elif name == "cost_table":
        args["cost_table"] = random_table(rng)  # a block drafter's: no per-level cost
    elif name == "parents":
        if t.R == 0 or t.N < 2:
            return shape_case(rng)
        parents, sizes = t.parents.clone(), t.sizes.clone()
        r, j = int(rng.integers(0, t.R)), int(rng.integers(1, t.N))
        parents[r, j] = j if maybe(rng, 0.5) else -2
        sizes[r] = t.N
        kw = {k: v for k, v in kw.items() if k != "max_verify"}
        args.update(parents=parents, tree_sizes=sizes)
    elif name == "survival":
        args["survival"] = survival.double()
    elif name == "widths":  # empty, out of [1, 16], uneven, not a list, too short for the depth, too many
        L = table.draft_levels
        shape = dict(widths=pick(rng, [[], [(0,) * L], [(17,) * L], [(2,) * L, (1,) * (L + 1)], "wide",
                                       [(1,) * (L - 2)] if L >= 2 else [(1,)] * 200]), max_depth=L)
    else:
        shape["out"] = (torch.zeros((), dtype=torch.int32),) * int(pick(rng, [1, 3]))

    def call():
        return choose_tree_shape(args["survival"], args["parents"], args["tree_sizes"], args["cost_table"],
                                 **shape, **kw)

    return Case("invalid", call, names=(name,), what=f"R={t.R} N={t.N} bad {name}")
