"""The simulator's latency targets (policy slo<ms>) and priority classes (workload.priority): the step-time cap
holds on every step the planner can keep under it, a cap that never binds changes nothing, weights move TPOT
between the classes, weight 1 changes nothing, and bad values are named."""
import dataclasses
import json

import numpy as np
import pytest

from adaptive_verify import cli
from adaptive_verify.sim import Priority, Profile, get_profile, parse_policy, profile_dict, simulate, sweep
from adaptive_verify.sim.engine import _Requests
from adaptive_verify.sim.overhead import overhead_preset

CLASS_KEYS = ("tpot_ms_high", "tpot_ms_low", "tokens_per_s_high", "tokens_per_s_low")


def with_priority(profile: Profile, fraction: float, weight: float) -> Profile:
    return dataclasses.replace(profile, workload=dataclasses.replace(profile.workload,
                                                                     priority=Priority(fraction, weight)))


def step_ms(profile: Profile, R: int, n: int, factor: float) -> float:
    """What the simulator charges an adaptive step (engine.py, step 4), from its trace record."""
    ct = profile.cost_table
    return factor * ct.draft_cost(R) + ct.request_ms * R + ct.verify_cost(n) + profile.overhead.cost(R)


def test_parse_slo_policy():
    p = parse_policy("slo40", 7)
    assert (p.kind, p.mode, p.max_step_ms, p.name) == ("adaptive", "lagged", 40.0, "slo40")
    assert parse_policy("slo37.5", 7).max_step_ms == 37.5
    assert parse_policy("lagged", 7).max_step_ms is None and parse_policy("greedy", 7).mode == "greedy"
    with pytest.raises(ValueError, match=r"policy 'slo0': the step-time target \(ms\) must be > 0"):
        parse_policy("slo0", 7)
    for bad in ("slo", "slo-5", "slo4ms", "SLO40"):
        with pytest.raises(ValueError, match=f"unknown policy '{bad}'.*slo<ms>"):
            parse_policy(bad, 7)


@pytest.mark.parametrize("c, target", [(16, 15.0), (64, 40.0), (256, 40.0)])
def test_slo_never_charges_a_step_above_the_target_when_b_min_allows(c, target):
    """The host preset's 0.2 ms per step is not in the cost table: the target only holds if the simulator
    leaves room for it. Lagged, on the same draws, goes over the target on steps the cap keeps under it."""
    prof = dataclasses.replace(get_profile("dsv4-pro-8xb300"), overhead=overhead_preset("host"))
    runs = {}
    for pol in (f"slo{target:g}", "lagged"):
        trace = []
        r = simulate(prof, parse_policy(pol, 7), c, steps=40, warmup=20, seed=1, trace=trace)
        times = [step_ms(prof, R, n, f) for R, n, f, *_ in trace]
        assert r["longest_step_ms"] == pytest.approx(max(times), rel=1e-12)
        assert r["p99_step_ms"] == pytest.approx(np.percentile(times, 99), rel=1e-12)
        runs[pol] = trace
    capped, over_for_lagged, near = 0, 0, 0
    for (R, n, f, _, _, prompt), lag in zip(runs[f"slo{target:g}"], runs["lagged"]):
        b_min_ms = step_ms(prof, R, R + prompt, f)  # the decodes and prompt chunks, no draft verified
        ms = step_ms(prof, R, n, f)
        if b_min_ms > target:
            assert n == R + prompt  # nothing fits under the target: verify nothing
            continue
        capped += 1
        assert ms <= target * (1 + 1e-6), (R, n, prompt, ms)  # the planner sums in float32
        near += ms > target - 2.0
        over_for_lagged += step_ms(prof, lag[0], lag[1], lag[2]) > target
    assert capped >= 10 and near >= 5  # the cap was reachable and it bound
    assert over_for_lagged >= 5


@pytest.mark.parametrize("priority", [None, (0.3, 3.0)])
def test_slo_with_an_unreachable_target_equals_lagged_exactly(priority):
    prof = get_profile("dsv4-pro-8xb300")
    if priority:
        prof = with_priority(prof, *priority)
    for c in (4, 64):
        lagged = simulate(prof, parse_policy("lagged", 7), c, steps=40, seed=2)
        slo = simulate(prof, parse_policy("slo1000000", 7), c, steps=40, seed=2)
        assert slo.pop("policy") == "slo1000000" and lagged.pop("policy") == "lagged"
        assert json.dumps(slo) == json.dumps(lagged)


def test_tight_slo_lowers_step_time_and_speculation():
    prof = get_profile("dsv4-pro-8xb300")
    lagged = simulate(prof, parse_policy("lagged", 7), 64, steps=40, seed=0)
    tight = simulate(prof, parse_policy("slo30", 7), 64, steps=40, seed=0)
    assert tight["mean_step_ms"] < lagged["mean_step_ms"] and tight["p99_step_ms"] < lagged["p99_step_ms"]
    assert tight["verified_per_step"] < 0.8 * lagged["verified_per_step"]


def test_priority_weight_lowers_the_high_class_tpot_when_the_budget_binds():
    """dsv4-pro-8xb300 at c=64: the cost climbs steeply past ~1k tokens per step, so the planner verifies
    a fraction of the drafts and the weights decide whose. Fixed k verifies everyone's drafts, so its
    classes differ by chance only."""
    base = get_profile("dsv4-pro-8xb300")
    ranked = with_priority(base, 0.25, 4.0)
    even = with_priority(base, 0.25, 1.0)
    for pol in ("lagged", "greedy", "slo40"):
        r = simulate(ranked, parse_policy(pol, 7), 64, steps=60, seed=0)
        assert r["tpot_ms_high"] < 0.8 * r["tpot_ms_low"], pol
        e = simulate(even, parse_policy(pol, 7), 64, steps=60, seed=0)
        assert r["tpot_ms_high"] < 0.8 * e["tpot_ms_high"], pol  # the weight, not the draw, made it faster
        assert abs(e["tpot_ms_high"] / e["tpot_ms_low"] - 1) < 0.1, pol
        assert r["tokens_per_s_high"] + r["tokens_per_s_low"] == pytest.approx(r["tokens_per_s"], rel=1e-12)
    k3 = simulate(ranked, parse_policy("k3", 7), 64, steps=60, seed=0)
    assert abs(k3["tpot_ms_high"] / k3["tpot_ms_low"] - 1) < 0.1
    # weights do not reach fixed k
    assert json.dumps(k3) == json.dumps(simulate(even, parse_policy("k3", 7), 64, steps=60, seed=0))


@pytest.mark.parametrize("pol", ["lagged", "greedy", "global", "slo40", "k3", "none"])
def test_weight_one_classes_equal_the_unclassed_run(pol):
    """Weights of 1 must leave every decision as it was (the planner's 'bit for bit'), and drawing classes
    must not move any other draw."""
    base = get_profile("dsv4-pro-8xb300")
    for c in (2, 64):
        plain = simulate(base, parse_policy(pol, 7), c, steps=30, seed=3)
        classed = simulate(with_priority(base, 0.4, 1.0), parse_policy(pol, 7), c, steps=30, seed=3)
        assert set(classed) - set(plain) == set(CLASS_KEYS)
        assert json.dumps({k: classed[k] for k in plain}) == json.dumps(plain)
        assert classed["tokens_per_s_high"] + classed["tokens_per_s_low"] == pytest.approx(plain["tokens_per_s"],
                                                                                            rel=1e-12)
        assert not set(CLASS_KEYS) & set(plain)


def test_classes_are_drawn_at_the_fraction_and_leave_other_draws_alone():
    base = get_profile("dsv4-pro-8xb300")
    plain = _Requests(base, 4000, seed=5)
    classed = _Requests(with_priority(base, 0.3, 2.0), 4000, seed=5)
    assert abs(classed.high.mean() - 0.3) < 4 * np.sqrt(0.3 * 0.7 / 4000)
    assert not plain.high.any()
    for name in ("target", "generated", "difficulty", "prefill_left"):
        np.testing.assert_array_equal(getattr(plain, name), getattr(classed, name))
    again = _Requests(with_priority(base, 0.3, 2.0), 4000, seed=5)
    np.testing.assert_array_equal(again.high, classed.high)
    other = _Requests(with_priority(base, 0.3, 2.0), 4000, seed=6)
    assert (other.high != classed.high).any()


def test_priority_values_are_checked_and_named():
    assert Priority.parse("0.2:4") == Priority(0.2, 4.0)
    for text, message in [("0.2", "priority must be FRACTION:WEIGHT"), ("0.2:4:1", "priority must be FRACTION:WEIGHT"),
                          ("a:4", "priority must be FRACTION:WEIGHT"), ("1:4", "priority.fraction must be < 1"),
                          ("0:4", "priority.fraction must be > 0.0"), ("0.2:0", "priority.weight must be > 0.0"),
                          ("0.2:nan", "priority.weight must be a finite number"),
                          ("0.2:inf", "priority.weight must be a finite number")]:
        with pytest.raises(ValueError, match=message):
            Priority.parse(text)
    with pytest.raises(ValueError, match=r"--priority '2:4': priority.fraction must be < 1"):
        Priority.parse("2:4", "--priority")
    with pytest.raises(TypeError, match="priority must be a str"):
        Priority.parse(0.2)
    with pytest.raises(TypeError, match="priority must be 'FRACTION:WEIGHT', a Priority or None"):
        sweep(concurrency=[2], policies=["none"], steps=5, priority=(0.2, 4))
    with pytest.raises(TypeError, match="workload.priority must be a Priority"):
        dataclasses.replace(get_profile("dsv4-pro-8xb300").workload, priority=(0.2, 4))
    d = profile_dict("dsv4-pro-8xb300")
    d["workload"]["priority"] = {"fraction": 0.2, "weight": -1}
    with pytest.raises(ValueError, match=r"workload.priority: priority.weight must be > 0.0, got -1"):
        Profile.from_dict(d)
    d["workload"]["priority"] = {"fraction": 0.2}
    with pytest.raises(ValueError, match="workload.priority: missing key 'weight'"):
        Profile.from_dict(d)
    d["workload"]["priority"] = {"fraction": 0.2, "weight": 2, "classes": 3}
    with pytest.raises(ValueError, match=r"workload.priority: unknown keys \['classes'\]"):
        Profile.from_dict(d)


def test_profile_json_round_trips_the_priority():
    d = profile_dict("dsv4-pro-8xb300")
    assert "priority" not in Profile.from_dict(d).to_dict()["workload"]  # profiles without classes unchanged
    d["workload"]["priority"] = {"fraction": 0.1, "weight": 5}
    prof = Profile.from_dict(d)
    assert prof.workload.priority == Priority(0.1, 5.0)
    assert Profile.from_dict(prof.to_dict()).to_dict() == prof.to_dict()


def test_sweep_reports_classes_in_table_csv_and_json(tmp_path, capsys):
    out = tmp_path / "o"
    argv = ["sweep", "--concurrency", "2,64", "--policies", "none,k3,lagged,slo40", "--steps", "20", "--quiet",
            "--out", str(out)]
    assert cli.main(argv + ["--priority", "0.25:4"]) == 0
    printed = capsys.readouterr().out
    assert "TPOT ms per priority class: high (fraction 0.25, weight 4) / low (weight 1)" in printed
    assert (out / "sweep.png").stat().st_size > 0  # slo policies have a style of their own
    data = json.loads((out / "sweep.json").read_text())
    assert data["settings"]["priority"] == {"fraction": 0.25, "weight": 4.0}
    assert data["profile"]["workload"]["priority"] == {"fraction": 0.25, "weight": 4.0}
    assert all(set(CLASS_KEYS) <= set(r) for r in data["rows"])
    header = (out / "sweep.csv").read_text().splitlines()[0].split(",")
    assert header[-4:] == list(CLASS_KEYS)
    slo = next(r for r in data["rows"] if r["policy"] == "slo40" and r["concurrency"] == 64)
    assert slo["tpot_ms_high"] < slo["tpot_ms_low"]

    assert cli.main(argv + ["--no-plot"]) == 0  # no classes: the files are as before
    assert "per priority class" not in capsys.readouterr().out
    assert "tpot_ms_high" not in (out / "sweep.csv").read_text()
    data = json.loads((out / "sweep.json").read_text())
    assert data["settings"]["priority"] is None and "tpot_ms_high" not in data["rows"][0]


def test_sweep_seeds_average_the_class_columns():
    kw = dict(concurrency=[64], policies=["lagged"], steps=20, priority="0.25:4")
    many = sweep(seed=0, seeds=2, **kw).rows[0]
    single = [sweep(seed=s, **kw).rows[0] for s in (0, 1)]
    for key in CLASS_KEYS:
        assert many[key] == pytest.approx(np.mean([r[key] for r in single]), rel=1e-12)


@pytest.mark.parametrize("argv, message", [
    (["--priority", "0.2"], "--priority must be FRACTION:WEIGHT (e.g. 0.2:4), got '0.2'"),
    (["--priority", "1.5:2"], "--priority '1.5:2': priority.fraction must be < 1"),
    (["--priority", "0.5:-2"], "--priority '0.5:-2': priority.weight must be > 0.0"),
    (["--policies", "slo0"], "policy 'slo0': the step-time target (ms) must be > 0"),
    (["--policies", "slo"], "unknown policy 'slo'"),
])
def test_cli_errors_name_the_argument(argv, message, capsys, tmp_path):
    assert cli.main(["sweep", "--quiet", "--concurrency", "2", "--steps", "5", "--out", str(tmp_path / "o")]
                    + argv) == 1
    assert message in capsys.readouterr().err
