"""choose_tree_shape: a tree's draft depth, beam width and verify budget decided together (docs/design.md, "Drafting
from the budget").

The C++ CPU kernel against the reference's brute force over (W, D, B), on random trees of awkward sizes and on
EAGLE-2-shaped beam trees, with every keyword the budget takes; what the decision means (a chain given as a tree is
choose_draft_depth's decision at width 1, cheaper wide levels widen the beam); invariance to the requests' order;
the cost of a shape; the errors; and, on the kernel's own struct, that a width skipped as equivalent to a narrower
one is skipped only when it costs no less and its latency cap is no looser. Per-level widths (widths=): the brute
force on random and beam trees with every non-increasing and random unordered profile lists, a beam that narrows
where only level 1's siblings pay, the profiles listed, their cost, and errors. The CUDA kernel's run of the same
cases under the emulator is in test_planner_emu.py.
"""
import ctypes

import pytest
import torch

import adaptive_verify as av
from adaptive_verify import reference as ref
from adaptive_verify._ext import _C
from adaptive_verify.cost import tree_draft_cost
from test_planner_depth import block_table, chain_table


def random_trees(R, N, seed, *, lo=0.2):
    """Random parents (parents[j] < j), conditional confidences in [lo, 1), random sizes."""
    g = torch.Generator().manual_seed(seed)
    parents = torch.full((R, N), -1, dtype=torch.int32)
    for j in range(1, N):
        parents[:, j] = (torch.rand(R, generator=g) * (j + 1)).long() - 1
    conf = torch.rand(R, N, generator=g) * (1 - lo) + lo
    sizes = torch.randint(0, N + 1, (R,), generator=g, dtype=torch.int32)
    return av.tree_survival(conf, parents, sizes), parents, sizes, g


def beam_trees(R, k, depth, seed, *, lo=0.05):
    """EAGLE-2-shaped trees: level 1 the anchor's k children, each later level k children of each of the k best
    nodes of the level before (by path confidence); nodes numbered level by level. Siblings split a request's
    acceptance mass ``top`` (their confidences sum to it; the first child is the likeliest)."""
    g = torch.Generator().manual_seed(seed)
    N = k + (depth - 1) * k * k
    parents = torch.full((R, N), -1, dtype=torch.int32)
    conf = torch.empty(R, N)
    surv = torch.empty(R, N)
    top = (torch.rand(R, generator=g) * (1 - lo) + lo)[:, None]  # [R, 1] each request's top-child confidence
    share = torch.sort(torch.rand(R, k, generator=g), dim=1, descending=True).values  # [R, k]
    split = top * share / share.sum(1, keepdim=True)  # [R, k]
    conf[:, :k] = split
    surv[:, :k] = conf[:, :k]
    level = torch.arange(k)[None, :].expand(R, k)  # [R, k] node indices of the last level
    at = k
    for _ in range(1, depth):
        beam = torch.gather(level, 1, torch.argsort(-torch.gather(surv, 1, level), dim=1, stable=True)[:, :k])
        for b in range(k):
            noise = torch.rand(R, k, generator=g) * 0.2 + 0.9
            c = split * noise / 1.1  # (sums stay below top)
            parents[:, at:at + k] = beam[:, b:b + 1].int()
            conf[:, at:at + k] = c
            surv[:, at:at + k] = torch.gather(surv, 1, beam[:, b:b + 1]) * c
            at += k
        level = torch.arange(at - k * k, at)[None, :].expand(R, k * k)
    sizes = torch.full((R,), N, dtype=torch.int32)
    return av.tree_survival(conf, parents, sizes), parents, sizes, g


def check(survival, parents, sizes, table, **kw):
    got = av.choose_tree_shape(survival, parents, sizes, table, **kw)
    want = ref.choose_tree_shape(survival, parents, sizes, table, **kw)
    assert tuple(int(x) for x in got) == tuple(int(x) for x in want), kw
    assert all(x.dtype == torch.int32 and x.dim() == 0 for x in got)
    return tuple(int(x) for x in got)


TABLES = {
    "uniform levels": lambda L: chain_table(levels=L),
    "wide levels cheap": lambda L: chain_table({1: 0.01, 4096: 0.05}, levels=L, draft={1: 2.0, 512: 3.0}),
    "per-request term": lambda L: chain_table(levels=L, request_ms=0.004),
    "costly drafter": lambda L: chain_table(levels=L, draft={1: 6.0, 512: 30.0}),
}


@pytest.mark.parametrize("table", list(TABLES))
@pytest.mark.parametrize("R,N,L,W", [(1, 1, 1, 1), (3, 7, 4, 3), (17, 13, 5, 2), (40, 31, 6, 4), (9, 63, 8, 5)])
def test_random_trees_match_brute_force(table, R, N, L, W):
    ct = TABLES[table](L)
    for seed in range(2):
        survival, parents, sizes, _ = random_trees(R, N, seed, lo=0.1 + 0.4 * seed)
        check(survival, parents, sizes, ct, max_width=W)


@pytest.mark.parametrize("R,k,depth", [(2, 2, 3), (11, 3, 4), (33, 4, 4)])
def test_beam_trees_match_brute_force(R, k, depth):
    seen = set()
    for seed, table in enumerate(TABLES):
        survival, parents, sizes, _ = beam_trees(R, k, depth, seed)
        seen.add(check(survival, parents, sizes, TABLES[table](depth), max_width=k)[:2])
    assert len(seen) > 1, seen  # the tables lead to different shapes


@pytest.mark.parametrize("R,N", [(5, 9), (37, 21)])
def test_every_keyword_matches_brute_force(R, N):
    """max_verify, capacity, prompt tokens (extra_tokens and a shifted table), extra_emitting, weights, invalidated
    drafts, a NaN survival, min_depth / max_depth and a latency target, and conf=."""
    for seed in range(3):
        survival, parents, sizes, g = random_trees(R, N, 20 + seed)
        ct = chain_table({1: 0.02, 512: 0.1}, levels=5, request_ms=0.002 * seed, max_tokens=2048)
        weights = torch.rand(R, generator=g) * 3
        ids = torch.arange(N, dtype=torch.int32).repeat(R, 1)  # distinct siblings (a duplicate raises on CPU)
        ids[torch.rand(R, N, generator=g) < 0.1] = -1  # invalidated: the node and its subtree leave
        nan_survival = survival.clone()
        nan_survival[R // 2, 1] = float("nan")
        cases = [dict(max_verify=N // 2), dict(capacity=R + R // 3), dict(extra_tokens=300), dict(extra_emitting=3),
                 dict(weights=weights), dict(draft_tokens=ids), dict(min_depth=1), dict(min_depth=2, max_depth=4),
                 dict(max_depth=0), dict(max_step_ms=5.0), dict(max_step_ms=4.2 + seed, weights=weights),
                 dict(max_step_ms=1.0)]
        for kw in cases:
            check(survival, parents, sizes, ct, max_width=3, **kw)
        check(nan_survival, parents, sizes, ct, max_width=2)
        check(survival, parents, sizes, ct.shifted(500), max_width=3, capacity=2048 - 500)
        check(None, parents, sizes, ct, max_width=3, conf=torch.rand(R, N, generator=g))


def test_a_chain_is_choose_draft_depth_at_width_one():
    """A chain given as a tree: every depth has one node, so every width drafts the same nodes at the same cost
    only at width 1 (wider beams cost more rows): the decision is choose_draft_depth's."""
    g = torch.Generator().manual_seed(4)
    R, K = 23, 6
    conf = torch.rand(R, K, generator=g) * 0.7 + 0.3
    drafts = torch.full((R,), K, dtype=torch.int32)
    survival = av.prefix_survival(conf, drafts)
    parents = (torch.arange(K, dtype=torch.int32) - 1).repeat(R, 1)
    for ct in (chain_table(levels=K), chain_table({1: 0.01, 512: 0.03}, levels=K)):
        d, b = (int(x) for x in av.choose_draft_depth(survival, drafts, ct))
        assert check(survival, parents, drafts, ct, max_width=4) == (d, 1, b)


def test_cheaper_wide_levels_widen_the_beam():
    """Two level-1 nodes, each with one child: width 1 drafts the better one's child only, width 2 both (twice the
    rows at level 2). As a later level's per-row cost falls, the chosen width never falls, from 1 to 2."""
    R = 16
    survival = torch.tensor([[0.5, 0.45, 0.45, 0.405]]).repeat(R, 1)
    parents = torch.tensor([[-1, -1, 0, 1]], dtype=torch.int32).repeat(R, 1)
    sizes = torch.full((R,), 4, dtype=torch.int32)
    shapes = []
    for per_row in (0.05, 0.002, 0.0005):
        ct = chain_table({1: per_row, 4096: 4096 * per_row}, levels=2,
                         draft={1: 0.5 + per_row, 4096: 0.5 + 4096 * per_row}, sizes=(256,))
        shapes.append(check(survival, parents, sizes, ct, max_width=2))
    assert [w for _, w, _ in shapes] == [1, 1, 2] and shapes[-1] == (2, 2, 4 * R), shapes


def test_request_order_does_not_matter():
    survival, parents, sizes, g = random_trees(45, 17, 9)
    ct = chain_table(levels=5)
    weights = torch.rand(45, generator=g) * 2
    for kw in (dict(), dict(weights=weights), dict(capacity=80)):
        base = av.choose_tree_shape(survival, parents, sizes, ct, max_width=3, **kw)
        perm = torch.randperm(45, generator=g)
        kw_p = dict(kw, weights=weights[perm]) if "weights" in kw else kw
        moved = av.choose_tree_shape(survival[perm].contiguous(), parents[perm].contiguous(),
                                     sizes[perm].contiguous(), ct, max_width=3, **kw_p)
        assert tuple(int(x) for x in base) == tuple(int(x) for x in moved)


def test_out_triple():
    survival, parents, sizes, _ = random_trees(7, 9, 2)
    ct = chain_table(levels=4)
    out = tuple(torch.full((), -5, dtype=torch.int32) for _ in range(3))
    got = av.choose_tree_shape(survival, parents, sizes, ct, max_width=2, out=out)
    assert all(a is b for a, b in zip(got, out))
    assert tuple(int(x) for x in out) == tuple(int(x) for x in ref.choose_tree_shape(survival, parents, sizes, ct,
                                                                                    max_width=2))


def test_an_empty_batch():
    """R = 0 (an empty tensor's pointer may be null: the kernel knows the tree decision by its widths): the brute
    force's answer, no speculation unless a prefill that samples makes drafting free."""
    ct = chain_table(levels=4)
    empty = (torch.zeros(0, 5), torch.zeros(0, 5, dtype=torch.int32), torch.zeros(0, dtype=torch.int32))
    for kw in (dict(max_width=3), dict(max_width=2, extra_tokens=7, extra_emitting=2)):
        assert check(*empty, ct, **kw)[2] == 0


def test_tree_draft_cost():
    ct = chain_table({1: 0.1, 512: 0.3}, levels=4, draft={1: 1.0, 512: 4.0}, request_ms=0.01)
    for r in (1, 7, 100):
        for d in range(5):
            assert tree_draft_cost(ct, r, d, 1) == pytest.approx(ct.draft_cost(r, d))
        level = ct.draft_cost(3 * r, 4) - ct.draft_cost(3 * r, 3)
        assert tree_draft_cost(ct, r, 3, 3) == pytest.approx(ct.draft_cost(r, 1) + 2 * level)
        assert tree_draft_cost(ct, r, 1, 4) == ct.draft_cost(r, 1)  # level 1 is the anchors' forward at any width
    with pytest.raises(ValueError, match="cost_table"):
        tree_draft_cost(block_table(), 4, 2, 2)
    with pytest.raises(ValueError, match="depth"):
        tree_draft_cost(ct, 4, 5, 1)
    with pytest.raises(ValueError, match="width"):
        tree_draft_cost(ct, 4, 2, 0)


def test_bad_arguments_name_themselves():
    survival, parents, sizes, _ = random_trees(4, 6, 1)
    ct = chain_table(levels=4)
    for kw, match in [(dict(max_width=0), "max_width"), (dict(max_width=17), "max_width"),
                      (dict(max_width=2, max_depth=5), "max_depth"), (dict(max_width=2, min_depth=-1), "min_depth"),
                      (dict(max_width=2, min_depth=3, max_depth=2), "min_depth"),
                      (dict(max_width=2, step=av.PlanStep(min_verify=1)), "min_verify"),
                      (dict(max_width=2, out=(torch.zeros((), dtype=torch.int32),)), "out")]:
        with pytest.raises((ValueError, TypeError), match=match):
            av.choose_tree_shape(survival, parents, sizes, ct, **kw)
    with pytest.raises(ValueError, match="cost_table"):
        av.choose_tree_shape(survival, parents, sizes, block_table(), max_width=2)
    with pytest.raises(ValueError, match="parents"):
        av.choose_tree_shape(survival, None, sizes, ct, max_width=2)
    wide = chain_table(levels=32)
    with pytest.raises(ValueError, match="max_width \\* \\(max_depth \\+ 1\\)"):
        av.choose_tree_shape(survival, parents, sizes, wide, max_width=8)
    bad = parents.clone()
    bad[0, 3] = 5
    with pytest.raises(ValueError, match="parents"):
        av.choose_tree_shape(survival, bad, torch.full((4,), 6, dtype=torch.int32), ct, max_width=2)


def _filled_struct(call):
    """The parameter struct a CPU call fills (its launch intercepted), to run the kernel again on edited costs. Its
    pointers stay valid while the call's own tensors do: inputs that needed no conversion (int32 / float32,
    contiguous: the caller's), the out= triple, and the cost table (it holds the verify cost array)."""
    from adaptive_verify.planner import tree_shape

    held = {}
    real = tree_shape.launch

    def grab(p, device, op):
        held["p"] = p
        return real(p, device, op)

    tree_shape.launch = grab
    try:
        call()
    finally:
        tree_shape.launch = real
    return held["p"]


def test_a_width_that_drafts_the_same_nodes_is_weighed_by_its_own_cost_and_cap():
    """Every level-2 node hangs under the best level-1 node, so width 2 drafts width 1's nodes at every depth (the
    kernel skips such a shape only when it costs no less and its latency cap is no looser: a CostTable's costs grow
    with the rows, so the public call cannot show it). On the struct: width 2 made cheaper at depth 2 wins there;
    with equal costs, width 1's latency cap at 0 drafts and width 2's none, width 2 verifies and wins; a negative
    cost for width 1 (its Theta negative) does not make the costlier width 2 redundant."""
    R = 16
    survival = torch.tensor([[0.6, 0.3, 0.55, 0.5]]).repeat(R, 1)
    parents = torch.tensor([[-1, -1, 0, 0]], dtype=torch.int32).repeat(R, 1)
    sizes = torch.full((R,), 4, dtype=torch.int32)
    ct = chain_table(levels=2)
    out = tuple(torch.zeros((), dtype=torch.int32) for _ in range(3))
    p = _filled_struct(lambda: av.choose_tree_shape(survival, parents, sizes, ct, max_width=2, out=out))
    assert tuple(int(x) for x in out) == check(survival, parents, sizes, ct, max_width=2)
    s1, s2 = 2, (p.max_depth + 1) + 2  # (W, D) = (1, 2) and (2, 2)
    assert p.depth_cost[s2] >= p.depth_cost[s1]  # the table's: a wider beam never costs less
    address = ctypes.addressof(p)

    p.depth_cost[s2] = 0.0  # (2, 2): width 1's nodes for nothing
    assert _C.plan(address, False, 0) == 0
    assert (int(out[0]), int(out[1])) == (2, 2), tuple(int(x) for x in out)

    p.depth_cost[s2] = p.depth_cost[s1]
    p.depth_step_cap[s1], p.depth_step_cap[s2] = 0, 2 ** 62  # (1, 2) may verify nothing, (2, 2) anything
    for s in range(2 * (p.max_depth + 1)):
        if s not in (s1, s2):
            p.depth_cost[s] = 1e9  # every other shape out of the running
    assert _C.plan(address, False, 0) == 0
    assert (int(out[0]), int(out[1])) == (2, 2) and int(out[2]) > 0, tuple(int(x) for x in out)

    p.depth_step_cap[s1] = p.depth_step_cap[s2]
    p.depth_cost[s1], p.depth_cost[s2] = -100.0, 0.0  # (1, 2)'s Theta negative: costing less does not dominate
    assert _C.plan(address, False, 0) == 0
    assert (int(out[0]), int(out[1])) == (2, 2), tuple(int(x) for x in out)


# ---- per-level widths (widths=) ----


def check_levels(survival, parents, sizes, table, **kw):
    """choose_tree_shape(widths=...) against the brute force: (depth, per-level widths as a tuple, budget)."""
    got = av.choose_tree_shape(survival, parents, sizes, table, **kw)
    want = ref.choose_tree_shape(survival, parents, sizes, table, **kw)
    d_hi = got[1].numel()
    assert got[0].dim() == 0 and got[2].dim() == 0 and got[1].shape == (d_hi,) and got[1].dtype == torch.int32
    mine = (int(got[0]), tuple(got[1].tolist()), int(got[2]))
    assert mine == (int(want[0]), tuple(want[1].tolist()), int(want[2])), kw
    assert all(w == 0 for w in mine[1][max(mine[0] - 1, 0):]), mine  # nothing expanded from level D on
    return mine


def random_profiles(g, n, levels, max_width):
    """n random width profiles of `levels` widths each, in no particular order (not non-increasing either)."""
    return [tuple(int(x) for x in torch.randint(1, max_width + 1, (levels,), generator=g)) for _ in range(n)]


@pytest.mark.parametrize("table", list(TABLES))
@pytest.mark.parametrize("R,N,L,W", [(1, 1, 1, 1), (3, 7, 4, 3), (17, 13, 5, 2), (40, 31, 4, 4), (9, 63, 6, 3)])
def test_per_level_widths_match_brute_force(table, R, N, L, W):
    """Random trees with every non-increasing profile, and with random profiles in random order (a profile's
    skip against the next one must hold for any list)."""
    ct = TABLES[table](L)
    for seed in range(2):
        survival, parents, sizes, g = random_trees(R, N, 50 + seed, lo=0.1 + 0.4 * seed)
        profiles = av.tree_width_profiles(W, L - 1)
        if len(profiles) * (L + 1) <= _C.PLANNER_MAX_SHAPES:
            check_levels(survival, parents, sizes, ct, widths=profiles)
        check_levels(survival, parents, sizes, ct, widths=random_profiles(g, 6, L - 1, W + 1))


@pytest.mark.parametrize("R,k,depth", [(2, 2, 3), (11, 3, 4), (33, 4, 4)])
def test_per_level_widths_on_beam_trees(R, k, depth):
    """EAGLE-2-shaped trees over every non-increasing profile: the brute force's decisions, which differ across the
    tables and seeds."""
    seen = set()
    for seed, table in enumerate(TABLES):
        survival, parents, sizes, _ = beam_trees(R, k, depth, seed)
        seen.add(check_levels(survival, parents, sizes, TABLES[table](depth),
                              widths=av.tree_width_profiles(k, depth - 1))[:2])
    assert len(seen) > 1, seen


def test_per_level_widths_with_every_keyword():
    R, N = 13, 21
    for seed in range(2):
        survival, parents, sizes, g = random_trees(R, N, 70 + seed)
        ct = chain_table({1: 0.02, 512: 0.1}, levels=4, request_ms=0.002 * seed, max_tokens=2048)
        weights = torch.rand(R, generator=g) * 3
        ids = torch.arange(N, dtype=torch.int32).repeat(R, 1)
        ids[torch.rand(R, N, generator=g) < 0.1] = -1
        profiles = av.tree_width_profiles(3, 3)
        for kw in [dict(max_verify=N // 2), dict(capacity=R + R // 3), dict(extra_tokens=300), dict(weights=weights),
                   dict(draft_tokens=ids), dict(min_depth=2), dict(max_depth=2), dict(max_depth=0),
                   dict(max_step_ms=4.2 + seed), dict(max_step_ms=1.0, weights=weights)]:
            check_levels(survival, parents, sizes, ct, widths=profiles, **kw)
        check_levels(None, parents, sizes, ct, widths=profiles, conf=torch.rand(R, N, generator=g))
        check_levels(survival, parents, sizes, ct.shifted(500), widths=profiles, capacity=2048 - 500)


def test_a_narrowing_beam_wins_where_only_level_one_siblings_pay():
    """Two likely level-1 nodes, each with one likely child; of those two level-2 nodes only the first has a likely
    child. Expanding both level-1 nodes and one level-2 node, (2, 1), drafts every node worth verifying; the uniform
    beam must expand two level-2 nodes to reach depth 3, the same budget for more drafting."""
    R = 16
    #    l1a  l1b  a.0   a.1   b.0   b.1   a.0.0 a.0.1 b.0.0 b.0.1 a.1.0 b.1.0
    s = [0.8, 0.7, 0.75, 0.03, 0.65, 0.02, 0.7, 0.02, 0.05, 0.01, 0.02, 0.01]
    par = [-1, -1, 0, 0, 1, 1, 2, 2, 4, 4, 3, 5]
    survival = torch.tensor([s]).repeat(R, 1)
    parents = torch.tensor([par], dtype=torch.int32).repeat(R, 1)
    sizes = torch.full((R,), len(s), dtype=torch.int32)
    per_row = 0.0002
    ct = chain_table({1: per_row, 4096: 4096 * per_row}, levels=3,
                     draft={1: 0.5 + 2 * per_row, 4096: 0.5 + 8192 * per_row}, sizes=tuple(range(8, 257, 8)))
    assert check_levels(survival, parents, sizes, ct, widths=av.tree_width_profiles(2, 2)) == (3, (2, 1, 0), 5 * R)
    assert check(survival, parents, sizes, ct, max_width=2) == (3, 2, 5 * R)


def test_tree_width_profiles():
    from math import comb

    for W, levels in [(1, 0), (1, 5), (3, 2), (4, 3), (2, 6)]:
        ps = av.tree_width_profiles(W, levels)
        assert len(ps) == comb(W + levels - 1, levels) and ps == sorted(set(ps))
        assert all(len(p) == levels and all(1 <= x <= W for x in p) for p in ps)
        assert all(all(a >= b for a, b in zip(p, p[1:])) for p in ps)
    with pytest.raises(ValueError, match="max_width"):
        av.tree_width_profiles(8, 5)  # 792 profiles
    with pytest.raises(ValueError, match="max_width"):
        av.tree_width_profiles(0, 2)


def test_tree_draft_cost_per_level():
    ct = chain_table({1: 0.1, 512: 0.3}, levels=4, draft={1: 1.0, 512: 4.0}, request_ms=0.003)
    L = 4

    def level(n):
        return ct.draft_cost(n, L) - ct.draft_cost(n, L - 1)

    for r in (1, 7, 100):
        assert tree_draft_cost(ct, r, 4, (3, 2, 1)) == pytest.approx(ct.draft_cost(r, 1) + level(3 * r)
                                                                     + level(2 * r) + level(r))
        assert tree_draft_cost(ct, r, 2, (3, 2, 1)) == pytest.approx(ct.draft_cost(r, 1) + level(3 * r))
        assert tree_draft_cost(ct, r, 1, ()) == ct.draft_cost(r, 1)
        assert tree_draft_cost(ct, r, 3, (2, 2)) == pytest.approx(tree_draft_cost(ct, r, 3, 2))
    # choose_tree_shape's per-shape costs (each width's later level priced once) are tree_draft_cost's floats exactly
    from adaptive_verify.planner.tree_shape import tree_shape_costs
    for r in (1, 7, 100):
        profiles = av.tree_width_profiles(3, 3)
        assert tree_shape_costs(ct, r, profiles, 4) == [tree_draft_cost(ct, r, d, w) + ct.request_ms * r
                                                        for w in profiles for d in range(5)]
        assert tree_shape_costs(ct, r, 3, 4) == [tree_draft_cost(ct, r, d, w) + ct.request_ms * r
                                                 for w in range(1, 4) for d in range(5)]
    with pytest.raises(ValueError, match="width"):
        tree_draft_cost(ct, 4, 3, (2,))
    with pytest.raises(ValueError, match="width\\[1\\]"):
        tree_draft_cost(ct, 4, 3, (2, 0))


def test_per_level_bad_arguments_name_themselves():
    survival, parents, sizes, _ = random_trees(4, 6, 1)
    ct = chain_table(levels=4)
    prof = av.tree_width_profiles(2, 3)
    zeros = tuple(torch.zeros((), dtype=torch.int32) for _ in range(3))
    for kw, match in [(dict(), "max_width"), (dict(max_width=2, widths=prof), "widths"), (dict(widths=[]), "widths"),
                      (dict(widths="22"), "widths"), (dict(widths=[2, 1]), "widths\\[0\\]"),
                      (dict(widths=[(2, 1, 1), (2, 1)]), "widths"),
                      (dict(widths=[(2, 0, 1)]), "widths\\[0\\]\\[1\\]"),
                      (dict(widths=[(17, 1, 1)]), "widths\\[0\\]\\[0\\]"),
                      (dict(widths=[(2, 1)], max_depth=4), "widths"),
                      (dict(widths=[(2, 1, 1)] * 60), "len\\(widths\\)"), (dict(widths=prof, out=zeros), "out\\[1\\]")]:
        with pytest.raises((ValueError, TypeError), match=match):
            av.choose_tree_shape(survival, parents, sizes, ct, **kw)
    out = (torch.zeros((), dtype=torch.int32), torch.zeros(4, dtype=torch.int32), torch.zeros((), dtype=torch.int32))
    got = av.choose_tree_shape(survival, parents, sizes, ct, widths=prof, out=out)
    assert all(a is b for a, b in zip(got, out))
    buf = torch.zeros(8, dtype=torch.int32)
    for overlapping in ((buf[1], buf[0:4], buf[6]), (buf[4], buf[0:4], buf[4]), (buf[0], buf[0:4], buf[5])):
        with pytest.raises(ValueError, match="overlap"):  # the widths' [max_depth] would write over depth or budget
            av.choose_tree_shape(survival, parents, sizes, ct, widths=prof, out=overlapping)
    got = av.choose_tree_shape(survival, parents, sizes, ct, widths=prof, out=(buf[0], buf[1:5], buf[5]))
    assert (int(got[0]), got[1].tolist(), int(got[2])) == (int(out[0]), out[1].tolist(), int(out[2]))
