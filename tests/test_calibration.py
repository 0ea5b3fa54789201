"""Calibration: metrics against slow loops, STS recovery of known temperatures, report, plot, online STS."""
import math

import pytest
import torch

import adaptive_verify as av
from adaptive_verify.calibration import (
    OnlineSTS,
    auc,
    calibration_report,
    expected_calibration_error,
    fit_sts,
    load_temperatures,
    save_temperatures,
)

# True per-position temperatures of the synthetic drafter: it reports logits z * S[j] for true logits z.
S = [2.0, 0.5, 1.5, 0.7, 1.25]
MU = [2.5, 2.0, 2.0, 2.0, 2.0]


def synthetic(N, s=S, mu=MU, sigma=1.5, seed=0, short_frac=0.3):
    """Rows of K drafts accepted left to right with true conditional probability sigmoid(z).

    A fraction ``short_frac`` of the rows verified fewer than K drafts (1..K-1, uniform); their accepted
    length stops at the first rejection or at verified. Returns (reported logits, accepted, verified, z).
    """
    g = torch.Generator().manual_seed(seed)
    K = len(s)
    z = torch.randn(N, K, generator=g, dtype=torch.float64) * sigma + torch.tensor(mu, dtype=torch.float64)
    passes = torch.rand(N, K, generator=g, dtype=torch.float64) < torch.sigmoid(z)
    verified = torch.full((N,), K, dtype=torch.int64)
    short = torch.rand(N, generator=g) < short_frac
    verified[short] = torch.randint(1, K, (int(short.sum()),), generator=g)
    ok = passes & (torch.arange(K)[None, :] < verified[:, None])
    accepted = torch.cumprod(ok.long(), 1).sum(1)
    logits = (z * torch.tensor(s, dtype=torch.float64)).float()
    return logits, accepted, verified, z


# ----------------------------------------------------------------------------------------------------
# metrics against straightforward loops
# ----------------------------------------------------------------------------------------------------


def slow_ece(pred, outcome, num_bins):
    bins = [[] for _ in range(num_bins)]
    for p, y in zip(pred, outcome):
        bins[min(int(p * num_bins), num_bins - 1)].append((p, y))
    total = 0.0
    for b in bins:
        if b:
            total += len(b) / len(pred) * abs(sum(p for p, _ in b) / len(b) - sum(y for _, y in b) / len(b))
    return total


def slow_auc(pred, outcome):
    pos = [p for p, y in zip(pred, outcome) if y]
    neg = [p for p, y in zip(pred, outcome) if not y]
    if not pos or not neg:
        return math.nan
    wins = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in pos for b in neg)
    return wins / (len(pos) * len(neg))


@pytest.mark.parametrize("num_bins", [1, 7, 15])
def test_ece_matches_loop(num_bins):
    g = torch.Generator().manual_seed(num_bins)
    pred = torch.rand(501, generator=g, dtype=torch.float64)
    pred[:5] = torch.tensor([0.0, 1.0, 1.0, 0.5, 1 / 7])  # exact bin edges and the top of [0, 1]
    outcome = torch.rand(501, generator=g, dtype=torch.float64) < pred ** 2
    got = expected_calibration_error(pred, outcome, num_bins)
    assert got == pytest.approx(slow_ece(pred.tolist(), outcome.tolist(), num_bins), rel=1e-12, abs=1e-15)
    assert got > 0.01  # pred**2 is not pred: the data is miscalibrated on purpose


def test_auc_matches_pairwise_with_ties():
    g = torch.Generator().manual_seed(1)
    pred = (torch.rand(300, generator=g) * 8).round() / 8  # 9 distinct values: many ties
    outcome = torch.rand(300, generator=g) < pred
    got = auc(pred, outcome)
    assert got == pytest.approx(slow_auc(pred.tolist(), outcome.tolist()), rel=1e-12)
    assert 0.6 < got < 1.0
    assert auc(torch.tensor([0.1, 0.9]), torch.tensor([0, 1])) == 1.0
    assert auc(torch.tensor([0.5, 0.5]), torch.tensor([0, 1])) == 0.5
    assert math.isnan(auc(torch.tensor([0.2, 0.3]), torch.tensor([1, 1])))


def test_metric_inputs_rejected():
    with pytest.raises(ValueError, match="pred"):
        expected_calibration_error(torch.tensor([1.5]), torch.tensor([1]))
    with pytest.raises(ValueError, match="outcome"):
        auc(torch.tensor([0.5, 0.2]), torch.tensor([2, 0]))
    with pytest.raises(ValueError, match="same number"):
        auc(torch.tensor([0.5, 0.2]), torch.tensor([1]))


# ----------------------------------------------------------------------------------------------------
# fit_sts
# ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fitted():
    logits, accepted, verified, z = synthetic(40000)
    return logits, accepted, verified, z, fit_sts(logits, accepted, verified)


def test_sts_recovers_known_temperatures(fitted):
    logits, accepted, verified, _, temps = fitted
    assert temps.dtype == torch.float32 and temps.shape == (len(S),)
    rel = (temps.double() / torch.tensor(S) - 1).abs()
    assert bool((rel < 0.15).all()), f"temperatures {temps.tolist()} vs truth {S}"
    rep = calibration_report(logits, accepted, verified, is_logits=True, temperatures=temps)
    assert rep["ece_overall"] > 0.03  # the drafter was miscalibrated ...
    assert rep["after"]["ece_overall"] < 0.015  # ... and is not any more


def test_sts_keeps_order_within_position(fitted):
    logits, _, _, _, temps = fitted
    conf = torch.sigmoid(logits.double() / temps.double())
    for j in range(logits.shape[1]):
        assert torch.equal(torch.argsort(conf[:, j], stable=True), torch.argsort(logits[:, j].double(), stable=True))


def test_sts_uses_verified(fitted):
    logits, accepted, verified, _, temps = fitted
    # Positions at or past verified[n] are never read: garbage there changes nothing.
    poisoned = logits.clone()
    poisoned[torch.arange(logits.shape[1])[None, :] >= verified[:, None]] = float("nan")
    assert torch.equal(fit_sts(poisoned, accepted, verified), temps)
    # Ignoring verified counts short rows as rejections and pulls the fit far from the truth.
    wrong = fit_sts(logits, accepted)
    assert float((wrong.double() / torch.tensor(S) - 1).abs().max()) > 0.15


def test_sts_matches_truth_when_calibrated():
    logits, accepted, verified, _ = synthetic(30000, s=[1.0, 1.0, 1.0], mu=MU[:3], seed=3)
    temps = fit_sts(logits, accepted, verified)
    assert bool(((temps - 1).abs() < 0.15).all()), temps.tolist()


def test_sts_grid_and_numpy_inputs():
    logits, accepted, verified, _ = synthetic(500, s=[1.0, 1.0], mu=[1.0, 1.0], seed=4)
    one = fit_sts(logits.numpy(), accepted.numpy(), verified.int().numpy(), grid=[1.3])
    assert one.tolist() == pytest.approx([1.3, 1.3])


def test_sts_too_little_data_names_position():
    logits, accepted, verified, _ = synthetic(400, s=[1.0, 1.0, 1.0], mu=[1.0, 1.0, 1.0], short_frac=0.0, seed=5)
    verified[10:] = 2  # position 2 is reached by 10 rows only
    accepted = torch.minimum(accepted, verified)
    with pytest.raises(ValueError, match="position 2: only 10 rows"):
        fit_sts(logits, accepted, verified)
    short = verified.clamp(max=2)
    assert fit_sts(logits[:, :2], torch.minimum(accepted, short), short).shape == (2,)  # the suggested way out
    with pytest.raises(ValueError, match="position 0"):
        fit_sts(logits[:20], accepted[:20], verified[:20])


N_BAD = 100


def _good():
    logits, accepted, verified, _ = synthetic(N_BAD, s=[1.0, 1.0, 1.0], mu=[1.0, 1.0, 1.0], seed=6)
    return {"logits": logits, "accepted": accepted, "verified": verified}


@pytest.mark.parametrize(
    "change, name",
    [
        (lambda d: d.update(logits=d["logits"][:, 0]), "logits"),
        (lambda d: d.update(logits=d["logits"].long()), "logits"),
        (lambda d: d.update(logits=[["a"]]), "logits"),
        (lambda d: d["logits"].__setitem__((0, 0), float("nan")), "logits"),
        (lambda d: d.update(accepted=d["accepted"].float()), "accepted"),
        (lambda d: d.update(accepted=d["accepted"] > 0), "accepted"),
        (lambda d: d.update(accepted=d["accepted"][:-1]), "accepted"),
        (lambda d: d.update(accepted=d["accepted"][:, None]), "accepted"),
        (lambda d: d["accepted"].__setitem__(3, -1), "accepted"),
        (lambda d: d["accepted"].__setitem__(3, d["verified"][3] + 1), "accepted"),
        (lambda d: d["verified"].__setitem__(3, 4), "verified"),
        (lambda d: d.update(verified=d["verified"].double()), "verified"),
        (lambda d: d.update(grid=[1.0, 0.0]), "grid"),
        (lambda d: d.update(grid=[-2.0]), "grid"),
        (lambda d: d.update(grid=[float("inf")]), "grid"),
        (lambda d: d.update(grid=[]), "grid"),
    ],
)
def test_sts_bad_inputs_name_argument(change, name):
    d = _good()
    change(d)
    with pytest.raises((TypeError, ValueError), match=name):
        fit_sts(d["logits"], d["accepted"], d["verified"], d.get("grid"), min_rows=10)


# ----------------------------------------------------------------------------------------------------
# calibration_report
# ----------------------------------------------------------------------------------------------------


def slow_report(conf, accepted, verified, num_bins):
    """Cumulative survival per row by a loop, then per-position and pooled ECE / AUC by the slow helpers."""
    N, K = len(conf), len(conf[0])
    per = [([], []) for _ in range(K)]
    for n in range(N):
        a = 1.0
        for j in range(verified[n]):
            a *= conf[n][j]
            per[j][0].append(a)
            per[j][1].append(1 if accepted[n] > j else 0)
    pooled_p = [p for ps, _ in per for p in ps]
    pooled_y = [y for _, ys in per for y in ys]
    return {
        "ece": [slow_ece(p, y, num_bins) for p, y in per],
        "auc": [slow_auc(p, y) for p, y in per],
        "acceptance": [sum(y) / len(y) for _, y in per],
        "trials": [len(y) for _, y in per],
        "ece_overall": slow_ece(pooled_p, pooled_y, num_bins),
        "auc_overall": slow_auc(pooled_p, pooled_y),
    }


def _assert_report_equal(got, want):
    for key in ("ece", "auc", "acceptance"):
        assert got[key] == pytest.approx(want[key], rel=1e-9, abs=1e-12), key
    assert got["trials"] == want["trials"]
    assert got["ece_overall"] == pytest.approx(want["ece_overall"], rel=1e-9)
    assert got["auc_overall"] == pytest.approx(want["auc_overall"], rel=1e-9)


def test_report_matches_loop():
    logits, accepted, verified, _ = synthetic(300, s=[2.0, 0.5, 1.5], mu=[1.5, 1.0, 1.0], seed=7)
    conf = torch.sigmoid(logits.double())
    temps = torch.tensor([2.0, 0.5, 1.5])
    num_bins = 10
    rep = calibration_report(conf, accepted, verified, temperatures=temps, num_bins=num_bins)
    _assert_report_equal(rep, slow_report(conf.tolist(), accepted.tolist(), verified.tolist(), num_bins))
    after = torch.sigmoid(logits.double() / temps.double())
    _assert_report_equal(rep["after"], slow_report(after.tolist(), accepted.tolist(), verified.tolist(), num_bins))
    assert rep["temperatures"] == pytest.approx(temps.tolist())
    assert (rep["num_rows"], rep["num_positions"], rep["num_bins"]) == (300, 3, num_bins)
    # The same data as logits gives the same numbers.
    rep_l = calibration_report(logits, accepted, verified, is_logits=True, temperatures=temps, num_bins=num_bins)
    _assert_report_equal(rep_l["after"], rep["after"])
    assert "after" not in calibration_report(conf, accepted, verified)


def test_report_rejects_bad_inputs():
    logits, accepted, verified, _ = synthetic(50, s=[1.0, 1.0], mu=[1.0, 1.0], seed=8)
    with pytest.raises(ValueError, match="conf_or_logits.*is_logits=True"):
        calibration_report(logits, accepted, verified)  # logits outside [0, 1] passed as confidences
    conf = torch.sigmoid(logits)
    with pytest.raises(ValueError, match="temperatures"):
        calibration_report(conf, accepted, verified, temperatures=[1.0, 0.0])
    with pytest.raises(ValueError, match="temperatures"):
        calibration_report(conf, accepted, verified, temperatures=[1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="accepted"):
        calibration_report(conf, accepted[:-1], verified)


def test_reliability_plot(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    figures = []
    savefig = Figure.savefig

    def record(fig, *args, **kwargs):
        figures.append(fig)
        return savefig(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", record)
    logits, accepted, verified, _ = synthetic(2000, s=[2.0, 0.5, 1.5], mu=[1.5, 1.0, 1.0], seed=9)
    conf = torch.sigmoid(logits)
    for temps, curves in ((None, 2), ([2.0, 0.5, 1.5], 3)):  # perfect + before (+ after)
        path = tmp_path / f"rel-{curves}.png"
        calibration_report(conf, accepted, verified, temperatures=temps, plot=path)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        axes = figures[-1].axes
        assert len(axes) == 3  # one panel per position
        assert all(len(ax.lines) == curves for ax in axes)


def test_temperatures_json_round_trip(tmp_path):
    path = tmp_path / "t.json"
    save_temperatures(path, torch.tensor([0.5, 2.0]), auc=[float("nan"), 0.7])
    assert load_temperatures(path).tolist() == [0.5, 2.0]
    with pytest.raises(ValueError, match="temperatures"):
        save_temperatures(path, [1.0, -1.0])
    (tmp_path / "bad.json").write_text('{"temperatures": [1.0, 0.0]}')
    with pytest.raises(ValueError, match="bad.json"):
        load_temperatures(tmp_path / "bad.json")


# ----------------------------------------------------------------------------------------------------
# OnlineSTS, fed by the real AcceptanceStats
# ----------------------------------------------------------------------------------------------------


class Stream:
    """Decode steps of a drafter whose raw logits are z * s[j] (true conditional acceptance sigmoid(z)).

    The stats are fed what ``sts.stats_conf`` asks for: confidences at the current temperatures
    ("calibrated", computed before the step's refresh, as an engine does) or raw ones.
    """

    def __init__(self, K, seed=0, R=64):
        self.K, self.R = K, R
        self.g = torch.Generator().manual_seed(seed)

    def feed(self, stats, sts, s, steps, verify_lens=None):
        s = torch.tensor(s)
        refreshed = 0
        for _ in range(steps):
            z = torch.randn(self.R, self.K, generator=self.g) * 1.5 + 1.0
            passes = torch.rand(self.R, self.K, generator=self.g) < torch.sigmoid(z)
            L = torch.full((self.R,), self.K if verify_lens is None else verify_lens, dtype=torch.int32)
            passes &= torch.arange(self.K)[None, :] < L[:, None]
            num_accepted = torch.cumprod(passes.int(), 1).sum(1).int()
            T = sts.temperatures if sts.stats_conf == "calibrated" else None
            stats.update(av.confidence_from_logits((z * s).float(), T), L, num_accepted)
            refreshed += sts.step(stats)
        return refreshed


def _close(temps, truth, tol=0.15):
    return bool(((temps.double() / torch.tensor(truth) - 1).abs() < tol).all())


@pytest.mark.parametrize("stats_conf", ["calibrated", "raw"])
def test_online_sts_cold_start_and_convergence(stats_conf):
    K = 3
    stats, sts = av.AcceptanceStats(K), OnlineSTS(K, refresh_every=20, stats_conf=stats_conf)
    buf = sts.temperatures
    assert torch.equal(buf, torch.ones(K)) and buf.dtype == torch.float32
    stream = Stream(K, seed=0)
    assert stream.feed(stats, sts, [2.0, 0.6, 1.5], 19) == 0
    assert torch.equal(sts.temperatures, torch.ones(K))  # nothing happens between refreshes
    assert stream.feed(stats, sts, [2.0, 0.6, 1.5], 181) == 10
    assert _close(sts.temperatures, [2.0, 0.6, 1.5]), sts.temperatures
    assert sts.temperatures.data_ptr() == buf.data_ptr()  # updated in place (CUDA-graph friendly)


def test_online_sts_follows_drift():
    K = 3
    stats, sts = av.AcceptanceStats(K), OnlineSTS(K, refresh_every=20, decay=0.7)
    stream = Stream(K, seed=1)
    stream.feed(stats, sts, [2.0, 0.6, 1.5], 200)
    assert _close(sts.temperatures, [2.0, 0.6, 1.5]), sts.temperatures
    stream.feed(stats, sts, [0.6, 3.0, 1.0], 200)
    assert _close(sts.temperatures, [0.6, 3.0, 1.0]), sts.temperatures
    # A reset of the stats between refreshes is detected (no negative counts) and the fit keeps working.
    stats.reset()
    stream.feed(stats, sts, [1.0, 1.0, 4.0], 200)
    assert _close(sts.temperatures, [1.0, 1.0, 4.0]), sts.temperatures


def test_online_sts_merges_old_windows():
    K = 2
    stats, sts = av.AcceptanceStats(K), OnlineSTS(K, refresh_every=10, max_windows=2)
    Stream(K, seed=3).feed(stats, sts, [3.0, 0.5], 300)
    assert _close(sts.temperatures, [3.0, 0.5]), sts.temperatures


def test_online_sts_raw_counts_biased_for_strong_overconfidence():
    # The documented limitation of fitting raw (uncalibrated) bins: T = 4 comes out well below 4 ...
    K = 1
    stats, sts = av.AcceptanceStats(K), OnlineSTS(K, refresh_every=20, stats_conf="raw")
    Stream(K, seed=4).feed(stats, sts, [4.0], 200)
    assert 1.5 < float(sts.temperatures[0]) < 4.0 * 0.85
    # ... which calibrated counts (the default) do not suffer from.
    stats, sts = av.AcceptanceStats(K), OnlineSTS(K, refresh_every=20)
    Stream(K, seed=4).feed(stats, sts, [4.0], 200)
    assert _close(sts.temperatures, [4.0]), sts.temperatures


def test_online_sts_warm_start():
    K = 2
    sts = OnlineSTS(K, refresh_every=10, initial=torch.tensor([2.5, 0.5]))
    assert sts.temperatures.tolist() == [2.5, 0.5] and sts.temperatures.dtype == torch.float32
    stats = av.AcceptanceStats(K)
    Stream(K, seed=5).feed(stats, sts, [3.0, 0.5], 200)
    assert _close(sts.temperatures, [3.0, 0.5]), sts.temperatures
    with pytest.raises(ValueError, match="initial"):
        OnlineSTS(K, initial=[1.0, 0.0])


def test_online_sts_keeps_temperature_without_trials():
    K = 3
    stats, sts = av.AcceptanceStats(K), OnlineSTS(K, refresh_every=10, min_trials=200)
    Stream(K, seed=2).feed(stats, sts, [2.0, 0.6, 1.5], 50, verify_lens=1)  # only position 0 is ever verified
    assert sts.temperatures[1:].tolist() == [1.0, 1.0]
    assert _close(sts.temperatures[:1], [2.0])


def test_online_sts_bad_arguments():
    with pytest.raises(ValueError, match="stats"):
        OnlineSTS(3).refresh(av.AcceptanceStats(4))
    with pytest.raises(TypeError, match="stats"):
        OnlineSTS(3).refresh(object())
    with pytest.raises(ValueError, match="decay"):
        OnlineSTS(3, decay=1.5)
    with pytest.raises(ValueError, match="refresh_every"):
        OnlineSTS(3, refresh_every=0)
    with pytest.raises(ValueError, match="grid"):
        OnlineSTS(3, grid=[0.0, 1.0])
    with pytest.raises(ValueError, match="stats_conf"):
        OnlineSTS(3, stats_conf="calibrate")


def test_sizes_that_allocate_are_bounded():
    """Issue 16: every size that drives host work or allocation has a documented bound checked before any work
    (a grid of 10**9 temperatures, 2**40 bins or positions would allocate in proportion)."""
    from adaptive_verify.calibration.metrics import default_grid

    with pytest.raises(ValueError, match="^grid points must be an int in"):
        default_grid(0.1, 1.0, 10**9)
    with pytest.raises(ValueError, match="^grid must contain at most"):
        OnlineSTS(3, grid=torch.linspace(0.1, 10.0, 100_001))
    with pytest.raises(ValueError, match="^num_bins must be an int in"):
        expected_calibration_error(torch.rand(10, dtype=torch.float64), torch.randint(0, 2, (10,)), 2**40)
    with pytest.raises(ValueError, match="^num_positions must be an int in"):
        OnlineSTS(2**40)
    with pytest.raises(ValueError, match="^device"):
        OnlineSTS(3, device="foo")
    # numbers too large for a float are ValueErrors naming the argument, not Python's OverflowError
    with pytest.raises(ValueError, match="^min_trials"):
        OnlineSTS(3, min_trials=10**400)
    with pytest.raises(ValueError, match="^grid"):
        default_grid(0.1, 10**400, 5)
