"""tree_rejection_sample (docs/design.md, "Draft trees", Sampling): one-hot "sample and match" down each request's
verified draft tree.

- The C++ CPU kernel gives the torch reference's integers on planned trees of every shape, dtype and sampling
  setting; outputs are fully written (sentinel-filled out=) and the path is a path of the tree.
- A chain given as a tree gives exactly rejection_sample(draft_probs=None)'s tokens.
- Only the accepted path's rows are read (every other row poisoned with NaN changes nothing, counts nothing).
- The outputs plug into commit_tree_kv as they stand (planned step, write_kv, sample, commit).
- Bad inputs: ValueError / TypeError naming the argument on CPU; the CUDA kernel's source (host emulator) equals
  the CPU kernel integer for integer and counts bad values the same way; on CUDA tensors (marked cuda) the
  kernel equals the CPU kernel.
- Losslessness by frequency, greedy decoding, determinism, batch invariance and unseeded independence are in the
  second half (chi-square at ALPHA like test_sampling_stats.py).
"""
import ctypes
import functools
import importlib

import numpy as np
import pytest
import torch
from scipy import stats

import adaptive_verify as av
import emu_build
import test_sampling_nonfinite as nonfinite
from adaptive_verify import reference as ref
from test_planner_tree import gen_parents

sampling_module = importlib.import_module("adaptive_verify.sampling_tree")
ALPHA = 1e-3


def i32(x):
    return torch.tensor(x, dtype=torch.int32)


def sibling_distinct_ids(rng, parents, V):
    """[R, N] int32 ids, distinct among each node's siblings (-1 once a node has V siblings before it)."""
    R, N = parents.shape
    ids = np.full((R, N), -1, dtype=np.int32)
    for r in range(R):
        used = {}
        for j in range(N):
            taken = used.setdefault(int(parents[r, j]), set())
            free = [v for v in rng.permutation(V)[:len(taken) + 1].tolist() if v not in taken]
            if free:
                ids[r, j] = free[0]
                taken.add(free[0])
    return torch.from_numpy(ids)


def planned_step(seed, R=7, N=10, V=300, style="random", dtype=torch.float32, budget=None, boost=10.0):
    """A planned tree step: the plan's query_start_loc / token_parent / input_ids and logits [T, V] in which each
    token's row favours one random child's id by `boost` (so paths go deep and also branch). Padding rows and
    empty trees included (tree_sizes may be 0)."""
    rng = np.random.default_rng(seed)
    parents = gen_parents(rng, R, N, style)
    sizes = torch.from_numpy(rng.integers(0, N + 1, size=R).astype(np.int32))
    conf = torch.from_numpy(rng.uniform(0.2, 1.0, size=(R, N)).astype(np.float32))
    drafts = sibling_distinct_ids(rng, parents, V)
    anchors = torch.from_numpy(rng.integers(0, V, size=R).astype(np.int32))
    kw = dict(mode="fixed", budget=budget) if budget is not None else dict(mode="all")
    plan = av.plan_tree_verification(av.tree_survival(conf, parents, sizes), parents, sizes, anchor_tokens=anchors,
                                     draft_tokens=drafts, num_reqs_padded=R + 2, **kw)
    T = int(plan.num_tokens)
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(T + 3, V, generator=g) * 2  # rows past the plan's tokens: never read
    qsl, parent, ids = plan.query_start_loc.tolist(), plan.token_parent.tolist(), plan.input_ids.tolist()
    for r in range(R):
        for t in range(qsl[r], qsl[r + 1]):
            kids = [c for c in range(t + 1, qsl[r + 1]) if parent[c] == t - qsl[r]]
            if kids:
                logits[t, ids[int(rng.choice(kids))]] += boost
    pad = torch.zeros(3, dtype=torch.int32)
    return dict(logits=logits.to(dtype), qsl=plan.query_start_loc, parent=torch.cat([plan.token_parent[:T], pad - 1]),
                ids=torch.cat([plan.input_ids[:T], pad]), W=N + 1, plan=plan, R=R + 2)


def settings(R, seed, kind):
    g = torch.Generator().manual_seed(seed)
    kw = dict(seeds=torch.randint(-2**62, 2**62, (R,), generator=g, dtype=torch.int64), offset=seed * 7919)
    if kind == "greedy":
        return kw
    kw["temperature"] = torch.where(torch.rand(R, generator=g) < 0.25, torch.zeros(R),
                                    torch.rand(R, generator=g) * 1.5 + 0.2)
    if kind == "trunc":
        kw["top_k"] = torch.randint(0, 6, (R,), generator=g, dtype=torch.int32)
        kw["top_p"] = torch.where(torch.rand(R, generator=g) < 0.5, torch.ones(R), torch.rand(R, generator=g) * 0.8 + 0.1)
        kw["min_p"] = torch.where(torch.rand(R, generator=g) < 0.5, torch.zeros(R), torch.rand(R, generator=g) * 0.2)
    return kw


def call(step, **kw):
    return av.tree_rejection_sample(step["logits"], step["qsl"], step["parent"], step["ids"], step["W"], **kw)


def check_path(step, tokens, emitted, offsets):
    """The path starts at the anchor, each entry is a child of the one before carrying the token drawn there, the
    last draw matches no child, and everything past num_emitted is -1."""
    qsl, parent, ids = step["qsl"].tolist(), step["parent"].tolist(), step["ids"].tolist()
    for r in range(step["R"]):
        n, b = int(emitted[r]), qsl[r]
        q_len = qsl[r + 1] - b
        assert (q_len == 0) == (n == 0)
        assert (tokens[r, n:] == -1).all() and (offsets[r, n:] == -1).all()
        if n == 0:
            continue
        assert int(offsets[r, 0]) == 0
        for d in range(1, n):
            o = int(offsets[r, d])
            assert parent[b + o] == int(offsets[r, d - 1]) and ids[b + o] == int(tokens[r, d - 1]), (r, d)
        last = int(offsets[r, n - 1])
        assert not any(parent[b + c] == last and ids[b + c] == int(tokens[r, n - 1]) for c in range(1, q_len))


# ---------------------------------------------------------------------------------------------------------------
# exact: reference, chains, rows read, commit_tree_kv
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("style", ["random", "levels", "bushy", "chain", "star"])
@pytest.mark.parametrize("kind", ["greedy", "sampled", "trunc"])
def test_cpu_kernel_matches_reference(dtype, style, kind):
    for seed in range(2):
        step = planned_step(seed, style=style, dtype=dtype, V=97 if style == "bushy" else 300,
                            budget=None if seed == 0 else 8)
        kw = settings(step["R"], seed, kind)
        kw["logprobs"] = seed == 1
        R, W = step["R"], step["W"]
        out = (torch.full((R, W), 77, dtype=torch.int32), torch.full((R,), 77, dtype=torch.int32),
               torch.full((R, W), 77, dtype=torch.int32))  # every element must be written
        if kw["logprobs"]:
            out += (torch.full((R, W), 77.0),)
        got = call(step, out=out, **kw)
        want = ref.tree_rejection_sample(step["logits"], step["qsl"], step["parent"], step["ids"], W, **kw)
        assert len(got) == len(want) == 3 + kw["logprobs"]
        for g_, w_ in zip(got, want):
            assert torch.equal(g_, w_)
        check_path(step, *got[:3])
        if style != "star" and seed == 0:
            assert int(got[1].max()) >= 3, "the case never went deep"


def test_hand_tree():
    """Anchor (offset 0) with children 7 (offset 1) and 4 (offset 2); offset 3 (id 9) hangs from offset 2. Greedy:
    row 0 argmax 4 -> offset 2, row 2 argmax 9 -> offset 3, row 3 argmax 5 matches nothing: emits [4, 9, 5]."""
    V = 12
    logits = torch.zeros(5, V)
    logits[0, 4] = logits[1, 1] = logits[2, 9] = logits[3, 5] = logits[4, 3] = 1.0
    qsl, parent, ids = i32([0, 4, 5]), i32([-1, 0, 0, 2, -1]), i32([11, 7, 4, 9, 8])
    tokens, emitted, offsets = av.tree_rejection_sample(logits, qsl, parent, ids, 4)
    assert tokens.tolist() == [[4, 9, 5, -1], [3, -1, -1, -1]]
    assert emitted.tolist() == [3, 1]
    assert offsets.tolist() == [[0, 2, 3, -1], [0, -1, -1, -1]]


@pytest.mark.parametrize("kind", ["greedy", "sampled", "trunc"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_chain_tree_is_rejection_sample(kind, dtype):
    """parents = previous token: exactly rejection_sample(draft_probs=None)'s tokens, bit for bit, and the path's
    offsets are its depths."""
    R, K, V = 40, 6, 50
    g = torch.Generator().manual_seed(5)
    q_len = torch.randint(0, K + 2, (R,), generator=g)
    qsl = torch.zeros(R + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(q_len, 0)
    T = int(qsl[-1])
    logits = (torch.randn(T, V, generator=g) * 3).to(dtype)
    drafts = torch.randint(0, V, (R, K), generator=g, dtype=torch.int32)
    parent, ids = torch.empty(T, dtype=torch.int32), torch.empty(T, dtype=torch.int32)
    for r in range(R):
        b = int(qsl[r])
        for j in range(int(q_len[r])):
            parent[b + j] = j - 1
            ids[b + j] = 0 if j == 0 else drafts[r, j - 1]
            if j < q_len[r] - 1 and bool(torch.rand(1, generator=g) < 0.7):
                logits[b + j, drafts[r, j]] += 8  # accept often
    kw = settings(R, 3, kind)
    want_tokens, want_emitted, want_lps = av.rejection_sample(logits, qsl, drafts, logprobs=True, **kw)
    tokens, emitted, offsets, lps = av.tree_rejection_sample(logits, qsl, parent, ids, K + 1, logprobs=True, **kw)
    assert torch.equal(tokens, want_tokens) and torch.equal(emitted, want_emitted) and torch.equal(lps, want_lps)
    assert int(emitted.max()) >= 4
    depth = torch.arange(K + 1, dtype=torch.int32).expand(R, -1)
    assert torch.equal(offsets, torch.where(depth < emitted[:, None], depth, -1))


@pytest.mark.parametrize("kind", ["greedy", "trunc"])
def test_reads_only_the_accepted_path(kind):
    """Rows off the accepted path poisoned with NaN: same outputs, no NaN counted (they are never read)."""
    step = planned_step(3, R=9, N=14, style="levels")
    kw = settings(step["R"], 4, kind)
    first = call(step, **kw)
    on_path = torch.zeros(step["logits"].shape[0], dtype=torch.bool)
    qsl = step["qsl"].tolist()
    for r in range(step["R"]):
        for d in range(int(first[1][r])):
            on_path[qsl[r] + int(first[2][r, d])] = True
    assert int(on_path.sum()) < int(step["plan"].num_tokens), "every token on a path: nothing poisoned"
    step["logits"][~on_path] = float("nan")
    av.reset_error_counts("cpu")
    again = call(step, **kw)
    assert av.error_counts("cpu")["nan_logits"] == 0
    for a, b in zip(first, again):
        assert torch.equal(a, b)


@pytest.mark.parametrize("style", ["random", "levels", "chain"])
def test_outputs_feed_commit_tree_kv(style):
    """Planned step with a paged cache -> write_kv -> tree_rejection_sample -> commit_tree_kv(accepted_offsets,
    num_emitted - 1): every accepted token's K/V now sits at context_len + depth."""
    rng = np.random.default_rng(11)
    R, N, V, Hkv, D, bs = 6, 12, 64, 2, 8, 4
    parents = gen_parents(rng, R, N, style)
    sizes = torch.from_numpy(rng.integers(1, N + 1, size=R).astype(np.int32))
    conf = torch.from_numpy(rng.uniform(0.3, 1.0, size=(R, N)).astype(np.float32))
    ctx = torch.from_numpy(rng.integers(0, 20, size=R).astype(np.int32))
    max_blocks = (20 + N + 1) // bs + 1
    block_table = torch.from_numpy(rng.permutation(R * max_blocks).reshape(R, max_blocks).astype(np.int32))
    plan = av.plan_tree_verification(av.tree_survival(conf, parents, sizes), parents, sizes, mode="all",
                                     context_lens=ctx, block_table=block_table, block_size=bs,
                                     anchor_tokens=torch.zeros(R, dtype=torch.int32),
                                     draft_tokens=sibling_distinct_ids(rng, parents, V))
    T = int(plan.num_tokens)
    k_cache = torch.randn(R * max_blocks, bs, Hkv, D)
    v_cache = torch.randn(R * max_blocks, bs, Hkv, D)
    k_new = torch.randn(T, Hkv, D)
    av.write_kv(k_new, -k_new, k_cache, v_cache, plan.slot_mapping[:T])
    logits = torch.randn(T, V)
    qsl, parent, ids = plan.query_start_loc.tolist(), plan.token_parent.tolist(), plan.input_ids.tolist()
    for r in range(R):
        for t in range(qsl[r], qsl[r + 1]):
            kids = [c for c in range(t + 1, qsl[r + 1]) if parent[c] == t - qsl[r]]
            if kids:
                logits[t, ids[kids[-1]]] += 9  # the last child: offsets differ from depths in a tree
    tokens, emitted, offsets = av.tree_rejection_sample(logits, plan.query_start_loc[:R + 1], plan.token_parent[:T],
                                                        plan.input_ids[:T], N + 1, temperature=torch.ones(R),
                                                        seeds=torch.arange(R, dtype=torch.int64))
    num_accepted = (emitted - 1).clamp(min=0)
    assert int(num_accepted.sum()) > R
    want_k, want_v = ref.commit_tree_kv(k_cache, v_cache, block_table, ctx, offsets, num_accepted)
    av.commit_tree_kv(k_cache, v_cache, block_table, ctx, offsets, num_accepted)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)
    for r in range(R):
        for d in range(1, int(emitted[r])):
            pos = int(ctx[r]) + d
            blk = int(block_table[r, pos // bs])
            assert torch.equal(k_cache[blk, pos % bs], k_new[qsl[r] + int(offsets[r, d])]), (r, d)
            assert ids[qsl[r] + int(offsets[r, d])] == int(tokens[r, d - 1])


# ---------------------------------------------------------------------------------------------------------------
# arguments and bad values
# ---------------------------------------------------------------------------------------------------------------

def _small():
    logits = torch.randn(5, 9)
    return dict(target_logits=logits, query_start_loc=i32([0, 3, 5]), token_parent=i32([-1, 0, 0, -1, 0]),
                input_ids=i32([1, 2, 3, 4, 5]), max_query_len=3)


@pytest.mark.parametrize("name, value, exc", [
    ("target_logits", torch.randn(5, 9).to(torch.int32), TypeError),
    ("query_start_loc", i32([0, 3, 2]), ValueError),  # decreasing
    ("query_start_loc", i32([0, 3, 6]), ValueError),  # past T
    ("query_start_loc", torch.tensor([0, 3, 5]), TypeError),
    ("token_parent", i32([-1, 0, 2, -1, 0]), ValueError),  # offset 2's parent is itself
    ("token_parent", i32([-1, -1, 0, -1, 0]), ValueError),  # a non-anchor token without a parent
    ("token_parent", i32([-1, 0, 0, -1]), ValueError),  # shape
    ("input_ids", torch.zeros(5), TypeError),
    ("max_query_len", 2, ValueError),  # a request has 3 tokens (the CPU message names query_start_loc)
    ("max_query_len", 65, ValueError),
    ("max_query_len", 0, ValueError),
    ("max_query_len", True, TypeError),
    ("temperature", torch.tensor([1.0, -1.0]), ValueError),
    ("top_k", i32([-1, 0]), ValueError),
    ("top_p", torch.tensor([0.0, 1.0]), ValueError),
    ("min_p", torch.tensor([2.0, 0.0]), ValueError),
    ("seeds", torch.arange(3), ValueError),
    ("offset", -1, ValueError),
])
def test_bad_inputs_name_the_argument(name, value, exc):
    kw = _small()
    av.tree_rejection_sample(**kw, temperature=torch.ones(2))
    kw[name] = value
    match = "query_start_loc" if (name, value) == ("max_query_len", 2) else name
    extra = {} if name == "temperature" else dict(temperature=torch.ones(2))
    with pytest.raises(exc, match=match):
        av.tree_rejection_sample(**kw, **extra)


def test_bad_out_names_the_output():
    kw = _small()
    with pytest.raises(ValueError, match="accepted_offsets"):
        av.tree_rejection_sample(**kw, out=(torch.empty(2, 3, dtype=torch.int32), torch.empty(2, dtype=torch.int32),
                                            torch.empty(2, 4, dtype=torch.int32)))
    with pytest.raises(TypeError, match="out"):
        av.tree_rejection_sample(**kw, out=(torch.empty(2, 3, dtype=torch.int32),))
    three = (torch.empty(2, 3, dtype=torch.int32), torch.empty(2, dtype=torch.int32), torch.empty(2, 3, dtype=torch.int32))
    with pytest.raises(TypeError, match="logprobs"):
        av.tree_rejection_sample(**kw, logprobs=True, out=three)
    with pytest.raises(TypeError, match="logprobs"):
        av.tree_rejection_sample(**kw, out=three + (torch.empty(2, 3, dtype=torch.float64),), logprobs=True)
    with pytest.raises(TypeError, match="logprobs"):
        av.tree_rejection_sample(**kw, logprobs=1)


def test_ids_out_of_range_are_never_matched_and_counted():
    """Greedy row 0 picks id 3; the child carrying 3 + V (out of range) or -1 is not entered; counted per token."""
    V = 9
    logits = torch.zeros(4, V)
    logits[0, 3] = 5
    parent, qsl = i32([-1, 0, 0, 0]), i32([0, 4])
    av.reset_error_counts("cpu")
    tokens, emitted, _ = av.tree_rejection_sample(logits, qsl, parent, torch.tensor([0, 3 + V, -1, 3 - 2**32]), 4)
    assert emitted.tolist() == [1] and tokens[0, 0] == 3
    assert av.error_counts("cpu")["draft_id_out_of_range"] == 3
    av.reset_error_counts("cpu")


@pytest.mark.parametrize("kind", ["sampled", "trunc"])
def test_prepared_call_follows_new_values_offsets_and_logits(kind):
    """A prepared tree_rejection_sample reads the tensors' current values, each run's host offset and new logits of
    the prepared layout, and equals a fresh call every run; unseeded requests get fresh seeds each run."""
    step = planned_step(2, R=6)
    R = step["R"]
    kw = settings(R, 2, kind)
    out = tuple(torch.empty_like(t) for t in call(step, **kw))
    handle = av.prepare(av.tree_rejection_sample, step["logits"], step["qsl"], step["parent"], step["ids"], step["W"],
                        out=out, **kw)
    for offset in (3, 4, 5):
        logits = step["logits"].clone().mul_(-1 if offset % 2 else 1)
        got = handle.run(offset=offset, target_logits=logits)
        assert got[0] is out[0]
        fresh = av.tree_rejection_sample(logits, step["qsl"], step["parent"], step["ids"], step["W"],
                                         **dict(kw, offset=offset))
        assert all(torch.equal(a, b) for a, b in zip(got, fresh)), offset
    kw.pop("seeds")
    handle = av.prepare(av.tree_rejection_sample, step["logits"], step["qsl"], step["parent"], step["ids"], step["W"],
                        out=out, **kw)
    seen = {tuple(handle.run()[0].flatten().tolist()) for _ in range(6)}
    assert len(seen) > 1


def test_custom_op_passes_opcheck():
    step = planned_step(1, R=3, N=6, V=40)
    R, W = step["R"], step["W"]
    out = (torch.empty(R, W, dtype=torch.int32), torch.empty(R, dtype=torch.int32), torch.empty(R, W, dtype=torch.int32))
    err = torch.zeros(16, dtype=torch.int32)
    kw = settings(R, 1, "trunc")
    for offset, lps in ((None, None), (torch.tensor(5, dtype=torch.int64), torch.empty(R, W))):
        torch.library.opcheck(torch.ops.adaptive_verify.tree_rejection_sample_into.default,
                              (step["logits"], step["qsl"], step["parent"], step["ids"], kw["temperature"],
                               kw["seeds"], offset, kw["top_k"], kw["top_p"], kw["min_p"], *out, lps, err, 3, W))


# ---------------------------------------------------------------------------------------------------------------
# the CUDA kernel's source under the host emulator, and on a GPU
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def emu_lib(tmp_path_factory):
    lib = emu_build.build("sampling_emu", tmp_path_factory)
    lib.av_emu_tree_rejection_sample.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    lib.av_emu_set_reverse.argtypes = [ctypes.c_int]
    return lib


@pytest.fixture(params=["forward", "reverse"])
def emulated(request, monkeypatch, emu_lib):
    emu_lib.av_emu_set_reverse(request.param == "reverse")
    proxy = emu_build.EmulatedC(sampling_module._C, {
        "tree_rejection_sample": lambda p, on_cuda, stream: emu_build.status_of(emu_lib.av_emu_tree_rejection_sample,
                                                                                p)})
    yield emu_build.emulated_runner(monkeypatch, sampling_module, proxy)
    emu_lib.av_emu_set_reverse(0)


def _same(run, args, kw):
    av.reset_error_counts("cpu")
    cpu = av.tree_rejection_sample(*args, **kw)
    counts = av.error_counts("cpu")
    av.reset_error_counts("cpu")
    emu = run(lambda: av.tree_rejection_sample(*args, **kw))
    for a, b in zip(cpu, emu):
        assert torch.equal(a, b)
    assert av.error_counts("cpu") == counts
    av.reset_error_counts("cpu")
    return counts


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["greedy", "sampled", "trunc"])
def test_emulated_kernel_matches_cpu(emulated, dtype, kind):
    for style, V in (("levels", 700), ("bushy", 97)):
        step = planned_step(4, R=5, N=12, V=V, style=style, dtype=dtype)
        args = (step["logits"], step["qsl"], step["parent"], step["ids"], step["W"])
        _same(emulated, args, dict(settings(step["R"], 4, kind), logprobs=kind != "greedy" or V == 97))


def test_emulated_bad_values_are_safe_and_counted(emulated):
    """What the CPU refuses, the CUDA kernel makes safe: a parent out of [0, i) is never entered, tokens past
    max_query_len do not exist, ids out of [0, V) never match, NaN rows never win. Compared with the CPU kernel on
    the same values made valid by hand."""
    V = 16
    logits = torch.randn(9, V)
    logits[0, 5] = logits[1, 6] = logits[5, 2] = 9.0
    logits[6, 3] = float("nan")
    # request 0: offsets 1 (id 5, parent 0) -> 2 (id 6, parent 2: itself, bad) and 3 (id 6, parent 1);
    # 4 (id 5 + V, parent 0). request 1: 4 tokens with max_query_len 3 (offset 3 cut), a NaN in its row 1.
    qsl = i32([0, 5, 9])
    parent = i32([-1, 0, 2, 1, 0, -1, 0, 1, 2])
    ids = i32([0, 5, 6, 6, 5 + V, 0, 2, 3, 3])
    emu = emulated(lambda: av.tree_rejection_sample(logits, qsl, parent, ids, 5))
    counts = av.error_counts("cpu")
    av.reset_error_counts("cpu")
    assert emu[0].tolist() == [[5, 6, int(logits[3].argmax()), -1, -1], [2, int(torch.nan_to_num(logits[6], -1e9).argmax()), -1, -1, -1]]
    assert emu[2].tolist()[0][:3] == [0, 1, 3]
    assert (counts["token_parent_out_of_range"], counts["draft_id_out_of_range"], counts["nan_logits"]) == (1, 1, 1)
    assert counts["query_len_out_of_range"] == 0
    # max_query_len 4: request 0's offset 4 (the out-of-range id) no longer exists; its path is unchanged
    cut = emulated(lambda: av.tree_rejection_sample(logits, qsl, parent, ids, 4))
    counts = av.error_counts("cpu")
    av.reset_error_counts("cpu")
    assert (counts["query_len_out_of_range"], counts["draft_id_out_of_range"],
            counts["token_parent_out_of_range"]) == (1, 0, 1)
    assert cut[0].tolist()[0] == emu[0].tolist()[0][:4] and cut[1].tolist() == emu[1].tolist()
    # the CPU kernel on the same tree with the bad parent made a leaf of its own (never matched: id V - 1)
    fixed_parent, fixed_ids = parent.clone(), ids.clone()
    fixed_parent[2], fixed_ids[2], fixed_ids[4] = 0, V - 1, V - 2
    logits[:, V - 2:] = -30
    cpu = av.tree_rejection_sample(logits, qsl, fixed_parent, fixed_ids, 5)
    emu = emulated(lambda: av.tree_rejection_sample(logits, qsl, parent, ids, 5))
    for a, b in zip(cpu, emu):
        assert torch.equal(a, b)
    av.reset_error_counts("cpu")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["greedy", "sampled", "trunc"])
def test_cuda_kernel_matches_cpu(dtype, kind):
    step = planned_step(6, R=40, N=20, V=32003, style="levels", dtype=dtype)
    args = (step["logits"], step["qsl"], step["parent"], step["ids"], step["W"])
    kw = dict(settings(step["R"], 6, kind), logprobs=True)
    cpu = av.tree_rejection_sample(*args, **kw)
    cuda_kw = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    av.reset_error_counts("cuda")
    got = av.tree_rejection_sample(*(a.cuda() if isinstance(a, torch.Tensor) else a for a in args), **cuda_kw)
    for a, b in zip(cpu, got):
        assert torch.equal(a, b.cpu())
    assert av.error_counts("cuda")["nan_logits"] == 0


@pytest.mark.cuda
def test_cuda_graph_replay_with_device_offset():
    step = planned_step(7, R=16, N=12, V=4096, style="random")
    dev = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in step.items() if k != "plan"}
    kw = settings(step["R"], 7, "sampled")
    temperature, seeds = kw["temperature"].cuda(), kw["seeds"].cuda()
    offset = torch.tensor(100, dtype=torch.int64, device="cuda")
    R, W = step["R"], step["W"]
    out = (torch.empty(R, W, dtype=torch.int32, device="cuda"), torch.empty(R, dtype=torch.int32, device="cuda"),
           torch.empty(R, W, dtype=torch.int32, device="cuda"))
    args = (dev["logits"], dev["qsl"], dev["parent"], dev["ids"], W)
    av.tree_rejection_sample(*args, temperature=temperature, seeds=seeds, offset=offset, out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        av.tree_rejection_sample(*args, temperature=temperature, seeds=seeds, offset=offset, out=out)
    for off in (100, 101):
        offset.fill_(off)
        graph.replay()
        want = av.tree_rejection_sample(step["logits"], step["qsl"], step["parent"], step["ids"], W,
                                        temperature=kw["temperature"], seeds=kw["seeds"], offset=off)
        for a, b in zip(want, out):
            assert torch.equal(a, b.cpu())


# ---------------------------------------------------------------------------------------------------------------
# losslessness and the promises on randomness
# ---------------------------------------------------------------------------------------------------------------

def _chi2_pvalue(codes, p):
    """Chi-square p-value of integer `codes` against probabilities `p` [C] (bins expecting < 5 merged)."""
    counts = torch.bincount(codes, minlength=p.numel()).double()
    if bool((counts[p == 0] > 0).any()):
        return 0.0
    counts, expected = counts[p > 0], p[p > 0] * codes.numel()
    small = expected < 5
    if bool(small.any()):
        counts = torch.cat([counts[~small], counts[small].sum().reshape(1)])
        expected = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    return stats.chisquare(counts.numpy(), expected.numpy() * (counts.sum() / expected.sum()).item()).pvalue


class ToyModel:
    """A target over V tokens whose next-token logits depend on the last two tokens: row(prefix) =
    L0 for the anchor, L1[y0] after y0, L2[y0, y1] after (y0, y1)."""

    def __init__(self, V, seed):
        g = torch.Generator().manual_seed(seed)
        self.V = V
        self.L0 = torch.randn(V, generator=g) * 1.5
        self.L1 = torch.randn(V, V, generator=g) * 1.5
        self.L2 = torch.randn(V, V, V, generator=g) * 1.5

    def row(self, prefix):
        if len(prefix) == 0:
            return self.L0
        return self.L1[prefix[0]] if len(prefix) == 1 else self.L2[prefix[-2], prefix[-1]]

    def joint3(self, T, top_k=0):
        """Exact law of the first three tokens at temperature T (> 0: softmax(logits / T) over each row's top_k tokens
        when top_k > 0; 0: greedy), float64 [V^3]."""
        def law(x):
            x = x.double()
            if T == 0:
                return torch.nn.functional.one_hot(x.argmax(-1), self.V).double()
            if top_k:
                kth = x.topk(top_k, -1).values[..., -1:]
                x = torch.where(x >= kth, x, torch.tensor(float("-inf"), dtype=x.dtype))
            return torch.softmax(x / T, -1)
        p0 = law(self.L0)
        p1 = law(self.L1)
        p2 = law(self.L2)
        return (p0[:, None, None] * p1[:, :, None] * p2).flatten()


def random_trees(model, n, seed, draft_T=None):
    """n requests, each a random tree of depth <= 3 (1-3 children of the anchor, 0-3 of a depth-1 node, 0-2 of a
    depth-2 node: branching at every depth), siblings drawn without replacement from the drafter: uniform
    (draft_T None, unlike the target), or softmax(row / draft_T) of the same context (one that agrees).
    Returns (logits [T, V], qsl, token_parent, input_ids, max_query_len)."""
    g = torch.Generator().manual_seed(seed)
    V = model.V
    rows, parents, ids = [], [], []
    qsl = [0]
    for _ in range(n):
        toks = [(-1, ())]  # (parent offset, tokens before this token's row ends with its own id)
        frontier = [0]
        for depth, (lo, hi) in enumerate(((1, 4), (0, 4), (0, 3))):
            nxt = []
            for off in frontier:
                width = int(torch.randint(lo, hi, (1,), generator=g))
                if width == 0:
                    continue
                prefix = toks[off][1]
                q = torch.ones(V) if draft_T is None else torch.softmax(model.row(prefix) / draft_T, -1)
                for x in torch.multinomial(q, width, replacement=False, generator=g).tolist():
                    toks.append((off, prefix + (x,)))
                    nxt.append(len(toks) - 1)
            frontier = nxt
        for off, prefix in toks:
            rows.append(model.row(prefix))
            parents.append(off)
            ids.append(prefix[-1] if prefix else 0)
        qsl.append(qsl[-1] + len(toks))
    return (torch.stack(rows), i32(qsl), i32(parents), i32(ids), max(b - a for a, b in zip(qsl, qsl[1:])))


@functools.lru_cache(maxsize=None)
def uniform_trees(n, V, seed):
    """random_trees' shapes with the uniform drafter, for many requests at once (shared by the frequency tests):
    (qsl, token_parent, depth, id, parent's id) per token; the rows are the model's (:func:`uniform_tree_rows`)."""
    rng = np.random.default_rng(seed)
    parent, depth, last, prev, qsl = [], [], [], [], [0]
    for _ in range(n):
        start = len(parent)
        parent.append(-1), depth.append(0), last.append(0), prev.append(-1)  # the anchor
        frontier = [0]
        for d, (lo, hi) in enumerate(((1, 4), (0, 4), (0, 3))):
            nxt = []
            for off in frontier:
                for x in rng.permutation(V)[:rng.integers(lo, hi)].tolist():
                    parent.append(off), depth.append(d + 1), last.append(x), prev.append(last[start + off])
                    nxt.append(len(parent) - 1 - start)
            frontier = nxt
        qsl.append(len(parent))
    return i32(qsl), i32(parent), torch.tensor(depth), torch.tensor(last), torch.tensor(prev)


def uniform_tree_rows(model, depth, last, prev):
    """logits [T, V]: the model's row for each token (L0, L1[own id], L2[parent's id, own id])."""
    rows = torch.empty(depth.numel(), model.V)
    rows[depth == 0] = model.L0
    rows[depth == 1] = model.L1[last[depth == 1]]
    deep = depth >= 2
    rows[deep] = model.L2[prev[deep], last[deep]]
    return rows


def complete_to_three(model, tokens, emitted, T, seed, top_k=0):
    """The first three tokens of each request: those emitted, then (as the next steps would) draws from the target
    given the tokens so far, with av.sample and fresh seeds."""
    n = tokens.shape[0]
    seq = torch.full((n, 3), -1, dtype=torch.int64)
    k = emitted.clamp(max=3).long()
    for d in range(3):
        have = k > d
        seq[have, d] = tokens[have, d].long()
        need = ~have
        if bool(need.any()):
            idx = need.nonzero().flatten()
            rows = (model.L0.expand(idx.numel(), -1), model.L1[seq[idx, 0]], model.L2[seq[idx, 0], seq[idx, 1]])[d]
            temp = torch.full((idx.numel(),), float(T))
            seeds = torch.randint(0, 2**62, (idx.numel(),), generator=torch.Generator().manual_seed(seed + d))
            ks = torch.full((idx.numel(),), top_k, dtype=torch.int32)
            seq[idx, d] = av.sample(rows, temp, seeds, offset=d + 1, top_k=ks).long()
    return seq


@pytest.mark.parametrize("T, top_k", [(1.0, 0), (0.7, 0), (1.0, 3)])
def test_emitted_tokens_follow_the_target(T, top_k):
    """Chi-square on the joint law of the first three emitted tokens (V = 6: 216 bins) over 2^16 trees with
    branching at depths 1, 2 and 3, against the exact (truncated, with top_k) target; and on the first token alone."""
    model = ToyModel(6, seed=int(T * 10) + top_k)
    n = 2**16
    qsl, parent, depth, ids, prev = uniform_trees(n, model.V, 17)
    logits, W = uniform_tree_rows(model, depth, ids, prev), int((qsl[1:] - qsl[:-1]).max())
    seeds = torch.randint(0, 2**62, (n,), generator=torch.Generator().manual_seed(3))
    trunc = dict(top_k=torch.full((n,), top_k, dtype=torch.int32)) if top_k else {}
    tokens, emitted, offsets = av.tree_rejection_sample(logits, qsl, parent, ids, W, temperature=torch.full((n,), T),
                                                        seeds=seeds, offset=2024, **trunc)
    assert float((emitted >= 3).double().mean()) > 0.05 and int(emitted.max()) == 4  # branches were taken deep
    seq = complete_to_three(model, tokens, emitted, T, seed=99, top_k=top_k)
    V = model.V
    codes = seq[:, 0] * V * V + seq[:, 1] * V + seq[:, 2]
    joint = model.joint3(T, top_k)
    assert _chi2_pvalue(codes, joint) > ALPHA
    assert _chi2_pvalue(tokens[:, 0].long(), joint.view(V, V * V).sum(1)) > ALPHA


def test_sensitivity_a_biased_sampler_fails():
    """The same test on tokens that lean towards the drafter (the first draft kept whenever it exists) fails: the
    test can tell."""
    model = ToyModel(6, seed=10)
    n = 2**16
    qsl, parent, depth, ids, prev = uniform_trees(n, model.V, 17)
    logits, W = uniform_tree_rows(model, depth, ids, prev), int((qsl[1:] - qsl[:-1]).max())
    tokens, emitted, _ = av.tree_rejection_sample(logits, qsl, parent, ids.to(torch.int32), W,
                                                  temperature=torch.ones(n), seeds=torch.arange(n, dtype=torch.int64))
    first_child = ids[qsl[:-1].long() + 1]  # every tree has a child of its anchor
    biased = torch.where(torch.arange(n) % 2 == 0, first_child, tokens[:, 0].long())
    assert _chi2_pvalue(biased, torch.softmax(model.L0.double(), -1)) < ALPHA


def test_greedy_is_greedy_decoding():
    """Temperature 0: the emitted tokens are the target's greedy continuation, as far as the tree verified it."""
    model = ToyModel(6, seed=4)
    n = 500
    logits, qsl, parent, ids, W = random_trees(model, n, seed=8, draft_T=1.0)  # a drafter that agrees with the target
    tokens, emitted, _ = av.tree_rejection_sample(logits, qsl, parent, ids, W)
    g0 = int(model.L0.argmax())
    g1 = int(model.L1[g0].argmax())
    greedy = [g0, g1, int(model.L2[g0, g1].argmax())]
    for r in range(n):
        k = min(int(emitted[r]), 3)
        assert tokens[r, :k].tolist() == greedy[:k]
    assert int((emitted >= 3).sum()) > 0


def test_seeded_determinism_and_batch_invariance():
    """Seeded requests: the same call twice gives the same integers; a request alone, or among others in any order,
    gives the same tokens; another offset gives other draws."""
    step = planned_step(9, R=12, N=10, style="random", boost=2.0)
    R = step["R"]
    kw = settings(R, 9, "trunc")
    first = call(step, **kw)
    for a, b in zip(first, call(step, **kw)):
        assert torch.equal(a, b)
    qsl = step["qsl"].tolist()
    for r in range(R):
        lo, hi = qsl[r], qsl[r + 1]
        pre = torch.randn(2, step["logits"].shape[1])  # another request before it
        sub = dict(logits=torch.cat([pre, step["logits"][lo:hi]]), qsl=i32([0, 2, 2 + hi - lo]),
                   parent=torch.cat([i32([-1, 0]), step["parent"][lo:hi]]), ids=torch.cat([i32([0, 1]),
                                                                                         step["ids"][lo:hi]]),
                   W=step["W"])
        sub_kw = {k: (torch.stack([v[(r + 1) % R], v[r]]) if isinstance(v, torch.Tensor) else v)
                  for k, v in kw.items()}
        alone = av.tree_rejection_sample(sub["logits"], sub["qsl"], sub["parent"], sub["ids"], sub["W"], **sub_kw)
        assert torch.equal(alone[0][1], first[0][r]) and int(alone[1][1]) == int(first[1][r])
        assert torch.equal(alone[2][1], first[2][r])
    other = call(step, **{**kw, "offset": kw["offset"] + 1})
    assert not torch.equal(other[0], first[0])


def test_unseeded_requests_draw_independent_streams():
    """Identical unseeded requests in one batch emit different tokens; torch.manual_seed reproduces a run."""
    model = ToyModel(6, seed=1)
    logits, qsl, parent, ids, W = random_trees(model, 1, seed=2)
    n = 64
    T = logits.shape[0]
    logits_b = logits.repeat(n, 1)
    qsl_b = torch.arange(n + 1, dtype=torch.int32) * T
    args = (logits_b, qsl_b, parent.repeat(n), ids.repeat(n), W)
    torch.manual_seed(5)
    a = av.tree_rejection_sample(*args, temperature=torch.ones(n))
    assert len({tuple(row) for row in a[0].tolist()}) > 4
    torch.manual_seed(5)
    b = av.tree_rejection_sample(*args, temperature=torch.ones(n))
    assert torch.equal(a[0], b[0])


def test_bench_tree_runs_and_agrees_with_the_reference():
    """`adaptive-verify bench sampling --tree` at a tiny size: every row timed, the op agrees with the reference."""
    from adaptive_verify.bench import sampling as bench

    result = bench._run(type("A", (), dict(tree=True, reqs=[2], vocab=[300], nodes=[8], device="cpu",
                                            min_time=0.01))())
    assert {r["mode"] for r in result["rows"]} == {"greedy", "T=1"}
    assert all(r["reference_agrees"] == "yes" and r["tree_us"] > 0 and r["chain_us"] > 0 for r in result["rows"])
    assert "Tree sampling" in bench._report(result)


def test_offset_as_a_device_tensor_equals_the_int():
    """A 0-d int64 offset (graph-safe: advanced in place between replays) draws what the same int draws."""
    step = planned_step(12, R=6)
    kw = settings(step["R"], 12, "sampled")
    offset = torch.tensor(kw.pop("offset"), dtype=torch.int64)
    a = call(step, offset=offset, **kw)
    b = call(step, offset=int(offset), **kw)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    offset += 1
    c = call(step, offset=offset, **kw)
    assert all(torch.equal(x, y) for x, y in zip(c, call(step, offset=int(offset), **kw)))


def test_compiles_fullgraph_like_eager():
    dynamo = pytest.importorskip("torch._dynamo")
    step = planned_step(13, R=5, N=8, V=64)
    kw = settings(step["R"], 13, "trunc")

    def fn(logits):
        return av.tree_rejection_sample(logits, step["qsl"], step["parent"], step["ids"], step["W"], **kw)

    dynamo.reset()
    eager = fn(step["logits"])
    compiled = torch.compile(fn, fullgraph=True)(step["logits"])
    assert all(torch.equal(e, c) for e, c in zip(eager, compiled))
    explained = dynamo.explain(fn)(step["logits"])
    ops = " ".join(str(n.target) for gm in explained.graphs for n in gm.graph.nodes if n.op == "call_function")
    assert "tree_rejection_sample_into" in ops


@pytest.mark.parametrize("truncate", [False, True])
def test_emulated_kernel_nonfinite_logits(emulated, truncate):
    """test_sampling_nonfinite.py's trees (nodes carrying their parents' +inf ids, every non-finite pattern): the
    CUDA source gives the CPU kernel's integers, logprobs and counts."""
    args, R = nonfinite.tree_step(300, torch.bfloat16, seed=11 + truncate)
    kw = dict(temperature=torch.tensor([0.0, 0.5, 1.0]).repeat(R // 3), seeds=torch.arange(R), offset=2, logprobs=True)
    if truncate:
        kw.update(top_k=torch.tensor([0, 1, 2]).repeat(R // 3).to(torch.int32), min_p=torch.full((R,), 0.1))
    _same(emulated, args, kw)
