"""The planner's CUDA kernel (planner/kernel.cuh: the one planner algorithm, planner/algorithm.h, on a thread
block), launched by its real launcher, runs on the CPU under the fiber emulator in tests/emu, and is compared
with the C++ CPU kernel field by field, exactly: the cases of test_planner_cuda.py, chains and draft trees, without
a GPU.

The emulated kernel replaces adaptive_verify._C.plan for the duration of a call (it takes the same parameter
struct), so the Python layer, its validation and its output allocation are the ones real calls use.
"""
import ctypes
import importlib
import warnings

import pytest
import torch

import adaptive_verify as av
import emu_build
from adaptive_verify import errors as av_errors
from test_planner_cuda import (TREE_CASES, _assert_same, _assert_same_tree, _cost_table, _plan, _plan_tree,
                               bad_tree_inputs, matches_cpu_cases, stress_cases, tree_matches_cpu_cases, tree_problem)

ops_module = importlib.import_module("adaptive_verify.planner.launch")  # every planner launch passes there
survival_module = importlib.import_module("adaptive_verify.planner.survival")


@pytest.fixture(scope="session")
def emu_lib(tmp_path_factory):
    lib = emu_build.build("planner_emu", tmp_path_factory)
    lib.av_emu_plan.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    lib.av_emu_plan.restype = ctypes.c_int
    lib.av_emu_prefix_survival.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    lib.av_emu_prefix_survival.restype = ctypes.c_int
    lib.av_emu_set_reverse.argtypes = [ctypes.c_int]
    return lib


@pytest.fixture(params=["forward", "reverse"])
def emulated(request, monkeypatch, emu_lib):
    """Returns run(fn): fn() with the emulated kernel, fibers resumed in thread order or in reverse, in place of
    the CPU kernel."""
    emu_lib.av_emu_set_reverse(request.param == "reverse")
    proxy = emu_build.EmulatedC(ops_module._C, {
        "plan": lambda params, on_cuda, stream: emu_build.status_of(emu_lib.av_emu_plan, params)})
    yield emu_build.emulated_runner(monkeypatch, ops_module, proxy)
    emu_lib.av_emu_set_reverse(0)  # the emulator's state is one per process (shared by every emulated library)


@pytest.fixture(params=["forward", "reverse"])
def emulated_survival(request, monkeypatch, emu_lib):
    """run(fn): fn() with the emulated survival kernel in place of the CPU one."""
    emu_lib.av_emu_set_reverse(request.param == "reverse")
    proxy = emu_build.EmulatedC(survival_module._C, {
        "prefix_survival": lambda params, on_cuda, stream: emu_build.status_of(emu_lib.av_emu_prefix_survival, params)})
    yield emu_build.emulated_runner(monkeypatch, survival_module, proxy)
    emu_lib.av_emu_set_reverse(0)


def _compare(ct, cases, run):
    for prob, kw, what in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # mode="global" warns when verification is undeclared
            cpu = _plan(prob, ct, **kw)
            emu = run(lambda: _plan(prob, ct, **kw))
        _assert_same(cpu, emu, what)


# (1200, 16): 19200 slots, past the kernel's shared memory: the global-workspace path.
@pytest.mark.parametrize("R,K", [(1, 1), (7, 3), (83, 7), (256, 8), (300, 16), (1200, 16)])
@pytest.mark.parametrize("mode", ["greedy", "global", "fixed", "all"])
def test_emulated_kernel_matches_cpu(R, K, mode, emulated):
    _compare(_cost_table(), matches_cpu_cases(R, K, mode), emulated)


@pytest.mark.parametrize("kind", ["constant", "cluster", "wild"])
@pytest.mark.parametrize("R,K", [(5, 3), (256, 8), (700, 32)])
@pytest.mark.parametrize("mode", ["greedy", "global", "fixed", "all"])
def test_emulated_kernel_matches_cpu_stress(kind, R, K, mode, emulated):
    """Survivals that stress the buckets (one value everywhere, a tight cluster, values outside [0, 1]), with
    min/max verify and a capacity."""
    _compare(_cost_table(), stress_cases(kind, R, K, mode), emulated)


@pytest.mark.parametrize("R,K", [(1, 1), (83, 7), (256, 8), (1200, 16)])
@pytest.mark.parametrize("mode", ["greedy", "fixed"])
def test_emulated_kernel_plans_from_confidences(R, K, mode, emulated):
    """plan_verification(conf=...): the kernel's survival prologue (the block's threads write rows, then a barrier
    before the walk reads them) gives the CPU kernel's survival bits, plan and NaN counts."""
    g = torch.Generator().manual_seed(R * 31 + K)
    conf = torch.rand(R, K, generator=g) * 0.6 + 0.4
    conf[torch.rand(R, K, generator=g) < 0.03] = float("nan")
    drafts = torch.randint(0, K + 1, (R,), generator=g, dtype=torch.int32)
    kw = dict(mode=mode, min_verify=1, extra_tokens=3)
    if mode == "fixed":
        kw["budget"] = R * K // 3
    ct = _cost_table()
    results = []
    for runner in (lambda fn: fn(), emulated):
        av_errors.reset_error_counts()
        survival = torch.full((R, K), -1.0)
        plan = runner(lambda: av.plan_verification(None, drafts, ct, conf=conf, survival_out=survival, **kw))
        results.append((plan, survival, av_errors.error_counts()))
    (cpu, cpu_s, cpu_err), (emu, emu_s, emu_err) = results
    _assert_same(cpu, emu, "conf=")
    assert torch.equal(cpu_s, emu_s) and cpu_err == emu_err
    av_errors.reset_error_counts()


@pytest.mark.parametrize("R,K", [(5, 3), (256, 8), (1200, 16)])
@pytest.mark.parametrize("mode", ["greedy", "global", "fixed"])
def test_emulated_kernel_weights_and_step_cap(R, K, mode, emulated):
    """Priorities (the block's max-weight reduction, weighted words, the unweighted expected tokens) and the
    latency target: the CUDA source gives the CPU kernel's integers. Unusable weights, which the CPU refuses,
    weigh 1 on the device and are counted: compared with the CPU run on weights where they are 1."""
    g = torch.Generator().manual_seed(R + K)
    conf = torch.rand(R, K, generator=g) * 0.6 + 0.4
    drafts = torch.randint(0, K + 1, (R,), generator=g, dtype=torch.int32)
    survival = av.prefix_survival(conf, drafts)
    w = torch.tensor([0.0, 0.5, 1.0, 3.0, 7.5])[torch.randint(0, 5, (R,), generator=g)]
    ct = _cost_table()
    kw = dict(mode=mode, min_verify=1, weights=w, max_step_ms=float(ct.fixed_cost(R) + ct.verify_cost(R + R * K // 3)),
              verification="onehot")
    if mode == "fixed":
        kw["budget"] = R * K
    _assert_same(av.plan_verification(survival, drafts, ct, **kw),
                 emulated(lambda: av.plan_verification(survival, drafts, ct, **kw)), "weights")
    bad = w.clone()
    bad[0], bad[-1] = float("nan"), -2.0
    ones = bad.clone()
    ones[0] = ones[-1] = 1.0
    av_errors.reset_error_counts()
    emu = emulated(lambda: av.plan_verification(survival, drafts, ct, **{**kw, "weights": bad}))
    assert av_errors.error_counts()["weight_out_of_range"] == (2 if R > 1 else 1)
    av_errors.reset_error_counts()
    _assert_same(av.plan_verification(survival, drafts, ct, **{**kw, "weights": ones}), emu, "bad weights")


# ---- draft trees ----


# (300, 63): 18900 nodes, past the kernel's shared memory (with the tree's depths): the global-workspace path, on
# the cases that differ most (levels; star trees with NaNs and invalidated drafts), to keep the emulator's time down.
@pytest.mark.parametrize("R,N", [(1, 1), (7, 5), (64, 16), (300, 63)])
@pytest.mark.parametrize("mode", ["greedy", "global", "fixed", "all"])
def test_emulated_tree_kernel_matches_cpu(R, N, mode, emulated):
    ct = _cost_table()
    cases = TREE_CASES[::2] if R * N > 4096 else TREE_CASES
    for prob, kw, what in tree_matches_cpu_cases(R, N, mode, cases):
        cpu = _plan_tree(prob, ct, **kw)
        emu = emulated(lambda: _plan_tree(prob, ct, **kw))
        _assert_same_tree(cpu, emu, what)
        if mode != "fixed":
            want = av.choose_budget(prob["survival"], prob["tree_sizes"], ct, mode=mode, parents=prob["parents"])
            got = emulated(lambda: av.choose_budget(prob["survival"], prob["tree_sizes"], ct, mode=mode,
                                                    parents=prob["parents"]))
            assert int(got) == int(want)


@pytest.mark.parametrize("R,N", [(1, 1), (83, 7), (256, 63)])
def test_emulated_tree_kernel_plans_from_confidences(R, N, emulated):
    """plan_tree_verification(conf=...): the kernel's tree-survival prologue gives the CPU kernel's bits and plan."""
    prob = tree_problem(R, N, 5, style="random")
    g = torch.Generator().manual_seed(R + N)
    conf = torch.rand(R, N, generator=g) * 0.6 + 0.4
    conf[torch.rand(R, N, generator=g) < 0.03] = float("nan")
    ct = _cost_table()
    rest = {k: v for k, v in prob.items() if k not in ("survival", "parents", "tree_sizes")}
    results = []
    for runner in (lambda fn: fn(), emulated):
        av_errors.reset_error_counts()
        survival = torch.full((R, N), -1.0)
        plan = runner(lambda: av.plan_tree_verification(None, prob["parents"], prob["tree_sizes"], ct, conf=conf,
                                                        survival_out=survival, min_verify=1, **rest))
        results.append((plan, survival, av_errors.error_counts()))
    (cpu, cpu_s, cpu_err), (emu, emu_s, emu_err) = results
    _assert_same_tree(cpu, emu, "conf=")
    assert torch.equal(cpu_s, emu_s) and cpu_err == emu_err
    av_errors.reset_error_counts()


def test_emulated_tree_survival_matches_cpu(emulated_survival):
    for R, N, style in [(1, 1, "chain"), (50, 63, "levels"), (300, 9, "random")]:
        prob = tree_problem(R, N, R, style=style)
        conf = torch.rand(R, N) * 1.4 - 0.2
        conf[0, 0] = float("nan")
        av_errors.reset_error_counts()
        want = av.tree_survival(conf, prob["parents"], prob["tree_sizes"])
        cpu_err = av_errors.error_counts()
        av_errors.reset_error_counts()
        got = emulated_survival(lambda: av.tree_survival(conf, prob["parents"], prob["tree_sizes"]))
        assert torch.equal(got, want) and av_errors.error_counts() == cpu_err
    av_errors.reset_error_counts()


def test_emulated_tree_bad_inputs_are_counted_not_raised(emulated):
    """What the CPU rejects, the device makes safe and counts: a node with a bad parent or repeating a sibling's token
    is no candidate (nor its subtree), tree sizes are clamped; the plan equals the CPU's on the equivalent valid
    batch. tree_survival: a bad parent's node survives with 0, counted."""
    bad, good, counts = bad_tree_inputs()
    ct = _cost_table()
    av_errors.reset_error_counts()
    got = emulated(lambda: _plan_tree(bad, ct, mode="all"))
    seen = av_errors.error_counts()
    assert {k: seen[k] for k in counts} == counts
    _assert_same_tree(got, _plan_tree(good, ct, mode="all"), "bad inputs under the emulator")
    av_errors.reset_error_counts()


def test_emulated_tree_survival_bad_parents_are_counted(emulated_survival):
    bad, good, _ = bad_tree_inputs()
    conf = torch.rand(bad["parents"].shape)
    av_errors.reset_error_counts()
    sizes = good["tree_sizes"]
    got = emulated_survival(lambda: av.tree_survival(conf, bad["parents"], sizes))
    assert av_errors.error_counts()["bad_parent"] == 3
    zeroed = conf.clone()
    for r, j in ((0, 3), (1, 5), (2, 2)):  # a bad parent's node survives with 0, and so does its subtree
        zeroed[r, j] = 0.0
    assert torch.equal(got, av.tree_survival(zeroed, good["parents"], sizes))
    av_errors.reset_error_counts()


@pytest.mark.parametrize("mode", ["global", "fixed"])
def test_emulated_tree_replay_rewrites_every_output(mode, emulated):
    """The emulator's CUDA-graph replay: one remembered kernel struct (fixed addresses, the budget a device tensor)
    relaunched after new values land in the same input buffers, every output poisoned in between; each launch must
    equal the CPU kernel's eager plan of the new values."""
    R, N, Rp = 40, 20, 45
    Tp = Rp + R * N
    ct = _cost_table()
    first, second = tree_problem(R, N, 3, style="levels"), tree_problem(R, N, 4, style="random")
    bufs = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in first.items()}
    budget = torch.tensor(100, dtype=torch.int32)
    out = av.TreeVerifyPlan.allocate(Rp, Tp, positions=True, slot_mapping=True, input_ids=True)
    kw = dict(mode=mode, num_reqs_padded=Rp, num_tokens_padded=Tp, out=out)
    if mode == "fixed":
        kw["budget"] = budget
    _plan_tree(bufs, ct, **kw)  # the "capture": validation, the struct remembered
    for prob, b in ((second, 37), (first, 250), (second, 0)):
        for k, v in prob.items():
            if isinstance(v, torch.Tensor):
                bufs[k].copy_(v)
        budget.fill_(b)
        for name in ("verify_lens", "budget", "num_tokens", "query_start_loc", "token_req", "seq_lens", "positions",
                     "slot_mapping", "input_ids", "tree_mask", "token_parent", "token_node", "token_depth"):
            getattr(out, name).fill_(-7)
        replayed = emulated(lambda: _plan_tree(bufs, ct, **kw))
        assert replayed.tree_mask.data_ptr() == out.tree_mask.data_ptr()  # the remembered struct's buffers
        eager = _plan_tree(prob, ct, **{**kw, "out": None, **({"budget": b} if mode == "fixed" else {})})
        _assert_same_tree(replayed, eager, f"replay budget={b}")


def test_emulated_weighted_tree_kernel_matches_cpu(emulated):
    """Weights and a latency target on trees: the block's weight reduction, weighted words capped by the parent's,
    and the unweighted expected tokens over the verified nodes give the CPU kernel's integers."""
    ct = _cost_table()
    for R, N, seed in [(5, 7, 1), (120, 31, 2)]:
        prob = tree_problem(R, N, seed, style="random" if seed == 1 else "levels")
        g = torch.Generator().manual_seed(seed)
        w = torch.tensor([0.0, 0.5, 1.0, 3.0, 7.5])[torch.randint(0, 5, (R,), generator=g)]
        kw = dict(mode="global", min_verify=1, weights=w,
                  max_step_ms=float(ct.fixed_cost(R) + ct.verify_cost(R + R * N // 3)))
        _assert_same_tree(_plan_tree(prob, ct, **kw), emulated(lambda: _plan_tree(prob, ct, **kw)), f"weights R={R}")


def test_emulated_kernel_makes_out_of_range_context_lengths_padding_and_counts_them(emulated):
    """Issue 16, finding 8: context_lens near 2**31 wrapped seq_lens and positions negative. The CPU kernel raises
    ValueError naming context_lens; the CUDA kernel (no sync to check) writes that request's seq_lens 0, positions 0
    and slots -1, counts it in error_counts()["context_len_out_of_range"], and plans every other request as usual."""
    top = av.planner.MAX_CONTEXT_LEN
    R, K, bs = 5, 4, 2**31 - 1  # one block holds every position: only the context lengths can be wrong
    survival = torch.full((R, K), 0.5)
    drafts = torch.full((R,), K, dtype=torch.int32)
    bad_ctx = torch.tensor([3, top, -1, 2**31 - 1, 7], dtype=torch.int32)
    good_ctx = torch.where((bad_ctx < 0) | (bad_ctx > top), torch.zeros_like(bad_ctx), bad_ctx)
    kw = dict(mode="all", block_table=torch.arange(2 * R, dtype=torch.int32).view(R, 2), block_size=bs)
    with pytest.raises(ValueError, match="context_lens"):
        av.plan_verification(survival, drafts, context_lens=bad_ctx, **kw)
    want = av.plan_verification(survival, drafts, context_lens=good_ctx, **kw)
    av_errors.reset_error_counts()
    got = emulated(lambda: av.plan_verification(survival, drafts, context_lens=bad_ctx, **kw))
    assert av_errors.error_counts()["context_len_out_of_range"] == 2
    assert av_errors.error_counts()["slot_out_of_range"] == 0  # the bad requests' slots are not counted twice
    av_errors.reset_error_counts()
    bad_rows = [2, 3]
    assert got.seq_lens.tolist() == [0 if r in bad_rows else v for r, v in enumerate(want.seq_lens.tolist())]
    for r in range(R):
        rows = got.token_req == r
        if r in bad_rows:
            assert (got.positions[rows] == 0).all() and (got.slot_mapping[rows] == -1).all()
        else:
            assert torch.equal(got.positions[rows], want.positions[rows])
            assert torch.equal(got.slot_mapping[rows], want.slot_mapping[rows])
    for name in ("verify_lens", "budget", "query_start_loc", "token_req", "num_tokens"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name


def _frozen_struct(monkeypatch, emu_lib, call) -> ctypes.Array:
    """The planner struct of call()'s launch, as a captured CUDA graph keeps its parameters (its bytes), the launch
    itself run under the emulator."""
    from adaptive_verify._binding import PlannerParams
    frozen = {}

    def capture(params, on_cuda, stream):
        frozen["struct"] = ctypes.create_string_buffer(ctypes.string_at(params, ctypes.sizeof(PlannerParams)))
        return emu_build.status_of(emu_lib.av_emu_plan, params)

    with monkeypatch.context() as m:
        m.setattr(ops_module, "_C", emu_build.EmulatedC(ops_module._C, {"plan": capture}))
        call()
    return frozen["struct"]


@pytest.mark.parametrize("R,K", [(1, 1), (9, 5), (256, 8), (1200, 16)])
def test_emulated_draft_depth_matches_cpu(R, K, emulated):
    """choose_draft_depth (algorithm.h choose_depth: per depth the buckets counted again and the budget searched) on
    the block, the shared-memory and the global-workspace paths: the same (depth, budget) as the CPU kernel."""
    from test_planner_depth import chain_table, problem
    survival, drafts, g = problem(R, K, R + K)
    ct = chain_table({1: 0.02, 512: 0.04}, levels=K, max_tokens=8192)
    weights = torch.rand(R, generator=g) * 2
    cases = [dict(), dict(min_verify=1), dict(weights=weights, extra_tokens=100), dict(max_step_ms=6.0),
             dict(capacity=R + R // 2 + 1)]
    for kw in cases[:2] if R > 1000 else cases:  # (the global-workspace size is slow to emulate at 17 depths)
        cpu = av.choose_draft_depth(survival, drafts, ct, **kw)
        emu = emulated(lambda: av.choose_draft_depth(survival, drafts, ct, **kw))
        assert (int(cpu[0]), int(cpu[1])) == (int(emu[0]), int(emu[1])), kw


def test_emulated_draft_depth_replay_reads_the_new_values(monkeypatch, emu_lib):
    """A CUDA graph of choose_draft_depth under the emulator: the kernel struct of the first call frozen (its bytes,
    as a captured launch keeps its parameters), relaunched after new survivals and drafts land in the same buffers,
    the outputs poisoned in between; each launch gives the eager call's (depth, budget) of the new values."""
    from test_planner_depth import chain_table, problem
    R, K = 50, 6
    ct = chain_table({1: 0.05, 512: 0.1}, levels=K, max_tokens=4096)
    values = [problem(R, K, seed, lo=lo)[:2] for seed, lo in ((1, 0.3), (2, 0.8), (3, 0.05))]
    survival, drafts = values[0][0].clone(), values[0][1].clone()
    out = (torch.zeros((), dtype=torch.int32), torch.zeros((), dtype=torch.int32))
    frozen = _frozen_struct(monkeypatch, emu_lib, lambda: av.choose_draft_depth(survival, drafts, ct, min_verify=1,
                                                                                 out=out))
    for s, d in values[1:] + values[:1]:
        survival.copy_(s)
        drafts.copy_(d)
        out[0].fill_(-7)
        out[1].fill_(-7)
        emu_build.status_of(emu_lib.av_emu_plan, ctypes.addressof(frozen))
        eager = av.choose_draft_depth(s, d, ct, min_verify=1)
        assert (int(out[0]), int(out[1])) == (int(eager[0]), int(eager[1]))
    assert len({int(av.choose_draft_depth(s, d, ct, min_verify=1)[0]) for s, d in values}) > 1  # not one answer


@pytest.mark.parametrize("R,N", [(1, 4), (13, 21), (300, 63)])
def test_emulated_tree_shape_matches_cpu(R, N, emulated):
    """choose_tree_shape (choose_depth's tree branch: per width profile a fresh walk and the profile's filter, then per
    depth the buckets counted again), uniform and per-level widths, on the block, the shared-memory and the
    global-workspace paths: the CPU kernel's (depth, width, budget)."""
    from test_planner_depth import chain_table
    from test_planner_tree_shape import random_trees
    survival, parents, sizes, g = random_trees(R, N, R + N)
    ct = chain_table({1: 0.01, 4096: 0.05}, levels=4, max_tokens=32768)
    weights = torch.rand(R, generator=g) * 2
    narrowing = av.tree_width_profiles(3, 3)  # per-level widths: (3, 3, 3) down to (1, 1, 1)
    shuffled = [narrowing[i] for i in torch.randperm(len(narrowing), generator=g)[:7]]
    cases = [dict(max_width=3), dict(widths=narrowing, weights=weights, extra_tokens=100),
             dict(max_width=4, max_step_ms=6.0), dict(widths=shuffled, max_step_ms=6.0),
             dict(max_width=2, capacity=R + R // 2 + 1)]
    seen = set()

    def ints(got):
        return tuple(tuple(x.tolist()) if x.dim() else int(x) for x in got)

    for kw in cases[:2] if R > 100 else cases:  # (the global-workspace size is slow to emulate)
        cpu = ints(av.choose_tree_shape(survival, parents, sizes, ct, **kw))
        emu = ints(emulated(lambda: av.choose_tree_shape(survival, parents, sizes, ct, **kw)))
        assert cpu == emu, kw
        seen.add(cpu)
    assert len(seen) > 1 or R == 1


def test_emulated_tree_shape_replay_reads_the_new_values(monkeypatch, emu_lib):
    """A CUDA graph of choose_tree_shape under the emulator: the kernel struct of the first call frozen, relaunched
    after new trees land in the same buffers (outputs poisoned in between): each launch gives the eager call's
    (depth, width, budget) of the new values."""
    from test_planner_depth import chain_table
    from test_planner_tree_shape import beam_trees
    ct = chain_table({1: 0.05, 4096: 0.2}, levels=4, max_tokens=8192)
    values = [beam_trees(24, 3, 4, seed, lo=lo)[:3] for seed, lo in ((1, 0.3), (2, 0.9), (3, 0.02))]
    bufs = [t.clone() for t in values[0]]
    out = tuple(torch.zeros((), dtype=torch.int32) for _ in range(3))
    frozen = _frozen_struct(monkeypatch, emu_lib, lambda: av.choose_tree_shape(*bufs, ct, max_width=3, out=out))
    answers = set()
    for new in values[1:] + values[:1]:
        for b, t in zip(bufs, new):
            b.copy_(t)
        for o in out:
            o.fill_(-7)
        emu_build.status_of(emu_lib.av_emu_plan, ctypes.addressof(frozen))
        eager = tuple(int(x) for x in av.choose_tree_shape(*new, ct, max_width=3))
        assert tuple(int(x) for x in out) == eager
        answers.add(eager)
    assert len(answers) > 1  # not one answer
