"""verify_attention and write_kv on CPU: the C++ kernels against the float64 torch reference on random paged
problems with poisoned memory, batch invariance, determinism, and argument checks.

Poison: cache slots that no request may read (spare pages and the tail of each request's last page) hold NaN,
block_table entries past a request's last needed block point far out of range, query rows of padding tokens
are NaN, and out= is NaN-filled before the call. A kernel that reads what it must not, or leaves an output
element unwritten, produces NaN and fails.

Tolerance: a request's error against the float64 reference must stay within twice the error of the same
reference computed in float32 and rounded to the output dtype, plus one ulp of the output dtype at the
request's output magnitude. lse must be within 1e-4 (plus twice the float32 reference's lse error, which
matters only for very large scores) of the float64 reference, and exactly -inf on padding tokens.
CUDA tests are in test_attention_cuda.py.
"""
import itertools
import math
import re

import pytest
import torch

import adaptive_verify as av
from attention_inputs import _kv_problem
from adaptive_verify import reference as ref

DTYPES = [torch.bfloat16, torch.float16]
HEAD_DIMS = [64, 128, 256]
BLOCK_SIZES = [16, 32, 64, 128, 256]
GQA_RATIOS = [1, 2, 4, 8, 16]
FAR = 2**30  # block id of unused block_table entries: reading it is out of bounds by gigabytes
NAN = float("nan")
NEG_INF = float("-inf")
META = "meta"


# ------------------------------------------------------------------------------------------------------
# building paged problems
# ------------------------------------------------------------------------------------------------------


class Problem:
    """A paged verification batch built from dense per-request tensors.

    Request r has q [q_len, Hq, D] and its whole context k, v [seq_len, Hkv, D] (seq_len includes the q_len
    tokens being verified). Pages are drawn from a shuffled pool with spare pages left over; every cache slot
    that no request reads is NaN.
    """

    def __init__(self, reqs, block_size, *, extra_tokens=2, spare_blocks=3, max_query_len=None, seed=0,
                 dtype=None, Hq=None, Hkv=None, D=None):
        g = torch.Generator().manual_seed(seed)
        first = next((r for r in reqs if r[1].shape[0] > 0), None)
        dtype = dtype or first[0].dtype
        Hq, D = Hq or first[0].shape[1], D or first[0].shape[2]
        Hkv = Hkv or first[1].shape[1]
        R = len(reqs)
        q_lens = [r[0].shape[0] for r in reqs]
        self.q_lens = q_lens
        self.seq_lens_list = [r[1].shape[0] for r in reqs]
        qsl = [0]
        for n in q_lens:
            qsl.append(qsl[-1] + n)
        T = qsl[-1] + extra_tokens
        need = [-(-s // block_size) for s in self.seq_lens_list]
        max_blocks = max(need) + 2
        num_blocks = sum(need) + spare_blocks
        pool = torch.randperm(num_blocks, generator=g).tolist()

        # [num_blocks, block_size, Hkv, D]: NaN wherever no request reads
        self.k_cache = torch.full((num_blocks, block_size, Hkv, D), NAN, dtype=dtype)
        self.v_cache = torch.full((num_blocks, block_size, Hkv, D), NAN, dtype=dtype)
        # [R, max_blocks]: entries past each request's last needed block point far out of range
        self.block_table = torch.full((R, max_blocks), FAR, dtype=torch.int32)
        self.q = torch.full((T, Hq, D), NAN, dtype=dtype)  # padding tokens' queries are NaN
        for r, (q, k, v) in enumerate(reqs):
            blocks = [pool.pop() for _ in range(need[r])]
            self.block_table[r, :need[r]] = torch.tensor(blocks, dtype=torch.int32)
            if need[r] + 1 < max_blocks:
                self.block_table[r, need[r] + 1] = -1  # negative ids past the end must not be read either
            pos = torch.arange(k.shape[0])
            ids = torch.tensor(blocks, dtype=torch.long)[pos // block_size] if need[r] else pos
            self.k_cache[ids, pos % block_size] = k
            self.v_cache[ids, pos % block_size] = v
            self.q[qsl[r]:qsl[r + 1]] = q
        self.seq_lens = torch.tensor(self.seq_lens_list, dtype=torch.int32)
        self.query_start_loc = torch.tensor(qsl, dtype=torch.int32)
        self.max_query_len = max_query_len or max(max(q_lens), 1)
        self.T, self.R = T, R

    def args(self):
        return (self.q, self.k_cache, self.v_cache, self.block_table, self.seq_lens, self.query_start_loc,
                self.max_query_len)

    def rows(self, r):
        return slice(int(self.query_start_loc[r]), int(self.query_start_loc[r + 1]))

    def padding_mask(self):
        """[T] True for tokens of no request (rows of q_len 0 own none; tokens past query_start_loc[R])."""
        mask = torch.ones(self.T, dtype=torch.bool)
        mask[:int(self.query_start_loc[-1])] = False
        return mask


def random_request(g, q_len, seq_len, Hq, Hkv, D, dtype, q_scale=1.0):
    q = (torch.randn(q_len, Hq, D, generator=g) * q_scale).to(dtype)
    k = torch.randn(seq_len, Hkv, D, generator=g).to(dtype)
    v = torch.randn(seq_len, Hkv, D, generator=g).to(dtype)
    return q, k, v


def random_problem(seed, dtype, D, block_size, Hkv, group, *, R=5, max_query_len=None, max_seq=5000,
                   n_padding_rows=1, extra_tokens=3, q_scale=1.0):
    """R requests with q_len in 1..max_query_len (1 and max_query_len both present), seq_len log-uniform in
    q_len..max_seq (one request at max_seq), and padding rows (q_len 0) at random places."""
    g = torch.Generator().manual_seed(seed)
    Hq = Hkv * group
    mql = max_query_len or int(torch.randint(1, 17, (1,), generator=g))
    q_lens = [1, mql] + torch.randint(1, mql + 1, (R - 2,), generator=g).tolist()
    seq_lens = []
    for i, n in enumerate(q_lens):
        if i == 1:
            seq_lens.append(max_seq)
        else:
            u = float(torch.rand((), generator=g))
            seq_lens.append(max(n, int(round(n * (max_seq / n) ** u))))
    reqs = [random_request(g, n, s, Hq, Hkv, D, dtype, q_scale) for n, s in zip(q_lens, seq_lens)]
    for _ in range(n_padding_rows):
        at = int(torch.randint(0, len(reqs) + 1, (1,), generator=g))
        reqs.insert(at, random_request(g, 0, 0, Hq, Hkv, D, dtype))
    perm = torch.randperm(len(reqs), generator=g).tolist()
    reqs = [reqs[i] for i in perm]
    return Problem(reqs, block_size, extra_tokens=extra_tokens, max_query_len=mql, seed=seed, dtype=dtype, Hq=Hq,
                   Hkv=Hkv, D=D)


# ------------------------------------------------------------------------------------------------------
# checking against the reference
# ------------------------------------------------------------------------------------------------------


def ulp(dtype, magnitude):
    """Spacing of `dtype` numbers at `magnitude` (eps is the spacing at 1.0)."""
    finfo = torch.finfo(dtype)
    magnitude = max(float(magnitude), finfo.smallest_normal)
    return finfo.eps * 2.0 ** math.floor(math.log2(magnitude))


def bits(t):
    """Bit pattern of a tensor, so that equality is bitwise (NaN == NaN, -0.0 != 0.0)."""
    return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def call(p, **kw):
    """The op with out= poisoned (NaN); checks it was returned and fully rewritten."""
    out = torch.full_like(p.q, NAN)
    got, lse = av.verify_attention(*p.args(), out=out, return_lse=True, **kw)
    assert got.data_ptr() == out.data_ptr() and got.dtype == p.q.dtype and got.shape == p.q.shape
    assert lse.dtype == torch.float32 and lse.shape == p.q.shape[:2]
    assert not torch.isnan(got).any(), f"{int(torch.isnan(got).sum())} output elements NaN (unwritten or read NaN)"
    return got, lse


def check_against_reference(p, got, lse, scale=None, tree_mask=None, k_scale=None, v_scale=None, **variants):
    """`got` and `lse` against the float64 reference (module docstring's tolerance); fp8 caches (p.k_cache of
    float8_e4m3fn) with their scales: the references dequantise, in float64 and float32. variants: sinks,
    window_left, softcap (test_attention_variants.py)."""
    kw = dict(scale=scale, return_lse=True, tree_mask=tree_mask, k_scale=k_scale, v_scale=v_scale, **variants)
    ref64, lse64 = ref.verify_attention(p.q.double(), p.k_cache.double(), p.v_cache.double(), p.block_table,
                                        p.seq_lens, p.query_start_loc, p.max_query_len, **kw)
    ref32, lse32 = ref.verify_attention(*p.args(), dtype=torch.float32, **kw)
    ref32 = ref32.to(p.q.dtype).double()
    assert ref64.dtype == torch.float64
    pad = p.padding_mask()
    assert (got[pad] == 0).all(), "padding tokens' output is not exactly 0"
    assert (lse[pad] == NEG_INF).all(), "padding tokens' lse is not -inf"
    for r in range(p.R):
        rows = p.rows(r)
        if p.q_lens[r] == 0:
            continue
        want = ref64[rows]
        err = (got[rows].double() - want).abs().max().item()
        ref_err = (ref32[rows] - want).abs().max().item()
        tol = 2 * ref_err + ulp(p.q.dtype, want.abs().max().item())
        assert err <= tol, (f"request {r} (q_len {p.q_lens[r]}, seq_len {p.seq_lens_list[r]}): max error {err:.3g} "
                            f"> tolerance {tol:.3g} (float32 reference error {ref_err:.3g})")
        finite = torch.isfinite(lse64[rows])  # every token's but a draft-tree token's that sees no position
        assert torch.equal(torch.isfinite(lse[rows]), finite) and (lse[rows][~finite] == NEG_INF).all()
        lse_ref_err = (lse32[rows][finite].double() - lse64[rows][finite].double()).abs().max().item()
        lse_err = (lse[rows][finite].double() - lse64[rows][finite].double()).abs().max().item()
        assert lse_err <= 1e-4 + 2 * lse_ref_err, (
            f"request {r} (q_len {p.q_lens[r]}, seq_len {p.seq_lens_list[r]}): lse error {lse_err:.3g}")


# ------------------------------------------------------------------------------------------------------
# against the reference
# ------------------------------------------------------------------------------------------------------


def _pairwise_grid():
    """25 (dtype, D, block_size, ratio) cases covering every pair of values of any two of the four factors
    (block_size x ratio is a full 5 x 5; dtype and D follow two orthogonal diagonals)."""
    rows = []
    for b, r in itertools.product(range(5), range(5)):
        rows.append((DTYPES[(b + r) % 5 % 2], HEAD_DIMS[(b + 2 * r) % 5 % 3], BLOCK_SIZES[b], GQA_RATIOS[r]))
    levels = [DTYPES, HEAD_DIMS, BLOCK_SIZES, GQA_RATIOS]
    for i, j in itertools.combinations(range(4), 2):
        assert {(x[i], x[j]) for x in rows} == set(itertools.product(levels[i], levels[j])), (i, j)
    return rows


PAIRWISE = _pairwise_grid()


GRID = list(itertools.product(DTYPES, HEAD_DIMS, BLOCK_SIZES, GQA_RATIOS))


@pytest.mark.parametrize("dtype,D,block_size,group", GRID,
                         ids=[f"{str(d)[6:]}-D{D}-bs{bs}-g{gr}" for d, D, bs, gr in GRID])
def test_matches_reference_full_grid(dtype, D, block_size, group):
    """Every (dtype, D, block_size, Hq/Hkv). Contexts reach 5000 on a pairwise covering of the four factors
    and 1200 elsewhere, to keep the suite fast on two cores."""
    Hkv = 2 if group <= 4 else 1
    max_seq = 5000 if (dtype, D, block_size, group) in PAIRWISE else 1200
    p = random_problem(GRID.index((dtype, D, block_size, group)), dtype, D, block_size, Hkv, group, R=4,
                       max_seq=max_seq)
    got, lse = call(p)
    check_against_reference(p, got, lse)


BIG = [
    (torch.bfloat16, 128, 16, 1, 8, 16),
    (torch.bfloat16, 128, 16, 2, 4, 33),  # K = 32 drafts + the anchor: the planner's longest chain
    (torch.float16, 64, 32, 1, 2, 64),  # the longest query (trees of 63 nodes)
    (torch.float16, 256, 256, 1, 16, 16),
    (torch.bfloat16, 64, 128, 4, 1, 8),
    (torch.float16, 128, 32, 2, 4, 4),
]


@pytest.mark.parametrize("dtype,D,block_size,Hkv,group,mql", BIG,
                         ids=[f"{str(d)[6:]}-D{D}-bs{bs}-Hkv{h}-g{gr}-mql{m}" for d, D, bs, h, gr, m in BIG])
def test_matches_reference_big_context(dtype, D, block_size, Hkv, group, mql):
    p = random_problem(7 * D + block_size, dtype, D, block_size, Hkv, group, R=3, max_query_len=mql, max_seq=5000)
    got, lse = call(p)
    check_against_reference(p, got, lse)


def test_seq_lens_at_block_and_split_boundaries():
    """seq_len == q_len (the first query token sees only position 0), and lengths one either side of page
    sizes and of powers of two where a fixed KV split would end."""
    dtype, D, Hkv, group, block_size = torch.bfloat16, 64, 2, 2, 16
    g = torch.Generator().manual_seed(5)
    cases = [(1, 1), (4, 4), (16, 16), (3, 15), (3, 16), (3, 17), (16, 31), (2, 32), (5, 33)]
    cases += [(q_len, n + d) for n in (64, 128, 256, 512, 1024, 2048) for d in (-1, 0, 1)
              for q_len in [1 + (n + d) % 16]]
    reqs = [random_request(g, q, s, Hkv * group, Hkv, D, dtype) for q, s in cases]
    p = Problem(reqs, block_size, extra_tokens=0, max_query_len=16, seed=5)
    got, lse = call(p)
    check_against_reference(p, got, lse)


def test_large_scores_do_not_overflow():
    """Scores up to ~100 (exp overflows float32 without subtracting the running max) and sharp softmax."""
    p = random_problem(11, torch.bfloat16, 128, 64, 2, 4, R=4, max_query_len=6, max_seq=3000, q_scale=30.0)
    got, lse = call(p)
    check_against_reference(p, got, lse)


@pytest.mark.parametrize("scale", [0.3, 1.0, 1e-3])
def test_scale_is_honoured(scale):
    p = random_problem(21, torch.float16, 64, 32, 2, 2, R=3, max_query_len=5, max_seq=600)
    got, lse = call(p, scale=scale)
    check_against_reference(p, got, lse, scale=scale)
    default, _ = call(p)
    assert not torch.equal(got, default)


@pytest.mark.parametrize("scale", [NAN, float("inf"), -float("inf"), 1e300, -1e39, 10**400])
def test_scale_must_be_finite_in_float32(scale):
    """Issue 16, finding 6: scale=nan or inf ran and returned lse = -inf; 1e300 is finite but reached the kernel's
    float32 field as inf. Each is a ValueError naming scale, before any work."""
    p = random_problem(23, torch.float16, 64, 16, 1, 1, R=2, max_query_len=3, max_seq=40)
    with pytest.raises(ValueError, match="^scale must be finite"):
        av.verify_attention(*p.args(), scale=scale)
    for bad_type in ("0.1", [0.1], True):
        with pytest.raises(TypeError, match="^scale"):
            av.verify_attention(*p.args(), scale=bad_type)


def test_default_scale_is_inverse_sqrt_head_dim():
    p = random_problem(22, torch.bfloat16, 128, 16, 1, 4, R=3, max_query_len=4, max_seq=400)
    got, lse = call(p)
    check_against_reference(p, got, lse, scale=128 ** -0.5)


def test_only_padding():
    """Every row a padding row: all zeros, lse -inf, nothing read (block_table all out of range)."""
    g = torch.Generator().manual_seed(3)
    reqs = [random_request(g, 0, 0, 4, 2, 64, torch.float16) for _ in range(3)]
    p = Problem(reqs, 16, extra_tokens=5, max_query_len=4, dtype=torch.float16, Hq=4, Hkv=2, D=64)
    got, lse = call(p)
    assert (got == 0).all() and (lse == NEG_INF).all()


@pytest.mark.parametrize("T,R", [(0, 2), (0, 0), (3, 0)])
def test_empty_batches(T, R):
    """No tokens, or no requests (every token padding)."""
    q = torch.full((T, 4, 64), NAN, dtype=torch.bfloat16)
    cache = torch.full((2, 16, 2, 64), NAN, dtype=torch.bfloat16)
    out = torch.full_like(q, NAN)
    got, lse = av.verify_attention(q, cache, cache, torch.full((R, 1), FAR, dtype=torch.int32),
                                   torch.zeros(R, dtype=torch.int32), torch.zeros(R + 1, dtype=torch.int32), 1,
                                   out=out, return_lse=True)
    assert got.data_ptr() == out.data_ptr() and got.shape == (T, 4, 64) and lse.shape == (T, 4)
    assert (got == 0).all() and (lse == NEG_INF).all()


def test_padding_rows_with_stale_lengths_are_not_read():
    """A padding row (q_len 0) whose seq_lens and block_table are left over from an earlier step reads
    nothing: its pages are NaN and its output rows do not exist."""
    g = torch.Generator().manual_seed(4)
    reqs = [random_request(g, 3, 200, 8, 2, 128, torch.bfloat16), random_request(g, 0, 0, 8, 2, 128, torch.bfloat16),
            random_request(g, 2, 90, 8, 2, 128, torch.bfloat16)]
    p = Problem(reqs, 32, extra_tokens=2, max_query_len=4, spare_blocks=4)
    nan_block = int((torch.isnan(p.k_cache.flatten(1)).all(1)).nonzero()[0])
    p.seq_lens[1] = 40
    p.block_table[1, :2] = nan_block
    got, lse = call(p)
    check_against_reference(p, got, lse)


# ------------------------------------------------------------------------------------------------------
# batch invariance, determinism, out= and return_lse
# ------------------------------------------------------------------------------------------------------


INVARIANCE = [(torch.bfloat16, 128, 16, 2, 4), (torch.float16, 64, 64, 1, 16), (torch.bfloat16, 256, 256, 4, 1)]


@pytest.mark.parametrize("dtype,D,block_size,Hkv,group", INVARIANCE,
                         ids=[f"{str(d)[6:]}-D{D}-bs{bs}-Hkv{h}-g{gr}" for d, D, bs, h, gr in INVARIANCE])
def test_batch_invariance(dtype, D, block_size, Hkv, group):
    """A request's output and lse are bitwise identical alone and inside batches where it sits at other
    positions, in other pages, next to other requests and padding."""
    g = torch.Generator().manual_seed(D + block_size)
    Hq, mql = Hkv * group, 8
    targets = [random_request(g, q_len, seq_len, Hq, Hkv, D, dtype) for q_len, seq_len in [(5, 3001), (1, 777), (8, 8)]]
    alone = []
    for t in targets:
        p = Problem([t], block_size, extra_tokens=0, spare_blocks=0, max_query_len=mql, seed=1)
        alone.append(call(p))
    for seed, at in [(2, 3), (3, 0), (4, 5)]:
        others = [random_request(g, n, s, Hq, Hkv, D, dtype) for n, s in [(2, 4000), (0, 0), (8, 130), (1, 1),
                                                                            (7, 2500), (3, 64)]]
        for i, t in enumerate(targets):
            reqs = others[:at] + [t] + others[at:]
            p = Problem(reqs, block_size, extra_tokens=seed, spare_blocks=seed, max_query_len=mql, seed=seed)
            got, lse = call(p)
            rows = p.rows(at)
            assert torch.equal(bits(got[rows]), bits(alone[i][0])), f"target {i} output differs at position {at}"
            assert torch.equal(bits(lse[rows]), bits(alone[i][1])), f"target {i} lse differs at position {at}"


def test_deterministic_and_return_lse_consistent():
    p = random_problem(31, torch.bfloat16, 128, 32, 2, 4, R=4, max_query_len=7, max_seq=2000)
    a, lse_a = call(p)
    b, lse_b = call(p)
    assert torch.equal(bits(a), bits(b)) and torch.equal(bits(lse_a), bits(lse_b))
    plain = av.verify_attention(*p.args())
    assert isinstance(plain, torch.Tensor) and torch.equal(bits(plain), bits(a))
    out = torch.full_like(p.q, NAN)
    plain_out = av.verify_attention(*p.args(), out=out)
    assert plain_out.data_ptr() == out.data_ptr() and torch.equal(bits(out), bits(a))
    res = av.verify_attention(*p.args(), return_lse=True)
    assert torch.equal(bits(res[0]), bits(a)) and torch.equal(bits(res[1]), bits(lse_a))


def test_strided_q_and_block_table():
    """q as a slice of a fused [T, Hq + 2 Hkv, D] projection and block_table as the first columns of a wider
    table give the same bits as contiguous copies."""
    p = random_problem(33, torch.bfloat16, 128, 16, 2, 4, R=4, max_query_len=6, max_seq=900)
    want, want_lse = call(p)
    T, Hq, D = p.q.shape
    qkv = torch.full((T, Hq + 4, D), NAN, dtype=p.q.dtype)
    qkv[:, :Hq] = p.q
    wide = torch.full((p.R, p.block_table.shape[1] + 5), FAR, dtype=torch.int32)
    wide[:, :p.block_table.shape[1]] = p.block_table
    args = list(p.args())
    args[0], args[3] = qkv[:, :Hq], wide[:, :p.block_table.shape[1]]
    got, lse = av.verify_attention(*args, return_lse=True)
    assert torch.equal(bits(got), bits(want)) and torch.equal(bits(lse), bits(want_lse))


def test_inputs_are_not_modified():
    p = random_problem(32, torch.float16, 64, 16, 2, 2, R=3, max_query_len=3, max_seq=300)
    before = [t.clone() for t in p.args()[:6]]
    call(p)
    for b, a in zip(before, p.args()[:6]):
        assert torch.equal(bits(b), bits(a))


# ------------------------------------------------------------------------------------------------------
# argument checks
# ------------------------------------------------------------------------------------------------------


def _small():
    """(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, max_query_len) of a valid small problem:
    two requests (q_len 3 and 2, seq_len 20 and 5) with 4 pages of 16, Hq 4, Hkv 2, D 64, bf16."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(6, 4, 64, generator=g).to(torch.bfloat16)
    k_cache = torch.randn(4, 16, 2, 64, generator=g).to(torch.bfloat16)
    v_cache = torch.randn(4, 16, 2, 64, generator=g).to(torch.bfloat16)
    block_table = torch.tensor([[2, 0], [3, FAR]], dtype=torch.int32)
    seq_lens = torch.tensor([20, 5], dtype=torch.int32)
    qsl = torch.tensor([0, 3, 5], dtype=torch.int32)
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table, seq_lens=seq_lens,
                query_start_loc=qsl, max_query_len=4)


def _attn(**changes):
    kw = _small()
    kw.update(changes)
    return av.verify_attention(**kw)


def _bf16(*shape, device="cpu"):
    return torch.zeros(*shape, dtype=torch.bfloat16, device=device)


def _i32(*values):
    return torch.tensor(values, dtype=torch.int32)


def names(pattern):
    """Regex: the message's first word is one of the argument names in `pattern` ("a|b"), possibly after
    the op's name ("adaptive_verify.verify_attention: seq_lens: ...")."""
    return rf"^(adaptive_verify\.\w+: )?({pattern})\b"


@pytest.mark.parametrize("name,value,exc,named", [
    # q
    ("q", torch.randn(6, 4, 64), TypeError, "q"),
    ("q", torch.randn(6, 4, 64, dtype=torch.float64), TypeError, "q"),
    ("q", _bf16(6, 256), ValueError, "q"),
    ("q", _bf16(6, 4, 64, device=META), ValueError, "q"),
    ("q", _bf16(6, 3, 64), ValueError, "q|k_cache"),  # Hq not a multiple of Hkv
    ("q", _bf16(6, 64, 64), ValueError, "q|k_cache"),  # Hq / Hkv = 32
    ("q", _bf16(6, 6, 64), ValueError, "q|k_cache"),  # Hq / Hkv = 3
    ("q", _bf16(6, 4, 128), ValueError, "q|k_cache"),  # head dim differs from the cache's
    # k_cache, v_cache
    ("k_cache", torch.randn(4, 16, 2, 64), TypeError, "k_cache"),
    ("k_cache", torch.randn(4, 16, 2, 64).half(), TypeError, "k_cache"),
    ("k_cache", _bf16(4, 16, 128), ValueError, "k_cache"),
    ("k_cache", _bf16(4, 16, 2, 64, device=META), ValueError, "k_cache"),
    ("k_cache", _bf16(4, 2, 16, 64).transpose(1, 2), ValueError, "k_cache"),  # not contiguous
    ("v_cache", torch.randn(4, 16, 2, 64).half(), TypeError, "v_cache"),
    ("v_cache", _bf16(4, 16, 1, 64), ValueError, "v_cache"),
    ("v_cache", _bf16(5, 16, 2, 64), ValueError, "v_cache"),
    ("v_cache", _bf16(4, 16, 2, 64, device=META), ValueError, "v_cache"),
    # block_table
    ("block_table", torch.tensor([[2, 0], [3, 1]]), TypeError, "block_table"),
    ("block_table", _i32(2, 0, 3, 1), ValueError, "block_table"),
    ("block_table", torch.zeros(3, 2, dtype=torch.int32), ValueError, "block_table|seq_lens"),  # R differs
    ("block_table", torch.zeros(2, 2, dtype=torch.int32, device=META), ValueError, "block_table"),
    ("block_table", torch.tensor([[2], [3]], dtype=torch.int32), ValueError, "block_table"),  # too narrow
    ("block_table", torch.tensor([[2, 4], [3, 0]], dtype=torch.int32), ValueError, "block_table"),  # id 4
    ("block_table", torch.tensor([[2, 0], [-1, 0]], dtype=torch.int32), ValueError, "block_table"),  # id -1
    ("block_table", torch.tensor([[FAR, 0], [3, 0]], dtype=torch.int32), ValueError, "block_table"),
    # seq_lens
    ("seq_lens", torch.tensor([20, 5]), TypeError, "seq_lens"),
    ("seq_lens", _i32(20, 5, 7), ValueError, "seq_lens"),
    ("seq_lens", _i32(20, 5).to(META), ValueError, "seq_lens"),
    ("seq_lens", _i32(2, 5), ValueError, "seq_lens"),  # seq_len < q_len
    ("seq_lens", _i32(20, -1), ValueError, "seq_lens"),
    # query_start_loc
    ("query_start_loc", torch.tensor([0, 3, 5]), TypeError, "query_start_loc"),
    ("query_start_loc", _i32(0, 3), ValueError, "query_start_loc"),
    ("query_start_loc", _i32(0, 3, 5).to(META), ValueError, "query_start_loc"),
    ("query_start_loc", _i32(0, 3, 2), ValueError, "query_start_loc"),  # decreasing
    ("query_start_loc", _i32(0, 3, 7), ValueError, "query_start_loc"),  # past T
    ("query_start_loc", _i32(-1, 3, 5), ValueError, "query_start_loc"),
    # max_query_len
    ("max_query_len", 0, ValueError, "max_query_len"),
    ("max_query_len", 65, ValueError, "max_query_len"),
    ("max_query_len", -3, ValueError, "max_query_len"),
    ("max_query_len", 2.5, TypeError, "max_query_len"),
    ("max_query_len", 2, ValueError, "query_start_loc|max_query_len"),  # request 0 has q_len 3
])
def test_verify_attention_bad_inputs_name_the_argument(name, value, exc, named):
    with pytest.raises(exc, match=names(named)):
        _attn(**{name: value})
    _attn()  # the good arguments pass


@pytest.mark.parametrize("value", ["", "Rowwise", "tensor_core", "tiled", 0, 1, True, ["mma"]])
def test_verify_attention_bad_cuda_kernel(value):
    """cuda_kernel picks the CUDA implementation; on CPU it is checked, then ignored."""
    with pytest.raises(ValueError, match=names("cuda_kernel")):
        _attn(cuda_kernel=value)


@pytest.mark.parametrize("value", ["", "tiled", None])
def test_verify_attention_bad_module_setting(monkeypatch, value):
    """The module setting CUDA_KERNEL (used when cuda_kernel is None) is checked like the argument, by name."""
    from adaptive_verify import attention as attention_module
    monkeypatch.setattr(attention_module, "CUDA_KERNEL", value)
    with pytest.raises(ValueError, match=r"^adaptive_verify\.attention\.CUDA_KERNEL"):
        _attn()
    _attn(cuda_kernel="rowwise")  # an explicit argument does not read the setting


@pytest.mark.parametrize("setting", ["rowwise", "mma", "mma_fused"])
def test_verify_attention_cuda_kernel_is_ignored_on_cpu(monkeypatch, setting):
    from adaptive_verify import attention as attention_module
    monkeypatch.setattr(attention_module, "CUDA_KERNEL", setting)
    want = _attn(cuda_kernel="rowwise")
    for kernel in (None, "rowwise", "mma", "mma_fused"):
        assert torch.equal(_attn(cuda_kernel=kernel), want), kernel


@pytest.mark.parametrize("block_size", [8, 48, 512])
def test_unsupported_block_size(block_size):
    with pytest.raises(ValueError, match=names("k_cache")):
        _attn(k_cache=_bf16(16, block_size, 2, 64), v_cache=_bf16(16, block_size, 2, 64),
              block_table=torch.zeros(2, 8, dtype=torch.int32))


@pytest.mark.parametrize("D", [32, 96, 512])
def test_unsupported_head_dim(D):
    with pytest.raises(ValueError, match=names("q|k_cache")):
        _attn(q=_bf16(6, 4, D), k_cache=_bf16(4, 16, 2, D), v_cache=_bf16(4, 16, 2, D))


def test_fp32_rejected():
    with pytest.raises(TypeError, match=names("q")):
        _attn(q=torch.randn(6, 4, 64), k_cache=torch.randn(4, 16, 2, 64), v_cache=torch.randn(4, 16, 2, 64))


@pytest.mark.parametrize("out,exc", [
    (torch.empty(6, 4, 64, dtype=torch.float16), TypeError),
    (torch.empty(6, 4, 64, dtype=torch.float32), TypeError),
    (_bf16(5, 4, 64), ValueError),
    (_bf16(6, 4, 128), ValueError),
    (_bf16(6, 4, 64, device=META), ValueError),
])
def test_bad_out(out, exc):
    with pytest.raises(exc, match=names("out")):
        _attn(out=out)


# ------------------------------------------------------------------------------------------------------
# write_kv
# ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES + [torch.float32], ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("D,block_size,Hkv,T", [(64, 16, 1, 37), (128, 32, 8, 100), (256, 256, 2, 19),
                                                (128, 64, 4, 1), (64, 128, 16, 70)])
def test_write_kv_writes_exactly_the_given_slots(dtype, D, block_size, Hkv, T):
    k, v, k_cache, v_cache, slots = _kv_problem(D + T, dtype, T, Hkv, D, 7, block_size, T // 4)
    want_k, want_v = ref.write_kv(k, v, k_cache, v_cache, slots)
    assert av.write_kv(k, v, k_cache, v_cache, slots) is None
    assert torch.equal(bits(k_cache), bits(want_k)) and torch.equal(bits(v_cache), bits(want_v))
    written = int((slots >= 0).sum())
    assert int((~torch.isnan(k_cache[..., 0, 0])).sum()) == written  # the rest is still NaN


def test_write_kv_first_and_last_slot_and_all_skipped():
    k, v, k_cache, v_cache, _ = _kv_problem(1, torch.bfloat16, 3, 2, 64, 5, 16, 0)
    slots = torch.tensor([5 * 16 - 1, -1, 0])
    want = ref.write_kv(k, v, k_cache, v_cache, slots)
    av.write_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(bits(k_cache), bits(want[0])) and torch.equal(bits(v_cache), bits(want[1]))
    before = (k_cache.clone(), v_cache.clone())
    av.write_kv(k.flip(0), v.flip(0), k_cache, v_cache, torch.full((3,), -1))
    assert torch.equal(bits(k_cache), bits(before[0])) and torch.equal(bits(v_cache), bits(before[1]))
    av.write_kv(k[:0], v[:0], k_cache, v_cache, slots[:0])  # T = 0
    assert torch.equal(bits(k_cache), bits(before[0]))


def test_write_kv_strided_sources():
    """k and v as slices of a fused [T, Hq + 2 Hkv, D] projection, the way engines pass them."""
    g = torch.Generator().manual_seed(2)
    qkv = torch.randn(9, 8 + 2 * 2, 64, generator=g).to(torch.float16)
    k, v = qkv[:, 8:10], qkv[:, 10:12]
    _, _, k_cache, v_cache, slots = _kv_problem(2, torch.float16, 9, 2, 64, 3, 32, 2)
    want = ref.write_kv(k, v, k_cache, v_cache, slots)
    av.write_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(bits(k_cache), bits(want[0])) and torch.equal(bits(v_cache), bits(want[1]))


def _kv_call(**changes):
    k, v, k_cache, v_cache, slots = _kv_problem(0, torch.bfloat16, 4, 2, 64, 3, 16, 1)
    kw = dict(k=k, v=v, k_cache=k_cache, v_cache=v_cache, slot_mapping=slots)
    kw.update(changes)
    return av.write_kv(**kw)


@pytest.mark.parametrize("name,value,exc", [
    ("k", torch.randn(4, 2, 64), TypeError),
    ("k", _bf16(4, 2, 128)[..., ::2], ValueError),  # last dim not contiguous
    ("k", torch.randn(4, 2, 64).half(), TypeError),
    ("k", _bf16(4, 1, 64), ValueError),
    ("k", _bf16(4, 2, 128), ValueError),
    ("k", _bf16(4, 128), ValueError),
    ("v", torch.randn(4, 2, 64).half(), TypeError),
    ("v", _bf16(5, 2, 64), ValueError),
    ("v", _bf16(4, 2, 64, device=META), ValueError),
    ("k_cache", torch.randn(3, 16, 2, 64, dtype=torch.float64), TypeError),
    ("k_cache", torch.zeros(3, 16, 2, 64, dtype=torch.int16), TypeError),
    ("k_cache", _bf16(3, 16, 2, 64, device=META), ValueError),
    ("v_cache", _bf16(3, 32, 2, 64), ValueError),
    ("v_cache", torch.randn(3, 16, 2, 64).half(), TypeError),
    ("v_cache", _bf16(3, 2, 16, 64).transpose(1, 2), ValueError),  # not contiguous
    ("slot_mapping", torch.tensor([0, 1, 2, 3], dtype=torch.int32), TypeError),
    ("slot_mapping", torch.tensor([0.0, 1, 2, 3]), TypeError),
    ("slot_mapping", torch.tensor([0, 1, 2]), ValueError),
    ("slot_mapping", torch.tensor([0, 1, 2, 3], device=META), ValueError),
    ("slot_mapping", torch.tensor([0, 1, 2, 48]), ValueError),  # == num_blocks * block_size
    ("slot_mapping", torch.tensor([0, -2, 2, 3]), ValueError),
    ("slot_mapping", torch.tensor([0, 1, 2, 2**32 + 3]), ValueError),  # would wrap to a valid slot in int32
    ("slot_mapping", torch.tensor([0, 1, 2, -(2**32) + 3]), ValueError),
])
def test_write_kv_bad_inputs_name_the_argument(name, value, exc):
    with pytest.raises(exc, match=names(name)):
        _kv_call(**{name: value})
    _kv_call()


def test_write_kv_bad_slot_writes_nothing():
    """A rejected call leaves the caches untouched (the check runs before any write)."""
    k, v, k_cache, v_cache, _ = _kv_problem(3, torch.float16, 4, 2, 64, 3, 16, 0)
    with pytest.raises(ValueError, match=names("slot_mapping")):
        av.write_kv(k, v, k_cache, v_cache, torch.tensor([0, 1, 2, 10**6]))
    assert torch.isnan(k_cache).all() and torch.isnan(v_cache).all()


def test_max_seq_len_bounds_the_blocks_read():
    """max_seq_len (a host bound of seq_lens) gives the same bits as the full table width; a request beyond
    it is rejected like a block table that is too short."""
    p = random_problem(35, torch.bfloat16, 128, 16, 2, 4, R=4, max_query_len=6, max_seq=900)
    want, want_lse = call(p)
    args = list(p.args())
    wide = torch.full((p.R, p.block_table.shape[1] + 300), FAR, dtype=torch.int32)  # a long-context table
    wide[:, :p.block_table.shape[1]] = p.block_table
    args[3] = wide
    longest = int(args[4].max())
    for bound in (longest, longest + 1, 10**6):
        got, lse = av.verify_attention(*args, return_lse=True, max_seq_len=bound)
        assert torch.equal(bits(got), bits(want)) and torch.equal(bits(lse), bits(want_lse)), bound
    with pytest.raises(ValueError, match="exceeds max_seq_len"):
        av.verify_attention(*args, max_seq_len=longest - 32)  # two blocks short (block_size 16)
    with pytest.raises(ValueError, match="max_seq_len must be >= 1"):
        av.verify_attention(*args, max_seq_len=0)
    with pytest.raises(TypeError, match="max_seq_len"):
        av.verify_attention(*args, max_seq_len=12.5)


# (field overrides of a good _C.verify_attention parameter struct, the name its error must start with)
CAN_IMPLEMENT = [
    (dict(dtype=0), "q: dtype"), (dict(head_dim=96), "q: head dim"), (dict(num_kv_heads=3), "q / k_cache"),
    (dict(num_q_heads=24, num_kv_heads=8), "q / k_cache: Hq / Hkv"), (dict(block_size=48), "k_cache: block_size"),
    (dict(max_query_len=65), "max_query_len"), (dict(max_query_len=0), "max_query_len"),
    (dict(kernel=3), "cuda_kernel"), (dict(max_blocks=2**27), "block_table: positions"),
    (dict(kv_dtype=1), "k_cache: dtype"), (dict(kv_dtype=4), "k_cache: dtype"),
    (dict(on_cuda=True, num_reqs=65536), "block_table: at most 65535"),
    (dict(on_cuda=True, num_reqs=65535, kernel=2), "block_table: at most 65534"),  # mma_fused: one more slice
]


@pytest.mark.parametrize("bad,name", CAN_IMPLEMENT, ids=[n for _, n in CAN_IMPLEMENT])
def test_kernels_can_implement_rejects_unsupported_problems(bad, name):
    """The C++ can_implement check behind _C.verify_attention: an unsupported problem is a ValueError naming
    the argument before anything is read (the pointers here are null) or launched."""
    import ctypes

    from adaptive_verify._binding import AttentionParams
    from adaptive_verify._ext import _C
    fields = dict(max_blocks=1, dtype=2, kv_dtype=2, num_q_heads=8, num_kv_heads=2, head_dim=128, block_size=16, num_blocks=1,
                  max_query_len=4, scale=1.0, kernel=1)
    fields.update(bad)  # (every other test here passes through the check with a good problem)
    on_cuda = fields.pop("on_cuda", False)
    p = AttentionParams(**fields)
    with pytest.raises(ValueError, match=f"verify_attention: {re.escape(name)}"):
        _C.verify_attention(ctypes.addressof(p), on_cuda, 0)
