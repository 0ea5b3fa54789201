"""CUDA planner == C++ CPU planner, exactly (both instantiate planner/algorithm.h); graph capture and replay.
The GPU tests are skipped without a GPU; tests/test_planner_emu.py runs the same cases through the kernel's
CUDA source under the host emulator."""
import warnings

import pytest
import torch

import adaptive_verify as av

needs_cuda = pytest.mark.cuda

FIELDS = ("verify_lens", "budget", "expected_tokens", "num_tokens", "query_start_loc", "token_req", "seq_lens",
          "positions", "slot_mapping", "input_ids")


def _cost_table():
    return av.CostTable.from_points(
        {1: 4.0, 64: 4.4, 256: 5.5, 1024: 9.0, 4096: 30.0, 32768: 200.0},
        draft_ms={1: 0.5, 256: 1.0, 4096: 4.0},
        graph_sizes=[8, 16, 32, 64, 128, 256, 512],
    )


def _problem(R, K, seed, *, ties=False, nan=False, block_size=16, invalid=False):
    g = torch.Generator().manual_seed(seed)
    conf = torch.rand(R, K, generator=g) * 0.6 + 0.4
    if ties:
        conf = (conf * 4).round() / 4
    drafts = torch.randint(0, K + 1, (R,), generator=g, dtype=torch.int32)
    survival = av.prefix_survival(conf, drafts)
    if nan and R > 2:
        survival[1, 0] = float("nan")
    ctx = torch.randint(0, 3000, (R,), generator=g, dtype=torch.int32)
    max_blocks = (3000 + K + 1) // block_size + 2
    block_table = torch.randint(0, 100000, (R, max_blocks), generator=g, dtype=torch.int32)
    anchor = torch.randint(0, 150000, (R,), generator=g, dtype=torch.int32)
    draft_tokens = torch.randint(0, 150000, (R, K), generator=g, dtype=torch.int32)
    if invalid:  # drafts the engine invalidated (-1): they end their request's candidates
        draft_tokens[torch.rand(R, K, generator=g) < 0.1] = -1
    return dict(survival=survival, drafts=drafts, context_lens=ctx, block_table=block_table, block_size=block_size,
                anchor_tokens=anchor, draft_tokens=draft_tokens)


def _to(d, device):
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in d.items()}


def _plan(prob, ct, **kw):
    rest = {k: v for k, v in prob.items() if k not in ("survival", "drafts")}
    return av.plan_verification(prob["survival"], prob["drafts"], ct, **kw, **rest)


def _assert_same(a, b, what):
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        if x is None or y is None:
            assert x is None and y is None, (what, f)
            continue
        assert torch.equal(x.cpu(), y.cpu()), f"{what}: field {f} differs"


def matches_cpu_cases(R, K, mode):
    """(problem, keyword arguments, label) of test_cuda_matches_cpu (also run by test_planner_emu.py)."""
    for seed, ties, nan, invalid in [(0, False, False, False), (1, True, False, False), (2, False, True, True)]:
        prob = _problem(R, K, seed + 17 * R, ties=ties, nan=nan, invalid=invalid)
        kw = dict(mode=mode, min_verify=1 if K > 1 else 0, extra_tokens=3, extra_emitting=2, token_offset=5,
                  num_reqs_padded=R + 5, num_tokens_padded=R + R * K + 11)
        if mode == "fixed":
            kw["budget"] = (R * K) // 3
        yield prob, kw, f"R={R} K={K} mode={mode} seed={seed}"


@needs_cuda
@pytest.mark.parametrize("R,K", [(1, 1), (7, 3), (83, 7), (256, 8), (300, 16), (1024, 16), (1200, 16), (5000, 4)])
@pytest.mark.parametrize("mode", ["greedy", "global", "fixed", "all"])
def test_cuda_matches_cpu(R, K, mode):
    ct = _cost_table()
    for prob, kw, what in matches_cpu_cases(R, K, mode):
        gp = _to(prob, "cuda")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # mode="global" warns that it is not lossless live
            cpu = _plan(prob, ct, **kw)
            gpu = _plan(gp, ct, **kw)
        _assert_same(cpu, gpu, what)
        if mode in ("greedy", "global", "all"):
            b_cpu = av.choose_budget(prob["survival"], prob["drafts"], ct, mode=mode)
            b_gpu = av.choose_budget(gp["survival"], gp["drafts"], ct, mode=mode)
            assert int(b_cpu) == int(b_gpu)


@needs_cuda
def test_prefix_survival_cuda_matches_cpu():
    for R, K in [(1, 1), (33, 5), (1000, 32)]:
        g = torch.Generator().manual_seed(R)
        conf = torch.rand(R, K, generator=g) * 1.4 - 0.2  # out of [0, 1] on purpose
        conf[0, 0] = float("nan")
        drafts = torch.randint(0, K + 1, (R,), generator=g, dtype=torch.int32)
        assert torch.equal(av.prefix_survival(conf, drafts), av.prefix_survival(conf.cuda(), drafts.cuda()).cpu())


@needs_cuda
def test_device_errors_are_counted_not_raised(planner_kernel):
    av.reset_error_counts("cuda")
    s = torch.rand(4, 3, device="cuda")
    s[2, 0] = float("nan")
    drafts = torch.tensor([3, 9, 3, -1], dtype=torch.int32, device="cuda")  # 9 and -1 out of [0, 3]
    ctx = torch.tensor([0, 0, 0, 40], dtype=torch.int32, device="cuda")
    bt = torch.zeros(4, 1, dtype=torch.int32, device="cuda")  # 16 positions per request only
    plan = av.plan_verification(s, drafts, mode="all", context_lens=ctx, block_table=bt, block_size=16)
    counts = av.error_counts("cuda")
    assert counts["nan_survival"] == 1
    assert counts["drafts_out_of_range"] == 2
    assert counts["slot_out_of_range"] == 1  # request 3's anchor at position 40
    assert plan.verify_lens.tolist() == [3, 3, 0, 0]  # clamped to K; NaN row never verified
    assert plan.slot_mapping[plan.query_start_loc[3]].item() == -1


@needs_cuda
@pytest.mark.parametrize("mode", ["greedy", "fixed"])
def test_cuda_graph_capture_and_replay(mode):
    R, K, Rp, Tp = 64, 8, 72, 64 * 9 + 8
    ct = _cost_table()
    first = _to(_problem(R, K, 3), "cuda")
    second = _to(_problem(R, K, 4), "cuda")
    bufs = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in first.items()}
    budget = torch.tensor(100, dtype=torch.int32, device="cuda")
    out = av.VerifyPlan.allocate(Rp, Tp, "cuda", positions=True, slot_mapping=True, input_ids=True)
    kw = dict(mode=mode, num_reqs_padded=Rp, num_tokens_padded=Tp, out=out)
    if mode == "fixed":
        kw["budget"] = budget

    def step():
        return _plan(bufs, ct, **kw)

    step()  # warm up: cost arrays, error buffer and the kernel's shared-memory opt-in exist before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for prob, b in ((second, 37), (first, 250)):
        for k, v in prob.items():
            if isinstance(v, torch.Tensor):
                bufs[k].copy_(v)
        budget.fill_(b)
        for t in (out.verify_lens, out.query_start_loc, out.token_req, out.slot_mapping, out.input_ids):
            t.fill_(-7)  # poison: replay must rewrite every element
        graph.replay()
        torch.cuda.synchronize()
        replayed = {f: getattr(out, f).clone() for f in FIELDS}
        eager = _plan(prob, ct, **{**kw, "out": None, **({"budget": b} if mode == "fixed" else {})})
        for f in FIELDS:
            assert torch.equal(replayed[f], getattr(eager, f)), f"replay differs from eager in {f}"


@needs_cuda
def test_repeated_runs_are_identical(planner_kernel):
    """A race shows up as a result that changes between identical runs."""
    prob = _to(_problem(1024, 16, 9, ties=True), "cuda")
    ct = _cost_table()
    ref = _plan(prob, ct)
    for _ in range(20):
        again = _plan(prob, ct)
        _assert_same(ref, again, "repeat")


def _stress_survival(kind, R, K, g):
    """Survivals that stress the planner's buckets: one value everywhere, a tight cluster of distinct values
    (buckets holding many different words), values outside [0, 1] and not monotone (sanitised, running min)."""
    if kind == "constant":
        return torch.full((R, K), 0.75)
    if kind == "cluster":
        return 0.5 + torch.rand(R, K, generator=g) * 1e-4
    return torch.rand(R, K, generator=g) * 1.4 - 0.2


def stress_cases(kind, R, K, mode):
    """(problem, keyword arguments, label) of test_cuda_matches_cpu_stress (also run by test_planner_emu.py):
    min/max verify and a capacity on survivals from _stress_survival."""
    g = torch.Generator().manual_seed(R * 31 + K)
    survival = _stress_survival(kind, R, K, g)
    drafts = torch.randint(0, K + 1, (R,), generator=g, dtype=torch.int32)
    prob = _problem(R, K, 5)
    prob.update(survival=survival, drafts=drafts)
    for min_verify, max_verify, capacity in [(0, None, None), (2, K - 1, None), (1, None, R + 3 + (R * K) // 5)]:
        min_verify = min(min_verify, K - 1)
        kw = dict(mode=mode, min_verify=min_verify, max_verify=max_verify, capacity=capacity, extra_tokens=3,
                  extra_emitting=1, num_reqs_padded=R + 2, num_tokens_padded=R + R * K + 4)
        if mode == "fixed":
            kw["budget"] = torch.tensor((R * K) // 2, dtype=torch.int32)
        yield prob, kw, f"{kind} R={R} K={K} mode={mode} min={min_verify} max={max_verify} cap={capacity}"


@needs_cuda
@pytest.mark.parametrize("kind", ["constant", "cluster", "wild"])
@pytest.mark.parametrize("R,K", [(5, 3), (256, 8), (700, 32)])
@pytest.mark.parametrize("mode", ["greedy", "global", "fixed", "all"])
def test_cuda_matches_cpu_stress(kind, R, K, mode):
    ct = _cost_table()
    for prob, kw, what in stress_cases(kind, R, K, mode):
        gp = _to(prob, "cuda")
        gkw = dict(kw, budget=kw["budget"].cuda()) if mode == "fixed" else kw
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cpu = _plan(prob, ct, **kw)
            gpu = _plan(gp, ct, **gkw)
        _assert_same(cpu, gpu, what)


# ----------------------------------------------------------------------------------------------------------
# Draft trees (plan_tree_verification, tree_survival): the same kernel with Params::parents set
# ----------------------------------------------------------------------------------------------------------

TREE_FIELDS = FIELDS + ("tree_mask", "token_parent", "token_node", "token_depth")


def tree_problem(R, N, seed, *, style="levels", ties=False, nan=False, invalid=False, block_size=16):
    """A batch of draft trees with metadata inputs; siblings carry distinct tokens."""
    g = torch.Generator().manual_seed(seed)
    parents = torch.empty(R, N, dtype=torch.int32)
    for j in range(N):
        if style == "chain":
            parents[:, j] = j - 1
        elif style == "star":
            parents[:, j] = -1
        elif style == "levels":  # EAGLE-2 style: 4 nodes per level, each under one of the previous level's
            parents[:, j] = -1 if j < 4 else (j // 4 - 1) * 4 + torch.randint(0, 4, (R,), generator=g)
        else:
            parents[:, j] = torch.randint(-1, j, (R,), generator=g) if j else -1
    conf = torch.rand(R, N, generator=g) * 0.6 + 0.4
    if ties:
        conf = (conf * 4).round() / 4
    sizes = torch.randint(0, N + 1, (R,), generator=g, dtype=torch.int32)
    survival = av.tree_survival(conf, parents, sizes)
    if nan and R > 2:
        survival[1, 0] = float("nan")
    ctx = torch.randint(0, 3000, (R,), generator=g, dtype=torch.int32)
    max_blocks = (3000 + N + 1) // block_size + 2
    block_table = torch.randint(0, 100000, (R, max_blocks), generator=g, dtype=torch.int32)
    anchor = torch.randint(0, 150000, (R,), generator=g, dtype=torch.int32)
    draft_tokens = torch.stack([torch.randperm(150000, generator=g)[:N] for _ in range(R)]).to(torch.int32)
    if invalid:
        draft_tokens[torch.rand(R, N, generator=g) < 0.1] = -1
    return dict(survival=survival, parents=parents, tree_sizes=sizes, context_lens=ctx, block_table=block_table,
                block_size=block_size, anchor_tokens=anchor, draft_tokens=draft_tokens)


def _plan_tree(prob, ct, **kw):
    rest = {k: v for k, v in prob.items() if k not in ("survival", "parents", "tree_sizes")}
    return av.plan_tree_verification(prob["survival"], prob["parents"], prob["tree_sizes"], ct, **kw, **rest)


def _assert_same_tree(a, b, what):
    for f in TREE_FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        if x is None or y is None:
            assert x is None and y is None, (what, f)
            continue
        assert torch.equal(x.cpu(), y.cpu()), f"{what}: field {f} differs"


TREE_CASES = [(0, "levels", False, False, False), (1, "random", True, False, False), (2, "star", False, True, True),
              (3, "chain", True, False, False)]


def tree_matches_cpu_cases(R, N, mode, cases=TREE_CASES):
    """(problem, keyword arguments, label) of test_cuda_tree_matches_cpu (also run by test_planner_emu.py)."""
    for seed, style, ties, nan, invalid in cases:
        prob = tree_problem(R, N, seed + 13 * R, style=style, ties=ties, nan=nan, invalid=invalid)
        kw = dict(mode=mode, min_verify=2 if N > 2 else 0, extra_tokens=3, extra_emitting=2, token_offset=5,
                  num_reqs_padded=R + 5, num_tokens_padded=R + R * N + 11)
        if mode == "fixed":
            kw["budget"] = (R * N) // 3
        yield prob, kw, f"tree R={R} N={N} mode={mode} seed={seed} {style}"


@needs_cuda
@pytest.mark.parametrize("R,N", [(1, 1), (7, 5), (64, 16), (256, 31), (256, 63), (1024, 16)])
@pytest.mark.parametrize("mode", ["greedy", "global", "fixed", "all"])
def test_cuda_tree_matches_cpu(R, N, mode):
    ct = _cost_table()
    for prob, kw, what in tree_matches_cpu_cases(R, N, mode):
        gp = _to(prob, "cuda")
        _assert_same_tree(_plan_tree(prob, ct, **kw), _plan_tree(gp, ct, **kw), what)
        if mode != "fixed":
            b_cpu = av.choose_budget(prob["survival"], prob["tree_sizes"], ct, mode=mode, parents=prob["parents"])
            b_gpu = av.choose_budget(gp["survival"], gp["tree_sizes"], ct, mode=mode, parents=gp["parents"])
            assert int(b_cpu) == int(b_gpu)
        conf = torch.rand(prob["survival"].shape)
        assert torch.equal(av.tree_survival(conf, prob["parents"], prob["tree_sizes"]),
                           av.tree_survival(conf.cuda(), gp["parents"], gp["tree_sizes"]).cpu())


def bad_tree_inputs():
    """A tree batch with every malformed value the device must survive, and the valid batch it must equal: the
    offending nodes (bad parent, duplicate sibling) replaced by invalidated drafts (id -1), which remove a node and
    its subtree without a count, and the tree sizes clamped. Returns (bad, equivalent, expected counters)."""
    prob = tree_problem(6, 8, 77, style="random")
    prob["tree_sizes"] = torch.tensor([8, 8, 8, 8, 9, -2], dtype=torch.int32)  # two outside [0, 8]
    bad, good = dict(prob), dict(prob)
    bad["parents"], good["parents"] = prob["parents"].clone(), prob["parents"].clone()
    bad["draft_tokens"], good["draft_tokens"] = prob["draft_tokens"].clone(), prob["draft_tokens"].clone()
    good["tree_sizes"] = torch.tensor([8, 8, 8, 8, 8, 0], dtype=torch.int32)
    bad["parents"][0, 3] = 3  # its own parent: not topological
    bad["parents"][1, 5] = -4  # out of range
    bad["parents"][2, 2] = 40
    for r, j in ((0, 3), (1, 5), (2, 2)):
        good["parents"][r, j] = -1
        good["draft_tokens"][r, j] = -1
    p = int(prob["parents"][3, 6])  # node 6 of request 3 repeats an earlier sibling's token
    sibling = next((q for q in range(6) if int(prob["parents"][3, q]) == p), None)
    if sibling is None:  # make one: node 6 and node 0 both hang from the anchor
        bad["parents"][3, 6] = good["parents"][3, 6] = -1
        sibling = 0
    bad["draft_tokens"][3, 6] = prob["draft_tokens"][3, sibling]
    good["draft_tokens"][3, 6] = -1
    return bad, good, dict(bad_parent=3, duplicate_sibling=1, drafts_out_of_range=2)


@needs_cuda
def test_cuda_tree_bad_inputs_are_counted_not_raised():
    bad, good, counts = bad_tree_inputs()
    ct = _cost_table()
    av.reset_error_counts("cuda")
    got = _plan_tree(_to(bad, "cuda"), ct, mode="all")
    seen = av.error_counts("cuda")
    assert {k: seen[k] for k in counts} == counts
    _assert_same_tree(got, _plan_tree(good, ct, mode="all"), "bad inputs on CUDA")


@needs_cuda
@pytest.mark.parametrize("mode", ["global", "fixed"])
def test_cuda_tree_graph_capture_and_replay(mode):
    R, N, Rp = 64, 24, 72
    Tp = Rp + R * N
    ct = _cost_table()
    first, second = (_to(tree_problem(R, N, s, style=st), "cuda") for s, st in ((3, "levels"), (4, "random")))
    bufs = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in first.items()}
    budget = torch.tensor(100, dtype=torch.int32, device="cuda")
    out = av.TreeVerifyPlan.allocate(Rp, Tp, "cuda", positions=True, slot_mapping=True, input_ids=True)
    kw = dict(mode=mode, num_reqs_padded=Rp, num_tokens_padded=Tp, out=out)
    if mode == "fixed":
        kw["budget"] = budget
    _plan_tree(bufs, ct, **kw)  # warm up: cost arrays, error buffer, shared-memory opt-in exist before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _plan_tree(bufs, ct, **kw)
    for prob, b in ((second, 37), (first, 250)):
        for k, v in prob.items():
            if isinstance(v, torch.Tensor):
                bufs[k].copy_(v)
        budget.fill_(b)
        for f in TREE_FIELDS:
            getattr(out, f).fill_(-7)  # poison: replay must rewrite every element
        graph.replay()
        torch.cuda.synchronize()
        eager = _plan_tree(prob, ct, **{**kw, "out": None, **({"budget": b} if mode == "fixed" else {})})
        _assert_same_tree(out, eager, "replay")


@needs_cuda
@pytest.mark.parametrize("R,K", [(1, 1), (9, 5), (256, 8), (1200, 16)])
def test_cuda_draft_depth_matches_cpu(R, K):
    """choose_draft_depth's CUDA kernel (plan_kernel<true>, at most 512 threads) against the CPU kernel, on the
    shared-memory and the global-workspace sizes, then replayed in a CUDA graph on new values."""
    from test_planner_depth import chain_table, problem
    survival, drafts, g = problem(R, K, R + K)
    ct = chain_table({1: 0.02, 512: 0.04}, levels=K, max_tokens=8192)
    weights = torch.rand(R, generator=g) * 2
    for kw in (dict(), dict(min_verify=1), dict(weights=weights, extra_tokens=100), dict(max_step_ms=6.0)):
        cpu = av.choose_draft_depth(survival, drafts, ct, **kw)
        gkw = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
        gpu = av.choose_draft_depth(survival.cuda(), drafts.cuda(), ct, **gkw)
        assert (int(cpu[0]), int(cpu[1])) == (int(gpu[0]), int(gpu[1])), kw
    s_buf, d_buf = survival.cuda(), drafts.cuda()
    out = (torch.zeros((), dtype=torch.int32, device="cuda"), torch.zeros((), dtype=torch.int32, device="cuda"))
    av.choose_draft_depth(s_buf, d_buf, ct, out=out)  # warm up (cost arrays, shared-memory opt-in)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        av.choose_draft_depth(s_buf, d_buf, ct, out=out)
    for seed, lo in ((1, 0.05), (2, 0.8)):
        s2, d2, _ = problem(R, K, seed, lo=lo)
        s_buf.copy_(s2)
        d_buf.copy_(d2)
        out[0].fill_(-7)
        graph.replay()
        torch.cuda.synchronize()
        want = av.choose_draft_depth(s2, d2, ct)
        assert (int(out[0]), int(out[1])) == (int(want[0]), int(want[1]))


@needs_cuda
@pytest.mark.parametrize("R,N", [(1, 4), (37, 21), (700, 63)])
def test_cuda_tree_shape_matches_cpu(R, N):
    """choose_tree_shape's CUDA kernel (choose_depth's tree branch) against the CPU kernel, then in a CUDA graph."""
    from test_planner_depth import chain_table
    from test_planner_tree_shape import random_trees
    survival, parents, sizes, g = random_trees(R, N, R + N)
    ct = chain_table({1: 0.01, 4096: 0.05}, levels=4, max_tokens=65536)
    weights = torch.rand(R, generator=g) * 2
    for kw in (dict(max_width=3), dict(max_width=2, weights=weights, extra_tokens=100), dict(max_width=4, max_step_ms=6.0)):
        cpu = av.choose_tree_shape(survival, parents, sizes, ct, **kw)
        gkw = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
        gpu = av.choose_tree_shape(survival.cuda(), parents.cuda(), sizes.cuda(), ct, **gkw)
        assert tuple(int(x) for x in cpu) == tuple(int(x) for x in gpu), kw
    bufs = [t.cuda() for t in (survival, parents, sizes)]
    out = tuple(torch.zeros((), dtype=torch.int32, device="cuda") for _ in range(3))
    av.choose_tree_shape(*bufs, ct, max_width=3, out=out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        av.choose_tree_shape(*bufs, ct, max_width=3, out=out)
    for seed in (1, 2):
        new = random_trees(R, N, seed, lo=0.05 + 0.7 * (seed - 1))[:3]
        for b, t in zip(bufs, new):
            b.copy_(t)
        out[0].fill_(-7)
        graph.replay()
        torch.cuda.synchronize()
        want = av.choose_tree_shape(*new, ct, max_width=3)
        assert tuple(int(x) for x in out) == tuple(int(x) for x in want)
