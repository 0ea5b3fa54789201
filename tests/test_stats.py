"""AcceptanceStats: counts against a literal loop, report numbers against straightforward formulas."""
import math

import pytest
import torch

import adaptive_verify as av
from adaptive_verify import reference as ref


def _step(R, K, g, nan=False):
    conf = torch.rand(R, K, generator=g)
    conf[conf < 0.05] = 0.0  # bin edges
    conf[conf > 0.97] = 1.0
    if nan:
        conf[0, 0] = float("nan")
    verify_lens = torch.randint(0, K + 1, (R,), generator=g, dtype=torch.int32)
    num_accepted = (torch.rand(R, generator=g) * (verify_lens + 1).float()).floor().to(torch.int32)  # <= verify_lens
    return conf, verify_lens, num_accepted


def test_counts_equal_the_literal_definition_over_many_steps():
    g = torch.Generator().manual_seed(0)
    P, B = 9, 7
    stats = av.AcceptanceStats(P, num_bins=B)
    want_t = torch.zeros(P, B, dtype=torch.int64)
    want_s = torch.zeros_like(want_t)
    want_c = torch.zeros(P, B, dtype=torch.float64)
    want_totals = torch.zeros(2, dtype=torch.int64)
    for step in range(7):
        R, K = [(13, 9), (1, 1), (40, 5), (7, 9), (0, 3), (64, 8), (3, 0)][step]
        conf, vl, na = _step(R, K, g)
        if step == 3:  # rows as given: a count past K, an accepted count past verify_lens, negatives
            vl[0], na[0], vl[1], na[1], na[2] = K + 3, K + 5, -2, -1, vl[2] + 4
        stats.update(conf, vl, na)
        t, s, c = ref.stats_update(conf, vl, na, P, B)
        want_t += t
        want_s += s
        want_c += c
        want_totals += ref.stats_totals(vl, na, K)
    assert torch.equal(stats.totals, want_totals) and int(want_totals[0]) > 50
    assert torch.equal(stats.trials, want_t)
    assert torch.equal(stats.survivals, want_s)
    assert (stats.conf_sum - want_c).abs().max() < 1e-6  # fixed point truncates below 2^-32 per trial
    assert int(stats.trials.sum()) > 100


def test_repeated_updates_follow_the_caller_tensors_layout_and_storage():
    """Repeated free updates read each caller tensor as it is now: the same objects given new storage (set_),
    reshaped in place (resize_), or new slices of one buffer each count exactly what they hold; a prepared update
    rebinding new slices counts the same, and refuses a tensor resized in place by name."""
    g = torch.Generator().manual_seed(3)
    P = 6
    stats = av.AcceptanceStats(P, num_bins=10)
    want = [torch.zeros(P, 10, dtype=torch.int64) for _ in range(2)]
    conf, vl, na = _step(5, 4, g)
    buf_v, buf_a = torch.zeros(64, dtype=torch.int32), torch.zeros(64, dtype=torch.int32)

    def check(c, v, a):
        stats.update(c, v, a)
        t, s, _ = ref.stats_update(c, v, a, P, 10)
        want[0].add_(t)
        want[1].add_(s)
        assert torch.equal(stats.trials, want[0]) and torch.equal(stats.survivals, want[1])

    for _ in range(3):
        check(conf, vl, na)
    c2, v2, a2 = _step(5, 4, g)
    vl.set_(v2.clone())  # same object, new storage
    check(conf, vl, na)
    conf.resize_(3, 4)  # same object, same storage, fewer rows
    check(conf, vl[:3], na[:3])
    for step in range(3):  # new slices of persistent buffers, values rewritten each step
        c3, v3, a3 = _step(5, 4, g)
        buf_v[:5], buf_a[:5] = v3, a3
        check(c3, buf_v[:5], buf_a[:5])
    handle = av.prepare(stats.update, c3, buf_v[:5], buf_a[:5])
    for step in range(3):  # the prepared update, rebinding each step's new slices
        c4, v4, a4 = _step(5, 4, g)
        buf_v[:5], buf_a[:5] = v4, a4
        handle.run(conf=c4, verify_lens=buf_v[:5], num_accepted=buf_a[:5])
        t, s, _ = ref.stats_update(c4, v4, a4, P, 10)
        want[0].add_(t)
        want[1].add_(s)
        assert torch.equal(stats.trials, want[0]) and torch.equal(stats.survivals, want[1])
    c4.resize_(2, 4)
    with pytest.raises(av.PreparedMismatch, match="conf"):
        handle.run()


def test_report_matches_straightforward_formulas():
    g = torch.Generator().manual_seed(1)
    P, B = 4, 5
    stats = av.AcceptanceStats(P, num_bins=B)
    trials = []  # (position, conf, survived)
    for _ in range(5):
        conf, vl, na = _step(50, P, g)
        stats.update(conf, vl, na)
        for r in range(50):
            for j in range(P):
                if j < vl[r] and j <= na[r]:
                    trials.append((j, float(conf[r, j]), int(j < na[r])))
    rep = stats.report()

    def ece(items):
        total = len(items)
        out = 0.0
        for b in range(B):
            cell = [(c, y) for c, y in items if min(int(c * B), B - 1) == b]
            if cell:
                out += abs(sum(y for _, y in cell) - sum(c for c, _ in cell)) / total
        return out

    def auc(items):  # pairwise, on the bin index (the statistic the counts can support), ties half
        pos = [min(int(c * B), B - 1) for c, y in items if y]
        neg = [min(int(c * B), B - 1) for c, y in items if not y]
        if not pos or not neg:
            return math.nan
        wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
        return wins / (len(pos) * len(neg))

    for j in range(P):
        items = [(c, y) for jj, c, y in trials if jj == j]
        assert rep["trials"][j] == len(items)
        assert rep["acceptance"][j] == pytest.approx(sum(y for _, y in items) / len(items))
        assert rep["ece"][j] == pytest.approx(ece(items), abs=1e-7)
        assert rep["auc"][j] == pytest.approx(auc(items)) or (math.isnan(rep["auc"][j]) and math.isnan(auc(items)))
    everything = [(c, y) for _, c, y in trials]
    assert rep["ece_overall"] == pytest.approx(ece(everything), abs=1e-7)
    assert rep["auc_overall"] == pytest.approx(auc(everything))
    assert rep["trials_overall"] == len(everything)


def test_perfectly_calibrated_and_perfectly_ranked():
    stats = av.AcceptanceStats(1, num_bins=2)
    conf = torch.tensor([[0.9]] * 10 + [[0.1]] * 10)
    accepted = torch.tensor([1] * 9 + [0] + [1] + [0] * 9, dtype=torch.int32)
    stats.update(conf, torch.ones(20, dtype=torch.int32), accepted)
    rep = stats.report()
    assert rep["ece"][0] == pytest.approx(0.0, abs=1e-6)
    # 10 survivors (9 high, 1 low), 10 failures (1 high, 9 low): 81 wins + 0.5 * (9 + 9) ties
    assert rep["auc"][0] == pytest.approx((81 + 0.5 * 18) / 100)


def test_nan_confidences_are_skipped_and_counted():
    av.reset_error_counts("cpu")
    stats = av.AcceptanceStats(3)
    conf = torch.tensor([[float("nan"), 0.5, 0.5], [0.5, float("nan"), 0.5]])
    stats.update(conf, torch.tensor([3, 3], dtype=torch.int32), torch.tensor([3, 3], dtype=torch.int32))
    assert stats.trials.sum(1).tolist() == [1, 1, 2]
    assert av.error_counts("cpu")["nan_confidence"] == 2


def test_reset_and_bad_inputs():
    stats = av.AcceptanceStats(4, num_bins=3)
    stats.update(torch.full((2, 4), 0.5), torch.tensor([4, 2], dtype=torch.int32), torch.tensor([1, 2], dtype=torch.int32))
    assert stats.trials.sum() > 0
    stats.reset()
    assert stats.trials.sum() == 0 and stats.survivals.sum() == 0 and stats.conf_sum.sum() == 0
    assert stats.totals.tolist() == [0, 0]
    assert math.isnan(stats.report()["ece_overall"])
    with pytest.raises(ValueError, match="num_positions"):
        stats.update(torch.rand(2, 5), torch.zeros(2, dtype=torch.int32), torch.zeros(2, dtype=torch.int32))
    with pytest.raises(TypeError, match="conf"):
        stats.update(torch.rand(2, 4).double(), torch.zeros(2, dtype=torch.int32), torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="verify_lens"):
        stats.update(torch.rand(2, 4), torch.zeros(3, dtype=torch.int32), torch.zeros(2, dtype=torch.int32))
    with pytest.raises(TypeError, match="num_accepted"):
        stats.update(torch.rand(2, 4), torch.zeros(2, dtype=torch.int32), torch.zeros(2))
    with pytest.raises(ValueError, match="num_bins"):
        av.AcceptanceStats(3, num_bins=0)
    with pytest.raises(TypeError, match="num_positions"):
        av.AcceptanceStats(2.5)


def test_sizes_and_devices_are_bounded_and_named():
    """Issue 16, finding 7: a bad device raised torch's RuntimeError; sizes that allocate had no bound."""
    for device in ("foo", "meta", "cuda:7", torch.device("meta")):
        with pytest.raises(ValueError, match="^device"):
            av.AcceptanceStats(4, device=device)
    with pytest.raises(TypeError, match="^device"):
        av.AcceptanceStats(4, device=None)
    with pytest.raises(ValueError, match="^num_positions must be <= 64"):
        av.AcceptanceStats(2**31)
    with pytest.raises(ValueError, match="^num_bins must be <= 16384"):
        av.AcceptanceStats(4, num_bins=2**40)
    with pytest.raises(TypeError, match="^conf must be a dense"):
        av.AcceptanceStats(4).update(torch.rand(2, 4).to_sparse(), torch.zeros(2, dtype=torch.int32),
                                     torch.zeros(2, dtype=torch.int32))


def test_update_custom_op_passes_opcheck():
    stats = av.AcceptanceStats(3, num_bins=4)
    conf, vl, na = _step(6, 3, torch.Generator().manual_seed(5))
    torch.library.opcheck(torch.ops.adaptive_verify.stats_update_.default,
                          (conf, vl, na, stats.trials, stats.survivals, stats._conf_fixed,
                           torch.zeros(16, dtype=torch.int32), stats.totals))


def test_out_of_range_confidences_bin_like_the_reference():
    """c * num_bins beyond int32 must clamp to the last bin (an unclamped float->int conversion differs
    between x86 and CUDA)."""
    stats = av.AcceptanceStats(1, num_bins=16)
    conf = torch.tensor([[float("inf")], [1e9], [1.5], [-3.0], [float("-inf")]])
    ones = torch.ones(5, dtype=torch.int32)
    stats.update(conf, ones, ones)
    want, _, _ = ref.stats_update(conf, ones, ones, 1, 16)
    assert torch.equal(stats.trials, want)
    assert stats.trials[0, 15] == 3 and stats.trials[0, 0] == 2


@pytest.mark.parametrize("R,K,P", [(1, 1, 1), (37, 1, 9), (23, 3, 7), (0, 2, 4), (5, 0, 3)])
def test_rows_placed_at_positions_equal_the_literal_definition(R, K, P):
    """positions=: row r's entry j counts at positions[r] + j (a draft tree's nodes at their depths); totals are the
    caller's, so they stay untouched; remembered calls see new positions."""
    g = torch.Generator().manual_seed(R * 100 + K)
    stats = av.AcceptanceStats(P, num_bins=5)
    conf, vl, na = _step(R, K, g)
    want = [torch.zeros(P, 5, dtype=torch.int64), torch.zeros(P, 5, dtype=torch.int64),
            torch.zeros(P, 5, dtype=torch.float64)]
    pos = torch.zeros(R, dtype=torch.int32)
    for step in range(3):
        n = torch.minimum(torch.minimum(vl, na + 1), torch.tensor(K)).clamp(min=0)  # trials per row
        pos.copy_((torch.rand(R, generator=g) * (P - n + 1).clamp(min=1).float()).floor().to(torch.int32))
        stats.update(conf, vl, na, positions=pos)
        for w, x in zip(want, ref.stats_update(conf, vl, na, P, 5, positions=pos)):
            w += x
    assert torch.equal(stats.trials, want[0]) and torch.equal(stats.survivals, want[1])
    torch.testing.assert_close(stats.conf_sum, want[2], rtol=0, atol=1e-9 * max(R, 1))
    assert stats.totals.tolist() == [0, 0]


def test_a_trial_placed_outside_the_positions_raises_naming_positions_and_adds_nothing():
    stats = av.AcceptanceStats(3)
    one = torch.ones(2, dtype=torch.int32)
    for bad in ([0, 3], [-1, 0]):
        with pytest.raises(ValueError, match="positions"):
            stats.update(torch.full((2, 1), 0.5), one, one, positions=torch.tensor(bad, dtype=torch.int32))
        assert stats.trials.sum() == 0
    # a row without trials may sit anywhere (its position is never read)
    stats.update(torch.full((2, 1), 0.5), torch.tensor([1, 0], dtype=torch.int32), one,
                 positions=torch.tensor([2, 99], dtype=torch.int32))
    assert stats.trials.sum(1).tolist() == [0, 0, 1]
    with pytest.raises(ValueError, match="positions"):
        stats.update(torch.full((2, 1), 0.5), one, one, positions=torch.zeros(3, dtype=torch.int32))


def test_update_with_positions_passes_opcheck():
    stats = av.AcceptanceStats(6, num_bins=4)
    conf, vl, na = _step(6, 2, torch.Generator().manual_seed(6))
    torch.library.opcheck(torch.ops.adaptive_verify.stats_update_.default,
                          (conf, vl, na, stats.trials, stats.survivals, stats._conf_fixed,
                           torch.zeros(16, dtype=torch.int32), None, torch.arange(6, dtype=torch.int32) % 4))
