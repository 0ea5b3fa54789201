"""choose_draft_depth: the draft depth and the budget decided together (docs/design.md, "Drafting from the budget").

The C++ CPU kernel against the brute force over (D, B) of the reference, on random survivals of awkward sizes with
every keyword the budget takes; what the decision means (a block drafter's smallest depth, no speculation when no
draft pays); invariance to the requests' order; and the errors. The CUDA kernel's run of the same cases under the
emulator is in test_planner_emu.py.
"""
import math
import time

import pytest
import torch

import adaptive_verify as av
from adaptive_verify import reference as ref

VERIFY = {1: 4.0, 16: 4.3, 64: 4.8, 256: 6.0, 1024: 10.0, 4096: 32.0}


def chain_table(level_ms=None, *, levels=8, draft=None, request_ms=0.0, max_tokens=None, sizes=(8, 16, 32, 64, 128)):
    """A level-by-level drafter of ``levels`` levels: uniform levels, or one level after the first costing
    ``level_ms``."""
    return av.CostTable.from_points(VERIFY, draft if draft is not None else {1: 0.4, 64: 0.8, 512: 2.4},
                                    graph_sizes=sizes, max_tokens=max_tokens, request_ms=request_ms,
                                    draft_levels=levels, draft_level_ms=level_ms)


def block_table(draft=1.5):
    return av.CostTable.from_points(VERIFY, draft, graph_sizes=(8, 16, 32, 64, 128))


def problem(R, K, seed, *, lo=0.3):
    g = torch.Generator().manual_seed(seed)
    conf = torch.rand(R, K, generator=g) * (1 - lo) + lo
    drafts = torch.randint(0, K + 1, (R,), generator=g, dtype=torch.int32)
    return av.prefix_survival(conf, drafts), drafts, g


def check(survival, drafts, table, **kw):
    depth, budget = av.choose_draft_depth(survival, drafts, table, **kw)
    d_ref, b_ref, _ = ref.choose_draft_depth(survival, drafts, table, **kw)
    assert (int(depth), int(budget)) == (int(d_ref), int(b_ref)), kw
    assert depth.dtype == budget.dtype == torch.int32 and depth.dim() == budget.dim() == 0
    return int(depth), int(budget)


TABLES = {
    "uniform levels": lambda K: chain_table(levels=K),
    "first level heavy": lambda K: chain_table({1: 0.02, 512: 0.1}, levels=K),
    "per-request term": lambda K: chain_table(levels=K, request_ms=0.004),
    "block": lambda K: block_table(),
    "costly drafter": lambda K: chain_table(levels=K, draft={1: 6.0, 512: 30.0}),
}


@pytest.mark.parametrize("table", list(TABLES))
@pytest.mark.parametrize("R,K", [(1, 1), (3, 5), (17, 3), (64, 8), (129, 7)])
def test_matches_brute_force(table, R, K):
    ct = TABLES[table](K)
    for seed in range(3):
        survival, drafts, _ = problem(R, K, seed, lo=0.1 + 0.3 * seed)
        check(survival, drafts, ct)


@pytest.mark.parametrize("R,K", [(5, 4), (40, 6), (97, 8)])
def test_matches_brute_force_with_every_keyword(R, K):
    """min_verify, max_verify, capacity, prompt tokens (extra_tokens and a shifted table), extra_emitting, weights,
    invalidated drafts, a NaN survival, min_depth and a latency target."""
    for seed in range(4):
        survival, drafts, g = problem(R, K, 10 + seed)
        ct = chain_table(levels=K, request_ms=0.002 * seed, max_tokens=2048)
        weights = torch.rand(R, generator=g) * 3
        ids = torch.randint(0, 50, (R, K), generator=g, dtype=torch.int32)
        ids[torch.rand(R, K, generator=g) < 0.1] = -1
        nan_survival = survival.clone()
        nan_survival[R // 2, K // 2] = float("nan")
        cases = [
            dict(min_verify=1), dict(min_verify=2, max_verify=K - 1), dict(max_verify=max(1, K // 2)),
            dict(capacity=R + R // 3), dict(extra_tokens=300), dict(extra_emitting=3), dict(weights=weights),
            dict(draft_tokens=ids), dict(min_depth=1), dict(min_depth=K), dict(max_step_ms=5.0),
            dict(max_step_ms=4.0 + seed, min_verify=1), dict(max_step_ms=1.0),
        ]
        for kw in cases:
            check(survival, drafts, ct, **kw)
        check(nan_survival, drafts, ct)
        check(survival, drafts, ct.shifted(500), capacity=2048 - 500)
        check(None, drafts, ct, conf=torch.rand(R, K, generator=g))


def test_equal_survivals_and_ties():
    """Every survival equal, every row full: many (D, B) tie on Theta only by structure; the smallest D wins."""
    for value in (1.0, 0.5, 0.0):
        survival = torch.full((32, 6), value)
        drafts = torch.full((32,), 6, dtype=torch.int32)
        for ct in (chain_table(levels=6), block_table(0.0), block_table(3.0)):
            check(survival, drafts, ct)
    d, b = check(torch.zeros(8, 4), torch.full((8,), 4, dtype=torch.int32), block_table(0.0))
    assert (d, b) == (0, 0)  # nothing survives: no depth is better than none


def test_block_drafter_takes_the_smallest_depth_holding_its_budget():
    """A block drafter costs the same at every depth >= 1, so the budget is choose_budget's and D is the deepest
    position the budget reaches (any deeper ties and loses to the smaller depth)."""
    survival, drafts, _ = problem(48, 8, 3, lo=0.5)
    ct = block_table(1.0)
    d, b = check(survival, drafts, ct)
    assert b == int(av.choose_budget(survival, drafts, ct))
    plan = av.plan_verification(survival, drafts, ct, mode="fixed", budget=b)
    assert d == int(plan.verify_lens.max())


def test_no_speculation_when_no_draft_pays_for_the_drafter():
    survival, drafts, _ = problem(16, 4, 4, lo=0.05)
    survival = survival * 0.02  # drafts barely survive
    d, b = check(survival, drafts, chain_table(levels=4, draft={1: 20.0}))
    assert (d, b) == (0, 0)
    # A drafter whose first forward runs anyway (draft_catch_up, vLLM's EAGLE): 0 levels cost what 1 does, so drafts
    # worth verifying but not worth a forward of their own are drafted when the forward is paid anyway.
    kw = dict(graph_sizes=(8, 16, 32, 64, 128), draft_levels=4)
    caught = av.CostTable.from_points(VERIFY, {1: 20.0}, draft_catch_up=True, **kw)
    assert caught.draft_cost(5, 0) == caught.draft_cost(5, 1) == 5.0 and "draft_catch_up=True" in repr(caught)
    assert av.CostTable.from_dict(caught.to_dict()).draft_catch_up
    half, full = torch.full((16, 4), 0.5), torch.full((16,), 4, dtype=torch.int32)
    assert check(half, full, av.CostTable.from_points(VERIFY, {1: 20.0}, **kw)) == (0, 0)
    d, b = check(half, full, caught)
    assert d == 1 and b == 16


def test_a_cheaper_level_deepens_the_draft():
    """The same survivals: as each level after the first gets cheaper, the chosen depth never falls."""
    survival, drafts, _ = problem(64, 8, 5, lo=0.6)
    depths = []
    for level in (0.5, 0.25, 0.1, 0.02, 0.0):
        ct = chain_table(float(level), levels=8, draft={1: 4.2})
        depths.append(check(survival, drafts, ct)[0])
    assert depths == sorted(depths) and depths[-1] > depths[0], depths


def test_request_order_does_not_matter():
    survival, drafts, g = problem(77, 6, 6)
    ct = chain_table(levels=6)
    weights = torch.rand(77, generator=g) * 2
    for kw in (dict(), dict(min_verify=1, weights=weights), dict(capacity=120)):
        base = av.choose_draft_depth(survival, drafts, ct, **kw)
        perm = torch.randperm(77, generator=g)
        kw_p = dict(kw, weights=weights[perm]) if "weights" in kw else kw
        moved = av.choose_draft_depth(survival[perm].contiguous(), drafts[perm].contiguous(), ct, **kw_p)
        assert (int(base[0]), int(base[1])) == (int(moved[0]), int(moved[1]))


def test_out_and_expected_tokens():
    survival, drafts, _ = problem(20, 5, 7)
    ct = chain_table(levels=5)
    out = (torch.full((), -7, dtype=torch.int32), torch.full((), -7, dtype=torch.int32))
    depth, budget = av.choose_draft_depth(survival, drafts, ct, out=out)
    assert depth is out[0] and budget is out[1]
    d, b, _ = ref.choose_draft_depth(survival, drafts, ct)
    assert (int(depth), int(budget)) == (int(d), int(b))


def test_bad_arguments_name_themselves():
    survival, drafts, _ = problem(4, 3, 8)
    ct = chain_table(levels=3)
    with pytest.raises(ValueError, match="cost_table"):
        av.choose_draft_depth(survival, drafts, None)
    with pytest.raises(ValueError, match="min_depth"):
        av.choose_draft_depth(survival, drafts, ct, min_depth=4)
    with pytest.raises(ValueError, match="draft_levels"):
        av.choose_draft_depth(survival, drafts, chain_table(levels=2))
    av.choose_draft_depth(survival, drafts, chain_table(levels=2), max_verify=2)  # within the drafter's levels
    with pytest.raises(TypeError, match="out"):
        av.choose_draft_depth(survival, drafts, ct, out=torch.zeros((), dtype=torch.int32))
    one = torch.zeros((), dtype=torch.int32)
    with pytest.raises(ValueError, match="out"):
        av.choose_draft_depth(survival, drafts, ct, out=(one, one))
    with pytest.raises(ValueError, match="out"):
        av.choose_draft_depth(survival, drafts, ct, out=(one, torch.zeros(1, dtype=torch.int32)))
    with pytest.raises(ValueError, match="drafts"):
        av.choose_draft_depth(survival, torch.tensor([0, 1, 9, 0], dtype=torch.int32), ct)
    with pytest.raises(ValueError, match="max_step_ms"):
        av.choose_draft_depth(survival, drafts, ct, max_step_ms=-1.0)
    with pytest.raises(ValueError, match="step.budget"):
        av.choose_draft_depth(survival, drafts, ct, step=av.PlanStep(budget=3))


# ---- the cost of a level ----

def test_draft_cost_per_level():
    ct = chain_table({1: 0.1, 512: 0.2}, levels=4, draft={1: 1.0, 512: 2.0}, request_ms=0.01)
    assert ct.draft_cost(1) == ct.draft_cost(1, 4) == 1.0
    assert ct.draft_cost(1, 0) == 0.0
    assert math.isclose(ct.draft_cost(1, 1), 1.0 - 3 * 0.1)
    assert math.isclose(ct.draft_cost(512, 2), 2.0 - 2 * 0.2)
    assert math.isclose(ct.fixed_cost(10, 3), ct.draft_cost(10, 3) + 0.1)
    uniform = chain_table(levels=4, draft=2.0)
    assert [uniform.draft_cost(7, d) for d in range(5)] == [0.0, 0.5, 1.0, 1.5, 2.0]
    block = block_table(1.5)
    assert [block.draft_cost(3, d) for d in (0, 1, 7, 32)] == [0.0, 1.5, 1.5, 1.5] and block.draft_levels is None
    with pytest.raises(ValueError, match="levels"):
        uniform.draft_cost(1, 5)
    with pytest.raises(ValueError, match="levels"):
        block.draft_cost(1, 33)


def test_level_cost_checks_and_round_trip(tmp_path):
    with pytest.raises(ValueError, match="draft_level_ms needs draft_levels"):
        av.CostTable.from_points(VERIFY, 1.0, draft_level_ms=0.1)
    with pytest.raises(ValueError, match="draft_level_ms"):
        av.CostTable.from_points(VERIFY, {1: 1.0, 64: 2.0}, draft_levels=4, draft_level_ms={1: 0.2, 64: 0.7})
    with pytest.raises(ValueError, match="draft_levels"):
        av.CostTable.from_points(VERIFY, 1.0, draft_levels=0)
    with pytest.raises(TypeError, match="draft_level_ms"):
        av.CostTable.from_points(VERIFY, 1.0, draft_levels=2, draft_level_ms="fast")
    for ct in (chain_table({1: 0.02, 512: 0.1}, levels=6), chain_table(0.05, levels=3), chain_table(levels=5),
               block_table()):
        back = av.CostTable.from_dict(ct.to_dict())
        assert back == ct and back.draft_levels == ct.draft_levels and back.draft_level_ms == ct.draft_level_ms
        ct.to_json(tmp_path / "t.json")
        back = av.CostTable.from_json(tmp_path / "t.json")
        assert [back.draft_cost(33, d) for d in range(2)] == [ct.draft_cost(33, d) for d in range(2)]
    old = block_table().to_dict()
    old["format_version"] = 3
    del old["draft_levels"], old["draft_level_ms"], old["draft_catch_up"]
    assert av.CostTable.from_dict(old).draft_levels is None
    old["draft_levels"] = 4
    with pytest.raises(ValueError, match="unknown keys"):
        av.CostTable.from_dict(old)


def test_profile_times_a_level():
    calls = []

    def full(r):  # three levels of 1 ms; the level function runs one
        calls.append(("full", r))
        time.sleep(0.003)

    def one(r):
        calls.append(("one", r))
        time.sleep(0.001)

    ct = av.CostTable.profile(lambda n: time.sleep(0.001), token_counts=[1, 8], draft_fn=full, request_counts=[1, 4],
                              draft_levels=3, draft_level_fn=one, reps=2, warmup=0, device="cpu")
    assert ct.draft_levels == 3 and set(ct.draft_level_ms) == {1, 4}
    assert ("one", 4) in calls and ("full", 4) in calls
    with pytest.raises(ValueError, match="draft_level_fn"):
        av.CostTable.profile(lambda n: None, token_counts=[1], draft_level_fn=lambda r: None, device="cpu")
