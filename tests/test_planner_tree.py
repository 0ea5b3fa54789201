"""Tests for the draft-tree planner (docs/design.md, "Draft trees"): tree_survival, choose_budget(parents=),
plan_tree_verification.

- Property tests (hypothesis), on every generated input: the C++ CPU kernel equals the torch reference integer for
  integer (fresh and into out= buffers poisoned with two sentinels, so every padding lane is written), and both
  satisfy the design's invariants, each checked by an independent loop written here: every plan is ancestor-closed;
  the budget is Algorithm 1 / the brute-force argmax of Theta over the canonical order; the verified set for a
  budget is the brute-force best ancestor-closed set of that size (by enumeration of every such set on small
  trees); masks hold exactly the ancestor bits; positions follow depth and slots the offset; a chain given as a
  tree plans exactly what plan_verification plans.
- Hand-written cases with exact expected outputs, the confidence path (conf=), and bad inputs (each error names
  its argument).
"""
import dataclasses
import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import adaptive_verify as av
from adaptive_verify import errors as av_errors
from adaptive_verify import reference as ref
from adaptive_verify.planner import TreeVerifyPlan, resolve_plan_args
from adaptive_verify.planner.launch import pack_plan_args
from adaptive_verify.planner.ops import token_views
from test_planner import algorithm1, brute_force_argmax, gen_cost_table, model_budget_cap

FIXED_ONE = 2**32
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
CHAIN_FIELDS = ("verify_lens", "budget", "expected_tokens", "num_tokens", "query_start_loc", "token_req", "seq_lens",
                "positions", "slot_mapping", "input_ids")
TREE_FIELDS = CHAIN_FIELDS + ("tree_mask", "token_parent", "token_node", "token_depth")
DTYPES = {name: torch.int32 for name in TREE_FIELDS}
DTYPES.update(expected_tokens=torch.float32, slot_mapping=torch.int64, tree_mask=torch.int64)


def i32(values):
    return torch.tensor(values, dtype=torch.int32)


def linear_table(draft_ms=2.0, **kwargs):
    """verify_cost(n) == n exactly for 1 <= n <= 64 (and flat at 1 for n = 0)."""
    return av.CostTable.from_points({1: 1.0, 64: 64.0}, draft_ms=draft_ms, **kwargs)


# ----------------------------------------------------------------------------------------------------------
# Independent model of the design (pure Python loops)
# ----------------------------------------------------------------------------------------------------------


def model_tree_candidates(survival, parents, sizes, min_verify, max_verify, tokens=None):
    """Candidate nodes as (forced, s, depth, r, node) in canonical order, and the requests a NaN cut.

    A node is looked at when j < min(size, max_verify); it is a candidate when its parent is the anchor or a
    candidate, its token (if given) is >= 0 and differs from every earlier sibling's, and its survival is not NaN.
    s = min(clamp(survival, 0, 1), s(parent)).
    """
    S, P, sz = survival.tolist(), parents.tolist(), sizes.tolist()
    T = None if tokens is None else tokens.tolist()
    cands, nan_rows = [], 0
    for r in range(len(S)):
        info, nan = {}, False
        for j in range(min(sz[r], max_verify)):
            p = P[r][j]
            if T is not None:
                if T[r][j] < 0:
                    continue
                if any(P[r][q] == p and T[r][q] == T[r][j] for q in range(j)):
                    continue
            if p >= 0 and p not in info:
                continue
            x = S[r][j]
            if math.isnan(x):
                nan = True
                continue
            x = min(x, 1.0) if x > 0 else 0.0
            s = min(x, info[p][0]) if p >= 0 else x
            d = info[p][1] + 1 if p >= 0 else 1
            info[j] = (s, d)
            cands.append((j < min_verify, s, d, r, j))
        nan_rows += nan
    cands.sort(key=lambda c: (not c[0], -c[1], c[2], c[3], c[4]))
    return cands, nan_rows


def model_theta(R, extra_tokens, extra_emitting, cost_table, prefix):
    fixed = np.float32(cost_table.fixed_cost(R))

    def theta(B):
        cost = np.float32(fixed + np.float32(cost_table.verify_cost(R + extra_tokens + B)))
        return ((R + extra_emitting) * FIXED_ONE + prefix[B]) / float(cost)

    return theta


def model_layout(plan, parents, R, context_lens, block_table, block_size, anchors, tokens):
    """The per-token tree outputs recomputed from verify_lens' node sets (token_node) by a loop: offsets, depths by
    walking parents to the anchor, masks from the ancestors' offsets, slots from the KV index."""
    qsl, node = plan.query_start_loc.tolist(), plan.token_node.tolist()
    P = parents.tolist()
    off0 = qsl[0]
    want = {k: [] for k in ("token_parent", "token_depth", "tree_mask", "positions", "slot_mapping", "input_ids")}
    for r in range(R):
        nodes = node[qsl[r] - off0 + 1: qsl[r + 1] - off0]
        offset = {n: 1 + i for i, n in enumerate(nodes)}
        assert nodes == sorted(nodes), "verified nodes are laid out in increasing node index"
        ctx = 0 if context_lens is None else int(context_lens[r])
        for i, n in enumerate([-1] + nodes):
            chain, q = [], n
            while q >= 0:
                chain.append(q)
                q = P[r][q]
            depth = len(chain)
            mask = 1
            for a in chain:
                mask |= 1 << offset[a]
            if mask >= 1 << 63:  # bit 63 (a token 63 places after its anchor): the int64 tensor's sign bit
                mask -= 1 << 64
            want["token_parent"].append(-1 if n < 0 else (0 if P[r][n] < 0 else offset[P[r][n]]))
            want["token_depth"].append(depth)
            want["tree_mask"].append(mask)
            want["positions"].append(ctx + depth)
            if block_table is not None:
                kv = ctx + i
                want["slot_mapping"].append(int(block_table[r, kv // block_size]) * block_size + kv % block_size)
            if anchors is not None:
                want["input_ids"].append(int(anchors[r]) if n < 0 else int(tokens[r, n]))
    return want


# ----------------------------------------------------------------------------------------------------------
# Input generation
# ----------------------------------------------------------------------------------------------------------

TREE_STYLES = ("random", "chain", "star", "bushy", "levels")


def gen_parents(rng, R, N, style):
    """[R, N] int32 topological parents in one of several shapes (per row, random where the style allows)."""
    P = np.empty((R, N), dtype=np.int32)
    for r in range(R):
        for j in range(N):
            if style == "chain":
                P[r, j] = j - 1
            elif style == "star":
                P[r, j] = -1
            elif style == "bushy":  # k-ary heap shapes: many siblings at every level
                k = 2 + r % 3
                P[r, j] = (j - 1) // k if j else -1
            elif style == "levels":  # EAGLE-2 style: each level's nodes hang from the previous level
                width = 1 + r % 4
                P[r, j] = -1 if j < width else int(rng.integers(j - j % width - width, j - j % width))
            else:
                P[r, j] = int(rng.integers(-1, j)) if j else -1
    return torch.from_numpy(P)


def gen_tokens(rng, R, N, parents, invalid_rate=0.0):
    """Draft tokens with distinct siblings (a node's id is unique within the row), some invalidated (-1)."""
    ids = np.stack([rng.permutation(32000)[:N] for _ in range(R)]).astype(np.int32) if R else np.zeros((0, N),
                                                                                                     np.int32)
    if invalid_rate:
        ids[rng.random((R, N)) < invalid_rate] = -1
    return torch.from_numpy(ids)


def gen_node_survival(rng, conf_style, parents, sizes, nan_rate):
    R, N = parents.shape
    if conf_style == "raw":  # arbitrary values: children above parents, out of [0, 1], specials
        values = rng.uniform(-0.2, 1.2, size=(R, N)).astype(np.float32)
        special = rng.random((R, N)) < 0.3
        values[special] = rng.choice(np.array([0.0, -0.0, 1.0, 0.5, np.inf, -np.inf, 1e-45], np.float32),
                                     size=int(special.sum()))
    else:
        conf = rng.uniform(0.0, 1.0, size=(R, N)).astype(np.float32)
        if conf_style == "ties":
            conf = rng.choice(np.array([0.0, 0.25, 0.5, 1.0], np.float32), size=(R, N))
        values = ref.tree_survival(torch.from_numpy(conf), parents, sizes).numpy()
    if nan_rate:
        values[rng.random((R, N)) < nan_rate] = np.nan
    return torch.from_numpy(np.ascontiguousarray(values))


TREE_MODES = ("greedy", "global", "fixed_int", "fixed_tensor", "all")


@st.composite
def tree_cases(draw, modes=TREE_MODES, small=False, max_n=63):
    mode = draw(st.sampled_from(modes))
    R = draw(st.integers(1, 4) if small else st.one_of(st.integers(1, 6), st.integers(1, 120)))
    N = draw(st.integers(1, 5) if small else st.one_of(st.integers(1, 12), st.integers(1, max_n)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    parents = gen_parents(rng, R, N, draw(st.sampled_from(TREE_STYLES)))
    sizes = torch.from_numpy(rng.integers(0, N + 1, size=R).astype(np.int32))
    if draw(st.booleans()):
        sizes.fill_(N)
    survival = gen_node_survival(rng, draw(st.sampled_from(("product", "ties", "raw"))), parents, sizes,
                                 draw(st.sampled_from((0.0, 0.0, 0.05))))
    if draw(st.booleans()):  # row-strided views must work like contiguous tensors
        wide = torch.full((R, N + 2), float("nan"))
        wide[:, :N] = survival
        survival = wide[:, :N]
    max_verify = draw(st.one_of(st.none(), st.integers(0, N)))
    mv = N if max_verify is None else max_verify
    min_verify = draw(st.integers(0, mv))
    extra_tokens = draw(st.sampled_from((0, 0, 3, 20)))
    extra_emitting = draw(st.sampled_from((0, 0, 2)))
    anchors = R + extra_tokens
    cost_table = gen_cost_table(rng, anchors) if mode in ("greedy", "global") or draw(st.booleans()) else None
    capacity = None
    if draw(st.booleans()):
        hi = anchors + R * mv + 5
        if cost_table is not None and cost_table.max_tokens is not None:
            hi = min(hi, cost_table.max_tokens)
        capacity = draw(st.integers(anchors, hi))
    cap = model_budget_cap(R, mv, extra_tokens, capacity, cost_table, None)
    kwargs = dict(mode=mode.split("_")[0], min_verify=min_verify, max_verify=max_verify, extra_tokens=extra_tokens,
                  extra_emitting=extra_emitting, capacity=capacity, token_offset=draw(st.sampled_from((0, 7))),
                  num_reqs_padded=draw(st.one_of(st.none(), st.integers(R, R + 3))),
                  num_tokens_padded=draw(st.one_of(st.none(), st.integers(R, R + cap + 6))))
    if mode.startswith("fixed"):
        want = draw(st.integers(0, R * N + 3))
        kwargs["budget"] = want if mode == "fixed_int" else torch.tensor(want, dtype=torch.int32)
    if draw(st.booleans()):
        ctx = rng.integers(0, 100, size=R)
        kwargs["context_lens"] = torch.from_numpy(ctx.astype(np.int32))
        if draw(st.booleans()):
            block_size = draw(st.sampled_from((1, 4, 16)))
            max_blocks = -(-(int(ctx.max()) + N + 1) // block_size)
            kwargs["block_table"] = torch.from_numpy(rng.integers(0, 5000, size=(R, max_blocks)).astype(np.int32))
            kwargs["block_size"] = block_size
    if draw(st.booleans()):
        kwargs["draft_tokens"] = gen_tokens(rng, R, N, parents, draw(st.sampled_from((0.0, 0.1))))
        if draw(st.booleans()):
            kwargs["anchor_tokens"] = torch.from_numpy(rng.integers(0, 32000, size=R).astype(np.int32))
    return dict(survival=survival, parents=parents, sizes=sizes, cost_table=cost_table, kwargs=kwargs)


def poisoned_out(Rp, Tp, kwargs, sentinel):
    out = TreeVerifyPlan.allocate(Rp, Tp, "cpu", positions=kwargs.get("context_lens") is not None,
                                  slot_mapping=kwargs.get("block_table") is not None,
                                  input_ids=kwargs.get("anchor_tokens") is not None)
    for f in dataclasses.fields(out):
        if getattr(out, f.name) is not None:
            getattr(out, f.name).fill_(sentinel)
    return out


def assert_plans_equal(got, want, context="", fields=TREE_FIELDS):
    for name in fields:
        g, w = getattr(got, name), getattr(want, name)
        assert (g is None) == (w is None), f"{context}{name}: {g} vs {w}"
        if g is None:
            continue
        assert g.dtype == w.dtype == DTYPES[name], f"{context}{name}: dtypes {g.dtype} / {w.dtype}"
        assert torch.equal(g, w), f"{context}{name}:\ngot  {g.tolist()}\nwant {w.tolist()}"


# ----------------------------------------------------------------------------------------------------------
# 1. Property tests
# ----------------------------------------------------------------------------------------------------------


def check_tree_case(case):
    survival, parents, sizes, table, kwargs = (case[k] for k in ("survival", "parents", "sizes", "cost_table",
                                                                "kwargs"))
    R, N = survival.shape
    mode = kwargs["mode"]
    mv = N if kwargs["max_verify"] is None else kwargs["max_verify"]
    Rp = R if kwargs["num_reqs_padded"] is None else kwargs["num_reqs_padded"]
    cap = model_budget_cap(R, mv, kwargs["extra_tokens"], kwargs["capacity"], table, kwargs["num_tokens_padded"])
    Tp = R + cap if kwargs["num_tokens_padded"] is None else kwargs["num_tokens_padded"]

    # ---- the model: canonical order, budget ----
    cands, nan_rows = model_tree_candidates(survival, parents, sizes, kwargs["min_verify"], mv,
                                            kwargs.get("draft_tokens"))
    n_forced = sum(c[0] for c in cands)
    b_max = min(len(cands), cap)
    b_min = min(n_forced, b_max)
    prefix = [0]
    for c in cands:
        prefix.append(prefix[-1] + int(c[1] * FIXED_ONE))
    if mode in ("greedy", "global"):
        theta = model_theta(R, kwargs["extra_tokens"], kwargs["extra_emitting"], table, prefix)
        want_budget = (algorithm1 if mode == "greedy" else brute_force_argmax)(theta, b_min, b_max)
    elif mode == "fixed":
        want_budget = max(b_min, min(int(kwargs["budget"]), b_max))
    else:
        want_budget = b_max

    # ---- kernel (allocating, and into poisoned out=) vs reference ----
    av_errors.reset_error_counts("cpu")
    plan = av.plan_tree_verification(survival, parents, sizes, table, **kwargs)
    assert av_errors.error_counts("cpu")["nan_survival"] == nan_rows
    expected = ref.plan_tree_verification(survival, parents, sizes, table, **kwargs)
    assert_plans_equal(plan, expected, "allocating: ")
    for sentinel in (12345, -7):  # an element left unwritten cannot equal the reference under both
        out = poisoned_out(Rp, Tp, kwargs, sentinel)
        got = av.plan_tree_verification(survival, parents, sizes, table, out=out, **kwargs)
        assert_plans_equal(got, expected, f"out= poisoned with {sentinel}: ")
        assert got.tree_mask.data_ptr() == out.tree_mask.data_ptr()

    # ---- invariants ----
    budget = int(plan.budget)
    assert budget == want_budget, f"budget {budget}, model {want_budget} (B_min {b_min}, B_max {b_max})"
    chosen = {(c[3], c[4]) for c in cands[:budget]}
    nodes = plan.token_node.tolist()
    reqs = plan.token_req.tolist()
    verified = {(r, n) for r, n in zip(reqs, nodes) if n >= 0}
    assert verified == chosen, "verified nodes != the first B candidates of the canonical order"
    P = parents.tolist()
    for r, n in verified:  # ancestor-closed
        assert P[r][n] < 0 or (r, P[r][n]) in verified, f"request {r}: node {n} verified without its parent"
    lens = plan.verify_lens.tolist()
    assert lens[:R] == [sum(1 for q, _ in verified if q == r) for r in range(R)] and sum(lens) == budget
    assert lens[R:] == [0] * (Rp - R)
    want = model_layout(plan, parents, R, kwargs.get("context_lens"), kwargs.get("block_table"),
                        kwargs.get("block_size"), kwargs.get("anchor_tokens"), kwargs.get("draft_tokens"))
    T = R + budget
    assert plan.token_parent.tolist()[:T] == want["token_parent"]
    assert plan.token_depth.tolist()[:T] == want["token_depth"]
    assert plan.tree_mask.tolist()[:T] == want["tree_mask"]
    assert plan.tree_mask.tolist()[T:] == [0] * (Tp - T) and plan.token_node.tolist()[T:] == [-1] * (Tp - T)
    if kwargs.get("context_lens") is not None:
        assert plan.positions.tolist()[:T] == want["positions"]
    if kwargs.get("block_table") is not None:
        assert plan.slot_mapping.tolist()[:T] == want["slot_mapping"]
    if kwargs.get("anchor_tokens") is not None:
        assert plan.input_ids.tolist()[:T] == want["input_ids"]

    # ---- choose_budget(parents=) chooses the plan's budget ----
    if mode in ("greedy", "global", "all") and kwargs["num_tokens_padded"] is None:
        cb = {k: kwargs[k] for k in ("mode", "min_verify", "max_verify", "extra_tokens", "extra_emitting", "capacity")}
        cb["draft_tokens"] = kwargs.get("draft_tokens")
        got = av.choose_budget(survival, sizes, table, parents=parents, **cb)
        assert int(got) == int(ref.choose_budget(survival, sizes, table, parents=parents, **cb)) == want_budget
    return plan


@pytest.mark.parametrize("mode", TREE_MODES)
@settings(max_examples=30, **SETTINGS)
@given(data=st.data())
def test_tree_plan_properties(mode, data):
    check_tree_case(data.draw(tree_cases(modes=(mode,))))


@settings(max_examples=60, **SETTINGS)
@given(case=tree_cases(small=True))
def test_tree_plan_properties_small(case):
    check_tree_case(case)


def _closed_sets(cands_by_req, parents, B):
    """Every ancestor-closed set of B candidates (over all requests together)."""
    nodes = [(r, n) for r, ns in cands_by_req.items() for n in ns]
    for combo in itertools.combinations(nodes, B):
        s = set(combo)
        if all(parents[r][n] < 0 or (r, parents[r][n]) in s for r, n in s):
            yield s


@settings(max_examples=60, **SETTINGS)
@given(R=st.integers(1, 3), N=st.integers(1, 4), seed=st.integers(0, 2**32 - 1),
       style=st.sampled_from(TREE_STYLES), conf_style=st.sampled_from(("product", "ties", "raw")))
def test_verified_set_is_the_best_ancestor_closed_set(R, N, seed, style, conf_style):
    """For every budget, the verified nodes are the ancestor-closed set of that size with the largest survival sum
    (in the kernels' fixed point), the canonical order breaking ties: found by enumerating every such set."""
    rng = np.random.default_rng(seed)
    parents = gen_parents(rng, R, N, style)
    sizes = torch.from_numpy(rng.integers(0, N + 1, size=R).astype(np.int32))
    survival = gen_node_survival(rng, conf_style, parents, sizes, 0.0)
    cands, _ = model_tree_candidates(survival, parents, sizes, 0, N)
    info = {(c[3], c[4]): c for c in cands}
    by_req = {}
    for r, n in info:
        by_req.setdefault(r, []).append(n)
    P = parents.tolist()

    def rank(s):  # larger fixed-point sum first, then the canonical order of the sorted members
        keys = sorted((-info[x][1], info[x][2], x[0], x[1]) for x in s)
        return (-sum(int(info[x][1] * FIXED_ONE) for x in s), keys)

    for B in range(len(cands) + 1):
        best = min(_closed_sets(by_req, P, B), key=rank)
        plan = av.plan_tree_verification(survival, parents, sizes, mode="fixed", budget=B)
        got = {(r, n) for r, n in zip(plan.token_req.tolist(), plan.token_node.tolist()) if n >= 0}
        assert got == best, f"B={B}: plan {sorted(got)}, best closed set {sorted(best)}"


@settings(max_examples=40, **SETTINGS)
@given(data=st.data())
def test_chain_as_tree_plans_the_chains_integers(data):
    """parents[r, j] = j - 1: plan_tree_verification gives plan_verification's every output, and the tree outputs of
    a chain (lower-triangular masks, depth = offset). Survival may be arbitrary (non-monotone, NaN, out of [0, 1]):
    the tree's cap by the parent is the chain's running minimum."""
    from test_planner import plan_cases
    case = data.draw(plan_cases())
    survival, drafts, table, kwargs = case["survival"], case["drafts"], case["cost_table"], case["kwargs"]
    R, K = survival.shape
    parents = torch.arange(-1, K - 1, dtype=torch.int32).repeat(R, 1)
    chain = av.plan_verification(survival, drafts, table, verification="onehot", **kwargs)
    tree = av.plan_tree_verification(survival, parents, drafts, table, **kwargs)
    assert_plans_equal(tree, chain, "chain as tree: ", fields=CHAIN_FIELDS)
    T = int(tree.num_tokens) - kwargs["token_offset"]
    offsets = [t - q for t, q in zip(range(T), torch.repeat_interleave(
        tree.query_start_loc[:R] - kwargs["token_offset"], 1 + tree.verify_lens[:R].long()).tolist())]
    assert tree.token_depth.tolist()[:T] == offsets
    assert tree.token_node.tolist()[:T] == [o - 1 for o in offsets]
    assert tree.token_parent.tolist()[:T] == [o - 1 if o else -1 for o in offsets]
    assert tree.tree_mask.tolist()[:T] == [(1 << (o + 1)) - 1 for o in offsets]
    if kwargs["mode"] in ("greedy", "global", "all") and kwargs["num_tokens_padded"] is None:
        cb = {k: kwargs[k] for k in ("mode", "min_verify", "max_verify", "extra_tokens", "extra_emitting", "capacity")}
        assert int(av.choose_budget(survival, drafts, table, parents=parents, **cb)) == \
            int(av.choose_budget(survival, drafts, table, **cb))


# ----------------------------------------------------------------------------------------------------------
# 2. tree_survival
# ----------------------------------------------------------------------------------------------------------


@settings(max_examples=40, **SETTINGS)
@given(R=st.integers(0, 40), N=st.integers(1, 63), seed=st.integers(0, 2**32 - 1),
       style=st.sampled_from(TREE_STYLES))
def test_tree_survival_matches_reference(R, N, seed, style):
    rng = np.random.default_rng(seed)
    conf = torch.from_numpy(rng.uniform(-0.2, 1.2, size=(R, N)).astype(np.float32))
    conf[torch.from_numpy(rng.random((R, N)) < 0.05)] = float("nan")
    parents = gen_parents(rng, R, N, style)
    sizes = torch.from_numpy(rng.integers(0, N + 1, size=R).astype(np.int32))
    av_errors.reset_error_counts("cpu")
    got = av.tree_survival(conf, parents, sizes)
    assert torch.equal(got, ref.tree_survival(conf, parents, sizes))
    drafted = torch.arange(N)[None, :] < sizes[:, None]
    assert av_errors.error_counts("cpu")["nan_survival"] == int((torch.isnan(conf) & drafted).sum())
    P = parents.tolist()
    for r in range(R):  # a loop of float32 products along each path
        for j in range(int(sizes[r])):
            path, q = [], j
            while q >= 0:
                path.append(q)
                q = P[r][q]
            a = np.float32(1.0)
            for q in reversed(path):
                c = float(conf[r, q])
                a = np.float32(a * np.float32(min(max(c, 0.0), 1.0) if c == c else 0.0))
            assert got[r, j].item() == a
        assert (got[r, int(sizes[r]):] == 0).all()
    if N <= av.planner.MAX_DRAFTS:  # a chain's survival is prefix_survival's, bit for bit
        chain = torch.arange(-1, N - 1, dtype=torch.int32).repeat(R, 1)
        assert torch.equal(av.tree_survival(conf, chain, sizes), av.prefix_survival(conf, sizes))


def test_plan_from_confidences_equals_tree_survival_then_plan():
    rng = np.random.default_rng(5)
    R, N = 17, 20
    parents = gen_parents(rng, R, N, "levels")
    conf = torch.from_numpy(rng.uniform(0.3, 1.0, size=(R, N)).astype(np.float32))
    conf[2, 3] = float("nan")
    sizes = torch.from_numpy(rng.integers(0, N + 1, size=R).astype(np.int32))
    ct = av.CostTable.from_points({1: 4.0, 64: 4.4, 256: 5.5}, draft_ms=0.5)
    results = []
    for fused in (True, False):
        av_errors.reset_error_counts("cpu")  # one count for the NaN confidence, by whichever call reads it
        if fused:
            buf = torch.full((R, N), -1.0)
            plan = av.plan_tree_verification(None, parents, sizes, ct, conf=conf, survival_out=buf, min_verify=1)
        else:
            buf = av.tree_survival(conf, parents, sizes)
            plan = av.plan_tree_verification(buf, parents, sizes, ct, min_verify=1)
        nan_count = av_errors.error_counts("cpu")["nan_survival"]
        budget = av.choose_budget(None if fused else buf, sizes, ct, conf=conf if fused else None, parents=parents,
                                  min_verify=1)
        results.append((plan, buf, nan_count, int(budget)))
    (a, sa, na, ba), (b, sb, nb, bb) = results
    assert_plans_equal(a, b, "conf=: ")
    assert torch.equal(sa, sb) and na == nb and ba == bb == int(a.budget)


# ----------------------------------------------------------------------------------------------------------
# 3. Hand-written cases
# ----------------------------------------------------------------------------------------------------------


def test_hand_tree_layout():
    """Request 0: anchor -> 0 (0.5) -> {1 (0.5), 2 (0.25)}, and 3 (0.75) under the anchor; request 1 empty.
    Dyadic survivals: every sum is exact. fixed budget 3 takes 3 (0.75), then 0 and 1 (0.5: depth 1 before 2)."""
    parents = i32([[-1, 0, 0, -1], [-1, -1, -1, -1]])
    survival = torch.tensor([[0.5, 0.5, 0.25, 0.75], [1.0, 1.0, 1.0, 1.0]])
    sizes = i32([4, 0])
    plan = av.plan_tree_verification(survival, parents, sizes, mode="fixed", budget=3, context_lens=i32([100, 7]),
                                     anchor_tokens=i32([9, 8]), draft_tokens=i32([[10, 11, 12, 13], [0, 1, 2, 3]]),
                                     num_reqs_padded=3, num_tokens_padded=7)
    assert plan.verify_lens.tolist() == [3, 0, 0] and int(plan.budget) == 3
    assert plan.expected_tokens.item() == 2 + 0.75 + 0.5 + 0.5
    assert plan.query_start_loc.tolist() == [0, 4, 5, 5]
    assert plan.token_req.tolist() == [0, 0, 0, 0, 1, -1, -1]
    assert plan.token_node.tolist() == [-1, 0, 1, 3, -1, -1, -1]
    assert plan.token_depth.tolist() == [0, 1, 2, 1, 0, 0, 0]
    assert plan.token_parent.tolist() == [-1, 0, 1, 0, -1, -1, -1]
    assert plan.tree_mask.tolist() == [0b1, 0b11, 0b111, 0b1001, 0b1, 0, 0]
    assert plan.positions.tolist() == [100, 101, 102, 101, 7, 0, 0]
    assert plan.seq_lens.tolist() == [104, 8, 0]
    assert plan.input_ids.tolist() == [9, 10, 11, 13, 8, 0, 0]


def test_a_step_without_requests_writes_every_tree_padding_lane():
    """Found by the fuzzer (issue 16): with R = 0 the parents tensor is empty (no data pointer), and the CPU kernel
    took the chain path, leaving tree_mask, token_parent, token_node and token_depth unwritten."""
    out = TreeVerifyPlan.allocate(2, 5, positions=True, slot_mapping=True, input_ids=True)
    for f in dataclasses.fields(out):
        t = getattr(out, f.name)
        if t is not None:
            t.fill_(-7)
    empty = dict(context_lens=i32([]), block_table=torch.zeros(0, 3, dtype=torch.int32), block_size=16,
                 anchor_tokens=i32([]), draft_tokens=torch.zeros(0, 4, dtype=torch.int32))
    plan = av.plan_tree_verification(torch.zeros(0, 4), torch.zeros(0, 4, dtype=torch.int32), i32([]), mode="all",
                                     num_reqs_padded=2, num_tokens_padded=5, out=out, **empty)
    want = ref.plan_tree_verification(torch.zeros(0, 4), torch.zeros(0, 4, dtype=torch.int32), i32([]), mode="all",
                                      num_reqs_padded=2, num_tokens_padded=5, **empty)
    for f in dataclasses.fields(plan):
        assert torch.equal(getattr(plan, f.name), getattr(want, f.name)), f.name
    assert plan.tree_mask.tolist() == [0] * 5 and plan.token_node.tolist() == [-1] * 5


def test_a_full_63_node_tree_sets_the_mask_sign_bit():
    """Found by the fuzzer (issue 16): a request verifying all 63 nodes has a token at offset 63, whose mask bit is
    int64's sign bit; the reference overflowed building it."""
    N = 63
    parents = torch.arange(-1, N - 1, dtype=torch.int32)[None, :]  # a chain: the last token sees all 64
    for tree in (parents, torch.full((1, N), -1, dtype=torch.int32)):  # and a star: anchor and itself
        plan = av.plan_tree_verification(torch.full((1, N), 0.5), tree, i32([N]), mode="all")
        want = ref.plan_tree_verification(torch.full((1, N), 0.5), tree, i32([N]), mode="all")
        assert torch.equal(plan.tree_mask, want.tree_mask)
        assert int(plan.tree_mask[N]) < 0  # bit 63
    assert int(plan.tree_mask[N]) == -(1 << 63) + 1  # the star's last node: the anchor (bit 0) and itself


def test_hand_ties_depth_then_request_then_node():
    """Equal survivals: the shallower node first, then the lower request, then the lower node index."""
    parents = i32([[-1, 0, -1], [-1, -1, 1]])
    survival = torch.full((2, 3), 0.5)
    sizes = i32([3, 3])
    order = []
    for B in range(7):
        plan = av.plan_tree_verification(survival, parents, sizes, mode="fixed", budget=B)
        nodes = {(r, n) for r, n in zip(plan.token_req.tolist(), plan.token_node.tolist()) if n >= 0}
        order += sorted(nodes - set(order))
    assert order == [(0, 0), (0, 2), (1, 0), (1, 1), (0, 1), (1, 2)]


def test_hand_forced_nodes_and_max_verify():
    """min_verify forces nodes by index (ancestor-closed since parents precede children); max_verify caps by index."""
    parents = i32([[-1, 0, -1, 2, 0]])
    survival = torch.tensor([[0.1, 0.05, 0.9, 0.8, 0.7]])
    plan = av.plan_tree_verification(survival, parents, i32([5]), mode="fixed", budget=2, min_verify=2)
    assert plan.token_node.tolist()[:3] == [-1, 0, 1]  # the forced nodes 0 and 1, despite their low survival
    plan = av.plan_tree_verification(survival, parents, i32([5]), mode="all", max_verify=3)
    assert plan.token_node.tolist()[:4] == [-1, 0, 1, 2]


def test_hand_global_budget_on_a_linear_cost():
    """verify_cost(n) = n, draft 2: Theta(B) = (R + P(B)) / (2 + R + B). R = 1; survivals 0.75 then 0.5 (siblings):
    Theta(0) = 1/3, Theta(1) = 1.75/4 = 0.4375, Theta(2) = 2.25/5 = 0.45: global takes 2."""
    parents = i32([[-1, -1, 0]])
    survival = torch.tensor([[0.75, 0.5, 0.25]])
    plan = av.plan_tree_verification(survival, parents, i32([3]), linear_table())
    assert int(plan.budget) == 2 and plan.token_node.tolist()[:3] == [-1, 0, 1]
    assert int(av.choose_budget(survival, i32([3]), linear_table(), parents=parents)) == 2


def test_nan_removes_the_subtree_and_counts_the_request_once():
    parents = i32([[-1, 0, 1, -1, 3], [-1, -1, -1, -1, -1]])
    survival = torch.tensor([[0.9, float("nan"), 0.8, 0.7, float("nan")], [0.5, 0.5, 0.5, 0.5, 0.5]])
    av_errors.reset_error_counts("cpu")
    plan = av.plan_tree_verification(survival, parents, i32([5, 5]), mode="all")
    assert av_errors.error_counts("cpu")["nan_survival"] == 1
    assert plan.token_node.tolist()[:3] == [-1, 0, 3]  # 1 (NaN), 2 (its child) and 4 (NaN) are not candidates
    assert plan.verify_lens.tolist() == [2, 5]
    av_errors.reset_error_counts("cpu")


def test_invalidated_drafts_remove_their_subtrees():
    parents = i32([[-1, 0, 0, 1, 2]])
    tokens = i32([[5, -1, 6, 7, 8]])
    plan = av.plan_tree_verification(torch.full((1, 5), 0.5), parents, i32([5]), mode="all", draft_tokens=tokens)
    assert plan.token_node.tolist() == [-1, 0, 2, 4, -1, -1]


# ----------------------------------------------------------------------------------------------------------
# 4. Bad inputs: each error names its argument
# ----------------------------------------------------------------------------------------------------------


def _tree(**overrides):
    kw = dict(survival=torch.full((2, 3), 0.5), parents=i32([[-1, 0, 0], [-1, 0, 1]]), tree_sizes=i32([3, 2]),
              mode="all")
    kw.update(overrides)
    return av.plan_tree_verification(kw.pop("survival"), kw.pop("parents"), kw.pop("tree_sizes"), **kw)


@pytest.mark.parametrize("exc,match,overrides", [
    (ValueError, "parents", dict(parents=i32([[-1, 1, 0], [-1, 0, 1]]))),  # node 1 its own parent
    (ValueError, "parents", dict(parents=i32([[-1, 0, 2], [-1, 0, 1]]))),  # a child before its parent
    (ValueError, "parents", dict(parents=i32([[-1, 0, -2], [-1, 0, 1]]))),  # below -1
    (ValueError, "parents", dict(parents=i32([[-1, 0, 0]]))),  # wrong shape
    (TypeError, "parents", dict(parents=torch.zeros(2, 3))),
    (ValueError, "parents is required", dict(parents=None)),
    (ValueError, "tree_sizes", dict(tree_sizes=i32([4, 2]))),  # tree_sizes > N
    (ValueError, "tree_sizes", dict(tree_sizes=i32([-1, 2]))),
    (ValueError, "tree_sizes", dict(tree_sizes=i32([3]))),
    (ValueError, r"survival.shape\[1\] \(N", dict(survival=torch.full((2, 64), 0.5),
                                                 parents=torch.full((2, 64), -1, dtype=torch.int32))),
    (ValueError, "draft_tokens", dict(draft_tokens=i32([[1, 2, 2], [1, 2, 3]]))),  # duplicate siblings 1 and 2
    (ValueError, "draft_tokens", dict(draft_tokens=i32([[1, 2], [1, 2]]))),  # narrower than max_verify
])
def test_bad_inputs_name_the_argument(exc, match, overrides):
    with pytest.raises(exc, match=match):
        _tree(**overrides)


def test_bad_values_past_the_window_are_never_read():
    """Parents and duplicates of nodes at or past min(tree_sizes, max_verify) are not looked at by the plan."""
    parents = i32([[-1, 0, 7]])  # node 2's parent is bad, but node 2 is past tree_sizes / max_verify
    assert _tree(parents=parents.repeat(2, 1), tree_sizes=i32([2, 2])).verify_lens.tolist() == [2, 2]
    plan = _tree(parents=parents.repeat(2, 1), max_verify=2)
    assert plan.verify_lens.tolist() == [2, 2]
    plan = _tree(draft_tokens=i32([[1, 2, 2], [1, 2, 2]]), max_verify=2)  # the repeat is node 2's
    assert plan.verify_lens.tolist() == [2, 2]


def test_tree_survival_bad_inputs():
    conf = torch.rand(2, 3)
    with pytest.raises(ValueError, match="parents"):
        av.tree_survival(conf, i32([[-1, 0, 2], [-1, 0, 1]]), i32([3, 3]))
    with pytest.raises(ValueError, match="tree_sizes"):
        av.tree_survival(conf, i32([[-1, 0, 1], [-1, 0, 1]]), i32([3, 4]))
    with pytest.raises(ValueError, match=r"conf.shape\[1\] \(N"):
        av.tree_survival(torch.rand(2, 64), torch.full((2, 64), -1, dtype=torch.int32), i32([1, 1]))
    # a bad parent past tree_sizes is not read
    assert torch.equal(av.tree_survival(conf, i32([[-1, 0, 9], [-1, 0, 1]]), i32([2, 3])),
                       ref.tree_survival(conf, i32([[-1, 0, 0], [-1, 0, 1]]), i32([2, 3])))


def test_out_must_be_a_tree_plan():
    with pytest.raises(TypeError, match="TreeVerifyPlan"):
        _tree(out=av.VerifyPlan.allocate(2, 8))
    out = TreeVerifyPlan.allocate(2, 8)
    with pytest.raises(ValueError, match="out.tree_mask"):
        _tree(out=dataclasses.replace(out, tree_mask=torch.zeros(7, dtype=torch.int64)))


@pytest.mark.parametrize("prepared", [False, True])
def test_repeated_tree_calls_see_new_values(prepared):
    """A decode loop's persistent buffers, written in place every step: repeated free calls with ``out=``, and a
    prepared call run every step, plan the new values (and the new tree shape)."""
    rng = np.random.default_rng(11)
    R, N = 6, 9
    parents, sizes = gen_parents(rng, R, N, "random"), torch.full((R,), N, dtype=torch.int32)
    survival = gen_node_survival(rng, "product", parents, sizes, 0.0)
    ct = av.CostTable.from_points({1: 4.0, 64: 4.4, 256: 5.5}, draft_ms=0.5)
    out = TreeVerifyPlan.allocate(R, R + R * N)
    handle = av.prepare(av.plan_tree_verification, survival, parents, sizes, ct, out=out) if prepared else None
    for seed in range(4):
        rng = np.random.default_rng(seed)
        parents.copy_(gen_parents(rng, R, N, TREE_STYLES[seed]))
        survival.copy_(gen_node_survival(rng, "product", parents, sizes, 0.0))
        got = handle.run() if prepared else av.plan_tree_verification(survival, parents, sizes, ct, out=out)
        assert_plans_equal(got, ref.plan_tree_verification(survival, parents, sizes, ct), f"step {seed}: ")


def test_opcheck_tree_plan_into():
    rng = np.random.default_rng(3)
    R, N = 4, 6
    parents = gen_parents(rng, R, N, "bushy")
    sizes = i32([6, 0, 4, 5])
    survival = gen_node_survival(rng, "product", parents, sizes, 0.0)
    kwargs = dict(mode="greedy", min_verify=1, token_offset=3, num_reqs_padded=5, num_tokens_padded=30,
                  context_lens=i32([3, 0, 9, 17]), block_table=torch.arange(4 * 8, dtype=torch.int32).view(4, 8),
                  block_size=4, anchor_tokens=i32([1, 2, 3, 4]), draft_tokens=gen_tokens(rng, R, N, parents))
    table = linear_table(draft_ms=1.5)
    a = resolve_plan_args(survival, sizes, table, parents=parents, **kwargs)
    tensors, config, draft_cost = pack_plan_args(a)
    out = TreeVerifyPlan.allocate(5, 30, positions=True, slot_mapping=True, input_ids=True)
    err = torch.zeros(len(av_errors.error_buffer("cpu")), dtype=torch.int32)
    args = (*tensors, out.verify_lens, out.budget, out.expected_tokens, out.num_tokens, out.query_start_loc,
            out.token_req, out.seq_lens, out.positions, out.slot_mapping, out.input_ids, out.tree_mask,
            out.token_parent, out.token_node, out.token_depth, err, config, draft_cost)
    torch.library.opcheck(torch.ops.adaptive_verify.plan_into.default, args)
    torch.ops.adaptive_verify.plan_into(*args)
    assert_plans_equal(token_views(out, a, a.num_tokens_padded), ref.plan_tree_verification(survival, parents, sizes, table, **kwargs))


def test_torch_compile_tree_plan_matches_eager():
    pytest.importorskip("torch._dynamo")
    import torch._dynamo
    rng = np.random.default_rng(4)
    R, N = 5, 7
    parents = gen_parents(rng, R, N, "random")
    sizes = torch.full((R,), N, dtype=torch.int32)
    conf = torch.from_numpy(rng.uniform(0.2, 1.0, size=(R, N)).astype(np.float32))
    ct = linear_table()

    def step(conf, parents, sizes):
        survival = av.tree_survival(conf, parents, sizes)
        plan = av.plan_tree_verification(survival, parents, sizes, ct, mode="greedy")
        return plan.verify_lens, plan.tree_mask, plan.token_depth

    torch._dynamo.reset()
    compiled = torch.compile(step, backend="eager")  # the cost table's arrays are host work: graph breaks there
    for g, w in zip(compiled(conf, parents, sizes), step(conf, parents, sizes)):
        assert torch.equal(g, w)
    code = "\n".join(g.code for g in torch._dynamo.explain(step)(conf, parents, sizes).graphs)
    assert "adaptive_verify.prefix_survival_into" in code and "adaptive_verify.plan_into" in code


# ----------------------------------------------------------------------------------------------------------
# 5. Priorities and the latency target (issue 21's weights and max_step_ms) on trees
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["greedy", "global", "fixed", "all"])
def test_weighted_trees_match_the_reference(mode):
    """weights rank nodes by w_r * capped survival (ancestor-closed still), Theta is weighted, expected_tokens stays
    unweighted; max_step_ms caps the budget; kernel == reference, and a chain given as a tree plans what
    plan_verification plans with the same weights and target."""
    rng = np.random.default_rng(len(mode))
    ct = av.CostTable.from_points({1: 4.0, 16: 4.2, 64: 5.0, 128: 6.5, 256: 11.0, 512: 20.0}, draft_ms=0.6)
    for R, N, style in [(1, 3, "chain"), (9, 6, "random"), (37, 12, "levels"), (64, 20, "bushy")]:
        parents = gen_parents(rng, R, N, style)
        sizes = torch.from_numpy(rng.integers(0, N + 1, size=R).astype(np.int32))
        survival = gen_node_survival(rng, "product" if R % 2 else "ties", parents, sizes, 0.0)
        w = torch.tensor(rng.choice([0.0, 0.5, 1.0, 4.0], R), dtype=torch.float32)
        kw = dict(mode=mode, weights=w, min_verify=int(rng.integers(0, 2)), extra_emitting=int(rng.integers(0, 3)),
                  extra_tokens=int(rng.integers(0, 9)))
        if R > 1:
            kw["max_step_ms"] = float(ct.fixed_cost(R) + ct.verify_cost(R + kw["extra_tokens"] + R * N // 4))
        if mode == "fixed":
            kw["budget"] = int(rng.integers(0, R * N + 1))
        got = av.plan_tree_verification(survival, parents, sizes, ct, **kw)
        assert_plans_equal(got, ref.plan_tree_verification(survival, parents, sizes, ct, **kw), f"R={R} {style}: ")
        nodes = {(r, n) for r, n in zip(got.token_req.tolist(), got.token_node.tolist()) if n >= 0}
        P = parents.tolist()
        assert all(P[r][n] < 0 or (r, P[r][n]) in nodes for r, n in nodes), "not ancestor-closed"
        if mode != "fixed":
            cb = {k: v for k, v in kw.items() if k != "mode"}
            assert int(av.choose_budget(survival, sizes, ct, mode=mode, parents=parents, **cb)) == int(got.budget)
        if N <= av.planner.MAX_DRAFTS:
            chain = torch.arange(-1, N - 1, dtype=torch.int32).repeat(R, 1)
            s = av.tree_survival(torch.from_numpy(rng.uniform(0.2, 1.0, (R, N)).astype(np.float32)), chain, sizes)
            assert_plans_equal(av.plan_tree_verification(s, chain, sizes, ct, **kw),
                               av.plan_verification(s, sizes, ct, verification="onehot", **kw),
                               f"weighted chain as tree R={R}: ", fields=CHAIN_FIELDS)
