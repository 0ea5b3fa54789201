"""The simulator and `adaptive-verify sweep`: it runs the library's planner, its limits behave as they
must, the bundled default reproduces the published qualitative findings, and the CLI keeps its promises."""
import dataclasses
import json

import numpy as np
import pytest

import adaptive_verify as av
from adaptive_verify import cli
from adaptive_verify.sim import (Profile, get_profile, parse_policy, pareto_frontier, profile_dict, simulate, sweep)


def flat_profile(verify_ms, *, head_noise=0.0, draft_ms=0.0, capacity=4096, K=4, overhead="none"):
    """A test deployment; no adaptive overhead unless asked, since these tests are about the planner's choices."""
    d = profile_dict("dsv4-pro-8xb300")
    d["adaptive_overhead"] = overhead
    d["cost"] = {"table": {"format_version": 1, "verify_ms": verify_ms, "draft_ms": draft_ms, "graph_sizes": [],
                           "max_tokens": capacity, "metadata": {}}}
    d["acceptance"]["head_noise"] = head_noise
    d["acceptance"]["conditional"] = d["acceptance"]["conditional"][:K]
    d["drafter"] = {"num_drafts": K, "kind": "block"}
    return Profile.from_dict(d)


@pytest.fixture(scope="module")
def default_sweep():
    return sweep()  # the README's main job: bundled default profile, default settings


class _Recording(av.AdaptiveVerifier):
    """The verifier, recording the per-step calls the simulator makes (and optionally verifying nothing)."""
    calls: list = []
    zero = False

    def add_request(self, req_indices):
        type(self).calls.append("add_request")
        return super().add_request(req_indices)

    def plan_budget(self, *a, **kw):
        type(self).calls.append("plan_budget")
        budget, padded = super().plan_budget(*a, **kw)
        return (0, padded) if type(self).zero else (budget, padded)

    def plan_draft(self, *a, **kw):
        depth, budget, padded = super().plan_draft(*a, **kw)
        type(self).calls.append("plan_draft" if depth else "plan_draft (depth 0)")
        return (depth, 0, padded) if type(self).zero else (depth, budget, padded)

    def plan_tree_draft(self, *a, **kw):
        depth, width, budget, padded = super().plan_tree_draft(*a, **kw)
        type(self).calls.append("plan_tree_draft" if depth else "plan_tree_draft (depth 0)")
        return (depth, width, 0, padded) if type(self).zero else (depth, width, budget, padded)

    def record_confidence(self, *a, **kw):
        type(self).calls.append("record_confidence")
        return super().record_confidence(*a, **kw)

    def plan(self, *a, **kw):
        type(self).calls.append("plan")
        return super().plan(*a, **kw)

    def observe(self, *a, **kw):
        type(self).calls.append("observe")
        return super().observe(*a, **kw)


@pytest.mark.parametrize("policy", ["lagged", "tree-lagged"])
def test_simulator_runs_the_engine_per_step_path(monkeypatch, policy):
    """Adaptive policies go through AdaptiveVerifier with an engine's calls in an engine's order, and what it
    decides is what the simulator verifies (a verifier whose budget is 0 makes every step verify nothing)."""
    from adaptive_verify.sim import engine as sim_engine

    prof = get_profile("llama3-70b-8xh200")
    honest = simulate(prof, parse_policy(policy, 4), 16, steps=60, seed=3)
    monkeypatch.setattr(sim_engine, "AdaptiveVerifier", _Recording)
    _Recording.calls = []
    same = simulate(prof, parse_policy(policy, 4), 16, steps=60, seed=3)
    nan = [k for k, x in honest.items() if x != x]  # NaN is never equal to itself
    assert {k: x for k, x in same.items() if k not in nan} == {k: x for k, x in honest.items() if k not in nan}
    assert all(same[k] != same[k] for k in nan)  # recording changes nothing
    calls = _Recording.calls
    # A chain policy decides the draft depth with its budget (plan_draft), a tree policy its depth, width and budget
    # (plan_tree_draft: the profile's drafter drafts level by level).
    steps = [i for i, c in enumerate(calls) if c.startswith(("plan_budget", "plan_draft", "plan_tree_draft"))]
    assert len(steps) >= 100  # one per step with decodes (warmup 100 + 60 measured, a few without decodes)
    for i in steps:  # each step: budget on the host, confidences recorded, then the plan (nothing at depth 0 for
        if calls[i] != "plan_draft (depth 0)":  # a chain; a tree step of depth 0 records and plans no nodes)
            assert calls[i + 1:i + 3] == ["record_confidence", "plan"], calls[i - 2:i + 4]
    assert "add_request" in calls  # finished requests are replaced by new ones in their slots
    if policy == "lagged":
        assert {calls[i] for i in steps} <= {"plan_draft", "plan_draft (depth 0)"}
    else:
        assert {calls[i] for i in steps} <= {"plan_tree_draft", "plan_tree_draft (depth 0)"}
    # every drafting step's outcomes feed the per-depth statistics (and the measured ones the head's figures)
    assert calls.count("observe") == calls.count("plan") >= 100
    _Recording.calls, _Recording.zero = [], True
    try:
        broken = simulate(prof, parse_policy(policy, 4), 16, steps=60, seed=3)
    finally:
        _Recording.zero = False
    assert honest["verified_per_step"] > 1.0
    assert broken["verified_per_step"] == 0.0 and broken["emitted_per_step"] == 1.0
    assert broken["tokens_per_s"] < 0.8 * honest["tokens_per_s"]


def test_perfect_head_and_flat_cost_make_adaptive_equal_fixed_K():
    prof = flat_profile([[1, 10.0], [4096, 10.0]], head_noise=0.0)
    for c in (1, 8, 64):
        fixed = simulate(prof, parse_policy("k4", 4), c, steps=80, seed=1)
        for pol in ("greedy", "global"):  # same draws, same decisions: identical numbers
            adaptive = simulate(prof, parse_policy(pol, 4), c, steps=80, seed=1)
            assert adaptive["verified_per_step"] == pytest.approx(fixed["verified_per_step"], abs=1e-12), (pol, c)
            assert adaptive["tokens_per_s"] == pytest.approx(fixed["tokens_per_s"], rel=1e-12), (pol, c)
        # lagged takes the previous step's budget: short only where the previous step drafted fewer
        # (a request near its end, or just admitted)
        lagged = simulate(prof, parse_policy("lagged", 4), c, steps=80, seed=1)
        assert lagged["tokens_per_s"] == pytest.approx(fixed["tokens_per_s"], rel=0.02), c


def test_steep_cost_adaptive_never_far_below_no_speculation():
    # Every token costs 1 ms and nothing is fixed: speculation cannot pay, no speculation is cheapest.
    prof = flat_profile([[1, 1.0], [4096, 4096.0]], head_noise=0.5)
    for c in (1, 16, 128):
        none = simulate(prof, parse_policy("none", 4), c, steps=150, seed=2)
        k4 = simulate(prof, parse_policy("k4", 4), c, steps=150, seed=2)
        assert k4["tokens_per_s"] < 0.97 * none["tokens_per_s"]  # the cost really is steep: speculation loses
        for pol in ("greedy", "lagged"):
            adaptive = simulate(prof, parse_policy(pol, 4), c, steps=150, seed=2)
            assert adaptive["tokens_per_s"] >= 0.97 * none["tokens_per_s"], (pol, c, adaptive, none)


def test_default_profile_reproduces_the_published_findings(default_sweep):
    res = default_sweep
    cs = res.concurrencies()
    fixed = [p for p in res.policies() if p.startswith("k")]
    assert fixed == [f"k{k}" for k in range(1, 8)] and cs[0] == 1 and cs[-1] == 256
    tput = lambda p, c: res.get(p, c)["tokens_per_s"]  # noqa: E731
    for pol in ("greedy", "lagged"):
        # c = 1: adaptive within 3% of the best fixed k
        assert tput(pol, 1) >= 0.97 * max(tput(k, 1) for k in fixed), pol
        # c = 256: above every fixed k and above no speculation
        assert tput(pol, 256) > max(tput(k, 256) for k in fixed), pol
        assert tput(pol, 256) > tput("none", 256), pol
        # on the frontier at every concurrency: no fixed-k point beats it on both axes by more than 2%
        for c in cs:
            a = res.get(pol, c)
            for r in res.rows:
                if r["policy"] in fixed:
                    assert not (r["tokens_per_s"] > 1.02 * a["tokens_per_s"]
                                and r["user_tokens_per_s"] > 1.02 * a["user_tokens_per_s"]), (pol, c, r)
    # Fixed k = 7 falls below no speculation at high concurrency; adaptive does not.
    assert tput("k7", 256) < tput("none", 256)


def test_same_seed_same_numbers_other_seed_other_numbers():
    kw = dict(concurrency=[1, 16], policies=["none", "k3", "greedy", "lagged"], steps=40)
    a, b = sweep(seed=5, **kw), sweep(seed=5, **kw)
    assert json.dumps(a.rows) == json.dumps(b.rows)  # (NaN head figures of non-adaptive rows compare equal)
    c = sweep(seed=6, **kw)
    assert [r["tokens_per_s"] for r in c.rows] != [r["tokens_per_s"] for r in a.rows]


def test_pareto_frontier():
    rows = [dict(tokens_per_s=t, user_tokens_per_s=u) for t, u in [(10, 1), (5, 5), (1, 10), (4, 4), (10, 1)]]
    assert pareto_frontier(rows) == [0, 1, 2, 4]


def test_cli_writes_the_promised_files(tmp_path, capsys):
    out = tmp_path / "sw"
    rc = cli.main(["sweep", "--concurrency", "1,8", "--policies", "none,k2,greedy", "--steps", "30", "--quiet",
                   "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "greedy" in printed and "c=8" in printed
    for name in ("sweep.csv", "sweep.json", "sweep.png"):
        assert (out / name).stat().st_size > 0
    import matplotlib.image

    img = matplotlib.image.imread(str(out / "sweep.png"))
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    data = json.loads((out / "sweep.json").read_text())
    assert len(data["rows"]) == 6 and data["settings"]["steps"] == 30
    lines = (out / "sweep.csv").read_text().strip().splitlines()
    assert len(lines) == 7 and lines[0].startswith("policy,concurrency,tokens_per_s")


def test_cli_profiles_lists_the_bundled_ones(capsys):
    assert cli.main(["profiles"]) == 0
    out = capsys.readouterr().out
    assert "dsv4-pro-8xb300" in out and "llama3-70b-8xh200" in out


def test_cli_user_cost_table_and_acceptance(tmp_path, capsys):
    ct = av.CostTable.from_points({1: 5.0, 64: 6.0, 1024: 20.0}, draft_ms=0.5, max_tokens=1024)
    ct.to_json(tmp_path / "ct.json")
    (tmp_path / "acc.json").write_text(json.dumps({
        "acceptance": {"conditional": [0.8, 0.7, 0.6]}, "drafter": {"num_drafts": 3}}))
    rc = cli.main(["sweep", "--cost-table", str(tmp_path / "ct.json"), "--acceptance", str(tmp_path / "acc.json"),
                   "--concurrency", "4", "--steps", "20", "--quiet", "--no-plot", "--out", str(tmp_path / "o")])
    assert rc == 0
    assert (tmp_path / "o" / "sweep.csv").exists() and not (tmp_path / "o" / "sweep.png").exists()
    assert "k3" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--profile", "no-such-profile"], "unknown profile 'no-such-profile'"),
    (["--concurrency", "0,4"], "--concurrency values must be >= 1"),
    (["--concurrency", "-3"], "--concurrency values must be >= 1"),
    (["--concurrency", "a,b"], "comma-separated list of ints"),
    (["--policies", "k9"], "unknown policy 'k9'"),
    (["--steps", "0"], "--steps must be >= 1"),
    (["--cost-table", "x.json"], "--cost-table and --acceptance go together"),
])
def test_cli_errors(argv, message, capsys, tmp_path):
    assert cli.main(["sweep", "--quiet", "--out", str(tmp_path / "o")] + argv) == 1
    assert message in capsys.readouterr().err


def test_cli_malformed_json_names_the_missing_key(tmp_path, capsys):
    d = profile_dict("dsv4-pro-8xb300")
    del d["acceptance"]["conditional"]
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(d))
    assert cli.main(["sweep", "--profile", str(p), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "missing key 'conditional'" in err and "bad.json" in err
    p.write_text("{not json")
    assert cli.main(["sweep", "--profile", str(p), "--quiet"]) == 1
    assert "not valid JSON" in capsys.readouterr().err
    ct = av.CostTable.from_points({1: 5.0}, max_tokens=64)
    ct.to_json(tmp_path / "ct.json")
    (tmp_path / "acc.json").write_text(json.dumps({"acceptance": {"conditional": [0.8]}}))
    assert cli.main(["sweep", "--cost-table", str(tmp_path / "ct.json"), "--acceptance",
                     str(tmp_path / "acc.json"), "--quiet"]) == 1
    assert "missing key 'drafter'" in capsys.readouterr().err


def test_api_errors():
    prof = get_profile("dsv4-pro-8xb300")
    with pytest.raises(ValueError, match="unknown profile"):
        get_profile("nope")
    with pytest.raises(ValueError, match="concurrency values must be ints >= 1"):
        sweep(concurrency=[0])
    with pytest.raises(ValueError, match="exceeds the profile's token capacity"):
        sweep(concurrency=[prof.capacity + 1])
    with pytest.raises(ValueError, match="concurrency must be an int >= 1"):
        simulate(prof, parse_policy("none", 7), -1)
    with pytest.raises(ValueError, match="unknown policy"):
        parse_policy("k0", 7)
    d = profile_dict("dsv4-pro-8xb300")
    d["acceptance"]["conditional"] = [0.9, 1.5]
    with pytest.raises(ValueError, match=r"acceptance.conditional\[1\]"):
        Profile.from_dict(d)
    d = profile_dict("dsv4-pro-8xb300")
    del d["cost"]["table"]["max_tokens"]
    with pytest.raises(ValueError, match="max_tokens"):
        Profile.from_dict(d)


def test_acceptance_model_matches_its_definition():
    """Emitted tokens per step under fixed k equal 1 + the model's expected survival sum (Monte Carlo)."""
    prof = flat_profile([[1, 10.0], [4096, 10.0]], K=4)
    a = prof.acceptance
    rng = np.random.default_rng(0)
    mu = np.log(a.conditional) - np.log1p(-np.asarray(a.conditional))
    z = mu + rng.normal(0, a.request_sigma, (400000, 1)) + rng.normal(0, a.token_sigma, (400000, 4))
    expected = 1 + np.cumprod(1 / (1 + np.exp(-z)), axis=1).sum(axis=1).mean()
    # Long outputs so the end-of-request cap barely matters; many requests for the difficulty spread.
    d = prof.to_dict()
    d["workload"] = {"prompt_len": 8, "output_len": [4000, 4000]}
    got = simulate(Profile.from_dict(d), parse_policy("k4", 4), 256, steps=200, seed=0)["emitted_per_step"]
    assert got == pytest.approx(expected, rel=0.03)


def test_bundled_profiles_round_trip_and_run():
    for name in ("dsv4-pro-8xb300", "llama3-70b-8xh200"):
        prof = get_profile(name)
        again = Profile.from_dict(json.loads(json.dumps(prof.to_dict())))
        # (the dicts, so that a failure shows the fields that differ: a CI run of 2026-12-03 failed here once)
        assert again.cost_table.to_dict() == prof.cost_table.to_dict(), name
        assert again.cost_table == prof.cost_table and again.acceptance == prof.acceptance
        r = simulate(prof, parse_policy("greedy", prof.drafter.num_drafts), 8, steps=20)
        assert r["tokens_per_s"] > 0 and np.isfinite(r["tpot_ms"])


def test_head_quality_is_configurable_and_reported():
    """head_noise lowers the head's AUC, head_temperature != 1 raises its calibration error; fixed k has none."""
    def run(**acc):
        d = profile_dict("dsv4-pro-8xb300")
        d["acceptance"].update(acc)
        return simulate(Profile.from_dict(d), parse_policy("greedy", 7), 32, steps=150, seed=4)

    sharp, noisy = run(head_noise=0.0), run(head_noise=2.0)
    assert sharp["head_auc"] > noisy["head_auc"] + 0.08
    assert sharp["head_ece"] < 0.02
    assert run(head_noise=0.0, head_temperature=3.0)["head_ece"] > 3 * sharp["head_ece"] + 0.03
    fixed = simulate(get_profile("dsv4-pro-8xb300"), parse_policy("k3", 7), 8, steps=20)
    assert np.isnan(fixed["head_auc"]) and np.isnan(fixed["head_ece"])


def test_roofline_tensor_parallel_scales_bandwidth_and_flops():
    d = profile_dict("llama3-70b-8xh200")
    r = d["cost"]["roofline"]
    assert r["tensor_parallel"] == 8
    tp8 = Profile.from_dict(d).cost_table
    r.update(hbm_gbps=r["hbm_gbps"] * 8, tflops=r["tflops"] * 8, tensor_parallel=1)
    tp1 = Profile.from_dict(d).cost_table
    for n in (1, 64, 512, 4096):
        assert tp8.verify_cost(n) == pytest.approx(tp1.verify_cost(n))
    assert tp8.metadata["tensor_parallel"] == 8
    r["tensor_parallel"] = 0
    with pytest.raises(ValueError, match="tensor_parallel"):
        Profile.from_dict(d)


# ----------------------------------------------------------------------------------------------------------
# The adaptive path's overhead, the per-request step term, several seeds
# ----------------------------------------------------------------------------------------------------------


def test_overhead_presets_are_the_measured_kernel_times():
    from adaptive_verify.sim.overhead import OVERHEAD_PRESETS, Overhead

    dev, host, none = OVERHEAD_PRESETS["device"], OVERHEAD_PRESETS["host"], OVERHEAD_PRESETS["none"]
    # H200: planner 6.0 us at R = 1, 42 us at R = 256; confidence head 9.0 us at R = 256; one more launch 1 us
    assert dev.cost(1) == pytest.approx(0.007 + 0.000176, rel=0.01)
    assert dev.cost(256) == pytest.approx((42 + 9 + 1) / 1000, rel=1e-9)
    assert host.cost(256) == pytest.approx(dev.cost(256) + 0.2, rel=1e-12)
    assert none.cost(256) == 0.0 and dev.cost(0) == host.cost(0) == 0.0  # nothing planned, nothing paid
    assert get_profile("dsv4-pro-8xb300").overhead == dev  # a profile without the key: device
    d = profile_dict("dsv4-pro-8xb300")
    d["adaptive_overhead"] = {"fixed_ms": 0.5, "per_request_ms": 0.01}
    prof = Profile.from_dict(json.loads(json.dumps(Profile.from_dict(d).to_dict())))
    assert prof.overhead == Overhead(0.5, 0.01) and prof.overhead.cost(10) == pytest.approx(0.6)
    for bad, match in [("gpu", "unknown overhead preset 'gpu'"), ({"fixed_ms": 0.1}, "missing key 'per_request_ms'"),
                       ({"fixed_ms": -1, "per_request_ms": 0}, "fixed_ms must be a finite number"),
                       ({"fixed_ms": 0, "per_request_ms": 0, "x": 1}, r"unknown keys \['x'\]"), (3, "preset name")]:
        d["adaptive_overhead"] = bad
        with pytest.raises(ValueError, match=match):
            Profile.from_dict(d)


def test_overhead_is_charged_to_adaptive_steps_only_and_exactly():
    """The planner does not see the overhead, so decisions and tokens are the same under every preset; each
    adaptive step with R decodes takes overhead.cost(R) longer, fixed k and none pay nothing."""
    from adaptive_verify.sim.overhead import OVERHEAD_PRESETS

    base = flat_profile([[1, 5.0], [4096, 6.0]], head_noise=0.5)
    runs = {}
    for name, o in OVERHEAD_PRESETS.items():
        prof = dataclasses.replace(base, overhead=o)
        for pol in ("k2", "none", "lagged", "greedy"):
            trace = []
            runs[name, pol] = (simulate(prof, parse_policy(pol, 4), 8, steps=60, seed=2, trace=trace), trace)
    for pol in ("k2", "none"):
        assert json.dumps(runs["host", pol][0]) == json.dumps(runs["none", pol][0]) == json.dumps(runs["device", pol][0])
    for pol in ("lagged", "greedy"):
        free, trace = runs["none", pol]
        for name in ("device", "host"):
            paid = runs[name, pol][0]
            assert paid["emitted_per_step"] == free["emitted_per_step"]
            extra_ms = sum(OVERHEAD_PRESETS[name].cost(R) for R, *_ in trace)
            assert 1000 * paid["simulated_s"] == pytest.approx(1000 * free["simulated_s"] + extra_ms, rel=1e-12)
        assert runs["host", pol][0]["tokens_per_s"] < runs["device", pol][0]["tokens_per_s"] < free["tokens_per_s"]


def test_step_time_includes_the_per_request_term():
    d = profile_dict("dsv4-pro-8xb300")
    d["cost"]["table"].update(format_version=3, request_ms=0.05)
    prof = Profile.from_dict(d)
    ct = prof.cost_table
    for pol in ("none", "k3"):
        trace = []
        r = simulate(prof, parse_policy(pol, 7), 16, steps=50, seed=1, trace=trace)
        want = sum(f * ct.draft_cost(R) + 0.05 * R + ct.verify_cost(n) for R, n, f, *_ in trace)
        assert 1000 * r["simulated_s"] == pytest.approx(want, rel=1e-12)
        assert sum(t for _, _, _, t, *_ in trace) == pytest.approx(r["tokens_per_s"] * r["simulated_s"], rel=1e-9)


def test_sweep_seeds_report_mean_and_spread():
    kw = dict(concurrency=[4], policies=["none", "k2", "lagged"], steps=30)
    many = sweep(seed=3, seeds=3, **kw)
    single = [sweep(seed=s, **kw) for s in (3, 4, 5)]
    for i, row in enumerate(many.rows):
        vals = [one.rows[i]["tokens_per_s"] for one in single]
        assert row["seeds"] == 3 and row["steps"] == 30 * 4
        assert row["tokens_per_s"] == pytest.approx(np.mean(vals), rel=1e-12)
        assert row["tokens_per_s_sd"] == pytest.approx(np.std(vals, ddof=1), rel=1e-9)
        assert row["tpot_ms"] == pytest.approx(np.mean([one.rows[i]["tpot_ms"] for one in single]), rel=1e-12)
    assert "+-" in many.table() and "over 3 seeds" in many.table()
    assert single[0].rows[0]["seeds"] == 1 and np.isnan(single[0].rows[0]["tokens_per_s_sd"])
    assert "+-" not in single[0].table()
    assert many.settings["seeds"] == 3 and many.settings["adaptive_overhead"] == "device"
    with pytest.raises(ValueError, match="seeds must be an int >= 1"):
        sweep(seeds=0, **kw)
    with pytest.raises(ValueError, match="unknown overhead preset"):
        sweep(overhead="gpu", **kw)


def test_cli_overhead_and_seeds(tmp_path, capsys):
    out = tmp_path / "o"
    common = ["sweep", "--concurrency", "2", "--policies", "k7,lagged", "--steps", "20", "--quiet", "--no-plot"]
    assert cli.main(common + ["--overhead", "host", "--seeds", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "host: 207 us + 0.176 us per request" in printed and "over 2 seeds" in printed
    data = json.loads((out / "sweep.json").read_text())
    assert data["settings"]["adaptive_overhead"] == "host" and data["profile"]["adaptive_overhead"] == "host"
    assert "tokens_per_s_sd" in (out / "sweep.csv").read_text().splitlines()[0]
    assert cli.main(common + ["--overhead", "none", "--out", str(out)]) == 0
    free = json.loads((out / "sweep.json").read_text())["rows"]
    assert cli.main(common + ["--overhead", "host", "--out", str(out)]) == 0
    one_host = json.loads((out / "sweep.json").read_text())["rows"]
    assert one_host[0]["tokens_per_s"] == free[0]["tokens_per_s"]  # k7: no overhead either way
    assert one_host[1]["tokens_per_s"] < free[1]["tokens_per_s"]  # lagged pays 0.2 ms more per step
    capsys.readouterr()
    assert cli.main(common + ["--overhead", "gpu"]) == 1
    assert "--overhead must be one of device, host, none" in capsys.readouterr().err
    assert cli.main(common + ["--seeds", "0"]) == 1
    assert "--seeds must be >= 1" in capsys.readouterr().err
