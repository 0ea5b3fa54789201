"""Non-finite logits and draft probabilities (docs/design.md, "Non-finite logits"): one rule for every sampling op.

- NaN never wins and is counted;
- a row with +inf logits samples from the limit of softmax: the +inf logits share the mass equally, every other
  token has none (greedy: the first +inf id; logprobs log(1/n) and -inf; truncation ranks the +inf ids by id);
- a row with only -inf and NaN emits id 0 with logprob -inf;
- draft probabilities are used as given (a NaN / +inf / non-positive q(x) rejects; a NaN q_v weighs 0 in the
  residual).

Checked here: the C++ CPU kernel against the reference bit for bit on rows built from every non-finite pattern, for
rejection_sample (greedy, one-hot, draft_probs, truncation, logprobs), tree_rejection_sample and sample; the rule's
consequences stated independently of both (which ids can be emitted, the logprobs); and, statistically, that the +inf
ids share the mass equally. The CUDA sources run the same rows under the host emulator in test_sampling_emu.py and
test_sampling_tree.py.
"""
import math

import pytest
import torch
from scipy import stats

import adaptive_verify as av
from adaptive_verify import reference as ref

INF, NAN = float("inf"), float("nan")
PATTERNS = ("finite", "one_inf", "many_inf", "inf_ends", "only_neg_inf_nan", "all_nan", "nan_neg_inf", "overflow")


def nonfinite_row(pattern: str, V: int, g: torch.Generator, dtype=torch.float32) -> torch.Tensor:
    """A float32 row [V] of the given non-finite pattern (values representable in dtype)."""
    row = torch.randn(V, generator=g) * 3

    def ids(n):
        return torch.randperm(V, generator=g)[: min(n, V)]

    if pattern == "one_inf":
        row[ids(1)] = INF
        row[ids(max(1, V // 8))] = NAN  # may land on the +inf id: then the row has no +inf left
    elif pattern == "many_inf":
        row[ids(V // 5)] = NAN
        row[ids(V // 6)] = -INF
        row[ids(max(2, V // 7))] = INF
    elif pattern == "inf_ends":
        row[0] = row[V - 1] = INF
    elif pattern == "only_neg_inf_nan":
        row[:] = -INF
        row[ids(V // 3)] = NAN
    elif pattern == "all_nan":
        row[:] = NAN
    elif pattern == "nan_neg_inf":
        row[ids(V // 4)] = NAN
        row[ids(V // 4)] = -INF
    elif pattern == "overflow":  # finite logits that overflow to +inf once divided by a temperature below 1
        big = 3.0e38 if dtype != torch.float16 else 6.0e4
        row[ids(3)] = big
    return row


def nonfinite_logits(rows: int, V: int, dtype, seed: int) -> torch.Tensor:
    """[rows, V] logits in dtype, every row of a pattern of PATTERNS (in turn, so each appears)."""
    g = torch.Generator().manual_seed(seed)
    return torch.stack([nonfinite_row(PATTERNS[i % len(PATTERNS)], V, g, dtype) for i in range(rows)]).to(dtype)


def drafts_on_rows(logits: torch.Tensor, qsl: torch.Tensor, K: int, seed: int) -> torch.Tensor:
    """[R, K] int32 drafts: on a +inf id where the row has one (so some are accepted), on a NaN id, or random."""
    g = torch.Generator().manual_seed(seed)
    R, V = qsl.numel() - 1, logits.shape[1]
    drafts = torch.randint(0, V, (R, K), generator=g, dtype=torch.int32)
    x = logits.float()
    for r in range(R):
        for j in range(int(qsl[r + 1] - qsl[r]) - 1):
            row, u = x[int(qsl[r]) + j], float(torch.rand(1, generator=g))
            for kind, mask in ((0.5, row == INF), (0.7, torch.isnan(row))):
                if u < kind and bool(mask.any()):
                    drafts[r, j] = int(mask.nonzero()[int(torch.randint(0, int(mask.sum()), (1,), generator=g))])
                    break
    return drafts


def nonfinite_probs(R: int, K: int, V: int, drafts: torch.Tensor, seed: int) -> torch.Tensor:
    """[R, K, V] draft probabilities with NaN, +inf, -inf and negative entries, some at the draft's own id."""
    g = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.randn(R, K, V, generator=g), -1)
    bad = torch.rand(R, K, V, generator=g) < 0.05
    q[bad] = torch.tensor([NAN, INF, -INF, -0.5])[torch.randint(0, 4, (int(bad.sum()),), generator=g)]
    on_draft = torch.rand(R, K, generator=g) < 0.25
    vals = torch.tensor([NAN, INF, -INF, 0.0])[torch.randint(0, 4, (R, K), generator=g)]
    q.scatter_(2, drafts.long().clamp(0, V - 1).unsqueeze(-1), torch.where(on_draft, vals, q.gather(
        2, drafts.long().clamp(0, V - 1).unsqueeze(-1)).squeeze(-1)).unsqueeze(-1))
    return q


def batch(R, K, V, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q_len = torch.randint(0, K + 2, (R,), generator=g)
    qsl = torch.zeros(R + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(q_len, 0).to(torch.int32)
    logits = nonfinite_logits(int(qsl[-1]), V, dtype, seed)
    drafts = drafts_on_rows(logits, qsl, K, seed)
    temperature = torch.tensor([0.0, 0.5, 1.0, 2.0])[torch.randint(0, 4, (R,), generator=g)]
    return logits, qsl, drafts, temperature, torch.arange(R, dtype=torch.int64) * 7 + seed


def assert_same(got, want):
    for a, b in zip(got, want):
        assert torch.equal(a, b), f"\n{a}\nreference\n{b}"


def test_issue_35_nan_logit_never_emitted_under_draft_probs():
    """The fuzzer's smallest case: NaN at 149 and 252, +inf at 196, -inf at three ids, the draft 240 (finite logit)
    with draft probabilities summing to 1, temperature 1. p is one-hot at 196: the draft is rejected and the
    residual max(p - q, 0) is one-hot at 196, whatever the seed. The CPU kernel emitted 149, the reference 0."""
    g = torch.Generator().manual_seed(35)
    V = 255
    row = torch.randn(V, generator=g) * 3
    row[[149, 252]] = NAN
    row[196] = INF
    row[[3, 77, 200]] = -INF
    logits = torch.stack([row, torch.randn(V, generator=g)])
    qsl = torch.tensor([0, 2], dtype=torch.int32)
    drafts = torch.tensor([[240]], dtype=torch.int32)
    q = torch.softmax(torch.randn(1, 1, V, generator=g), -1)
    for seed in range(20):
        kw = dict(draft_probs=q, temperature=torch.ones(1), seeds=torch.tensor([seed]), logprobs=True)
        got = av.rejection_sample(logits, qsl, drafts, **kw)
        assert_same(got, ref.rejection_sample(logits, qsl, drafts, **kw))
        assert got[0].tolist() == [[196, -1]] and got[1].tolist() == [1]
        assert got[2][0, 0].item() == 0.0  # log 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("V", [1, 5, 64, 777])
@pytest.mark.parametrize("probs", [False, True])
@pytest.mark.parametrize("truncate", [False, True])
def test_rejection_sample_matches_reference(dtype, V, probs, truncate):
    R, K = 24, 3
    logits, qsl, drafts, temperature, seeds = batch(R, K, V, dtype, seed=V * 3 + probs + 2 * truncate)
    kw = dict(temperature=temperature, seeds=seeds, offset=11, logprobs=True)
    if probs:
        kw["draft_probs"] = nonfinite_probs(R, K, V, drafts, seed=V)
    if truncate:
        g = torch.Generator().manual_seed(V)
        kw["top_k"] = torch.tensor([0, 1, 2, 3])[torch.randint(0, 4, (R,), generator=g)].to(torch.int32)
        kw["top_p"] = torch.tensor([1.0, 0.5, 0.9, 1e-6])[torch.randint(0, 4, (R,), generator=g)]
        kw["min_p"] = torch.tensor([0.0, 0.1, 0.5, 1.0])[torch.randint(0, 4, (R,), generator=g)]
    got = av.rejection_sample(logits, qsl, drafts, **kw)
    assert_same(got, ref.rejection_sample(logits, qsl, drafts, **kw))
    check_rule(logits, qsl, got, temperature, truncated=truncate)


def check_rule(logits, qsl, got, temperature, truncated=False):
    """The rule's consequences, stated without either implementation: a row with +inf scaled logits emits one of
    them, with logprob log(1/n) (untruncated softmax); a row without a number above -inf emits 0 with -inf; NaN
    ids are never emitted from a row that has a number."""
    tokens, emitted, lps = got
    x = logits.float()
    for r in range(qsl.numel() - 1):
        T = float(temperature[r])
        for j in range(int(emitted[r])):
            row = x[int(qsl[r]) + j]
            z = row if T == 0.0 else row / T
            t, lp = int(tokens[r, j]), float(lps[r, j])
            inf = z == INF
            if bool(inf.any()):
                assert bool(inf[t]), f"request {r} row {j}: emitted {t}, not a +inf logit"
                assert lp == pytest.approx(-math.log(int(inf.sum())), abs=1e-6)
            elif not bool((z > -INF).any()):
                assert t == 0 and lp == -INF
            else:
                assert not math.isnan(float(z[t])) and z[t] > -INF
                assert lp <= 0.0
            if not truncated and T > 0 and bool(inf.any()) and j < int(emitted[r]) - 1:
                assert bool(inf[t])  # an accepted draft is itself a +inf id


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("V", [2, 33, 500])
def test_sample_matches_reference(dtype, V):
    N = 40
    x = nonfinite_logits(N, V, dtype, seed=V)
    temperature = torch.tensor([0.0, 0.5, 1.0, 3.0]).repeat(N // 4)
    g = torch.Generator().manual_seed(V)
    for trunc in ({}, dict(top_k=torch.tensor([0, 1, 2, 5])[torch.randint(0, 4, (N,), generator=g)].to(torch.int32),
                           top_p=torch.tensor([1.0, 0.3, 0.8, 1.0])[torch.randint(0, 4, (N,), generator=g)],
                           min_p=torch.tensor([0.0, 0.2, 0.0, 1.0])[torch.randint(0, 4, (N,), generator=g)])):
        kw = dict(logprobs=True, **trunc)
        got = av.sample(x, temperature, torch.arange(N), 5, **kw)
        assert_same(got, ref.sample(x, temperature, torch.arange(N), 5, **kw))
        qsl = torch.arange(N + 1, dtype=torch.int32)
        check_rule(x, qsl, (got[0].view(N, 1), torch.ones(N, dtype=torch.int32), got[1].view(N, 1)), temperature,
                   truncated=bool(trunc))


def tree_step(V, dtype, seed):
    """Chains and small trees whose node ids hit +inf logits of their parents' rows (so paths go deep)."""
    g = torch.Generator().manual_seed(seed)
    R, N = 12, 6
    parents, ids, qsl = [], [], [0]
    for r in range(R):
        n = int(torch.randint(0, N + 1, (1,), generator=g))
        parents += [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n + 1)]
        ids += [0] * (n + 1)
        qsl.append(qsl[-1] + n + 1)
    # Mostly rows with one +inf logit (a node carrying it is always taken: paths go deep), every pattern mixed in.
    pattern = [PATTERNS[int(i)] if i < len(PATTERNS) else "one_inf"
               for i in torch.randint(0, 2 * len(PATTERNS), (qsl[-1],), generator=g)]
    logits = torch.stack([nonfinite_row(pt, V, g, dtype) for pt in pattern]).to(dtype)
    x = logits.float()
    ids = torch.tensor(ids)
    for r in range(R):
        seen = {}
        for i in range(1, qsl[r + 1] - qsl[r]):  # a node carries a +inf id of its parent's row where there is one
            p = parents[qsl[r] + i]
            row = x[qsl[r] + p]
            cand = (row == INF).nonzero().flatten().tolist() or list(range(V))
            cand = [c for c in cand if c not in seen.get(p, set())] or [V - 1]
            ids[qsl[r] + i] = cand[int(torch.randint(0, len(cand), (1,), generator=g))]
            seen.setdefault(p, set()).add(int(ids[qsl[r] + i]))
    return (logits, torch.tensor(qsl, dtype=torch.int32), torch.tensor(parents, dtype=torch.int32),
            ids.to(torch.int32), N + 1), R


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("truncate", [False, True])
def test_tree_rejection_sample_matches_reference(dtype, truncate):
    args, R = tree_step(40, dtype, seed=7 + truncate)
    kw = dict(temperature=torch.tensor([0.0, 0.5, 1.0]).repeat(R // 3), seeds=torch.arange(R), offset=2, logprobs=True)
    if truncate:
        kw.update(top_k=torch.tensor([0, 1, 2]).repeat(R // 3).to(torch.int32), min_p=torch.full((R,), 0.1))
    got = av.tree_rejection_sample(*args, **kw)
    assert_same(got, ref.tree_rejection_sample(*args, **kw))
    assert int(got[1].max()) >= 3, "no path went past two +inf nodes: the case does not test the walk"
    tokens, emitted, offsets, lps = got
    x = args[0].float()
    for r in range(R):
        T = float(kw["temperature"][r])
        for d in range(int(emitted[r])):
            row = x[int(args[1][r]) + int(offsets[r, d])]
            z = row if T == 0.0 else row / T
            if bool((z == INF).any()):
                assert bool(z[int(tokens[r, d])] == INF)
                assert float(lps[r, d]) == pytest.approx(-math.log(int((z == INF).sum())), abs=1e-6)


def test_only_neg_inf_and_nan_rows_emit_zero():
    V = 9
    row = torch.full((V,), -INF)
    row[[0, 4]] = NAN
    logits = row.repeat(4, 1)
    for T in (0.0, 1.0):
        temperature = torch.full((2,), T)
        for q in (None, torch.softmax(torch.randn(2, 1, V), -1)):
            out, emitted, lps = av.rejection_sample(logits, torch.tensor([0, 2, 4], dtype=torch.int32),
                                                    torch.tensor([[3], [5]], dtype=torch.int32), draft_probs=q,
                                                    temperature=temperature, seeds=torch.arange(2), logprobs=True)
            assert out[:, 0].tolist() == [0, 0] and emitted.tolist() == [1, 1] and lps[:, 0].tolist() == [-INF] * 2


def test_nan_logits_counted_in_rows_with_inf():
    logits = torch.tensor([[NAN, INF, 1.0, NAN, INF]])
    av.reset_error_counts("cpu")
    av.sample(logits, torch.ones(1), torch.zeros(1, dtype=torch.int64))
    assert av.error_counts("cpu")["nan_logits"] == 2
    av.reset_error_counts("cpu")


@pytest.mark.parametrize("top_k", [0, 2])
def test_inf_logits_share_the_mass_equally(top_k):
    """sample() over 3000 seeds on a row with +inf at ids 2, 5 and 9 (and NaN, -inf, finite elsewhere): each +inf id
    a third of the time (top_k = 2: ids 2 and 5 half the time each: the lowest-id +inf logits rank first); a
    one-hot draft on id 5 is accepted a third of the time. Chi-square at p > 1e-3."""
    V, N = 12, 3000
    row = torch.randn(V) * 5
    row[[2, 5, 9]] = INF
    row[[0, 7]] = NAN
    row[11] = -INF
    kw = {} if not top_k else dict(top_k=torch.full((N,), top_k, dtype=torch.int32))
    tokens = av.sample(row.repeat(N, 1), torch.full((N,), 0.8), torch.arange(N), 0, **kw)
    ids = [2, 5, 9] if not top_k else [2, 5]
    counts = torch.bincount(tokens.long(), minlength=V)
    assert int(counts[ids].sum()) == N
    assert stats.chisquare(counts[ids].numpy()).pvalue > 1e-3
    if not top_k:
        qsl = torch.arange(0, 2 * N + 1, 2, dtype=torch.int32)
        _, emitted = av.rejection_sample(row.repeat(2 * N, 1), qsl, torch.full((N, 1), 5, dtype=torch.int32),
                                         temperature=torch.ones(N), seeds=torch.arange(N))
        accepted = int((emitted == 2).sum())
        assert stats.binomtest(accepted, N, 1 / 3).pvalue > 1e-3
