"""Tests for the verification planner (adaptive_verify.planner, docs/design.md, "Planner").

Three layers:

- Property tests (hypothesis): the C++ CPU kernel equals the torch reference bit for bit, and both
  equal an independent pure-Python model written here from the design: canonical order by a Python
  sort, Theta with the design's exact arithmetic (32.32 fixed-point P(B), float32 cost, float64 ratio),
  the paper's Algorithm 1 as a literal loop, and the varlen metadata as a loop over requests and tokens.
- Hand-written small cases with exact expected outputs (dyadic survivals, so every sum is exact).
- Errors (each message names the argument), NaN handling and counters, the lagged mode, torch.library
  registration (opcheck) and torch.compile.
"""

import dataclasses
import math
import time
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import adaptive_verify as av
from adaptive_verify import errors as av_errors
from adaptive_verify import reference as ref
from adaptive_verify.planner import VerifyPlan, resolve_plan_args
from adaptive_verify.planner.launch import pack_plan_args
from adaptive_verify.planner.ops import _warned_global, token_views

FIXED_ONE = 2**32
SENTINEL = 12345
PLAN_FIELDS = (
    "verify_lens", "budget", "expected_tokens", "num_tokens", "query_start_loc", "token_req", "seq_lens",
    "positions", "slot_mapping", "input_ids",
)
FIELD_DTYPES = {name: torch.int32 for name in PLAN_FIELDS}
FIELD_DTYPES.update(expected_tokens=torch.float32, slot_mapping=torch.int64)

pytestmark = pytest.mark.filterwarnings("ignore:plan_verification\\(mode='global'\\):UserWarning")

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def i32(values):
    return torch.tensor(values, dtype=torch.int32)


def f32(values):
    return torch.tensor(values, dtype=torch.float32)


def linear_table(draft_ms=2.0, **kwargs):
    """verify_cost(n) == n exactly for 1 <= n <= 64 (and flat at 1 for n = 0)."""
    return av.CostTable.from_points({1: 1.0, 64: 64.0}, draft_ms=draft_ms, **kwargs)


# ----------------------------------------------------------------------------------------------------------
# Independent model of the design (pure Python, no library code)
# ----------------------------------------------------------------------------------------------------------


def model_candidates(survival, drafts, min_verify, max_verify):
    """Candidates (forced, s, pos, req) in canonical order, and the number of rows ended by a NaN.

    s is the sanitised running minimum (clamp to [0, 1], NaN ends the row) as float32 values held in
    Python floats; the order is a Python sort on (not forced, -s, pos, req).
    """
    rows, d = survival.tolist(), drafts.tolist()
    cands, nan_rows = [], 0
    for r, row in enumerate(rows):
        running = 1.0
        for j in range(min(d[r], max_verify)):
            x = row[j]
            if math.isnan(x):
                nan_rows += 1
                break
            x = min(x, 1.0) if x > 0 else 0.0
            running = min(running, x)
            cands.append((j < min_verify, running, j, r))
    cands.sort(key=lambda c: (not c[0], -c[1], c[2], c[3]))
    return cands, nan_rows


def model_budget_cap(R, max_verify, extra_tokens, capacity, cost_table, num_tokens_padded):
    cap = R * max_verify
    for limit in (capacity, None if cost_table is None else cost_table.max_tokens):
        if limit is not None:
            cap = min(cap, limit - R - extra_tokens)
    if num_tokens_padded is not None:
        cap = min(cap, num_tokens_padded - R)
    return cap


def model_prefix(cands):
    """P(0..N): sums of int(s * 2**32) (truncation of an exact power-of-two scaling)."""
    prefix = [0]
    for c in cands:
        prefix.append(prefix[-1] + int(c[1] * FIXED_ONE))
    return prefix


def model_theta(R, extra_tokens, extra_emitting, cost_table, prefix):
    draft = np.float32(cost_table.draft_cost(R))

    def theta(B):
        cost = np.float32(draft + np.float32(cost_table.verify_cost(R + extra_tokens + B)))
        assert isinstance(cost, np.float32)
        return ((R + extra_emitting) * FIXED_ONE + prefix[B]) / float(cost)

    return theta


def algorithm1(theta, b_min, b_max):
    """Paper Algorithm 1: start at B_min, admit the next candidate while Theta strictly improves."""
    B = b_min
    current = theta(B)
    while B < b_max:
        nxt = theta(B + 1)
        if not nxt > current:
            break
        B, current = B + 1, nxt
    return B


def brute_force_argmax(theta, b_min, b_max):
    best_b, best = b_min, theta(b_min)
    for B in range(b_min + 1, b_max + 1):
        t = theta(B)
        if t > best:  # ties keep the smallest B
            best_b, best = B, t
    return best_b


def model_metadata(R, Rp, Tp, verify_lens, token_offset, context_lens, block_table, block_size, anchors,
                   draft_tokens):
    """The varlen metadata as a slow loop over requests and tokens, padding lanes included."""
    out = dict(
        query_start_loc=[0] * (Rp + 1), token_req=[-1] * Tp, seq_lens=[0] * Rp, positions=[0] * Tp,
        slot_mapping=[-1] * Tp, input_ids=[0] * Tp,
    )
    tok = 0
    for r in range(R):
        q = 1 + verify_lens[r]
        out["query_start_loc"][r] = token_offset + tok
        ctx = context_lens[r] if context_lens is not None else 0
        out["seq_lens"][r] = ctx + q
        for i in range(q):
            out["token_req"][tok] = r
            pos = ctx + i
            out["positions"][tok] = pos
            if block_table is not None:
                out["slot_mapping"][tok] = block_table[r][pos // block_size] * block_size + pos % block_size
            if anchors is not None:
                out["input_ids"][tok] = anchors[r] if i == 0 else draft_tokens[r][i - 1]
            tok += 1
    for r in range(R, Rp + 1):
        out["query_start_loc"][r] = token_offset + tok
    out["num_tokens"] = token_offset + tok
    return out


# ----------------------------------------------------------------------------------------------------------
# Input generation
# ----------------------------------------------------------------------------------------------------------

QUANT_LEVELS = np.array([0.0, 0.25, 0.5, 0.75, 1.0], dtype=np.float32)
RAW_SPECIALS = np.array([0.0, -0.0, 1.0, 0.5, 0.5, -0.25, 1.5, np.inf, -np.inf, 1e-45, 1e-30], dtype=np.float32)


def gen_survival(rng, R, K, style, nan_rate):
    if style == "prefix":  # prefix_survival of random or quantised confidences (ties, exact 0 and 1)
        conf = rng.uniform(0.0, 1.0, size=(R, K)).astype(np.float32)
        quant = rng.random((R, K)) < 0.5
        conf[quant] = rng.choice(QUANT_LEVELS, size=int(quant.sum()))
        values = ref.prefix_survival(torch.from_numpy(conf), torch.full((R,), K, dtype=torch.int32)).numpy()
    elif style == "raw":  # arbitrary values: non-monotone rows, out of [0, 1], -0.0, inf, denormals
        values = rng.uniform(-0.2, 1.2, size=(R, K)).astype(np.float32)
        special = rng.random((R, K)) < 0.3
        values[special] = rng.choice(RAW_SPECIALS, size=int(special.sum()))
    else:  # "ties": few distinct values
        values = rng.choice(np.array([0.0, 0.5, 1.0, 0.125], dtype=np.float32), size=(R, K))
    if nan_rate:
        values[rng.random((R, K)) < nan_rate] = np.nan
    return torch.from_numpy(np.ascontiguousarray(values))


def gen_cost_table(rng, max_tokens_floor):
    """A random staircase table. max_tokens (when set) is >= max_tokens_floor."""
    n_points = int(rng.integers(1, 6))
    xs = np.sort(rng.choice(np.arange(1, 400), size=n_points, replace=False)).tolist()
    ys = rng.uniform(0.05, 5.0, size=n_points).tolist()
    sizes = []
    if rng.random() < 0.6:
        sizes = np.sort(rng.choice(np.arange(1, 300), size=int(rng.integers(1, 6)), replace=False)).tolist()
    if rng.random() < 0.5:
        draft = float(rng.choice([0.0, 0.5, 1.7]))
    else:
        rs = np.sort(rng.choice(np.arange(1, 400), size=int(rng.integers(1, 4)), replace=False)).tolist()
        draft = {int(r): float(v) for r, v in zip(rs, rng.uniform(0.0, 3.0, size=len(rs)))}
    max_tokens = None
    if rng.random() < 0.3:
        max_tokens = max(max_tokens_floor, sizes[-1] if sizes else 1) + int(rng.integers(0, 200))
    return av.CostTable.from_points(
        {int(x): float(y) for x, y in zip(xs, ys)}, draft_ms=draft, graph_sizes=sizes, max_tokens=max_tokens
    )


MODES = ("greedy", "global", "fixed_int", "fixed_tensor", "all")


@st.composite
def plan_cases(draw, modes=MODES, small=False):
    mode = draw(st.sampled_from(modes))
    R = draw(st.integers(1, 6) if small else st.one_of(st.integers(1, 8), st.integers(1, 300)))
    K = draw(st.integers(1, 6) if small else st.integers(1, 16))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    style = draw(st.sampled_from(("prefix", "raw", "ties")))
    nan_rate = draw(st.sampled_from((0.0, 0.0, 0.0, 0.05)))
    survival = gen_survival(rng, R, K, style, nan_rate)
    if draw(st.booleans()):  # a row-strided view (last dim contiguous) must work like a contiguous tensor
        wide = torch.full((R, K + 3), float("nan"))
        wide[:, :K] = survival
        survival = wide[:, :K]

    drafts_kind = draw(st.sampled_from(("random", "full", "zero_or_full")))
    if drafts_kind == "random":
        drafts = rng.integers(0, K + 1, size=R)
    elif drafts_kind == "full":
        drafts = np.full(R, K)
    else:
        drafts = rng.choice([0, K], size=R)
    drafts = torch.from_numpy(drafts.astype(np.int32))
    if draw(st.booleans()):
        drafts = drafts.to(torch.int64)  # documented conversion

    max_verify = draw(st.one_of(st.none(), st.integers(0, K)))
    min_verify = draw(st.integers(0, K if max_verify is None else max_verify))
    extra_tokens = draw(st.sampled_from((0, 0, 1, 7, 20)))
    extra_emitting = draw(st.sampled_from((0, 0, 1, 5, 20)))
    anchors = R + extra_tokens
    mv = K if max_verify is None else max_verify

    needs_table = mode in ("greedy", "global")
    cost_table = gen_cost_table(rng, anchors) if needs_table or draw(st.booleans()) else None
    capacity = None
    if draw(st.booleans()):
        hi = anchors + R * mv + 5
        if cost_table is not None and cost_table.max_tokens is not None:
            hi = min(hi, cost_table.max_tokens)
        capacity = draw(st.integers(anchors, hi))
    cap_no_pad = model_budget_cap(R, mv, extra_tokens, capacity, cost_table, None)
    num_reqs_padded = draw(st.one_of(st.none(), st.integers(R, R + 5)))
    num_tokens_padded = draw(st.one_of(st.none(), st.integers(R, R + cap_no_pad + 10)))
    token_offset = draw(st.sampled_from((0, 0, 3, 1000)))

    kwargs = dict(
        mode=mode.split("_")[0], min_verify=min_verify, max_verify=max_verify, extra_tokens=extra_tokens,
        extra_emitting=extra_emitting, capacity=capacity, token_offset=token_offset,
        num_reqs_padded=num_reqs_padded, num_tokens_padded=num_tokens_padded,
    )
    if mode.startswith("fixed"):
        want = draw(st.one_of(st.integers(0, R * K + 10), st.just(0), st.just(2**31 - 1)))
        kwargs["budget"] = want if mode == "fixed_int" else torch.tensor(want, dtype=torch.int32)

    if draw(st.booleans()):  # metadata inputs
        context_lens = rng.integers(0, 100, size=R)
        kwargs["context_lens"] = torch.from_numpy(context_lens.astype(np.int32))
        if draw(st.booleans()):
            block_size = draw(st.sampled_from((1, 3, 16)))
            need = max(int(c) + K + 1 for c in context_lens)
            max_blocks = -(-need // block_size) + draw(st.integers(0, 2))
            table = torch.from_numpy(rng.integers(0, 5000, size=(R, max_blocks + 2)).astype(np.int32))
            kwargs["block_table"] = table[:, :max_blocks] if draw(st.booleans()) else table.contiguous()
            kwargs["block_size"] = block_size
    if draw(st.booleans()):
        kwargs["anchor_tokens"] = torch.from_numpy(rng.integers(0, 32000, size=R).astype(np.int32))
        width = draw(st.integers(mv, K + 2))  # width 0 is valid with max_verify = 0
        kwargs["draft_tokens"] = torch.from_numpy(rng.integers(0, 32000, size=(R, width)).astype(np.int32))
    return dict(survival=survival, drafts=drafts, cost_table=cost_table, kwargs=kwargs)


def poisoned_out(Rp, Tp, kwargs, sentinel=SENTINEL):
    out = VerifyPlan.allocate(
        Rp, Tp, "cpu", positions=kwargs.get("context_lens") is not None,
        slot_mapping=kwargs.get("block_table") is not None, input_ids=kwargs.get("anchor_tokens") is not None,
    )
    for name in PLAN_FIELDS:
        t = getattr(out, name)
        if t is not None:
            t.fill_(sentinel)
    return out


def assert_plans_equal(got, want, context=""):
    for name in PLAN_FIELDS:
        g, w = getattr(got, name), getattr(want, name)
        assert (g is None) == (w is None), f"{context}{name}: kernel {g} vs reference {w}"
        if g is None:
            continue
        assert g.dtype == w.dtype == FIELD_DTYPES[name], f"{context}{name}: dtypes {g.dtype} / {w.dtype}"
        assert g.shape == w.shape, f"{context}{name}: shapes {tuple(g.shape)} / {tuple(w.shape)}"
        assert torch.equal(g, w), f"{context}{name}:\nkernel    {g.tolist()}\nreference {w.tolist()}"


# ----------------------------------------------------------------------------------------------------------
# 1. Property tests
# ----------------------------------------------------------------------------------------------------------


def check_case(case):
    """Runs kernel (fresh and into poisoned out=), reference and the model; checks every invariant."""
    survival, drafts, table, kwargs = case["survival"], case["drafts"], case["cost_table"], case["kwargs"]
    R, K = survival.shape
    mode = kwargs["mode"]
    max_verify = K if kwargs["max_verify"] is None else kwargs["max_verify"]
    min_verify, extra_tokens = kwargs["min_verify"], kwargs["extra_tokens"]
    Rp = R if kwargs["num_reqs_padded"] is None else kwargs["num_reqs_padded"]
    cap = model_budget_cap(R, max_verify, extra_tokens, kwargs["capacity"], table, kwargs["num_tokens_padded"])
    Tp = R + cap if kwargs["num_tokens_padded"] is None else kwargs["num_tokens_padded"]

    # ---- model ----
    cands, nan_rows = model_candidates(survival, drafts, min_verify, max_verify)
    n_forced = sum(c[0] for c in cands)
    b_max = min(len(cands), cap)
    b_min = min(n_forced, b_max)
    prefix = model_prefix(cands)
    if mode in ("greedy", "global"):
        theta = model_theta(R, extra_tokens, kwargs["extra_emitting"], table, prefix)
        want_budget = algorithm1(theta, b_min, b_max) if mode == "greedy" else brute_force_argmax(theta, b_min, b_max)
    elif mode == "fixed":
        want_budget = max(b_min, min(int(kwargs["budget"]), b_max))
    else:
        want_budget = b_max
    want_lens = [0] * Rp
    for forced, s, pos, r in cands[:want_budget]:
        want_lens[r] += 1

    # ---- kernel (allocating) vs kernel (into out= poisoned with two sentinels) vs reference ----
    av.reset_error_counts("cpu")
    plan = av.plan_verification(survival, drafts, table, **kwargs)
    assert av.error_counts("cpu")["nan_survival"] == nan_rows
    expected = ref.plan_verification(survival, drafts, table, **kwargs)
    assert_plans_equal(plan, expected, "allocating: ")
    for sentinel in (SENTINEL, -7):  # an element left unwritten cannot equal the reference under both
        out = poisoned_out(Rp, Tp, kwargs, sentinel)
        plan_out = av.plan_verification(survival, drafts, table, out=out, **kwargs)
        assert_plans_equal(plan_out, expected, f"out= poisoned with {sentinel}: ")
        for name in PLAN_FIELDS:  # out= keeps the caller's addresses
            if getattr(plan_out, name) is not None:
                assert getattr(plan_out, name).data_ptr() == getattr(out, name).data_ptr(), name

    # ---- invariants against the independent model ----
    L = plan.verify_lens.tolist()
    budget = int(plan.budget)
    d = drafts.tolist()
    assert budget == want_budget, f"budget {budget}, model {want_budget} (B_min {b_min}, B_max {b_max})"
    assert b_min <= budget <= b_max
    assert L == want_lens, "verified set != first B candidates of the canonical order"
    assert sum(L) == budget
    for r in range(R):
        assert 0 <= L[r] <= min(d[r], max_verify)
    if n_forced <= cap:  # capacity allows every forced candidate
        for r in range(R):
            window = sum(1 for c in cands if c[3] == r)  # candidates before the row's NaN
            assert L[r] >= min(d[r], min_verify, window)
    # prefix-closed: the verified drafts of r are exactly its first L[r] candidates
    chosen = {(c[3], c[2]) for c in cands[:budget]}
    assert chosen == {(r, j) for r in range(R) for j in range(L[r])}
    assert float(plan.expected_tokens) == float(np.float32((R * FIXED_ONE + prefix[budget]) / FIXED_ONE))
    assert plan.verify_lens.shape == (Rp,) and plan.token_req.shape == (Tp,)

    # ---- metadata against the slow loop ----
    ctx = kwargs.get("context_lens")
    bt = kwargs.get("block_table")
    anchors = kwargs.get("anchor_tokens")
    meta = model_metadata(
        R, Rp, Tp, L, kwargs["token_offset"], None if ctx is None else ctx.tolist(),
        None if bt is None else bt.tolist(), kwargs.get("block_size"),
        None if anchors is None else anchors.tolist(),
        None if anchors is None else kwargs["draft_tokens"].tolist(),
    )
    assert int(plan.num_tokens) == meta["num_tokens"] == kwargs["token_offset"] + R + budget
    assert plan.query_start_loc.tolist() == meta["query_start_loc"]
    assert plan.token_req.tolist() == meta["token_req"]
    produced = dict(seq_lens=ctx is not None, positions=ctx is not None, slot_mapping=bt is not None,
                    input_ids=anchors is not None)
    for name, present in produced.items():
        if present:
            assert getattr(plan, name).tolist() == meta[name], name
        else:
            assert getattr(plan, name) is None, f"{name} should be None when its inputs are absent"

    # ---- choose_budget (its T_pad is the default one) ----
    if mode in ("greedy", "global", "all") and kwargs["num_tokens_padded"] is None:
        cb_kwargs = {k: kwargs[k] for k in ("mode", "min_verify", "max_verify", "extra_tokens", "extra_emitting",
                                            "capacity")}
        got = av.choose_budget(survival, drafts, table, **cb_kwargs)
        want = ref.choose_budget(survival, drafts, table, **cb_kwargs)
        assert got.dtype == want.dtype == torch.int32 and got.shape == ()
        assert int(got) == int(want) == want_budget
    return plan


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=40, **SETTINGS)
@given(data=st.data())
def test_plan_properties(mode, data):
    check_case(data.draw(plan_cases(modes=(mode,))))


@settings(max_examples=60, **SETTINGS)
@given(case=plan_cases(small=True))
def test_plan_properties_small(case):
    check_case(case)


@settings(max_examples=40, **SETTINGS)
@given(
    R=st.integers(1, 300), K=st.integers(1, 16), seed=st.integers(0, 2**32 - 1),
    style=st.sampled_from(("prefix", "raw", "ties")), full=st.booleans(),
)
def test_prefix_survival_matches_reference(R, K, seed, style, full):
    rng = np.random.default_rng(seed)
    conf = gen_survival(rng, R, K, "raw" if style == "raw" else "ties", 0.0)
    if style == "prefix":
        conf = torch.from_numpy(rng.uniform(0, 1, size=(R, K)).astype(np.float32))
    drafts = torch.full((R,), K, dtype=torch.int32) if full else torch.from_numpy(
        rng.integers(0, K + 1, size=R).astype(np.int32))
    got = av.prefix_survival(conf, drafts)
    want = ref.prefix_survival(conf, drafts)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    # left-to-right float32 product, loop written here
    rows, d = conf.tolist(), drafts.tolist()
    for r in (0, R - 1):
        a = np.float32(1.0)
        for j in range(K):
            c = rows[r][j]
            a = np.float32(a * np.float32(min(c, 1.0) if c > 0 else 0.0))
            assert float(got[r, j]) == (float(a) if j < d[r] else 0.0)
    out = torch.full((R, K), float(SENTINEL))
    assert av.prefix_survival(conf, drafts, out=out) is out
    assert torch.equal(out, want)


# ----------------------------------------------------------------------------------------------------------
# 2. Hand-written cases
# ----------------------------------------------------------------------------------------------------------

# Dyadic survivals: every sum below is exact.
HAND_SURVIVAL = f32([[0.75, 0.5, 0.25], [0.625, 0.5, 0.125]])
# canonical order: (r0,j0,.75) (r1,j0,.625) (r0,j1,.5) (r1,j1,.5) (r0,j2,.25) (r1,j2,.125)
# P(B):            .75         1.375          1.875        2.375        2.625        2.75


def test_hand_linear_cost_greedy_and_global():
    table = linear_table(draft_ms=2.0)
    assert [table.verify_cost(n) for n in range(1, 9)] == [float(n) for n in range(1, 9)]
    drafts = i32([3, 3])
    # Theta(B) = (2 + P(B)) / (2 + 2 + B): .5, .55, .5625, .5536, .5469, .5139, .475 -> B = 2
    for mode in ("greedy", "global"):
        plan = av.plan_verification(HAND_SURVIVAL, drafts, table, mode=mode)
        assert plan.verify_lens.tolist() == [1, 1]
        assert int(plan.budget) == 2
        assert float(plan.expected_tokens) == 3.375
        assert int(av.choose_budget(HAND_SURVIVAL, drafts, table, mode=mode)) == 2


def test_hand_request_ms_is_part_of_thetas_fixed_term():
    """Theta's fixed term is cost_table.fixed_cost(R) = draft_cost(R) + request_ms * R: per-request step work
    moves the budget exactly as the same milliseconds of drafter cost do."""
    drafts = i32([3, 3])
    # no fixed term: Theta(B) = (2 + P(B)) / (2 + B): 1, .917, ... -> B = 0
    assert int(av.choose_budget(HAND_SURVIVAL, drafts, linear_table(draft_ms=0.0), mode="global")) == 0
    # request_ms = 1 at R = 2 is 2 ms: Theta(B) = (2 + P(B)) / (4 + B), as with draft_ms = 2 above -> B = 2
    per_request = linear_table(draft_ms=0.0, request_ms=1.0)
    assert per_request.fixed_cost(2) == 2.0 and per_request.step_cost(2, 3) == 5.0
    for mode in ("greedy", "global"):
        plan = av.plan_verification(HAND_SURVIVAL, drafts, per_request, mode=mode)
        assert plan.verify_lens.tolist() == [1, 1] and int(plan.budget) == 2, mode
    # both terms add: fixed 2 + 2 = 4 ms, Theta(B) = (2 + P) / (6 + B): .333, .393, .422, .431, .438, .420 -> B = 4
    both = linear_table(draft_ms=2.0, request_ms=1.0)
    assert int(av.choose_budget(HAND_SURVIVAL, drafts, both, mode="global")) == 4


def test_hand_extra_tokens_and_extra_emitting():
    table = linear_table(draft_ms=2.0)
    drafts = i32([3, 3])
    # extra_tokens=4: Theta(B) = (2 + P) / (8 + B): .25, .3056, .3375, .3523, .3646, .3558 -> B = 4
    plan = av.plan_verification(HAND_SURVIVAL, drafts, table, mode="greedy", extra_tokens=4)
    assert plan.verify_lens.tolist() == [2, 2] and int(plan.budget) == 4
    assert int(plan.num_tokens) == 6  # extra tokens are not laid out in the decode buffer
    # extra_emitting=10: Theta(B) = (12 + P) / (4 + B): 3, 2.55, ... -> B = 0
    plan = av.plan_verification(HAND_SURVIVAL, drafts, table, mode="global", extra_emitting=10)
    assert plan.verify_lens.tolist() == [0, 0] and int(plan.budget) == 0
    assert float(plan.expected_tokens) == 2.0  # R + P(0): extra_emitting is not part of it


def test_hand_staircase_greedy_stops_at_local_maximum():
    # graph sizes 4 and 8: cost 1.0 for n <= 4, 1.5 for 5..8; survival 1 everywhere: P(B) = B
    table = av.CostTable.from_points({4: 1.0, 8: 1.5}, draft_ms=0.0, graph_sizes=[4, 8], max_tokens=8)
    survival, drafts = torch.ones(2, 3), i32([3, 3])
    # Theta(B) = (2 + B) / cost(2 + B): 2, 3, 4, 3.33, 4, 4.67, 5.33
    greedy = av.plan_verification(survival, drafts, table, mode="greedy")
    assert greedy.verify_lens.tolist() == [1, 1] and int(greedy.budget) == 2
    glob = av.plan_verification(survival, drafts, table, mode="global")
    assert glob.verify_lens.tolist() == [3, 3] and int(glob.budget) == 6
    assert int(av.choose_budget(survival, drafts, table, mode="greedy")) == 2
    assert int(av.choose_budget(survival, drafts, table, mode="global")) == 6


def test_hand_global_ties_pick_smallest_budget():
    table = av.CostTable.from_points({100: 1.0}, draft_ms=0.0)  # constant cost
    survival, drafts = torch.zeros(2, 3), i32([3, 3])  # P(B) = 0: Theta is flat
    for mode in ("global", "greedy"):
        assert av.plan_verification(survival, drafts, table, mode=mode).verify_lens.tolist() == [0, 0]
        # forced candidates are B_min: Theta flat from there, so B = B_min
        plan = av.plan_verification(survival, drafts, table, mode=mode, min_verify=1)
        assert plan.verify_lens.tolist() == [1, 1] and int(plan.budget) == 2
        plan = av.plan_verification(survival, i32([0, 3]), table, mode=mode, min_verify=2)
        assert plan.verify_lens.tolist() == [0, 2] and int(plan.budget) == 2


def test_hand_theta_exact_arithmetic_decides_a_tie():
    # R = 1024 requests, one candidate s with s * 2**32 = 2**19 + 0.75. Costs: float32(0.1) + v0 rounds to
    # exactly 1.0 and float32(0.1) + v1 to 1 + 2**-23 in float32, so with P(1) = trunc(s * 2**32) = 2**19,
    # Theta(1) = (2**42 + 2**19) / (1 + 2**-23) = 2**42 = Theta(0): a tie, B = 0 in greedy and global.
    # Rounding P to nearest, or summing the cost in float64, would make Theta(1) larger and choose B = 1.
    R = 1024
    v0 = float(np.nextafter(np.float32(0.9), np.float32(1)))
    v1 = float(np.float32(0.9000001))
    draft = np.float32(0.1)
    assert np.float32(draft + np.float32(v0)) == 1.0 and np.float32(draft + np.float32(v1)) == np.float32(1 + 2**-23)
    table = av.CostTable.from_points({R: v0, R + 1: v1}, draft_ms=0.1)
    drafts = torch.zeros(R, dtype=torch.int32)
    drafts[0] = 1
    for s, want in ((2.0**-13 + 3 * 2.0**-34, 0), (2.0**-13 + 2.0**-32, 1)):
        survival = torch.zeros(R, 1)
        survival[0, 0] = s
        assert float(survival[0, 0]) * FIXED_ONE == 2**19 + (0.75 if want == 0 else 1)
        cands, _ = model_candidates(survival, drafts, 0, 1)
        theta = model_theta(R, 0, 0, table, model_prefix(cands))
        assert algorithm1(theta, 0, 1) == brute_force_argmax(theta, 0, 1) == want
        for mode in ("greedy", "global"):
            plan = av.plan_verification(survival, drafts, table, mode=mode)
            assert int(plan.budget) == want and int(plan.verify_lens[0]) == want, (s, mode)
            assert int(av.choose_budget(survival, drafts, table, mode=mode)) == want
            assert int(ref.choose_budget(survival, drafts, table, mode=mode)) == want


@pytest.mark.parametrize("budget,lens", [(0, [0, 0]), (1, [1, 0]), (2, [1, 1]), (3, [2, 1]), (4, [2, 2]),
                                         (5, [3, 2]), (6, [3, 3]), (7, [3, 3]), (1000, [3, 3])])
def test_hand_fixed_budget_follows_canonical_order(budget, lens):
    for b in (budget, torch.tensor(budget, dtype=torch.int32)):
        plan = av.plan_verification(HAND_SURVIVAL, i32([3, 3]), mode="fixed", budget=b)
        assert plan.verify_lens.tolist() == lens
        assert int(plan.budget) == min(budget, 6)


def test_hand_ties_broken_by_position_then_request():
    # order: (r0,j0,1) then survival .5 for all: (r1,j0) (r2,j0) (r0,j1) (r1,j1) (r2,j1) (r0,j2) ...
    survival = f32([[1.0, 0.5, 0.5], [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]])
    drafts = i32([3, 3, 3])
    expect = {1: [1, 0, 0], 2: [1, 1, 0], 3: [1, 1, 1], 4: [2, 1, 1], 5: [2, 2, 1], 6: [2, 2, 2], 7: [3, 2, 2]}
    for budget, lens in expect.items():
        plan = av.plan_verification(survival, drafts, mode="fixed", budget=budget)
        assert plan.verify_lens.tolist() == lens, budget
    # a non-monotone row is made non-increasing: r0 = [.5, 1, 1] ranks like [.5, .5, .5]
    survival = f32([[0.5, 1.0, 1.0], [0.5, 0.5, 0.5]])
    plan = av.plan_verification(survival, i32([3, 3]), mode="fixed", budget=3)
    assert plan.verify_lens.tolist() == [2, 1]


def test_hand_forced_candidates_and_capacity_clipping():
    survival = f32([[0.5, 0.5, 0.5], [0.75, 0.25, 0.25]])
    drafts = i32([3, 3])
    # forced (min_verify=2): (r1,j0,.75) (r0,j0,.5) (r0,j1,.5) (r1,j1,.25); capacity 5 leaves 3 slots
    for mode, budget in (("all", None), ("fixed", 0), ("fixed", 10)):
        plan = av.plan_verification(survival, drafts, mode=mode, budget=budget, min_verify=2, capacity=5)
        assert plan.verify_lens.tolist() == [2, 1] and int(plan.budget) == 3
    # without the capacity every forced candidate comes first, even below a higher non-forced one
    plan = av.plan_verification(survival, drafts, mode="fixed", budget=4, min_verify=2)
    assert plan.verify_lens.tolist() == [2, 2]
    plan = av.plan_verification(survival, drafts, mode="fixed", budget=0, min_verify=2)
    assert plan.verify_lens.tolist() == [2, 2] and int(plan.budget) == 4
    # max_verify caps each request
    plan = av.plan_verification(survival, drafts, mode="all", max_verify=1)
    assert plan.verify_lens.tolist() == [1, 1]
    # capacity with extra tokens: R + extra_tokens = 5, capacity 8 -> 3 drafts
    plan = av.plan_verification(torch.ones(3, 4), i32([4, 4, 4]), mode="all", extra_tokens=2, capacity=10)
    assert plan.verify_lens.tolist() == [2, 2, 1] and int(plan.budget) == 5
    # num_tokens_padded bounds the budget as well
    plan = av.plan_verification(torch.ones(3, 4), i32([4, 4, 4]), mode="all", num_tokens_padded=5)
    assert plan.verify_lens.tolist() == [1, 1, 0] and plan.token_req.tolist() == [0, 0, 1, 1, 2]


def test_hand_metadata_and_padding():
    out = VerifyPlan.allocate(3, 7, positions=True, slot_mapping=True, input_ids=True)
    for name in PLAN_FIELDS:
        getattr(out, name).fill_(SENTINEL)
    plan = av.plan_verification(
        HAND_SURVIVAL, i32([3, 3]), mode="fixed", budget=3, context_lens=i32([5, 0]),
        block_table=i32([[7, 3, 0], [2, 9, 9]]), block_size=4, anchor_tokens=i32([100, 200]),
        draft_tokens=i32([[11, 12, 13], [21, 22, 23]]), token_offset=10, num_reqs_padded=3, num_tokens_padded=7,
        out=out,
    )
    assert plan.verify_lens.tolist() == [2, 1, 0]
    assert int(plan.budget) == 3
    assert float(plan.expected_tokens) == 2 + 0.75 + 0.625 + 0.5
    assert int(plan.num_tokens) == 15
    assert plan.query_start_loc.tolist() == [10, 13, 15, 15]
    assert plan.seq_lens.tolist() == [8, 2, 0]
    assert plan.token_req.tolist() == [0, 0, 0, 1, 1, -1, -1]
    assert plan.positions.tolist() == [5, 6, 7, 0, 1, 0, 0]
    assert plan.slot_mapping.tolist() == [13, 14, 15, 8, 9, -1, -1]
    assert plan.input_ids.tolist() == [100, 11, 12, 200, 21, 0, 0]
    assert plan.slot_mapping.dtype == torch.int64


def test_out_with_unused_buffers_returns_none_for_them():
    out = VerifyPlan.allocate(2, 8, positions=True, slot_mapping=True, input_ids=True)
    plan = av.plan_verification(HAND_SURVIVAL, i32([3, 3]), mode="fixed", budget=3, out=out)
    assert plan.seq_lens is None and plan.positions is None and plan.slot_mapping is None
    assert plan.input_ids is None
    assert plan.verify_lens.data_ptr() == out.verify_lens.data_ptr()
    assert plan.verify_lens.tolist() == [2, 1] and plan.token_req.tolist() == [0, 0, 0, 1, 1, -1, -1, -1]


def test_draft_tokens_zero_width():
    # draft_tokens must be [R, >= max_verify]: width 0 is valid with max_verify = 0 (only anchors are fed)
    kwargs = dict(mode="all", max_verify=0, context_lens=i32([4, 0]), anchor_tokens=i32([7, 9]),
                  draft_tokens=torch.zeros(2, 0, dtype=torch.int32))
    plan = av.plan_verification(HAND_SURVIVAL, i32([3, 3]), **kwargs)
    assert plan.verify_lens.tolist() == [0, 0]
    assert plan.input_ids.tolist() == [7, 9] and plan.positions.tolist() == [4, 0]
    assert_plans_equal(plan, ref.plan_verification(HAND_SURVIVAL, i32([3, 3]), **kwargs))


def test_drafts_zero_and_k_one():
    table = linear_table(draft_ms=0.5)
    survival = f32([[1.0], [1.0], [0.5]])
    plan = av.plan_verification(survival, i32([0, 1, 1]), table, mode="all")
    assert plan.verify_lens.tolist() == [0, 1, 1] and plan.token_req.tolist() == [0, 1, 1, 2, 2, -1]
    plan = av.plan_verification(survival, i32([0, 0, 0]), table, mode="greedy")
    assert plan.verify_lens.tolist() == [0, 0, 0] and int(plan.num_tokens) == 3


# ----------------------------------------------------------------------------------------------------------
# 3. NaN
# ----------------------------------------------------------------------------------------------------------


def test_nan_survival_ends_row_and_is_counted():
    nan = float("nan")
    survival = f32([
        [0.9, nan, 0.8, 0.7],   # ends at 1
        [nan, 1.0, 1.0, 1.0],   # ends at 0
        [1.0, 1.0, 1.0, 0.5],   # no NaN
        [1.0, 1.0, 1.0, nan],   # NaN beyond drafts[3] = 2: not a candidate, not counted
        [0.5, 0.5, nan, 0.5],   # ends at 2
    ])
    drafts = i32([4, 4, 4, 2, 4])
    table = linear_table(draft_ms=100.0)  # large fixed cost: greedy/global take everything
    for mode, kw in (("all", {}), ("fixed", {"budget": 100}), ("greedy", {}), ("global", {})):
        av.reset_error_counts("cpu")
        plan = av.plan_verification(survival, drafts, table, mode=mode, **kw)
        assert plan.verify_lens.tolist() == [1, 0, 4, 2, 2], mode
        assert av.error_counts("cpu")["nan_survival"] == 3, mode
        assert_plans_equal(plan, ref.plan_verification(survival, drafts, table, mode=mode, **kw))
    # forced candidates stop at the NaN too
    av.reset_error_counts("cpu")
    plan = av.plan_verification(survival, drafts, mode="fixed", budget=0, min_verify=4)
    assert plan.verify_lens.tolist() == [1, 0, 4, 2, 2]
    assert av.error_counts("cpu")["nan_survival"] == 3
    # choose_budget counts too
    av.reset_error_counts("cpu")
    assert int(av.choose_budget(survival, drafts, table, mode="all")) == 9
    assert av.error_counts("cpu")["nan_survival"] == 3


def test_nan_rows_counted_once_per_row():
    nan = float("nan")
    survival = f32([[0.5, nan, nan], [nan, nan, nan], [1.0, 1.0, 1.0]])
    av.reset_error_counts("cpu")
    plan = av.plan_verification(survival, i32([3, 3, 3]), mode="all")
    assert plan.verify_lens.tolist() == [1, 0, 3]
    assert av.error_counts("cpu")["nan_survival"] == 2
    av.reset_error_counts("cpu")
    assert av.error_counts("cpu")["nan_survival"] == 0


def test_prefix_survival_nan_confidence():
    nan = float("nan")
    conf = f32([[0.5, nan, 0.5, 1.0], [1.0, 0.5, 0.5, nan], [nan, nan, 1.0, 1.0], [0.5, 0.5, 0.5, 0.5]])
    drafts = i32([4, 3, 4, 4])
    av.reset_error_counts("cpu")
    got = av.prefix_survival(conf, drafts)
    assert got.tolist() == [[0.5, 0, 0, 0], [1.0, 0.5, 0.25, 0], [0, 0, 0, 0], [0.5, 0.25, 0.125, 0.0625]]
    assert torch.equal(got, ref.prefix_survival(conf, drafts))
    # NaNs at drafted positions: one in row 0, two in row 2 (row 1's NaN is past drafts[1])
    assert av.error_counts("cpu")["nan_survival"] == 3
    av.reset_error_counts("cpu")


@pytest.mark.parametrize("R,K", [(8, 8), (13, 8), (257, 16), (30, 24), (9, 32)])
def test_plan_from_confidences_vector_prologue(R, K):
    """plan(conf=...) on the CPU computes the survival eight rows at a time (K % 8 == 0, R >= 8; leftover rows one by
    one): the survival it writes equals the reference's bit for bit, on values sanitize() must handle (NaN, -0.0,
    negatives, above 1, inf), rows of every draft count, a strided conf, and its plan and NaN count equal planning on
    that survival."""
    g = torch.Generator().manual_seed(R * 7 + K)
    wide = torch.rand(R, K + 5, generator=g) * 0.5 + 0.5
    special = torch.tensor([float("nan"), -0.0, 0.0, -0.25, 1.0, 1.5, float("inf"), float("-inf")])
    pick = torch.rand(R, K + 5, generator=g) < 0.1
    wide[pick] = special[torch.randint(0, len(special), (int(pick.sum()),), generator=g)]
    conf = wide[:, 2:K + 2]  # row stride K + 5
    drafts = torch.randint(0, K + 1, (R,), generator=g, dtype=torch.int32)
    drafts[: min(R, K + 1)] = torch.arange(min(R, K + 1), dtype=torch.int32)
    drafted_nans = int((conf.isnan() & (torch.arange(K) < drafts[:, None].long())).sum())
    ct = av.CostTable.from_points({1: 1.0, 4096: 3.0}, draft_ms=0.5)
    for mode in ("global", "fixed"):
        kw = dict(mode=mode, budget=R * K // 3) if mode == "fixed" else dict(mode=mode)
        av.reset_error_counts("cpu")
        survival = torch.full((R, K), -1.0)
        plan = av.plan_verification(None, drafts, ct, conf=conf, survival_out=survival, **kw)
        assert av.error_counts("cpu")["nan_survival"] == drafted_nans
        want = ref.prefix_survival(conf, drafts)
        assert torch.equal(survival.view(torch.int32), want.view(torch.int32)), mode
        av.reset_error_counts("cpu")
        assert_plans_equal(plan, av.plan_verification(want, drafts, ct, **kw), f"{mode}: ")
    av.reset_error_counts("cpu")


# ----------------------------------------------------------------------------------------------------------
# 4. Errors name the argument
# ----------------------------------------------------------------------------------------------------------

S, D = torch.full((2, 3), 0.5), i32([3, 2])


def _plan(**overrides):
    args = dict(survival=S, drafts=D, cost_table=None, mode="all")
    args.update(overrides)
    return av.plan_verification(args.pop("survival"), args.pop("drafts"), args.pop("cost_table"), **args)


META = dict(context_lens=i32([4, 9]), block_table=i32([[0, 1], [2, 3]]), block_size=8)


@pytest.mark.parametrize("exc,match,overrides", [
    (TypeError, "survival", dict(survival=S.double())),
    (TypeError, "survival", dict(survival=S.half())),
    (TypeError, "survival", dict(survival=[[0.5, 0.5]])),
    (ValueError, "survival", dict(survival=torch.full((6,), 0.5))),
    (ValueError, "survival", dict(survival=torch.full((2, 3, 1), 0.5))),
    (ValueError, "survival", dict(survival=torch.full((3, 2), 0.5).t())),  # last dim not contiguous
    (ValueError, r"survival\.shape\[1\]", dict(survival=torch.full((2, 33), 0.5))),
    (ValueError, r"survival\.shape\[1\]", dict(survival=torch.full((2, 0), 0.5))),
    (TypeError, "drafts", dict(drafts=torch.tensor([3.0, 2.0]))),
    (ValueError, "drafts", dict(drafts=i32([3, 2, 1]))),
    (ValueError, "drafts", dict(drafts=i32([4, 2]))),
    (ValueError, "drafts", dict(drafts=i32([-1, 2]))),
    (ValueError, "min_verify", dict(min_verify=3, max_verify=2)),
    (ValueError, "min_verify", dict(min_verify=-1)),
    (ValueError, "max_verify", dict(max_verify=4)),
    (ValueError, "max_verify", dict(max_verify=-1)),
    (ValueError, "extra_tokens", dict(extra_tokens=-1)),
    (ValueError, "extra_emitting", dict(extra_emitting=-1)),
    (ValueError, "token_offset", dict(token_offset=-1)),
    (ValueError, "mode", dict(mode="lagged")),
    (ValueError, "capacity", dict(capacity=1)),
    (ValueError, "capacity", dict(capacity=3, extra_tokens=2)),
    (ValueError, "capacity", dict(capacity=100, cost_table=linear_table(max_tokens=64))),
    (ValueError, "cost_table", dict(mode="greedy")),
    (ValueError, "cost_table", dict(mode="global")),
    (TypeError, "cost_table", dict(mode="greedy", cost_table={1: 1.0})),
    (ValueError, "budget", dict(mode="fixed")),
    (ValueError, "budget", dict(mode="all", budget=3)),
    (ValueError, "budget", dict(mode="greedy", cost_table=linear_table(), budget=3)),
    (ValueError, "budget", dict(mode="fixed", budget=-1)),
    (TypeError, "budget", dict(mode="fixed", budget=2.0)),
    (TypeError, "budget", dict(mode="fixed", budget=torch.tensor(2.0))),
    (ValueError, "budget", dict(mode="fixed", budget=i32([2]))),
    (ValueError, "num_tokens_padded", dict(num_tokens_padded=1)),
    (ValueError, "num_reqs_padded", dict(num_reqs_padded=1)),
    (ValueError, "context_lens", dict(context_lens=i32([1, 2, 3]))),
    (TypeError, "context_lens", dict(context_lens=torch.tensor([1.0, 2.0]))),
    (ValueError, "block_table", dict(context_lens=i32([4, 9]), block_table=i32([[0, 1]]), block_size=8)),
    (ValueError, "block_table", dict(block_table=i32([[0, 1], [2, 3]]), block_size=8)),  # no context_lens
    (ValueError, "block_size", dict(context_lens=i32([4, 9]), block_table=i32([[0, 1], [2, 3]]))),
    (ValueError, "block_size", dict(META, block_size=0)),
    (ValueError, "block_table", dict(META, context_lens=i32([4, 14]))),  # 14 + 3 tokens need a 3rd block
    (ValueError, "context_lens", dict(META, context_lens=i32([-1, 0]))),  # negative position
    (ValueError, "anchor_tokens", dict(anchor_tokens=i32([1, 2]))),
    (ValueError, "draft_tokens", dict(anchor_tokens=i32([1, 2]), draft_tokens=i32([[1, 2], [4, 5]]))),
    (ValueError, "anchor_tokens", dict(anchor_tokens=i32([1]), draft_tokens=i32([[1, 2, 3], [4, 5, 6]]))),
])
def test_bad_inputs_name_the_argument(exc, match, overrides):
    with pytest.raises(exc, match=match):
        _plan(**overrides)


# ----------------------------------------------------------------------------------------------------------
# Issue 16: every integer reaching the kernel is range-checked against the type it is narrowed to, and every
# size that drives host work is bounded before any work (found by fuzzing: python -m adaptive_verify.fuzz)
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("block_size", [2**31, 2**32, 2**32 + 16, 2**63, 2**70])
def test_block_size_beyond_int32_is_rejected_not_narrowed(block_size):
    """Finding 1: 2**32 reached the kernel's int32 field as 0 (SIGFPE dividing by it), 2**32 + 16 acted as 16."""
    with pytest.raises(ValueError, match=r"^block_size must be <= 2147483647"):
        _plan(**dict(META, block_size=block_size))
    plan = _plan(**dict(META, block_size=2**31 - 1))  # the largest valid size: one block holds every position
    assert plan.slot_mapping[:4].tolist() == [4, 5, 6, 7]


@pytest.mark.parametrize("padded", [2**31, 2**32 + 2, av.planner.MAX_REQS + 1])
def test_num_reqs_padded_beyond_max_reqs_is_rejected(padded):
    """Finding 2: 2**31 crashed (SIGSEGV), 2**32 + R left the padding rows unwritten."""
    with pytest.raises(ValueError, match=r"^num_reqs_padded must be <= "):
        _plan(num_reqs_padded=padded)
    with pytest.raises(ValueError, match=r"^num_reqs_padded must be <= "):
        VerifyPlan.allocate(padded, 8)


def test_extra_emitting_is_bounded_and_exact_at_the_bound():
    """Finding 5: from 2**32 the kernel's fixed-point numerator wrapped (budget 1 where the argmax is 0). Prefill
    emitters are requests: bounded by MAX_REQS, where Theta's numerator still fits 32.32 fixed point exactly."""
    for bad in (2**31 - 1, 2**32, 2**40):
        with pytest.raises(ValueError, match=r"^extra_emitting must be <= "):
            _plan(mode="global", cost_table=linear_table(), extra_emitting=bad, verification="onehot")
    survival = f32([[0.9, 0.5, 0.1], [0.8, 0.3, 0.2]])
    for extra in (0, 7, 2**20, av.planner.MAX_REQS):
        got = av.plan_verification(survival, D, linear_table(), mode="global", extra_emitting=extra,
                                   verification="onehot")
        want = ref.plan_verification(survival, D, linear_table(), mode="global", extra_emitting=extra)
        assert int(got.budget) == int(want.budget), extra
    # with a huge numerator every draft only adds cost: the exact argmax verifies none
    assert int(got.budget) == 0


def test_context_lens_whose_sums_would_wrap_int32_are_rejected_on_cpu():
    """Finding 8: context_lens near 2**31 wrapped seq_lens negative (kernel and reference alike)."""
    top = av.planner.MAX_CONTEXT_LEN
    assert top == 2**31 - 1 - 64
    for bad in ([top + 1, 0], [2**31 - 1, 0], [0, -1], [-(2**31), 5]):
        with pytest.raises(ValueError, match="context_lens"):
            _plan(context_lens=i32(bad))
        with pytest.raises(ValueError, match="context_lens"):
            ref.plan_verification(S, D, mode="all", context_lens=i32(bad))
    plan = _plan(context_lens=i32([top, top - 5]))  # the bound itself: positions and seq_lens exact, no wrap
    assert plan.seq_lens.tolist() == [top + 4, top - 5 + 3]
    assert plan.positions[:4].tolist() == [top, top + 1, top + 2, top + 3]
    assert int(plan.seq_lens.min()) > 0


def test_huge_extra_tokens_fail_before_any_work():
    """Finding 4: extra_tokens = 2**31 in greedy mode without max_tokens built a Python list per token count
    (10**8 passed 2 GiB in 18 s). Every count the search needs must fit the table's token_limit: checked first."""
    table = linear_table()
    for extra in (2**31, 2**24):
        t0 = time.perf_counter()
        with pytest.raises(ValueError, match="extra_tokens"):
            av.plan_verification(S, D, table, mode="greedy", extra_tokens=extra)
        assert time.perf_counter() - t0 < 1.0
    shifted = table.shifted(2**24 - 10)  # a prompt chunk already in the step leaves only 10 tokens
    assert shifted.token_limit == 10
    with pytest.raises(ValueError, match="extra_tokens"):
        av.plan_verification(S, D, shifted, mode="greedy", extra_tokens=3)
    plan = av.plan_verification(S, D, shifted, mode="greedy", extra_tokens=2)  # 2 anchors, 2 prompt, 6 drafts
    assert plan.verify_lens.tolist() == ref.plan_verification(S, D, shifted, mode="greedy", extra_tokens=2) \
        .verify_lens.tolist()


def test_out_fields_that_are_not_tensors_are_type_errors():
    """Issue 16, finding 7: an out= field that is not a tensor raised AttributeError; a field the call does not
    write, if not a tensor, did so on the remembered path (found by fuzzing)."""
    out = VerifyPlan.allocate(2, 8, positions=True)
    with pytest.raises(TypeError, match=r"^out\.token_req must be a torch\.Tensor"):
        _plan(out=dataclasses.replace(out, token_req=[0] * 8))
    for _ in range(2):  # the second call would take the remembered path
        with pytest.raises(TypeError, match=r"^out\.positions must be a torch\.Tensor or None"):
            _plan(out=dataclasses.replace(out, positions=[0] * 8))


def test_sparse_and_other_layouts_are_rejected_by_name():
    """Found by fuzzing: a sparse tensor raised torch's RuntimeError (no data pointer) instead of naming it."""
    with pytest.raises(TypeError, match="^conf must be a dense"):
        av.prefix_survival(S.to_sparse(), D)
    with pytest.raises(TypeError, match="^survival must be a dense"):
        _plan(survival=S.to_sparse())
    with pytest.raises(TypeError, match="^drafts must be a dense"):
        _plan(drafts=D.to_sparse())


def test_block_table_too_short_reference_agrees():
    with pytest.raises(ValueError, match="block_table"):
        ref.plan_verification(S, D, mode="all", **dict(META, context_lens=i32([4, 14])))
    # exactly enough blocks is fine: positions 14..17 need blocks 1 and 2 -> 3 blocks
    plan = _plan(context_lens=i32([4, 14]), block_table=i32([[0, 1, 5], [2, 3, 6]]), block_size=8)
    assert plan.slot_mapping.tolist() == [4, 5, 6, 7, 30, 31, 48, -1]  # T_pad = R + R * K = 8


@pytest.mark.parametrize("field,shape", [
    ("verify_lens", (3,)), ("query_start_loc", (2,)), ("token_req", (5,)), ("budget", (1,)),
    ("num_tokens", (1,)), ("expected_tokens", (1,)), ("seq_lens", (1,)), ("positions", (7,)),
    ("slot_mapping", (7,)), ("input_ids", (7,)), ("token_req", (8, 1)), ("seq_lens", (3,)),
])
def test_bad_out_buffers(field, shape):
    kwargs = dict(META, anchor_tokens=i32([1, 2]), draft_tokens=i32([[1, 2, 3], [4, 5, 6]]))
    out = VerifyPlan.allocate(2, 8, positions=True, slot_mapping=True, input_ids=True)  # default T_pad = 8
    _plan(out=out, **kwargs)  # the good buffers work
    bad = getattr(out, field)
    with pytest.raises(ValueError, match=rf"out\.{field}"):
        _plan(out=dataclasses.replace(out, **{field: torch.zeros(shape, dtype=bad.dtype)}), **kwargs)
    with pytest.raises(TypeError, match=rf"out\.{field}"):
        _plan(out=dataclasses.replace(out, **{field: bad.to(torch.float64)}), **kwargs)
    with pytest.raises(dataclasses.FrozenInstanceError):  # a plan's buffers are fixed: the planner relies on it
        setattr(out, field, bad)


def test_token_buffers_longer_than_t_pad_hold_the_plan_in_their_first_entries():
    """Persistent token buffers sized for the largest step (each may differ): the first T_pad entries are written and
    the plan returned holds views of them; the request buffers keep their exact shapes."""
    kwargs = dict(META, anchor_tokens=i32([1, 2]), draft_tokens=i32([[1, 2, 3], [4, 5, 6]]))
    want = _plan(**kwargs)  # T_pad = 8
    out = VerifyPlan.allocate(2, 8, positions=True, slot_mapping=True, input_ids=True)
    out = dataclasses.replace(out, token_req=torch.full((11,), 77, dtype=torch.int32),
                              slot_mapping=torch.full((30,), 77, dtype=torch.int64))
    got = _plan(out=out, **kwargs)
    assert_plans_equal(got, want)
    assert got.token_req.data_ptr() == out.token_req.data_ptr() and got.token_req.shape == (8,)
    assert out.token_req[8:].tolist() == [77] * 3 and (out.slot_mapping[8:] == 77).all()  # past T_pad: untouched


def test_out_missing_buffers_and_wrong_type():
    out = VerifyPlan.allocate(2, 8)  # no positions / slots
    with pytest.raises(ValueError, match=r"out\.seq_lens"):
        _plan(out=out, **META)
    with pytest.raises(TypeError, match="out"):
        _plan(out={"verify_lens": torch.zeros(2, dtype=torch.int32)})
    with pytest.raises(ValueError, match=r"out\.input_ids"):
        _plan(out=out, anchor_tokens=i32([1, 2]), draft_tokens=i32([[1, 2, 3], [4, 5, 6]]))


def test_choose_budget_and_prefix_survival_errors():
    table = linear_table()
    with pytest.raises(ValueError, match="mode"):
        av.choose_budget(S, D, table, mode="fixed")
    with pytest.raises(ValueError, match="cost_table"):
        av.choose_budget(S, D, None, mode="global")
    with pytest.raises(TypeError, match="conf"):
        av.prefix_survival([[0.5]], i32([1]))
    with pytest.raises(ValueError, match="conf"):
        av.prefix_survival(torch.full((3,), 0.5), i32([1, 1, 1]))
    with pytest.raises(TypeError, match="survival|conf"):
        av.prefix_survival(S.double(), D)
    with pytest.raises(ValueError, match="drafts"):
        av.prefix_survival(S, i32([4, 0]))
    with pytest.raises(ValueError, match="drafts"):
        av.prefix_survival(S, i32([-1, 0]))
    with pytest.raises(ValueError, match="out"):
        av.prefix_survival(S, D, out=torch.zeros(3, 2))
    with pytest.raises(TypeError, match="out"):
        av.prefix_survival(S, D, out=torch.zeros(2, 3, dtype=torch.float64))


@pytest.mark.cuda
def test_device_mismatch():
    survival = S.cuda()
    with pytest.raises(ValueError, match="drafts"):
        av.plan_verification(survival, D, mode="all")
    with pytest.raises(ValueError, match="context_lens"):
        av.plan_verification(survival, D.cuda(), mode="all", context_lens=i32([1, 2]))
    with pytest.raises(ValueError, match="budget"):
        av.plan_verification(survival, D.cuda(), mode="fixed", budget=torch.tensor(2, dtype=torch.int32))


def test_huge_fixed_budget_is_clamped_or_named():
    # the docstring: a Python int budget is clamped to [B_min, B_max]; any other answer must name `budget`
    for budget in (2**31, 2**40, 2**63 - 1, 2**63, 2**70):
        try:
            plan = av.plan_verification(S, D, mode="fixed", budget=budget)
        except (TypeError, ValueError) as exc:
            assert "budget" in str(exc), (budget, exc)
            continue
        assert int(plan.budget) == 5 and plan.verify_lens.tolist() == [3, 2], budget


def test_zero_requests_write_every_output():
    # R = 0 (a step without decode rows) passes validation, so every output must hold its padding values
    # (or the call must raise an error naming survival)
    survival, drafts = torch.zeros(0, 3), torch.zeros(0, dtype=torch.int32)
    for kwargs in (dict(mode="all", token_offset=4, num_tokens_padded=3), dict(mode="all", num_reqs_padded=2)):
        want = ref.plan_verification(survival, drafts, **kwargs)
        Rp, Tp = kwargs.get("num_reqs_padded", 0), kwargs.get("num_tokens_padded", 0)
        assert want.query_start_loc.tolist() == [kwargs.get("token_offset", 0)] * (Rp + 1)
        assert want.token_req.tolist() == [-1] * Tp and int(want.budget) == 0
        for sentinel in (SENTINEL, -7):
            out = poisoned_out(Rp, Tp, kwargs, sentinel)
            try:
                plan = av.plan_verification(survival, drafts, out=out, **kwargs)
            except ValueError as exc:
                assert "survival" in str(exc)
                continue
            assert_plans_equal(plan, want, f"R=0 {kwargs}, out= poisoned with {sentinel}: ")


def test_global_mode_warns_once_per_declaration():
    """Live global is lossless with one-hot verification (docs/design.md, "Planner"): declared "onehot" it is silent;
    undeclared or "probs" it warns once each, saying which verification makes it lossless."""
    _warned_global.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        av.plan_verification(S, D, linear_table(), mode="global", verification="onehot")
    with pytest.warns(UserWarning, match="lossless with one-hot verification"):
        av.plan_verification(S, D, linear_table(), mode="global")
    with pytest.warns(UserWarning, match="NOT lossless"):
        av.plan_verification(S, D, linear_table(), mode="global", verification="probs")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        av.plan_verification(S, D, linear_table(), mode="global")  # second call of each kind: silent
        av.plan_verification(S, D, linear_table(), mode="global", verification="probs")
        av.plan_verification(S, D, linear_table(), mode="greedy", verification="probs")
    with pytest.raises(ValueError, match="^verification"):
        av.plan_verification(S, D, linear_table(), mode="global", verification="sampled")


# ----------------------------------------------------------------------------------------------------------
# 5. Lagged mode
# ----------------------------------------------------------------------------------------------------------


@settings(max_examples=40, **SETTINGS)
@given(
    R0=st.integers(1, 40), R1=st.integers(1, 40), K=st.integers(1, 16), seed=st.integers(0, 2**32 - 1),
    min_verify=st.integers(0, 3), extra_tokens=st.sampled_from((0, 5)), as_tensor=st.booleans(),
)
def test_lagged_budget_is_clamped_to_the_new_step(R0, R1, K, seed, min_verify, extra_tokens, as_tensor):
    rng = np.random.default_rng(seed)
    min_verify = min(min_verify, K)
    table = gen_cost_table(rng, 0)
    if table.max_tokens is not None:
        table = av.CostTable.from_points(table.verify_ms, draft_ms=table.draft_ms, graph_sizes=table.graph_sizes)
    prev = gen_survival(rng, R0, K, "prefix", 0.0)
    prev_drafts = torch.from_numpy(rng.integers(0, K + 1, size=R0).astype(np.int32))
    B = av.choose_budget(prev, prev_drafts, table, mode="global", min_verify=min_verify, extra_tokens=extra_tokens)
    assert int(B) == int(ref.choose_budget(prev, prev_drafts, table, mode="global", min_verify=min_verify,
                                           extra_tokens=extra_tokens))
    cur = gen_survival(rng, R1, K, "prefix", 0.0)
    cur_drafts = torch.from_numpy(rng.integers(0, K + 1, size=R1).astype(np.int32))
    plan = av.plan_verification(cur, cur_drafts, table, mode="fixed", budget=B if as_tensor else int(B),
                                min_verify=min_verify, extra_tokens=extra_tokens)
    cands, _ = model_candidates(cur, cur_drafts, min_verify, K)
    b_max = len(cands)
    b_min = min(sum(c[0] for c in cands), b_max)
    assert int(plan.budget) == max(b_min, min(int(B), b_max))
    want = [0] * R1
    for c in cands[: int(plan.budget)]:
        want[c[3]] += 1
    assert plan.verify_lens.tolist() == want


# ----------------------------------------------------------------------------------------------------------
# 6. torch.library registration and torch.compile
# ----------------------------------------------------------------------------------------------------------


def _opcheck_plan_args(mode, with_meta):
    rng = np.random.default_rng(7)
    R, K = 5, 4
    survival = gen_survival(rng, R, K, "prefix", 0.0)
    drafts = i32([4, 0, 2, 4, 3])
    kwargs = dict(mode=mode, min_verify=1, extra_tokens=2, extra_emitting=1, token_offset=3, num_reqs_padded=7,
                  num_tokens_padded=30)
    if mode == "fixed":
        kwargs["budget"] = torch.tensor(6, dtype=torch.int32)
    if with_meta:
        kwargs.update(context_lens=i32([3, 0, 9, 17, 1]), block_table=torch.arange(5 * 6, dtype=torch.int32).view(5, 6),
                      block_size=4, anchor_tokens=i32([10, 20, 30, 40, 50]),
                      draft_tokens=torch.arange(5 * 4, dtype=torch.int32).view(5, 4))
    table = linear_table(draft_ms=1.5)
    a = resolve_plan_args(survival, drafts, table, **kwargs)
    tensors, config, draft_cost = pack_plan_args(a)
    out = VerifyPlan.allocate(7, 30, positions=with_meta, slot_mapping=with_meta, input_ids=with_meta)
    err = torch.zeros(len(av_errors.error_buffer("cpu")), dtype=torch.int32)
    args = (*tensors, out.verify_lens, out.budget, out.expected_tokens, out.num_tokens, out.query_start_loc,
            out.token_req, out.seq_lens, out.positions, out.slot_mapping, out.input_ids, None, None, None, None, err,
            config, draft_cost)  # the four tree outputs: None for chains
    return args, out, (survival, drafts, table, kwargs)


@pytest.mark.parametrize("mode", ["greedy", "global", "fixed", "all"])
@pytest.mark.parametrize("with_meta", [False, True])
def test_opcheck_plan_into(mode, with_meta):
    args, out, (survival, drafts, table, kwargs) = _opcheck_plan_args(mode, with_meta)
    torch.library.opcheck(torch.ops.adaptive_verify.plan_into.default, args)
    torch.ops.adaptive_verify.plan_into(*args)
    a = resolve_plan_args(survival, drafts, table, **kwargs)
    assert_plans_equal(token_views(out, a, a.num_tokens_padded),
                       ref.plan_verification(survival, drafts, table, **kwargs))


def test_opcheck_prefix_survival_into():
    conf = torch.from_numpy(np.random.default_rng(3).uniform(0, 1, size=(6, 5)).astype(np.float32))
    drafts = i32([5, 0, 3, 1, 5, 2])
    out = torch.empty(6, 5)
    err = torch.zeros(len(av_errors.error_buffer("cpu")), dtype=torch.int32)
    torch.library.opcheck(torch.ops.adaptive_verify.prefix_survival_into.default, (conf, drafts, out, err))
    torch.ops.adaptive_verify.prefix_survival_into(conf, drafts, out, err)
    assert torch.equal(out, ref.prefix_survival(conf, drafts))


def test_torch_compile_matches_eager():
    pytest.importorskip("torch._dynamo")
    import torch._dynamo

    table = linear_table(draft_ms=1.5)
    context_lens, block_table = i32([3, 0, 9, 17]), torch.arange(4 * 8, dtype=torch.int32).view(4, 8)
    anchors, draft_tokens = i32([10, 20, 30, 40]), torch.arange(4 * 5, dtype=torch.int32).view(4, 5)

    def step(conf, drafts):
        survival = av.prefix_survival(conf, drafts)
        plan = av.plan_verification(
            survival, drafts, table, mode="greedy", context_lens=context_lens, block_table=block_table,
            block_size=4, anchor_tokens=anchors, draft_tokens=draft_tokens, token_offset=2, num_reqs_padded=6,
            num_tokens_padded=30,
        )
        B = av.choose_budget(survival, drafts, table, mode="global")
        return (survival, B) + tuple(getattr(plan, name) for name in PLAN_FIELDS)

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=False)
    rng = np.random.default_rng(11)
    for drafts in (i32([5, 0, 2, 5]), i32([1, 5, 5, 3])):
        conf = torch.from_numpy(rng.uniform(0.3, 1.0, size=(4, 5)).astype(np.float32))
        eager = step(conf, drafts)
        got = compiled(conf, drafts)
        assert len(got) == len(eager)
        for name, g, e in zip(("survival", "choose_budget") + PLAN_FIELDS, got, eager):
            assert g.dtype == e.dtype and torch.equal(g, e), f"{name}: compiled {g} vs eager {e}"
        assert int(eager[2 + PLAN_FIELDS.index("budget")]) > 0  # the case exercises the allocation
    # the compiled graphs really go through the registered ops (not an eager fallback)
    explained = torch._dynamo.explain(step)(conf, drafts)
    code = "\n".join(g.code for g in explained.graphs)
    assert "adaptive_verify.prefix_survival_into" in code and "adaptive_verify.plan_into" in code


# ----------------------------------------------------------------------------------------------------------
# 7. Determinism and request permutation
# ----------------------------------------------------------------------------------------------------------


@settings(max_examples=30, **SETTINGS)
@given(case=plan_cases())
def test_deterministic(case):
    a = av.plan_verification(case["survival"], case["drafts"], case["cost_table"], **case["kwargs"])
    b = av.plan_verification(case["survival"].clone(), case["drafts"].clone(), case["cost_table"], **case["kwargs"])
    assert_plans_equal(a, b)


@settings(max_examples=40, **SETTINGS)
@given(
    R=st.integers(1, 60), K=st.integers(1, 16), seed=st.integers(0, 2**32 - 1),
    mode=st.sampled_from(("greedy", "global", "fixed", "all")), min_verify=st.integers(0, 2),
)
def test_permuting_requests_permutes_verify_lens(R, K, seed, mode, min_verify):
    rng = np.random.default_rng(seed)
    # distinct survivals (no ties anywhere): a random permutation of distinct dyadic values, sorted per row
    values = rng.permutation(np.arange(1, R * K + 1)).astype(np.float64) / (R * K + 1)
    survival = torch.from_numpy(np.sort(values.reshape(R, K), axis=1)[:, ::-1].astype(np.float32).copy())
    assert len(set(survival.flatten().tolist())) == R * K
    drafts = torch.from_numpy(rng.integers(0, K + 1, size=R).astype(np.int32))
    table = gen_cost_table(rng, R) if mode in ("greedy", "global") else None
    kwargs = dict(mode=mode, min_verify=min(min_verify, K))
    if mode == "fixed":
        kwargs["budget"] = int(rng.integers(0, R * K + 1))
    base = av.plan_verification(survival, drafts, table, **kwargs)
    perm = torch.from_numpy(rng.permutation(R))
    permuted = av.plan_verification(survival[perm].contiguous(), drafts[perm].contiguous(), table, **kwargs)
    assert int(permuted.budget) == int(base.budget)
    assert torch.equal(permuted.verify_lens, base.verify_lens[perm])


def test_out_buffers_resized_in_place_are_validated_again():
    """The planner remembers validated out= buffers between calls; a buffer resized in place must not
    slip through that memo (it would be written out of bounds)."""
    out = av.VerifyPlan.allocate(4, 12)
    kw = dict(mode="all", num_reqs_padded=4, num_tokens_padded=12, out=out)
    av.plan_verification(S[:4].contiguous(), D[:4].contiguous(), **kw)
    out.token_req.resize_(3)
    with pytest.raises(ValueError, match="out.token_req"):
        av.plan_verification(S[:4].contiguous(), D[:4].contiguous(), **kw)


def test_repeated_calls_see_new_values_in_the_same_buffers():
    """The planner skips re-validating a repeated call's arguments: the kernel must still read the buffers'
    current values (also for int64 drafts, which are converted, hence never remembered), and a buffer
    reshaped in place must be validated again."""
    ct = linear_table()
    survival = torch.tensor([[0.9, 0.8, 0.1], [0.7, 0.2, 0.1]])
    for drafts in (i32([3, 3]), torch.tensor([3, 3], dtype=torch.int64)):
        first = av.plan_verification(survival, drafts, ct, mode="all")
        assert first.verify_lens.tolist() == [3, 3]
        drafts.copy_(torch.tensor([1, 0]))
        survival[0, 0] = float("nan")
        again = av.plan_verification(survival, drafts, ct, mode="all")
        assert again.verify_lens.tolist() == [0, 0]
        survival[0, 0] = 0.9
    survival.resize_(2, 40)
    with pytest.raises(ValueError, match="K"):
        av.plan_verification(survival, drafts, ct, mode="all")


def test_empty_batch_from_numpy_is_accepted():
    """[0, K] tensors made from numpy carry strides (0, 0); nothing is read, so they are valid inputs."""
    conf = torch.from_numpy(np.zeros((0, 4), dtype=np.float32))
    drafts = torch.from_numpy(np.zeros(0, dtype=np.int32))
    s = av.prefix_survival(conf, drafts)
    assert s.shape == (0, 4)


# ----------------------------------------------------------------------------------------------------------
# Drafts the engine invalidated (token id -1, e.g. by a grammar) are not candidates
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["greedy", "global", "fixed", "all"])
def test_invalidated_drafts_end_their_requests_candidates(mode):
    """A negative draft token ends its request's candidates (vLLM marks grammar-invalidated drafts -1): it and
    every later draft of the request are never verified, in every mode, with or without input_ids, and
    choose_budget prices only the valid drafts."""
    rng = np.random.default_rng(5)
    R, K = 6, 5
    survival = gen_survival(rng, R, K, "prefix", 0.0)
    survival[:] = survival.clamp(min=0.5)  # every draft is worth verifying
    drafts = i32([5, 5, 3, 5, 0, 5])
    tokens = torch.arange(R * K, dtype=torch.int32).view(R, K) + 100
    tokens[0, 2] = -1  # request 0: drafts 0, 1 valid
    tokens[1, 0] = -1  # request 1: nothing to verify
    tokens[3, 4] = -7  # any negative id
    tokens[5, 3] = -1
    want_caps = [2, 0, 3, 4, 0, 3]
    table = linear_table(draft_ms=50.0)
    kw = dict(mode=mode, draft_tokens=tokens)
    if mode == "fixed":
        kw["budget"] = 100
    for extra in ({}, dict(anchor_tokens=i32(range(R)), context_lens=i32([3] * R))):
        plan = av.plan_verification(survival, drafts, table, **kw, **extra, verification="onehot")
        assert plan.verify_lens.tolist() == want_caps, (mode, plan.verify_lens.tolist())
        assert_plans_equal(plan, ref.plan_verification(survival, drafts, table, **kw, **extra))
        if "anchor_tokens" in extra:  # the verified drafts' tokens are the valid ones
            assert bool((plan.input_ids >= 0).all())
    if mode != "fixed":
        b = av.choose_budget(survival, drafts, table, mode=mode, draft_tokens=tokens)
        assert int(b) == int(ref.choose_budget(survival, drafts, table, mode=mode, draft_tokens=tokens))
        if mode == "all":
            assert int(b) == sum(want_caps)
    # Without draft_tokens the planner cannot know: every drafted position is a candidate.
    plain = av.plan_verification(survival, drafts, table, mode="all")
    assert plain.verify_lens.tolist() == drafts.tolist()


@pytest.mark.parametrize("K", [4, 8, 16])
@pytest.mark.parametrize("mode", ["global", "fixed"])
def test_draft_tokens_keep_full_rows_on_the_vector_walk(K, mode):
    """The CPU kernel walks full rows (every draft a candidate, none forced) with SIMD when K % 4 == 0; with
    draft_tokens it still may, for the rows none of whose tokens is invalidated. Mixed batches (clean full rows,
    rows cut by a negative token at every position, short rows, NaN survivals) must equal the reference."""
    rng = np.random.default_rng(K)
    R = 97
    survival = gen_survival(rng, R, K, "prefix", 0.05)
    drafts = torch.from_numpy(np.where(rng.random(R) < 0.8, K, rng.integers(0, K + 1, R)).astype(np.int32))
    tokens = torch.from_numpy(rng.integers(0, 1000, (R, K)).astype(np.int32))
    cut = rng.random(R) < 0.3
    tokens[torch.from_numpy(cut), torch.from_numpy(rng.integers(0, K, R))[torch.from_numpy(cut)]] = -1
    table = linear_table(draft_ms=2.0)
    kw = dict(mode=mode, draft_tokens=tokens, anchor_tokens=i32(range(R)), context_lens=i32([5] * R))
    if mode == "fixed":
        kw["budget"] = R * K // 3
    plan = av.plan_verification(survival, drafts, table, **kw, verification="onehot")
    assert_plans_equal(plan, ref.plan_verification(survival, drafts, table, **kw))
    assert bool((plan.input_ids >= 0).all())


@pytest.mark.parametrize("mode", ["all", "greedy", "global", "fixed"])
@pytest.mark.parametrize("conf", [False, True])
def test_no_requests_plan_nothing(mode, conf):
    """R = 0 in every mode, from survivals or confidences. Under tests/sanitize.sh, UndefinedBehaviorSanitizer reported
    here once (2026-12-03, fuzz plan_verification with R = 0 in a fresh worker): the CPU planner passed an empty
    scratch vector's null data() to memcpy for zero bytes, which memcpy forbids. Whether data() is null depends on
    whether the thread's reused scratch ever grew, so this test covers the path but cannot force the report."""
    K = 4
    x, drafts = torch.empty(0, K), torch.zeros(0, dtype=torch.int32)
    ct = av.CostTable.from_points({1: 1.0, 4096: 3.0}, draft_ms=0.5)
    kw = dict(mode=mode, budget=3) if mode == "fixed" else dict(mode=mode)
    plan = av.plan_verification(None, drafts, ct, conf=x, **kw) if conf else av.plan_verification(x, drafts, ct, **kw)
    assert plan.verify_lens.numel() == 0 and int(plan.budget) == 0
    assert plan.query_start_loc.tolist() == [0]
