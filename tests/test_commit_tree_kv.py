"""commit_tree_kv (docs/design.md, "Draft trees", KV commit): after tree sampling, the accepted path's K/V move from
KV index context_len + offset (where plan_tree_verification's slot_mapping wrote them) to context_len + depth.

Each case plans real trees, writes every verified token's K/V at its slot, walks a random accepted path down the
verified nodes, commits, and checks: the path's entries now sit at their depths with the values written at their
offsets; every other slot of every cache block (and guard blocks no request owns, poisoned) is unchanged; the
C++ CPU kernel equals the torch reference and, under the host emulator, the CUDA kernel's source (both word paths).
Bad paths raise ValueError naming the arguments on CPU; on the device that request moves nothing and is counted.
"""
import ctypes
import importlib

import numpy as np
import pytest
import torch

import adaptive_verify as av
import emu_build
from adaptive_verify import errors as av_errors
from adaptive_verify import reference as ref
from test_planner_tree import gen_parents

attention_module = importlib.import_module("adaptive_verify.attention")
GUARD = 3  # blocks at the end of each cache that no request owns: they must never change


def i32(x):
    return torch.tensor(x, dtype=torch.int32)


def committed_step(seed, R=6, N=12, Hkv=2, D=8, block_size=4, dtype=torch.float16, style="random"):
    """A planned tree step whose verified tokens' K/V are in the caches, and a random accepted path per request.
    Returns dict(k_cache, v_cache, block_table, context_lens, accepted_offsets, num_accepted, plan)."""
    rng = np.random.default_rng(seed)
    parents = gen_parents(rng, R, N, style)
    sizes = torch.from_numpy(rng.integers(0, N + 1, size=R).astype(np.int32))
    conf = torch.from_numpy(rng.uniform(0.3, 1.0, size=(R, N)).astype(np.float32))
    survival = av.tree_survival(conf, parents, sizes)
    ctx = torch.from_numpy(rng.integers(0, 30, size=R).astype(np.int32))
    max_blocks = (30 + N + 1) // block_size + 1
    num_blocks = R * max_blocks + GUARD
    block_table = torch.from_numpy(rng.permutation(R * max_blocks).reshape(R, max_blocks).astype(np.int32))
    plan = av.plan_tree_verification(survival, parents, sizes, mode="all", context_lens=ctx, block_table=block_table,
                                     block_size=block_size)
    # every slot holds distinct values; the verified block's tokens were written at their slots (write_kv)
    g = torch.Generator().manual_seed(seed)
    k_cache = torch.randn(num_blocks, block_size, Hkv, D, generator=g).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, Hkv, D, generator=g).to(dtype)
    k_cache[-GUARD:] = float("nan")
    v_cache[-GUARD:] = float("nan")
    T = int(plan.num_tokens)
    k_new = torch.randn(T, Hkv, D).to(dtype)
    av.write_kv(k_new, -k_new, k_cache, v_cache, plan.slot_mapping[:T])
    # a random accepted path: from the anchor, into a random verified child, stopping at random
    qsl, parent = plan.query_start_loc.tolist(), plan.token_parent.tolist()
    width = N + 1
    offsets = torch.full((R, width), -1, dtype=torch.int32)
    accepted = torch.zeros(R, dtype=torch.int32)
    for r in range(R):
        block = range(qsl[r], qsl[r + 1])
        path = [0]
        while True:
            children = [t - qsl[r] for t in block if t > qsl[r] and parent[t] == path[-1]]
            if not children or rng.random() < 0.2:
                break
            path.append(int(rng.choice(children)))
        offsets[r, :len(path)] = i32(path)
        accepted[r] = len(path) - 1
    return dict(k_cache=k_cache, v_cache=v_cache, block_table=block_table, context_lens=ctx,
                accepted_offsets=offsets, num_accepted=accepted, plan=plan)


def _args(step):
    return tuple(step[k] for k in ("k_cache", "v_cache", "block_table", "context_lens", "accepted_offsets",
                                   "num_accepted"))


def check_commit(step, k_after, v_after):
    """The path's entries at their depths hold what was at their offsets; nothing else changed."""
    k0, v0 = step["k_cache"], step["v_cache"]
    bs = k0.shape[1]
    bt, ctx = step["block_table"], step["context_lens"]
    moved = torch.zeros(k0.shape[:2], dtype=torch.bool)
    for r in range(bt.shape[0]):
        for depth in range(1, int(step["num_accepted"][r]) + 1):
            off = int(step["accepted_offsets"][r, depth])
            src, dst = int(ctx[r]) + off, int(ctx[r]) + depth
            sb, db = int(bt[r, src // bs]), int(bt[r, dst // bs])
            assert torch.equal(k_after[db, dst % bs], k0[sb, src % bs]), (r, depth)
            assert torch.equal(v_after[db, dst % bs], v0[sb, src % bs]), (r, depth)
            moved[db, dst % bs] = True
    same = ~moved
    assert torch.equal(k_after[:-GUARD][same[:-GUARD]], k0[:-GUARD][same[:-GUARD]])
    assert torch.equal(v_after[:-GUARD][same[:-GUARD]], v0[:-GUARD][same[:-GUARD]])
    assert k_after[-GUARD:].isnan().all() and v_after[-GUARD:].isnan().all(), "a guard block was written"


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("style", ["random", "levels", "star", "chain"])
def test_commit_moves_the_path_to_its_depths(seed, style):
    step = committed_step(seed, style=style)
    k, v = step["k_cache"].clone(), step["v_cache"].clone()
    want_k, want_v = ref.commit_tree_kv(*_args(step))
    av.commit_tree_kv(k, v, *_args(step)[2:])
    assert torch.equal(k.view(torch.int16), want_k.view(torch.int16)) and torch.equal(v.view(torch.int16),
                                                                                      want_v.view(torch.int16))
    check_commit(step, k, v)


def test_chain_paths_are_a_no_op():
    """A chain's accepted path has offsets equal to depths: nothing moves (a first-children path likewise)."""
    step = committed_step(1, style="chain")
    k, v = step["k_cache"].clone(), step["v_cache"].clone()
    assert all(int(step["accepted_offsets"][r, i]) == i for r in range(6)
               for i in range(int(step["num_accepted"][r]) + 1))
    av.commit_tree_kv(k, v, *_args(step)[2:])
    assert torch.equal(k.view(torch.int16), step["k_cache"].view(torch.int16))
    assert torch.equal(v.view(torch.int16), step["v_cache"].view(torch.int16))


def test_hand_commit():
    """One request, context 5, block size 4: path offsets [0, 2, 5] move KV 7 -> 6 and 10 -> 7 (depths 1, 2)."""
    k = torch.arange(4 * 4, dtype=torch.float32).reshape(4, 4, 1, 1)
    v = k + 100
    bt = i32([[2, 0, 3, 1]])  # KV indices 0-3 in block 2, 4-7 in block 0, 8-11 in block 3
    av.commit_tree_kv(k, v, bt, i32([5]), i32([[0, 2, 5, -1]]), i32([2]))
    def at(cache, idx):  # the value at KV index idx (each slot first held block * 4 + slot)
        return cache[int(bt[0, idx // 4]), idx % 4, 0, 0].item()

    assert (at(k, 6), at(k, 7)) == (3, 14)  # old KV 7 (block 0, slot 3) and KV 10 (block 3, slot 2)
    assert (at(v, 6), at(v, 7)) == (103, 114)
    assert (at(k, 5), at(k, 10), at(k, 4)) == (1, 14, 0)  # the anchor, a source and the context stay


BAD_PATHS = [
    ("num_accepted", i32([[0, 2, 5, -1]]), i32([4])),  # past the width - 1
    ("num_accepted", i32([[0, 2, 5, -1]]), i32([-1])),
    ("not increasing", i32([[0, 5, 2, -1]]), i32([2])),
    ("offset 0 after the anchor", i32([[0, 0, 5, -1]]), i32([2])),
    ("offset >= 64", i32([[0, 2, 64, -1]]), i32([2])),
    ("past the block table", i32([[0, 2, 20, -1]]), i32([2])),
]


@pytest.mark.parametrize("what,offsets,accepted", BAD_PATHS, ids=[b[0] for b in BAD_PATHS])
def test_bad_paths_raise_naming_the_arguments(what, offsets, accepted):
    k = torch.zeros(4, 4, 1, 2)
    with pytest.raises(ValueError, match="accepted_offsets / num_accepted"):
        av.commit_tree_kv(k, k.clone(), i32([[2, 0, 3]]), i32([5]), offsets, accepted)


def test_bad_arguments_name_themselves():
    k = torch.zeros(4, 4, 1, 2)
    bt, ctx, off, n = i32([[2, 0, 3]]), i32([5]), i32([[0, 2]]), i32([1])
    with pytest.raises(ValueError, match="accepted_offsets"):
        av.commit_tree_kv(k, k.clone(), bt, ctx, i32([[0, 2]] * 2), n)
    with pytest.raises(TypeError, match="num_accepted"):
        av.commit_tree_kv(k, k.clone(), bt, ctx, off, torch.tensor([1]))
    with pytest.raises(ValueError, match="v_cache"):
        av.commit_tree_kv(k, torch.zeros(4, 4, 1, 3), bt, ctx, off, n)
    with pytest.raises(ValueError, match="context_lens"):
        av.commit_tree_kv(k, k.clone(), bt, i32([5, 6]), off, n)
    with pytest.raises(ValueError, match="accepted_offsets / num_accepted"):  # a block id outside the cache
        av.commit_tree_kv(k, k.clone(), i32([[2, 9, 3]]), ctx, off, n)


def test_opcheck_commit_tree_kv():
    step = committed_step(2, dtype=torch.float32)
    err = torch.zeros(av_errors.error_buffer("cpu").numel(), dtype=torch.int32)
    args = (step["k_cache"].clone(), step["v_cache"].clone(), *_args(step)[2:], err)
    torch.library.opcheck(torch.ops.adaptive_verify.commit_tree_kv_.default, args)


# ---- the CUDA kernel's source under the host emulator ----


@pytest.fixture(scope="module")
def emu_lib(tmp_path_factory):
    lib = emu_build.build("commit_emu", tmp_path_factory)
    lib.av_emu_commit_tree_kv.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    lib.av_emu_commit_tree_kv.restype = ctypes.c_int
    lib.av_emu_set_reverse.argtypes = [ctypes.c_int]
    return lib


@pytest.fixture(params=["forward", "reverse"])
def emulated(request, monkeypatch, emu_lib):
    emu_lib.av_emu_set_reverse(request.param == "reverse")
    proxy = emu_build.EmulatedC(attention_module._C, {
        "commit_tree_kv": lambda params, on_cuda, stream: emu_build.status_of(emu_lib.av_emu_commit_tree_kv, params)})
    yield emu_build.emulated_runner(monkeypatch, attention_module, proxy)
    emu_lib.av_emu_set_reverse(0)  # the emulator's state is one per process (shared by every emulated library)


# D * Hkv * 2 bytes: 32 (16-byte words) and 6 (2-byte words, the unaligned path)
@pytest.mark.parametrize("Hkv,D", [(2, 8), (1, 3)])
@pytest.mark.parametrize("style", ["random", "levels", "star"])
def test_emulated_kernel_matches_cpu(Hkv, D, style, emulated):
    for seed in range(3):
        step = committed_step(seed, Hkv=Hkv, D=D, style=style, dtype=torch.bfloat16)
        k_cpu, v_cpu = step["k_cache"].clone(), step["v_cache"].clone()
        av.commit_tree_kv(k_cpu, v_cpu, *_args(step)[2:])
        k, v = step["k_cache"].clone(), step["v_cache"].clone()
        emulated(lambda: av.commit_tree_kv(k, v, *_args(step)[2:]))
        assert torch.equal(k.view(torch.int16), k_cpu.view(torch.int16))
        assert torch.equal(v.view(torch.int16), v_cpu.view(torch.int16))
        check_commit(step, k, v)


def test_emulated_bad_paths_move_nothing_and_are_counted(emulated):
    """Request 0 has a bad path (each kind in turn), request 1 a good one: on the device request 0 moves nothing, is
    counted once, and request 1 is committed as usual."""
    for what, offsets, accepted in BAD_PATHS:
        k = torch.arange(8 * 4 * 2, dtype=torch.float32).reshape(8, 4, 1, 2)
        v = -k
        bt = i32([[2, 0, 3], [4, 5, 6]])
        ctx = i32([5, 1])
        off = torch.cat([offsets, i32([[0, 1, 3, -1]])])
        n = torch.cat([accepted, i32([2])])
        want_k, want_v = ref.commit_tree_kv(k, v, bt[1:], ctx[1:], off[1:], n[1:])  # request 1 alone
        av_errors.reset_error_counts()
        emulated(lambda: av.commit_tree_kv(k, v, bt, ctx, off, n))
        assert av_errors.error_counts()["accepted_path"] == 1, what
        assert torch.equal(k, want_k) and torch.equal(v, want_v), what
    av_errors.reset_error_counts()


def test_emulated_replay_reads_new_paths(emu_lib):
    """The graph equivalent: one parameter struct (fixed addresses) launched again after new paths and contexts land in
    the same buffers; each launch equals the CPU kernel on the new values."""
    first, second = committed_step(4), committed_step(5)
    bufs = {k: v.clone() for k, v in first.items() if k != "plan"}
    err = av_errors.error_buffer("cpu")
    params = attention_module.CommitTreeKvParams()
    p_args = [bufs[k] for k in ("k_cache", "v_cache", "block_table", "context_lens", "accepted_offsets",
                                "num_accepted")]
    kc = p_args[0]
    params.num_blocks, params.block_size, Hkv, D = kc.shape
    params.k_cache, params.v_cache, params.row_bytes = kc.data_ptr(), p_args[1].data_ptr(), Hkv * D * kc.element_size()
    params.block_table, params.block_table_stride, params.max_blocks = p_args[2].data_ptr(), p_args[2].stride(0), \
        p_args[2].shape[1]
    params.context_lens, params.num_accepted, params.num_reqs = p_args[3].data_ptr(), p_args[5].data_ptr(), \
        p_args[2].shape[0]
    params.accepted_offsets, params.accepted_offsets_stride = p_args[4].data_ptr(), p_args[4].stride(0)
    params.width, params.error_counts = p_args[4].shape[1], err.data_ptr()
    for step in (second, first, second):
        for k, v in step.items():
            if k != "plan":
                bufs[k].copy_(v)
        want_k, want_v = ref.commit_tree_kv(*_args(step))
        emu_build.status_of(emu_lib.av_emu_commit_tree_kv, ctypes.addressof(params))
        assert torch.equal(bufs["k_cache"].view(torch.int16), want_k.view(torch.int16))
        assert torch.equal(bufs["v_cache"].view(torch.int16), want_v.view(torch.int16))


# ---- on a GPU ----


@pytest.mark.cuda
@pytest.mark.parametrize("Hkv,D", [(8, 128), (1, 3)])
def test_cuda_matches_cpu(Hkv, D):
    for seed, style in ((0, "random"), (1, "levels"), (2, "star")):
        step = committed_step(seed, R=40, N=31, Hkv=Hkv, D=D, style=style, dtype=torch.bfloat16)
        k_cpu, v_cpu = step["k_cache"].clone(), step["v_cache"].clone()
        av.commit_tree_kv(k_cpu, v_cpu, *_args(step)[2:])
        gpu = [t.cuda() for t in _args(step)]
        av.commit_tree_kv(*gpu)
        assert torch.equal(gpu[0].cpu().view(torch.int16), k_cpu.view(torch.int16))
        assert torch.equal(gpu[1].cpu().view(torch.int16), v_cpu.view(torch.int16))


@pytest.mark.cuda
def test_cuda_bad_paths_are_counted():
    k = torch.arange(8 * 4 * 2, dtype=torch.float32, device="cuda").reshape(8, 4, 1, 2)
    bt = i32([[2, 0, 3], [4, 5, 6]]).cuda()
    av.reset_error_counts("cuda")
    av.commit_tree_kv(k, -k, bt, i32([5, 1]).cuda(), i32([[0, 5, 2, -1], [0, 1, 3, -1]]).cuda(), i32([2, 2]).cuda())
    assert av.error_counts("cuda")["accepted_path"] == 1


@pytest.mark.cuda
def test_cuda_graph_capture_and_replay():
    first, second = committed_step(4), committed_step(5)
    bufs = {k: v.cuda() for k, v in first.items() if k != "plan"}
    names = ("k_cache", "v_cache", "block_table", "context_lens", "accepted_offsets", "num_accepted")
    av.commit_tree_kv(*(bufs[n].clone() for n in names))  # warm up: the error buffer exists before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        av.commit_tree_kv(*(bufs[n] for n in names))
    for step in (second, first):
        for n in names:
            bufs[n].copy_(step[n])
        graph.replay()
        torch.cuda.synchronize()
        want_k, want_v = ref.commit_tree_kv(*_args(step))
        assert torch.equal(bufs["k_cache"].cpu().view(torch.int16), want_k.view(torch.int16))
        assert torch.equal(bufs["v_cache"].cpu().view(torch.int16), want_v.view(torch.int16))
