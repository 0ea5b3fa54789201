"""Losslessness of rejection_sample, by frequency: the emitted tokens follow the target's distribution
whatever the drafter proposed (docs/design.md, "Sampling").

Each case runs N independent requests in ONE call of the C++ CPU kernel: every request has its own seed,
so a batch of N requests is N independent draws (batch invariance is tested in test_sampling.py). The
target rows are fixed per position (row j of every request has logits P[j], or P1[x0] for a row that
follows draft x0), drafts come from a drafter distribution Q != P sampled with torch's own generator, and
the observed tokens are compared with the exact target in float64 by a chi-square test at ALPHA.
Everything is seeded, so the tests are deterministic.
"""
import pytest
import torch
from scipy import stats

import adaptive_verify as av
from adaptive_verify import reference as ref

ALPHA = 1e-3  # a lossless sampler must give a chi-square p-value above this
N = 2**17  # draws per case (131072 >= 10^5)
OFFSET = 987654321


def _probs(logits, T):
    return torch.softmax(logits.double() / T, -1)


def _chi2_pvalue(tokens, p):
    """Chi-square p-value of integer `tokens` against probabilities `p` [C] (bins expecting < 5 merged)."""
    counts = torch.bincount(tokens, minlength=p.numel()).double()
    expected = p * tokens.numel()
    if bool((counts[p == 0] > 0).any()):  # a token the law never emits: as far from it as can be
        return 0.0
    counts, expected = counts[p > 0], expected[p > 0]
    small = expected < 5
    if bool(small.any()):
        counts = torch.cat([counts[~small], counts[small].sum().reshape(1)])
        expected = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    return stats.chisquare(counts.numpy(), expected.numpy() * (counts.sum() / expected.sum()).item()).pvalue


def _tv(tokens, p):
    """Total variation distance between the empirical law of `tokens` and `p`."""
    freq = torch.bincount(tokens, minlength=p.numel()).double() / tokens.numel()
    return 0.5 * (freq - p).abs().sum().item()


def _case(V, K, T, L, probs, seed, next_depends_on_draft=False, trunc=None):
    """Runs N requests; request r verifies L[r] drafts.

    Row j of request r has logits P[j] (float32 [V]), except that with next_depends_on_draft row 1 has
    logits P1[x0], x0 = the request's draft 0 (the target's next-token law after x0). Draft j ~ Q[j], or
    ~ Q1[x0] for j = 1 with next_depends_on_draft. probs: "full" passes draft_probs (the law each draft was
    sampled from), "one-hot" passes none (drafts taken without a distribution).
    trunc: sampling parameters (top_k / top_p / min_p: one value for every request).
    Returns (output_tokens, num_emitted, drafts, tables).
    """
    g = torch.Generator().manual_seed(seed)
    P = torch.randn(K + 1, V, generator=g) * 1.5
    Q = torch.softmax(torch.randn(K, V, generator=g) * 1.5, -1)
    P1 = torch.randn(V, V, generator=g) * 1.5
    Q1 = torch.softmax(torch.randn(V, V, generator=g) * 1.5, -1)
    drafts = torch.stack([torch.multinomial(Q[j], N, replacement=True, generator=g) for j in range(K)], 1)
    if next_depends_on_draft:
        drafts[:, 1] = torch.multinomial(Q1[drafts[:, 0]], 1, generator=g)[:, 0]
    q_len = (L + 1).long()
    qsl = torch.zeros(N + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(q_len, 0).to(torch.int32)
    req = torch.repeat_interleave(torch.arange(N), q_len)  # [T] request of each row
    pos = torch.arange(req.numel()) - qsl[req].long()  # [T] position of each row
    logits = P[pos]
    if next_depends_on_draft:
        at1 = pos == 1
        logits[at1] = P1[drafts[req[at1], 0]]
    draft_probs = None
    if probs == "full":
        draft_probs = Q.expand(N, K, V).clone()
        if next_depends_on_draft:
            draft_probs[:, 1] = Q1[drafts[:, 0]]
    per_request = {k: torch.full((N,), v, dtype=torch.int32 if k == "top_k" else torch.float32)
                   for k, v in (trunc or {}).items()}
    tokens, emitted = av.rejection_sample(
        logits, qsl, drafts.to(torch.int32), draft_probs=draft_probs, temperature=torch.full((N,), float(T)),
        seeds=torch.arange(N, dtype=torch.int64) * 7919 + seed, offset=OFFSET, **per_request)
    assert bool((emitted >= 1).all()) and bool((emitted <= q_len).all())
    return tokens, emitted, drafts, dict(P=P, Q=Q, P1=P1, Q1=Q1)


@pytest.mark.parametrize("probs,V,T", [
    ("one-hot", 32, 1.0),
    ("full", 32, 1.0),
    ("full", 8, 0.5),
    ("full", 64, 2.0),
    ("one-hot", 16, 0.5),
    ("one-hot", 24, 2.0),
])
def test_first_token_follows_the_target(probs, V, T):
    K = 1
    tokens, emitted, drafts, t = _case(V, K, T, torch.ones(N, dtype=torch.int32), probs, seed=V + int(10 * T))
    p, q = _probs(t["P"][0], T), t["Q"][0].double()
    first = tokens[:, 0].long()
    assert _chi2_pvalue(first, p) > ALPHA
    # power: the drafts themselves (what a sampler that always accepted would emit) fail the same test
    assert _chi2_pvalue(drafts[:, 0], p) < 1e-9
    # acceptance rate: sum_x min(p(x), q(x)) with draft_probs; for one-hot drafts x ~ q accepted w.p. p(x)
    rate = (emitted >= 2).double().mean().item()
    expected = torch.minimum(p, q).sum().item() if probs == "full" else (p * q).sum().item()
    se = (expected * (1 - expected) / N) ** 0.5
    assert abs(rate - expected) < 4 * se, f"acceptance {rate:.5f}, expected {expected:.5f} (se {se:.5f})"


def test_varying_verify_lengths_in_one_batch():
    """L in 0..3 per request, mixed in one batch; the first token follows P[0] for every L (bonus for
    L = 0, accepted draft or recovered token otherwise), and the token after an accepted draft 0
    follows P[1]."""
    V, K, T = 20, 3, 1.0
    L = torch.randint(0, K + 1, (N,), generator=torch.Generator().manual_seed(30)).int()
    tokens, emitted, drafts, t = _case(V, K, T, L, "full", seed=31)
    p0, p1 = _probs(t["P"][0], T), _probs(t["P"][1], T)
    first = tokens[:, 0].long()
    for l in range(K + 1):
        assert _chi2_pvalue(first[L == l], p0) > ALPHA, f"L = {l}"
    assert _chi2_pvalue(first, p0) > ALPHA
    second = (L >= 1) & (emitted >= 2)  # draft 0 accepted: the second token comes from row 1
    assert int(second.sum()) > 20000
    assert bool((tokens[second, 0] == drafts[second, 0]).all())
    assert _chi2_pvalue(tokens[second, 1].long(), p1) > ALPHA


@pytest.mark.parametrize("probs", ["full", "one-hot"])
def test_first_two_tokens_follow_the_target(probs):
    """Row 1 is the target's law after draft x0 (P1[x0]); the observable pair is (y1, y2) with y2 this
    step's second token when y1 was the accepted draft, else a draw from P1[y1] (what the next step would
    sample). Lossless: (y1, y2) ~ p0(y1) p1(y2 | y1)."""
    V, K, T = 8, 2, 1.0
    tokens, emitted, drafts, t = _case(V, K, T, torch.full((N,), 2, dtype=torch.int32), probs, seed=40,
                                       next_depends_on_draft=True)
    p0, p1 = _probs(t["P"][0], T), _probs(t["P1"], T)  # [V], [V, V]
    y1 = tokens[:, 0].long()
    y2 = tokens[:, 1].long()
    missing = emitted < 2
    y2[missing] = torch.multinomial(p1[y1[missing]], 1, generator=torch.Generator().manual_seed(41))[:, 0]
    assert _chi2_pvalue(y1 * V + y2, (p0[:, None] * p1).reshape(-1)) > ALPHA
    # both branches were exercised, and accepted pairs start with the draft
    assert 0.05 < missing.double().mean().item() < 0.95
    assert bool((y1[~missing] == drafts[~missing, 0]).all())


def test_converges_to_the_target_not_to_the_drafter():
    V, T = 32, 1.0
    tokens, _, drafts, t = _case(V, 1, T, torch.ones(N, dtype=torch.int32), "full", seed=50)
    p, q = _probs(t["P"][0], T), t["Q"][0].double()
    tv_pq = 0.5 * (p - q).abs().sum().item()
    assert tv_pq > 0.3  # the drafter is far from the target
    first = tokens[:, 0].long()
    to_target = [_tv(first[:n], p) for n in (N // 16, N // 4, N)]
    to_drafter = [_tv(first[:n], q) for n in (N // 16, N // 4, N)]
    assert to_target[0] > to_target[1] > to_target[2], f"TV to the target {to_target}"
    assert to_target[2] < 0.01
    # the distance to the drafter stays at TV(p, q): it does not shrink with more draws
    for d in to_drafter:
        assert abs(d - tv_pq) < 0.03, f"TV to the drafter {to_drafter}, TV(p, q) = {tv_pq:.3f}"
    # the drafts themselves converge to q, not to p (the test can tell the two apart)
    assert _tv(drafts[:, 0], q) < 0.01 and abs(_tv(drafts[:, 0], p) - tv_pq) < 0.03


@pytest.mark.parametrize("probs", ["one-hot", "full"])
def test_identical_unseeded_requests_draw_independent_streams(probs):
    """64 identical requests with seeds=None (unseeded, as most engine traffic is) must not share one random
    stream: they emit many distinct outputs, and the pooled first token still follows the target. Seeded
    requests keep their batch invariance (test_sampling.py)."""
    V, K, R, reps = 16, 3, 64, 256
    g = torch.Generator().manual_seed(5)
    P = torch.randn(K + 1, V, generator=g)
    Q = torch.softmax(torch.randn(K, V, generator=g), -1)
    x = torch.stack([torch.multinomial(Q[j], 1, generator=g) for j in range(K)], 1)[0]  # one draft block [K]
    qsl = torch.arange(R + 1, dtype=torch.int32) * (K + 1)
    logits = P.repeat(R, 1)  # [R * (K + 1), V]: every request sees the same rows
    drafts = x.to(torch.int32).expand(R, K).contiguous()
    draft_probs = Q.expand(R, K, V).contiguous() if probs == "full" else None
    torch.manual_seed(1234)
    firsts, distinct = [], set()
    for _ in range(reps):
        tokens, emitted = av.rejection_sample(logits, qsl, drafts, draft_probs=draft_probs,
                                              temperature=torch.ones(R))
        rows = {tuple(tokens[r, :int(emitted[r])].tolist()) for r in range(R)}
        distinct.add(len(rows))
        firsts.append(tokens[:, 0].long())
    assert min(distinct) >= 4, distinct  # was 1: every request drew the same numbers
    if probs == "one-hot":  # one-hot verification is lossless for any fixed draft; with draft_probs the
        # drafts would have to be sampled from Q per request, which identical requests cannot be
        assert _chi2_pvalue(torch.cat(firsts), _probs(P[0], 1.0)) > ALPHA
    # sample() too: identical rows, unseeded, give many distinct tokens following the row's law
    s = torch.cat([av.sample(P[:1].expand(R, V).contiguous(), torch.ones(R)).long() for _ in range(reps)])
    assert len(set(s[:R].tolist())) >= 4
    assert _chi2_pvalue(s, _probs(P[0], 1.0)) > ALPHA
    # reproducible under torch.manual_seed, like any torch sampling
    torch.manual_seed(99)
    a = av.rejection_sample(logits, qsl, drafts, draft_probs=draft_probs, temperature=torch.ones(R))
    torch.manual_seed(99)
    b = av.rejection_sample(logits, qsl, drafts, draft_probs=draft_probs, temperature=torch.ones(R))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# ------------------------------------------------------------------------------------------------------
# sampling parameters: the target is the truncated, renormalised softmax
# ------------------------------------------------------------------------------------------------------

TRUNCATIONS = [dict(top_k=5), dict(top_p=0.7), dict(min_p=0.25), dict(top_k=8, top_p=0.8),
               dict(top_p=0.9, min_p=0.1), dict(top_k=6, top_p=0.85, min_p=0.05)]


def _truncated_probs(logits, T, trunc):
    keep = ref.kept_tokens(logits.float() / T, **trunc)
    p = torch.where(keep, _probs(logits, T), torch.zeros((), dtype=torch.float64))
    return p / p.sum(), keep


@pytest.mark.parametrize("probs", ["one-hot", "full"])
@pytest.mark.parametrize("trunc", TRUNCATIONS, ids=lambda t: "-".join(f"{k}{v}" for k, v in t.items()))
def test_first_token_follows_the_truncated_target(probs, trunc):
    """Drafts come from a law that also proposes tokens outside the kept set; the first emitted token follows
    softmax restricted to the kept set, renormalised, and never leaves it."""
    V, K, T = 24, 1, 2.0  # a flat enough target that every filter keeps several tokens
    tokens, emitted, drafts, t = _case(V, K, T, torch.ones(N, dtype=torch.int32), probs, seed=40 + len(trunc),
                                       trunc=trunc)
    p, keep = _truncated_probs(t["P"][0], T, trunc)
    assert 1 < int(keep.sum()) < V, "the case must truncate"
    first = tokens[:, 0].long()
    assert bool(keep[first].all())
    assert _chi2_pvalue(first, p) > ALPHA
    assert _chi2_pvalue(first, _probs(t["P"][0], T)) < 1e-9  # power: the untruncated target fails


def test_second_token_and_bonus_follow_the_truncated_target():
    V, K, T = 20, 2, 1.0
    trunc = dict(top_k=7, top_p=0.9)
    L = torch.randint(0, K + 1, (N,), generator=torch.Generator().manual_seed(50)).int()
    tokens, emitted, drafts, t = _case(V, K, T, L, "full", seed=51, trunc=trunc)
    p0, _ = _truncated_probs(t["P"][0], T, trunc)
    p1, _ = _truncated_probs(t["P"][1], T, trunc)
    assert _chi2_pvalue(tokens[:, 0].long(), p0) > ALPHA  # accepted, recovered or bonus (L = 0)
    second = (L >= 1) & (emitted >= 2)
    assert int(second.sum()) > 10000
    assert _chi2_pvalue(tokens[second, 1].long(), p1) > ALPHA


def test_sample_follows_the_truncated_target():
    V, T = 30, 1.3
    g = torch.Generator().manual_seed(60)
    row = torch.randn(V, generator=g) * 1.5
    for trunc in TRUNCATIONS[:3]:
        per_row = {k: torch.full((N,), v, dtype=torch.int32 if k == "top_k" else torch.float32)
                   for k, v in trunc.items()}
        tokens = av.sample(row.expand(N, V).contiguous(), torch.full((N,), T), torch.arange(N, dtype=torch.int64) + 3,
                           **per_row)
        p, _ = _truncated_probs(row, T, trunc)
        assert _chi2_pvalue(tokens.long(), p) > ALPHA, trunc
