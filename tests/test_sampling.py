"""rejection_sample and sample: the torch reference's arithmetic, hand-written exact cases, the C++ CPU kernel
against the reference bit for bit, determinism, batch invariance, adversarial inputs and argument checks.

The distribution tests (losslessness) are in test_sampling_stats.py; CUDA == CPU in test_sampling_cuda.py.
"""
import itertools
import math

import numpy as np
import pytest
import torch

import adaptive_verify as av
from adaptive_verify import reference as ref

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
NEG_INF = float("-inf")
NAN = float("nan")


def _qsl(q_len, start=0):
    qsl = torch.full((len(q_len) + 1,), start, dtype=torch.int32)
    qsl[1:] += torch.cumsum(torch.as_tensor(q_len, dtype=torch.int64), 0).to(torch.int32)
    return qsl


def _run_both(logits, qsl, drafts, **kw):
    """(op result, reference result); the op result must also be fully written (sentinel-filled out=)."""
    R, K = drafts.shape
    out = (torch.full((R, K + 1), -777, dtype=torch.int32), torch.full((R,), -777, dtype=torch.int32))
    got = av.rejection_sample(logits, qsl, drafts, out=out, **kw)
    assert got[0].data_ptr() == out[0].data_ptr() and got[1].data_ptr() == out[1].data_ptr()
    return got, ref.rejection_sample(logits, qsl, drafts, **kw)


def _assert_same(got, want, what=""):
    assert torch.equal(got[0], want[0]), f"{what}\noutput_tokens\n{got[0]}\nreference\n{want[0]}"
    assert torch.equal(got[1], want[1]), f"{what}\nnum_emitted {got[1].tolist()} reference {want[1].tolist()}"


def _check_layout(tokens, emitted, q_len, V):
    """-1 padding after num_emitted, ids in [0, V) before, num_emitted in [1, q_len] (0 for padding rows)."""
    for r, n in enumerate(emitted.tolist()):
        assert n == 0 if q_len[r] == 0 else 1 <= n <= q_len[r]
        assert (tokens[r, n:] == -1).all()
        assert ((tokens[r, :n] >= 0) & (tokens[r, :n] < V)).all()


# ------------------------------------------------------------------------------------------------------
# the reference's building blocks
# ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("counter,key,expected", [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])
def test_philox_known_answers(counter, key, expected):
    """Random123's kat_vectors for philox4x32_10."""
    assert tuple(ref.philox(*counter, *key).tolist()) == expected
    # vectorised: the same counter in a batch of others gives the same words
    c0 = torch.tensor([counter[0], 1, 2, counter[0]])
    assert tuple(ref.philox(c0, *counter[1:], *key)[3].tolist()) == expected


def test_uniforms_layout():
    idx = torch.arange(4096)
    u = ref.uniforms(-5, 2**40 + 3, 7, 1, idx)
    assert u.dtype == torch.float32 and bool(((u > 0) & (u < 1)).all())
    # index v is word v & 3 of block v >> 2 of the counter (v >> 2, j << 8 | stream, offset lo, offset hi)
    seed, offset = -5 & (2**64 - 1), 2**40 + 3
    words = ref.philox(5, 7 << 8 | 1, offset & 0xFFFFFFFF, offset >> 32, seed & 0xFFFFFFFF, seed >> 32)
    assert torch.equal(u[20:24], ref.to_uniform(words))
    # different (seed, offset, j, stream) give different streams
    others = [ref.uniforms(-4, offset, 7, 1, idx), ref.uniforms(-5, offset + 1, 7, 1, idx),
              ref.uniforms(-5, offset, 8, 1, idx), ref.uniforms(-5, offset, 7, 2, idx)]
    for o in others:
        assert (o == u).float().mean() < 0.01


def test_uniforms_stay_inside_the_open_interval():
    """Every 32-bit word must give a uniform strictly inside (0, 1): E = -log u must be > 0, or the race's
    Gumbel noise -log E stops being bounded (av_log(-0.0) = -88: noise +88, which beats any logit within 88
    of the row's max and also escapes the kernels' kRaceWindow skip)."""
    bits = torch.tensor([0, 0xFF, 0x100, 0x7FFFFFFF, 0x80000000, 0xFFFFFE00, 0xFFFFFEFF, 0xFFFFFF00, 0xFFFFFFFF])
    u = ref.to_uniform(bits)
    assert bool(((u > 0) & (u < 1)).all()), f"to_uniform({[hex(b) for b in bits.tolist()]}) = {u.tolist()}"
    assert bool((-ref.av_log(u) > 0).all())


def test_race_with_an_extreme_uniform_matches_reference():
    """Seed 2656475 draws race uniform word 0xffffffxx for id 2 at position 0 (found by search). With id 2's
    logit 30 below the others, its probability is e^-30 / 7: it must not be emitted, and the kernel (which
    skips ids more than kRaceWindow below the max) must agree with the reference (which skips nothing)."""
    seed = torch.tensor([2656475])
    assert (int(ref.philox(0, 1, 0, 0, 2656475, 0)[2]) >> 8) == 0xFFFFFF  # the premise
    logits = torch.zeros(1, 8)
    logits[0, 2] = -30.0
    none = torch.zeros(1, 0, dtype=torch.int32)
    got, want = _run_both(logits, _qsl([1]), none, temperature=torch.ones(1), seeds=seed)
    msg = f"kernel {got[0].tolist()} reference {want[0].tolist()}"
    assert want[0].tolist() != [[2]] and got[0].tolist() != [[2]], msg
    _assert_same(got, want)


def test_av_log_accuracy():
    g = torch.Generator().manual_seed(0)
    x = torch.cat([
        torch.rand(200000, generator=g).clamp(min=2.0**-25),  # uniforms' range (0, 1)
        torch.tensor([2.0**-25, 1 - 2.0**-24, 0.5, 1.0, 2.0**-126, math.sqrt(0.5), math.sqrt(2.0)]),
        torch.logspace(0, 6, 200000),  # 1 .. 1e6 (the exponential variates and beyond)
        torch.logspace(-37, 0, 20000),
    ]).float()
    got, want = ref.av_log(x).double(), torch.log(x.double())
    nz = want != 0
    assert ((got - want)[nz] / want[nz]).abs().max() < 2e-7
    assert float(ref.av_log(torch.tensor(1.0))) == 0.0
    assert float(ref.av_log(torch.tensor(1 - 2.0**-24))) < 0  # the largest float below 1


def test_av_exp_accuracy():
    g = torch.Generator().manual_seed(1)
    x = torch.cat([-torch.rand(300000, generator=g) * 103, -torch.logspace(-10, 0, 1000), torch.tensor([0.0, -0.0])])
    got, want = ref.av_exp(x).double(), torch.exp(x.double())
    normal = want >= 2.0**-126
    assert ((got - want)[normal] / want[normal]).abs().max() < 3e-7
    assert float(ref.av_exp(torch.tensor(0.0))) == 1.0
    # subnormal results stay within a subnormal ulp, and the cut-off and NaN give 0
    sub = ~normal & (want > 0)
    assert (got - want)[sub].abs().max() <= 2.0**-149
    edge = ref.av_exp(torch.tensor([-103.0, -1e30, NEG_INF, NAN]))
    assert torch.equal(edge, torch.zeros(4))


def test_canonical_sum_order():
    """Lane l adds l, l + 256, ... then a pairwise tree: checked on values where the order shows."""
    g = torch.Generator().manual_seed(2)
    for V in (1, 255, 256, 257, 5003):
        t = torch.rand(V, generator=g) * torch.exp(torch.randn(V, generator=g) * 8)
        t = t.float()
        terms = t.numpy()
        lanes = [np.float32(0)] * 256
        for v in range(V):
            lanes[v % 256] = lanes[v % 256] + terms[v]  # float32 arithmetic
        s = 128
        while s:
            for i in range(s):
                lanes[i] = lanes[i] + lanes[i + s]
            s //= 2
        assert lanes[0].dtype == np.float32
        assert float(ref.canonical_sum(t)) == float(lanes[0])
        assert float(ref.canonical_sum(t)) != float(t.double().sum()) or V == 1  # the order matters here


# ------------------------------------------------------------------------------------------------------
# exact hand-written cases
# ------------------------------------------------------------------------------------------------------


def _greedy_logits(argmaxes, V=6):
    """One row per entry: a unique maximum at that id."""
    rows = torch.arange(V, dtype=torch.float32).flip(0).repeat(len(argmaxes), 1) * 0.1  # row max at id 0
    for i, a in enumerate(argmaxes):
        rows[i, a] = 5.0
    return rows


def test_greedy_hand_written_cases():
    # request 0: 3 drafts all accepted + bonus; 1: first rejected; 2: middle rejected; 3: L = 0 (bonus only);
    # 4: padding row (q_len 0); 5: ties -> smallest id (row [1, 3, 3, 3, 0, 3]); 6: all K drafts accepted + bonus
    rows = [
        [2, 4, 1, 5],  # req 0: drafts 2 4 1, bonus 5
        [3, 0],  # req 1: draft 1 rejected (argmax 3)
        [1, 1, 0, 2],  # req 2: drafts 1 1 accepted, draft 5 rejected at row 2 (argmax 0)
        [4],  # req 3: bonus 4
        # req 4: no rows
    ]
    logits = _greedy_logits([a for r in rows for a in r])
    tie = torch.tensor([[1.0, 3.0, 3.0, 3.0, 0.0, 3.0]] * 2)  # req 5: draft 2 (a tie, not the smallest) rejected
    last = _greedy_logits([3, 3, 3, 2])  # req 6: drafts 3 3 3 accepted, bonus 2
    logits = torch.cat([logits, tie, last])
    drafts = torch.tensor([
        [2, 4, 1],
        [1, -1, -1],
        [1, 1, 5],
        [-1, -1, -1],
        [-1, -1, -1],
        [2, -1, -1],
        [3, 3, 3],
    ], dtype=torch.int32)
    qsl = _qsl([4, 2, 4, 1, 0, 2, 4])
    want_tokens = torch.tensor([
        [2, 4, 1, 5],
        [3, -1, -1, -1],
        [1, 1, 0, -1],
        [4, -1, -1, -1],
        [-1, -1, -1, -1],
        [1, -1, -1, -1],
        [3, 3, 3, 2],
    ], dtype=torch.int32)
    want_emitted = torch.tensor([4, 1, 3, 1, 0, 1, 4], dtype=torch.int32)
    for impl in (av.rejection_sample, ref.rejection_sample):
        for temperature in (None, torch.zeros(7)):
            tokens, emitted = impl(logits, qsl, drafts, temperature=temperature, seeds=torch.arange(7))
            assert torch.equal(tokens, want_tokens), f"{impl.__module__}\n{tokens}"
            assert torch.equal(emitted, want_emitted), f"{impl.__module__} {emitted.tolist()}"
    # the tie drafted at its smallest id is accepted
    tokens, emitted = av.rejection_sample(tie, _qsl([2]), torch.tensor([[1]]))
    assert tokens.tolist() == [[1, 1]] and emitted.tolist() == [2]


def test_sample_greedy_and_ties():
    logits = torch.tensor([[0.0, 2.0, 1.0], [5.0, 5.0, 5.0], [NAN, 1.0, 1.0], [NEG_INF] * 3, [NAN] * 3])
    want = [1, 0, 1, 0, 0]  # argmax, ties -> smallest, NaN ignored, no finite logit -> 0
    assert av.sample(logits).tolist() == want
    assert ref.sample(logits).tolist() == want
    assert av.sample(logits, torch.zeros(5), torch.arange(5), 9).tolist() == want


def test_one_hot_draft_probs_hand_written():
    """p(x) = 1 (one finite logit) and q = one-hot(x): u * 1 < 1 always accepts; a draft with p(x) = 0 is
    rejected and the residual max(p - q, 0) = p emits the only possible token."""
    V = 5
    row = lambda a: torch.tensor([[NEG_INF] * a + [0.0] + [NEG_INF] * (V - a - 1)])  # noqa: E731
    logits = torch.cat([row(3), row(1), row(4), row(2), row(0)])
    drafts = torch.tensor([[3, 1, 0], [2, 9, 9]], dtype=torch.int64)
    qsl = _qsl([4, 1])  # request 1: L = 0, bonus from row 4
    q = torch.nn.functional.one_hot(drafts.clamp(0, V - 1), V).float()
    for impl in (av.rejection_sample, ref.rejection_sample):
        tokens, emitted = impl(logits, qsl, drafts, draft_probs=q, temperature=torch.tensor([1.0, 0.5]),
                               seeds=torch.tensor([11, 12]))
        assert tokens.tolist() == [[3, 1, 4, -1], [0, -1, -1, -1]]
        assert emitted.tolist() == [3, 1]


# ------------------------------------------------------------------------------------------------------
# C++ CPU kernel == reference, bit for bit
# ------------------------------------------------------------------------------------------------------


def _random_batch(g, R, K, V, dtype, id_dtype, probs, start=0):
    """A varlen batch with mixed temperatures, padding rows, plausible drafts (so many are accepted),
    poison (NaN) in every row and probability that must not be read, and far-out ids in unused draft slots."""
    q_len = torch.randint(0, K + 2, (R,), generator=g)
    q_len[0], q_len[-1] = K + 1, 0  # a full request and a padding row in every batch
    qsl = _qsl(q_len, start)
    T = int(qsl[-1]) + 2
    scale = torch.tensor([0.3, 1.0, 3.0, 8.0])[torch.randint(0, 4, (T, 1), generator=g)]
    logits = torch.randn(T, V, generator=g) * scale
    logits[torch.rand(T, generator=g) < 0.2] *= 0  # all-equal rows: every id ties
    quant = torch.rand(T, generator=g) < 0.3
    logits[quant] = (logits[quant] * 2).round() / 2  # many ties
    logits = logits.to(dtype)
    logits[:start] = NAN
    logits[int(qsl[-1]):] = NAN
    temperature = torch.tensor([0.0, 0.0, 1e-6, 0.25, 0.7, 1.0, 1.9, 4.0, 1e6])[torch.randint(0, 9, (R,), generator=g)]
    seeds = torch.randint(-2**63, 2**63 - 1, (R,), generator=g, dtype=torch.int64)
    q = None
    if probs == "full":
        q = torch.softmax(torch.randn(R, K, V, generator=g) * 2, -1)
    drafts = torch.empty(R, K, dtype=torch.int64)
    for r in range(R):
        T_r = float(temperature[r])
        for j in range(K):
            row = logits[int(qsl[r]) + j].float() if j < int(q_len[r]) else torch.zeros(V)
            if probs == "full":
                if T_r > 0 and bool(torch.isfinite(row).all()):  # a drafter close to the target
                    q[r, j] = 0.7 * torch.softmax(row / T_r, 0) + 0.3 * q[r, j]
                drafts[r, j] = torch.multinomial(q[r, j] + 1e-12, 1, generator=g)
            elif torch.rand(1, generator=g) < 0.25:
                drafts[r, j] = torch.randint(0, V, (1,), generator=g)
            elif T_r == 0 or not bool(torch.isfinite(row).all()):
                drafts[r, j] = row.nan_to_num(nan=NEG_INF).argmax()
            else:
                drafts[r, j] = torch.multinomial(torch.softmax(row / T_r, 0), 1, generator=g)
    if probs == "one-hot":
        q = torch.nn.functional.one_hot(drafts, V).float()
    if probs == "full":
        q[torch.rand(R, K, V, generator=g) < 0.2] = 0  # zeros, also at drafted ids now and then
    unused = torch.arange(K)[None, :] >= (q_len[:, None] - 1)
    drafts[unused] = 2**40 if id_dtype == torch.int64 else -(2**31)
    if q is not None:
        q[unused] = NAN
    return logits, qsl, drafts.to(id_dtype), q, temperature, seeds, q_len


@pytest.mark.parametrize("V", [1, 2, 7, 33, 1000, 5003])
@pytest.mark.parametrize("probs", [None, "one-hot", "full"])
def test_kernel_matches_reference(V, probs):
    g = torch.Generator().manual_seed(V * 10 + len(probs or ""))
    R = 10 if V > 1000 else 16
    accepted = 0
    for i, (dtype, id_dtype) in enumerate(itertools.product(DTYPES, (torch.int32, torch.int64))):
        K = [1, 3, 8, 5, 2, 7][i]
        logits, qsl, drafts, q, temperature, seeds, q_len = _random_batch(g, R, K, V, dtype, id_dtype, probs,
                                                                           start=i % 2 * 3)
        offset = [0, 5, 2**32 + 1, torch.tensor(77), torch.tensor(2**40 + 9), 2**64 - 1][i]
        got, want = _run_both(logits, qsl, drafts, draft_probs=q, temperature=temperature, seeds=seeds,
                              offset=offset)
        _assert_same(got, want, f"V={V} K={K} {dtype} {id_dtype} probs={probs} offset={offset}")
        _check_layout(*got, q_len.tolist(), V)
        accepted += int((got[1] - 1).clamp(min=0).sum())
    assert accepted >= 10, "the batches must exercise acceptance"


def test_kernel_matches_reference_default_arguments():
    g = torch.Generator().manual_seed(3)
    logits, qsl, drafts, _, _, _, _ = _random_batch(g, 9, 4, 50, torch.float32, torch.int32, None)
    _assert_same(*_run_both(logits, qsl, drafts))  # all greedy
    temperature = torch.full((9,), 0.8)
    # seeds None: fresh seeds from torch's default generator (unseeded requests); offset 0 == tensor(0)
    torch.manual_seed(77)
    a = av.rejection_sample(logits, qsl, drafts, temperature=temperature)
    torch.manual_seed(77)
    fresh = torch.randint(-2**63, 2**63 - 1, (9,), dtype=torch.int64)
    b = av.rejection_sample(logits, qsl, drafts, temperature=temperature, seeds=fresh, offset=torch.tensor(0))
    _assert_same(a, b)
    torch.manual_seed(77)
    _assert_same(a, ref.rejection_sample(logits, qsl, drafts, temperature=temperature))


def test_kernel_matches_reference_strided_inputs():
    """Rows of a wider buffer, draft ids and probabilities with padded strides."""
    g = torch.Generator().manual_seed(4)
    R, K, V = 8, 4, 300
    logits, qsl, drafts, q, temperature, seeds, _ = _random_batch(g, R, K, V, torch.bfloat16, torch.int64, "full")
    wide = torch.full((logits.shape[0], V + 37), NAN, dtype=logits.dtype)
    wide[:, 5:5 + V] = logits
    d_wide = torch.full((R, K + 3), 2**40, dtype=torch.int64)
    d_wide[:, :K] = drafts
    q_wide = torch.full((R, K + 1, V + 3), NAN)
    q_wide[:, :K, :V] = q
    kw = dict(draft_probs=q_wide[:, :K, :V], temperature=temperature, seeds=seeds, offset=3)
    got, want = _run_both(wide[:, 5:5 + V], qsl, d_wide[:, :K], **kw)
    _assert_same(got, want)
    _assert_same(got, av.rejection_sample(logits, qsl, drafts, **{**kw, "draft_probs": q}))


@pytest.mark.parametrize("V", [1, 2, 33, 5003])
@pytest.mark.parametrize("dtype", DTYPES)
def test_sample_matches_reference(V, dtype):
    g = torch.Generator().manual_seed(V)
    N = 12
    logits = (torch.randn(N, V, generator=g) * 3).to(dtype)
    logits[3] = (logits[3].float() * 2).round().to(dtype) / 2
    temperature = torch.tensor([0.0, 0.5, 1.0, 2.0, 1e-6, 1e6] * 2)
    seeds = torch.randint(-2**63, 2**63 - 1, (N,), generator=g, dtype=torch.int64)
    for offset in (0, 2**33 + 5, torch.tensor(12)):
        out = torch.full((N,), -777, dtype=torch.int32)
        got = av.sample(logits, temperature, seeds, offset, out=out)
        assert got.data_ptr() == out.data_ptr()
        want = ref.sample(logits, temperature, seeds, offset)
        assert torch.equal(got, want), f"{got.tolist()} != {want.tolist()}"
    assert torch.equal(av.sample(logits), ref.sample(logits))


def test_sample_uses_its_own_stream():
    """sample() (stream 2) and the bonus race of rejection_sample (stream 1, position 0) differ."""
    logits = torch.zeros(64, 1000)
    seeds = torch.arange(64)
    s = av.sample(logits, torch.ones(64), seeds, 0)
    b, _ = av.rejection_sample(logits, _qsl([1] * 64), torch.zeros(64, 0, dtype=torch.int32),
                               temperature=torch.ones(64), seeds=seeds)
    assert (s != b[:, 0]).float().mean() > 0.9


# ------------------------------------------------------------------------------------------------------
# decision boundaries: inputs built from the reference's own arithmetic so that every decision sits on an
# exact tie or one float32 ulp from it. Random inputs almost never resolve a decision by the last bit, so
# they cannot tell a faithful av_exp / av_log / canonical sum from a slightly different one; these can.
# Also run on CUDA (the same reference decides), where they catch fused multiply-adds and libm calls.
# ------------------------------------------------------------------------------------------------------

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
BOUNDARY_OFFSET = 2**32 + 17


def _step(x: torch.Tensor, ulps: int) -> torch.Tensor:
    """x moved by `ulps` float32 steps."""
    toward = torch.tensor(float("inf") if ulps > 0 else NEG_INF)
    for _ in range(abs(ulps)):
        x = torch.nextafter(x, toward)
    return x


def _solve(f, target, guess, reach=24):
    """A float32 c near `guess` with f(c) == target exactly, or None."""
    for k in sorted(range(-reach, reach + 1), key=abs):
        c = _step(guess, k)
        if bool(f(c) == target):
            return c
    return None


def _race_noise(seed, stream, V):
    """av_log(E_v), E_v = -av_log(u_v): the race score is z_v - av_log(E_v)."""
    u = ref.uniforms(seed, BOUNDARY_OFFSET, 0, stream, torch.arange(V))
    return ref.av_log(-ref.av_log(u))


def _race_boundary_rows(n, V, stream, g):
    """Rows where ids a < b race to a tie (delta 0: a wins), or b is one ulp behind (a) or ahead (b).
    Returns (logits [n, V] float32 at temperature 1, seeds [n], expected winners [n])."""
    rows, seeds, winners = [], [], []
    seed = 0
    while len(rows) < n:
        seed += 1
        noise = _race_noise(seed, stream, V)
        a, b = sorted(torch.randperm(V, generator=g)[:2].tolist())
        z_a = torch.rand((), generator=g)
        delta = len(rows) % 3 - 1
        target = _step(ref._fsub(z_a, noise[a]), delta)
        z_b = _solve(lambda c: ref._fsub(c, noise[b]), target, ref._fadd(target, noise[b]))
        if z_b is None:
            continue
        row = torch.full((V,), NEG_INF)
        row[a], row[b] = z_a, z_b
        rows.append(row)
        seeds.append(seed)
        winners.append(b if delta > 0 else a)
    return torch.stack(rows), torch.tensor(seeds), torch.tensor(winners, dtype=torch.int32)


def _to(device, *ts):
    return [None if t is None else t.to(device) for t in ts]


@pytest.mark.parametrize("device", DEVICES)
def test_race_ties_resolved_like_the_reference(device):
    n, V = 90, 64
    g = torch.Generator().manual_seed(20)
    # rejection_sample: the bonus race (stream 1, position 0) of q_len = 1 requests
    logits, seeds, winners = _race_boundary_rows(n, V, 1, g)
    kw = dict(temperature=torch.ones(n), seeds=seeds, offset=BOUNDARY_OFFSET)
    none = torch.zeros(n, 0, dtype=torch.int32)
    want = ref.rejection_sample(logits, _qsl([1] * n), none, **kw)
    assert torch.equal(want[0][:, 0], winners)  # the construction is right
    args = _to(device, logits, _qsl([1] * n), none)
    got = av.rejection_sample(*args, **{k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()})
    assert torch.equal(got[0].cpu(), want[0]), f"winners {got[0][:, 0].tolist()}\nexpected {winners.tolist()}"
    # sample(): stream 2
    logits, seeds, winners = _race_boundary_rows(n, V, 2, g)
    assert torch.equal(ref.sample(logits, torch.ones(n), seeds, BOUNDARY_OFFSET), winners)
    got = av.sample(*_to(device, logits, torch.ones(n), seeds), BOUNDARY_OFFSET)
    assert torch.equal(got.cpu(), winners), f"winners {got.tolist()}\nexpected {winners.tolist()}"


def _target_probs(row, T):
    """The reference's p = av_exp(z - m) / S for one row, z = row / T."""
    z = ref._fdiv(row, T)
    e = ref.av_exp(ref._fsub(z, z.max()))
    return ref._fdiv(e, ref.canonical_sum(e))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("V", [50, 3000])
def test_acceptance_on_the_boundary_like_the_reference(device, V):
    """q(x) chosen so that u * q(x) == p(x) (reject: the test is strict) or is one ulp below p(x) (accept):
    a p(x) one ulp off (another exp, another summation order) flips the decision."""
    n = 60
    g = torch.Generator().manual_seed(21 + V)
    T = torch.tensor(0.8)
    rows, qs, drafts, seeds, accept = [], [], [], [], []
    seed = 0
    while len(qs) < n:
        seed += 1
        row = torch.randn(V, generator=g) * 2
        p = _target_probs(row, T)
        u = ref.uniforms(seed, BOUNDARY_OFFSET, 0, 0, torch.tensor(0))
        ok = ((p < u * 0.9) & (p > 1e-4)).nonzero().reshape(-1)  # q(x) = p(x) / u stays a probability
        if ok.numel() == 0:
            continue
        x = int(ok[torch.randint(0, ok.numel(), (1,), generator=g)])
        want_accept = len(qs) % 2 == 1
        target = _step(p[x], -1) if want_accept else p[x]
        qx = _solve(lambda c: ref._fmul(u, c), target, ref._fdiv(target, u))
        if qx is None:
            continue
        q = torch.softmax(torch.randn(V, generator=g), 0)
        q[x] = qx
        rows += [row, torch.randn(V, generator=g)]  # draft row, bonus row
        qs.append(q)
        drafts.append(x)
        seeds.append(seed)
        accept.append(want_accept)
    logits, q = torch.stack(rows), torch.stack(qs)[:, None]
    drafts = torch.tensor(drafts, dtype=torch.int32)[:, None]
    kw = dict(draft_probs=q, temperature=T.repeat(n), seeds=torch.tensor(seeds), offset=BOUNDARY_OFFSET)
    want = ref.rejection_sample(logits, _qsl([2] * n), drafts, **kw)
    assert want[1].tolist() == [2 if a else 1 for a in accept]  # the construction is right
    got = av.rejection_sample(*_to(device, logits, _qsl([2] * n), drafts),
                              **{k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()})
    assert got[1].cpu().tolist() == want[1].tolist()
    assert torch.equal(got[0].cpu(), want[0])


@pytest.mark.parametrize("device", DEVICES)
def test_residual_ties_resolved_like_the_reference(device):
    """Draft a with q(a) = 0 (rejected); the residual race argmax max(p - q, 0) / E is made a tie (a wins),
    or b one ulp behind or ahead, by solving for q(b); every other id has q = p, so weight 0."""
    n, V = 90, 40
    g = torch.Generator().manual_seed(22)
    T = torch.tensor(1.3)
    rows, qs, drafts, seeds, winners = [], [], [], [], []
    seed = 0
    while len(qs) < n:
        seed += 1
        row = torch.randn(V, generator=g)
        p = _target_probs(row, T)
        E = -ref.av_log(ref.uniforms(seed, BOUNDARY_OFFSET, 0, 1, torch.arange(V)))
        a, b = sorted(torch.randperm(V, generator=g)[:2].tolist())
        key_a = ref._fdiv(p[a], E[a])  # q(a) = 0: w_a = p_a
        delta = len(qs) % 3 - 1
        target = _step(key_a, delta)
        w_b = ref._fmul(target, E[b])
        if not bool(w_b < p[b]):  # q(b) = p(b) - w(b) must be >= 0
            continue
        q_b = _solve(lambda c: ref._fdiv(ref._fsub(p[b], c), E[b]), target, ref._fsub(p[b], w_b))
        if q_b is None or not bool(q_b >= 0):
            continue
        q = p.clone()
        q[a], q[b] = 0.0, q_b
        rows += [row, torch.randn(V, generator=g)]
        qs.append(q)
        drafts.append(a)
        seeds.append(seed)
        winners.append(b if delta > 0 else a)
    logits, q = torch.stack(rows), torch.stack(qs)[:, None]
    drafts = torch.tensor(drafts, dtype=torch.int64)[:, None]
    kw = dict(draft_probs=q, temperature=T.repeat(n), seeds=torch.tensor(seeds), offset=BOUNDARY_OFFSET)
    want = ref.rejection_sample(logits, _qsl([2] * n), drafts, **kw)
    assert want[1].tolist() == [1] * n and want[0][:, 0].tolist() == winners  # the construction is right
    got = av.rejection_sample(*_to(device, logits, _qsl([2] * n), drafts),
                              **{k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()})
    assert torch.equal(got[0].cpu(), want[0]), f"winners {got[0][:, 0].tolist()}\nexpected {winners}"


# ------------------------------------------------------------------------------------------------------
# determinism, seeds, offsets and batch invariance
# ------------------------------------------------------------------------------------------------------


def _sampling_batch(seed=5, R=24, K=5, V=64, probs=None):
    g = torch.Generator().manual_seed(seed)
    logits, qsl, drafts, q, temperature, seeds, q_len = _random_batch(g, R, K, V, torch.float32, torch.int32, probs)
    temperature = torch.rand(R, generator=g) + 0.5  # all sampling: results depend on the generator
    return logits, qsl, drafts, q, temperature, seeds, q_len


@pytest.mark.parametrize("probs", [None, "full"])
def test_deterministic_when_seeded_and_sensitive_to_seed_and_offset(probs):
    logits, qsl, drafts, q, temperature, seeds, _ = _sampling_batch(probs=probs)
    kw = dict(draft_probs=q, temperature=temperature)
    base = av.rejection_sample(logits, qsl, drafts, seeds=seeds, offset=10, **kw)
    for _ in range(2):
        _assert_same(av.rejection_sample(logits, qsl, drafts, seeds=seeds.clone(), offset=10, **kw), base)
    _assert_same(av.rejection_sample(logits, qsl, drafts, seeds=seeds, offset=torch.tensor(10), **kw), base)

    def n_changed(res):
        return int((res[0] != base[0]).any(1).sum())

    assert n_changed(av.rejection_sample(logits, qsl, drafts, seeds=seeds, offset=11, **kw)) >= 8
    assert n_changed(av.rejection_sample(logits, qsl, drafts, seeds=seeds, offset=10 + 2**32, **kw)) >= 8
    assert n_changed(av.rejection_sample(logits, qsl, drafts, seeds=seeds + 1, offset=10, **kw)) >= 8
    assert n_changed(av.rejection_sample(logits, qsl, drafts, seeds=seeds ^ (1 << 40), offset=10, **kw)) >= 8


def test_sample_deterministic_and_sensitive():
    logits = torch.randn(200, 50, generator=torch.Generator().manual_seed(6))
    T, seeds = torch.ones(200), torch.arange(200) * 1000003
    a = av.sample(logits, T, seeds, 4)
    assert torch.equal(a, av.sample(logits, T, seeds, torch.tensor(4)))
    assert (a != av.sample(logits, T, seeds, 5)).float().mean() > 0.5
    assert (a != av.sample(logits, T, seeds + 1, 4)).float().mean() > 0.5
    # a row's token depends on its own seed only
    perm = torch.randperm(200, generator=torch.Generator().manual_seed(7))
    assert torch.equal(av.sample(logits[perm], T, seeds[perm], 4), a[perm])


def _sub_batch(logits, qsl, drafts, q, temperature, seeds, order):
    """The requests `order` (any subset / permutation) as a batch of their own, rows re-packed."""
    rows = [torch.arange(int(qsl[r]), int(qsl[r + 1])) for r in order]
    idx = torch.cat(rows) if rows else torch.zeros(0, dtype=torch.int64)
    new_logits = torch.cat([torch.full((1, logits.shape[1]), NAN), logits[idx]])  # rows start at 1
    new_qsl = _qsl([len(x) for x in rows], start=1)
    order = torch.tensor(order, dtype=torch.int64)
    return (new_logits, new_qsl, drafts[order]), dict(draft_probs=None if q is None else q[order],
                                                      temperature=temperature[order], seeds=seeds[order])


@pytest.mark.parametrize("probs", [None, "full"])
def test_batch_invariance(probs):
    logits, qsl, drafts, q, temperature, seeds, _ = _sampling_batch(seed=8, probs=probs)
    R = drafts.shape[0]
    temperature[::4] = 0  # greedy requests mixed in
    full = av.rejection_sample(logits, qsl, drafts, draft_probs=q, temperature=temperature, seeds=seeds, offset=3)
    g = torch.Generator().manual_seed(9)
    orders = [list(range(R))[::-1], torch.randperm(R, generator=g).tolist(), [5], [0, 7, 3],
              torch.randperm(R, generator=g)[: R // 2].tolist()]
    for order in orders:
        args, kw = _sub_batch(logits, qsl, drafts, q, temperature, seeds, order)
        tokens, emitted = av.rejection_sample(*args, **kw, offset=3)
        assert torch.equal(tokens, full[0][order]), f"order {order}"
        assert torch.equal(emitted, full[1][order]), f"order {order}"
    # with other requests added (same seeds for the originals)
    extra = [0, 1] * 3 + list(range(R))
    args, kw = _sub_batch(logits, qsl, drafts, q, temperature, seeds, extra)
    kw["seeds"][:6] = torch.arange(6) + 12345
    tokens, _ = av.rejection_sample(*args, **kw, offset=3)
    assert torch.equal(tokens[6:], full[0])


# ------------------------------------------------------------------------------------------------------
# adversarial inputs
# ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("probs", [None, "full"])
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
def test_out_of_range_draft_ids_are_rejected_never_indexed(probs, id_dtype):
    """Ids -1, V, V + 1, -2^31 (and as int64 2^32 + 1, 2^32 - 1, -2^63, which an int32 cast would turn into
    1, -1 and 0) are rejected. Poison: the rows around each draft row are all 50, and q is tiny around each
    judged q entry, so reading logits[x] or q[x] through a neighbour would accept the draft."""
    V = 16
    bad = [-1, V, V + 1, -(2**31)] + ([2**32 + 1, 2**32 - 1, -(2**63)] if id_dtype == torch.int64 else [])
    R = len(bad) * 4
    temperature = torch.tensor([0.0, 1.0, 0.5, 3.0] * len(bad))
    drafts = torch.tensor([[b] for b in bad for _ in range(4)], dtype=id_dtype)
    g = torch.Generator().manual_seed(13)
    guard = torch.full((1, V), 50.0)
    rows = [guard]
    for _ in range(R):  # request r: [draft row, guard row (its bonus row, never reached)]
        row = torch.randn(1, V, generator=g)
        row[0, 1], row[0, 0] = 10.0, 9.5  # ids 1 and 0 (what 2^32 + 1 and -2^63 truncate to) likely
        rows += [row, guard]
    logits = torch.cat(rows)
    qsl = _qsl([2] * R, start=1)
    q = None
    if probs:
        q = torch.full((R, 1, V), 1.0 / V)
        q[:, 0, 0] = q[:, 0, V - 1] = 1e-30  # q[r, 0, V] is q[r + 1, 0, 0], q[r, 0, -1] is q[r - 1, 0, V - 1]
    av.reset_error_counts("cpu")
    seeds = torch.arange(R) * 77
    got, want = _run_both(logits, qsl, drafts, draft_probs=q, temperature=temperature, seeds=seeds)
    counts = av.error_counts("cpu")
    _assert_same(got, want)
    tokens, emitted = got
    assert emitted.tolist() == [1] * R
    assert bool(((tokens[:, 0] >= 0) & (tokens[:, 0] < V)).all())
    assert counts["draft_id_out_of_range"] == R


def test_zero_draft_probability_rejects():
    """q(x) = 0 rejects even where u * q(x) = 0 < p(x) = 0.9; the residual then emits x itself (w = p - q is
    largest at x), so only num_emitted shows the rejection."""
    V, R = 8, 400
    row = torch.full((V,), -10.0)
    row[3] = 0.0  # p(3) ~ 0.9997
    logits = row.repeat(2 * R, 1)
    drafts = torch.full((R, 1), 3, dtype=torch.int32)
    q = torch.full((R, 1, V), 1.0 / (V - 1))
    q[:, 0, 3] = 0.0
    temperature = torch.ones(R)
    seeds = torch.arange(R)
    got, want = _run_both(logits, _qsl([2] * R), drafts, draft_probs=q, temperature=temperature, seeds=seeds)
    _assert_same(got, want)
    assert got[1].tolist() == [1] * R
    # control: with q(3) > 0 the same draft is accepted almost always
    q[:, 0, 3] = 1.0 / (V - 1)
    _, emitted = av.rejection_sample(logits, _qsl([2] * R), drafts, draft_probs=q, temperature=temperature,
                                     seeds=seeds)
    assert (emitted == 2).float().mean() > 0.99


@pytest.mark.parametrize("probs", [None, "one-hot", "full"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_single_finite_logit_is_always_emitted(probs, dtype):
    """Rows of -inf except one entry: greedy, races and residuals alike must emit that entry."""
    V, R, K = 37, 60, 3
    g = torch.Generator().manual_seed(10)
    q_len = torch.randint(1, K + 2, (R,), generator=g)
    where = torch.randint(0, V, (R, K + 1), generator=g)
    rows = []
    for r in range(R):
        for j in range(int(q_len[r])):
            row = torch.full((V,), NEG_INF)
            row[where[r, j]] = float(torch.randn(1, generator=g)) * 100
            rows.append(row)
    logits = torch.stack(rows).to(dtype)
    # drafts: the finite entry (accepted) or another id (rejected), mixed
    wrong = (where[:, :K] + 1 + torch.randint(0, V - 1, (R, K), generator=g)) % V
    drafts = torch.where(torch.rand(R, K, generator=g) < 0.7, where[:, :K], wrong).to(torch.int32)
    q = None
    if probs == "one-hot":
        q = torch.nn.functional.one_hot(drafts.long(), V).float()
    elif probs == "full":
        q = torch.softmax(torch.randn(R, K, V, generator=g), -1)
    temperature = torch.tensor([0.0, 1e-6, 0.5, 1.0, 7.0, 1e6]).repeat(R // 6)
    got, want = _run_both(logits, _qsl(q_len), drafts, draft_probs=q, temperature=temperature,
                          seeds=torch.arange(R))
    _assert_same(got, want)
    tokens, emitted = got
    for r in range(R):
        n = int(emitted[r])
        assert tokens[r, :n].tolist() == where[r, :n].tolist(), f"request {r} temperature {temperature[r]}"
        assert drafts[r, : n - 1].tolist() == where[r, : n - 1].tolist()  # accepted drafts were right
        if n < int(q_len[r]):  # stopped early: at a wrong draft
            assert int(drafts[r, n - 1]) != int(where[r, n - 1])
    assert int((emitted > 1).sum()) > 10 and int((emitted < q_len.int()).sum()) > 10


def _nan_batch(probs):
    V, R = 16, 300
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(2 * R, V, generator=g)
    nan = torch.rand(2 * R, V, generator=g) < 0.4
    nan[:, 0] = True  # the smallest id, which wins ties and failed reductions
    nan[:, 1] = False
    logits[nan] = NAN
    drafts = torch.randint(0, V, (R, 1), generator=g, dtype=torch.int32)
    q = torch.softmax(torch.randn(R, 1, V, generator=g), -1) if probs else None
    temperature = torch.tensor([0.0, 0.3, 1.0, 5.0, 1e6]).repeat(R // 5)
    return logits, nan, drafts, q, temperature


@pytest.mark.parametrize("probs", [None, "full"])
def test_nan_logits_never_win(probs):
    logits, nan, drafts, q, temperature = _nan_batch(probs)
    R = drafts.shape[0]
    got, want = _run_both(logits, _qsl([2] * R), drafts, draft_probs=q, temperature=temperature,
                          seeds=torch.arange(R))
    _assert_same(got, want)
    tokens, emitted = got
    for r in range(R):
        for j in range(int(emitted[r])):
            t = int(tokens[r, j])
            assert not nan[2 * r + j, t], f"request {r}: NaN logit {t} emitted"
    s = av.sample(logits, torch.ones(2 * R), torch.arange(2 * R))
    assert not bool(nan[torch.arange(2 * R), s.long()].any())


def test_nan_logits_are_counted():
    """math.h: "NaN logits never win and are counted" (error_counts()['nan_logits'])."""
    logits, _, drafts, q, temperature = _nan_batch("full")
    R = drafts.shape[0]
    av.reset_error_counts("cpu")
    av.rejection_sample(logits, _qsl([2] * R), drafts, draft_probs=q, temperature=temperature, seeds=torch.arange(R))
    assert av.error_counts("cpu")["nan_logits"] > 0
    av.reset_error_counts("cpu")
    av.sample(logits, torch.ones(2 * R), torch.arange(2 * R))
    assert av.error_counts("cpu")["nan_logits"] > 0


def test_tiny_temperature_is_greedy():
    g = torch.Generator().manual_seed(12)
    R, K, V = 40, 4, 200
    logits = torch.randn(R * (K + 1), V, generator=g) * 2
    greedy_ids = logits.argmax(1).reshape(R, K + 1)
    random_ids = torch.randint(0, V, (R, K), generator=g)
    drafts = torch.where(torch.rand(R, K, generator=g) < 0.7, greedy_ids[:, :K], random_ids)
    drafts = drafts.to(torch.int32)
    qsl = _qsl([K + 1] * R)
    greedy = av.rejection_sample(logits, qsl, drafts)
    tiny = torch.full((R,), 1e-6)
    for q in (None, torch.softmax(torch.randn(R, K, V, generator=g), -1)):
        got = av.rejection_sample(logits, qsl, drafts, draft_probs=q, temperature=tiny, seeds=torch.arange(R))
        _assert_same(got, greedy)
    assert torch.equal(av.sample(logits, torch.full((R * (K + 1),), 1e-6), torch.arange(R * (K + 1))),
                       greedy_ids.reshape(-1).int())


def test_huge_temperature_is_near_uniform():
    from scipy import stats

    V, N = 16, 32000
    logits = torch.linspace(-8, 8, V).repeat(N, 1)  # p(15) / p(0) = e^16 at T = 1
    tokens = av.sample(logits, torch.full((N,), 1e6), torch.arange(N))
    counts = torch.bincount(tokens.long(), minlength=V).double()
    assert stats.chisquare(counts.numpy()).pvalue > 1e-3  # uniform
    # the bonus race too
    b, _ = av.rejection_sample(logits, _qsl([1] * N), torch.zeros(N, 0, dtype=torch.int32),
                               temperature=torch.full((N,), 1e6), seeds=torch.arange(N))
    assert stats.chisquare(torch.bincount(b[:, 0].long(), minlength=V).numpy()).pvalue > 1e-3


@pytest.mark.parametrize("probs", [None, "full"])
def test_vocabulary_of_one(probs):
    R = 12
    logits = torch.randn(3 * R, 1)
    drafts = torch.tensor([[0, 0], [1, 0], [0, -1]] * (R // 3), dtype=torch.int64)
    q = torch.ones(R, 2, 1) if probs else None
    temperature = torch.tensor([0.0, 1.0, 0.3, 2.0] * (R // 4))
    got, want = _run_both(logits, _qsl([3] * R), drafts, draft_probs=q, temperature=temperature,
                          seeds=torch.arange(R))
    _assert_same(got, want)
    assert got[0].tolist() == [[0, 0, 0], [0, -1, -1], [0, 0, -1]] * (R // 3)
    assert got[1].tolist() == [3, 1, 2] * (R // 3)
    assert av.sample(logits, torch.ones(3 * R), torch.arange(3 * R)).tolist() == [0] * (3 * R)


def test_empty_batch_and_no_drafts():
    tokens, emitted = av.rejection_sample(torch.randn(0, 5), torch.zeros(1, dtype=torch.int32),
                                          torch.zeros(0, 3, dtype=torch.int32))
    assert tokens.shape == (0, 4) and emitted.shape == (0,)
    logits = torch.randn(3, 9)
    tokens, emitted = av.rejection_sample(logits, _qsl([1, 0, 1, 1]), torch.zeros(4, 0, dtype=torch.int32))
    assert tokens.tolist() == [[int(logits[0].argmax())], [-1], [int(logits[1].argmax())], [int(logits[2].argmax())]]
    assert emitted.tolist() == [1, 0, 1, 1]


# ------------------------------------------------------------------------------------------------------
# bad inputs: errors name the argument
# ------------------------------------------------------------------------------------------------------


def _good():
    R, K, V = 3, 2, 10
    return dict(
        target_logits=torch.randn(7, V), query_start_loc=_qsl([3, 1, 2]),
        draft_tokens=torch.zeros(R, K, dtype=torch.int32),
        draft_probs=torch.full((R, K, V), 0.1), temperature=torch.ones(R), seeds=torch.arange(R), offset=0)


def _call(**changes):
    kw = _good()
    kw.update(changes)
    return av.rejection_sample(kw.pop("target_logits"), kw.pop("query_start_loc"), kw.pop("draft_tokens"), **kw)


META = "meta"


@pytest.mark.parametrize("name,value,exc", [
    ("target_logits", torch.randn(7, 10, dtype=torch.float64), TypeError),
    ("target_logits", torch.randn(7, 10).int(), TypeError),
    ("target_logits", torch.randn(70), ValueError),
    ("target_logits", torch.randn(7, 10, device=META), ValueError),
    ("target_logits", torch.randn(7, 20)[:, ::2], ValueError),  # non-contiguous vocabulary
    ("target_logits", torch.randn(7, 0), ValueError),
    ("query_start_loc", _qsl([3, 1, 2]).long(), TypeError),
    ("query_start_loc", _qsl([3, 1]), ValueError),  # R + 1 = 3 entries for R = 3
    ("query_start_loc", _qsl([3, 1, 2, 0]), ValueError),
    ("query_start_loc", _qsl([3, 1, 2]).to(META), ValueError),
    ("query_start_loc", _qsl([3, 1, 4]), ValueError),  # rows past T = 7
    ("query_start_loc", torch.tensor([0, 3, 2, 6], dtype=torch.int32), ValueError),  # decreasing
    ("query_start_loc", _qsl([4, 1, 2]), ValueError),  # q_len 4 > K + 1 = 3
    ("draft_tokens", torch.zeros(3, 2), TypeError),
    ("draft_tokens", torch.zeros(3, 2, dtype=torch.int16), TypeError),
    ("draft_tokens", torch.zeros(6, dtype=torch.int32), ValueError),
    ("draft_tokens", torch.zeros(3, 2, dtype=torch.int32, device=META), ValueError),
    ("draft_probs", torch.full((3, 2, 11), 0.1), ValueError),
    ("draft_probs", torch.full((3, 3, 10), 0.1), ValueError),
    ("draft_probs", torch.full((2, 2, 10), 0.1), ValueError),
    ("draft_probs", torch.full((3, 2, 10), 0.1, dtype=torch.float64), TypeError),
    ("draft_probs", torch.full((3, 2, 10), 0.1, dtype=torch.bfloat16), TypeError),
    ("draft_probs", torch.full((3, 2, 10), 0.1, device=META), ValueError),
    ("temperature", torch.tensor([1.0, -0.5, 1.0]), ValueError),
    ("temperature", torch.tensor([1.0, NAN, 1.0]), ValueError),
    ("temperature", torch.ones(4), ValueError),
    ("temperature", torch.ones(3, dtype=torch.float64), TypeError),
    ("temperature", torch.ones(3, device=META), ValueError),
    ("seeds", torch.arange(3, dtype=torch.int32), TypeError),
    ("seeds", torch.arange(3).float(), TypeError),
    ("seeds", torch.arange(4), ValueError),
    ("seeds", torch.arange(3, device=META), ValueError),
    ("offset", -1, ValueError),
    ("offset", 2**64, ValueError),
    ("offset", 1.5, TypeError),
    ("offset", torch.tensor(1, dtype=torch.int32), TypeError),
    ("offset", torch.tensor([1]), ValueError),
    ("offset", torch.tensor(1, device=META), ValueError),
])
def test_rejection_sample_bad_inputs_name_the_argument(name, value, exc):
    with pytest.raises(exc, match=name):
        _call(**{name: value})
    _call()  # the good arguments pass


def test_rejection_sample_bad_out():
    R, K = 3, 2
    good = (torch.empty(R, K + 1, dtype=torch.int32), torch.empty(R, dtype=torch.int32))
    _call(out=good)
    for bad in [(torch.empty(R, K, dtype=torch.int32), good[1]), (good[0].long(), good[1]),
                (good[0], torch.empty(R + 1, dtype=torch.int32)), (good[0], good[1].float())]:
        with pytest.raises((TypeError, ValueError), match="out"):
            _call(out=bad)
    with pytest.raises(TypeError, match="out"):
        _call(out=good[0])


@pytest.mark.parametrize("name,value,exc", [
    ("logits", torch.randn(4, 5, dtype=torch.float64), TypeError),
    ("logits", torch.randn(20), ValueError),
    ("logits", torch.randn(4, 5, device=META), ValueError),
    ("temperature", torch.tensor([1.0, 0.0, -1e-3, 1.0]), ValueError),
    ("temperature", torch.ones(5), ValueError),
    ("seeds", torch.arange(4, dtype=torch.int32), TypeError),
    ("seeds", torch.arange(4, device=META), ValueError),
    ("offset", -3, ValueError),
    ("offset", torch.tensor(2.0), TypeError),
    ("out", torch.empty(4, dtype=torch.int64), TypeError),
    ("out", torch.empty(5, dtype=torch.int32), ValueError),
])
def test_sample_bad_inputs_name_the_argument(name, value, exc):
    kw = dict(logits=torch.randn(4, 5), temperature=torch.ones(4), seeds=torch.arange(4), offset=0)
    av.sample(**kw)
    kw[name] = value
    with pytest.raises(exc, match=name):
        av.sample(**kw)


def test_sampling_custom_ops_pass_opcheck():
    g = torch.Generator().manual_seed(21)
    logits = torch.randn(9, 40, generator=g)
    qsl = torch.tensor([0, 4, 4, 9], dtype=torch.int32)
    drafts = torch.randint(0, 40, (3, 4), generator=g, dtype=torch.int32)
    q = torch.softmax(torch.randn(3, 4, 40, generator=g), -1)
    temperature = torch.tensor([0.0, 1.0, 0.7])
    seeds = torch.arange(3, dtype=torch.int64)
    err = torch.zeros(16, dtype=torch.int32)
    out = (torch.empty(3, 5, dtype=torch.int32), torch.empty(3, dtype=torch.int32))
    for probs, offset in ((None, None), (q, torch.tensor(5, dtype=torch.int64))):
        torch.library.opcheck(torch.ops.adaptive_verify.rejection_sample_into.default,
                              (logits, qsl, drafts, probs, temperature, seeds, offset, None, None, None, out[0], out[1],
                               None, err, 3, 0))
    trunc = (torch.tensor([0, 2, 5], dtype=torch.int32), torch.tensor([1.0, 0.5, 0.9]), torch.tensor([0.0, 0.1, 0.0]))
    torch.library.opcheck(torch.ops.adaptive_verify.rejection_sample_into.default,
                          (logits, qsl, drafts, q, temperature, seeds, None, *trunc, out[0], out[1],
                           torch.empty(3, 5), err, 3, 0))
    torch.library.opcheck(torch.ops.adaptive_verify.sample_into.default,
                          (logits, torch.ones(9), torch.arange(9), None, None, None, None, torch.empty(9, dtype=torch.int32),
                           None, err, 0, 0))
    torch.library.opcheck(torch.ops.adaptive_verify.sample_into.default,
                          (logits, torch.ones(9), torch.arange(9), None, torch.full((9,), 3, dtype=torch.int32),
                           torch.full((9,), 0.8), torch.full((9,), 0.05), torch.empty(9, dtype=torch.int32),
                           torch.empty(9), err, 0, 0))
