"""Fuzz cases of the host-side API: CostTable (constructors, views, arrays, JSON), AdaptiveVerifier (a few steps of
a decode loop), MarginEstimator, the calibration tools, VerifyPlan.allocate and the error counters.

These have no kernel reference; valid cases check the documented invariants instead (a dense cost array holds
exactly float32 of the scalar costs, a shifted view prices n as base(n + x) - base(x) + base(0), a verifier's
plan is plan_verification's on the same inputs, a JSON round trip gives an equal table)."""
from __future__ import annotations

import json
import math
import os
import tempfile

import numpy as np
import torch

from .. import errors
from .. import reference as ref
from ..calibration import OnlineSTS, calibration_report, fit_sts, load_temperatures, save_temperatures
from ..calibration.metrics import auc, default_grid, expected_calibration_error
from ..cost import MAX_TOKENS_LIMIT, CostTable
from ..margin import MarginEstimator
from ..planner import VerifyPlan
from ..stats import AcceptanceStats
from ..verifier import AdaptiveVerifier
from .core import Case, Mismatch, same
from .tables import random_points, random_table
from .values import BOUNDARY_INTS, NON_INTS, NON_REALS, floats, int_arg, ints, maybe, pick, small_int


def _check_table(t: CostTable, rng) -> None:
    """Dense arrays equal the scalar costs rounded to float32; a shifted view is the base seen from its shift."""
    top = min(t.token_limit, 3000)
    arr = t.verify_array(top)
    ns = sorted({0, 1, top, *[int(x) for x in rng.integers(0, top + 1, size=20)]})
    for n in ns:
        if n < arr.shape[0] and arr[n].item() != float(np.float32(t.verify_cost(n))):
            raise Mismatch(f"verify_array[{n}] = {arr[n].item()!r} but float32(verify_cost) = "
                           f"{float(np.float32(t.verify_cost(n)))!r}")
    d = t.draft_array(64)
    for r in (0, 1, 7, 64):
        if d[r].item() != float(np.float32(t.draft_cost(r))):
            raise Mismatch(f"draft_array[{r}] differs from draft_cost")
    prev = -math.inf
    for n in range(0, top + 1, max(1, top // 50)):
        c = t.verify_cost(n)
        if not (math.isfinite(c) and c > 0 and c >= prev):
            raise Mismatch(f"verify_cost({n}) = {c!r} after {prev!r}: not positive, finite and non-decreasing")
        prev = c


def cost_table_case(rng) -> Case:
    r = rng.random()
    if r < 0.35:
        kind = "valid"
        table = random_table(rng)

        def call():
            t = table
            if maybe(rng, 0.5) and t.token_limit > 1:
                t = t.shifted(int(rng.integers(1, min(t.token_limit, 500))))
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "t.json")
                t.to_json(path)
                back = CostTable.from_json(path)
            return t, back

        def check(res):
            t, back = res
            _check_table(t, rng)
            _check_table(back, rng)
            if t.unshifted is t and back != t:
                raise Mismatch("a JSON round trip changed the table")
            # A shifted view is written as its curve sampled from n = 1 up to its largest sampled count (counts
            # start at 1, and past the last sample the written table extrapolates): compare it there.
            lo, hi = (0, min(t.token_limit, 5000)) if t.unshifted is t else \
                (1, min(max(n for n, _ in t.to_dict()["verify_ms"]), 5000))
            for n in range(lo, min(hi, back.token_limit) + 1, 97):
                if abs(back.verify_cost(n) - t.verify_cost(n)) > 1e-9 * max(1.0, t.verify_cost(n)):
                    raise Mismatch(f"the JSON round trip prices n={n} differently")
            if t.unshifted is not t:
                base, x = t.unshifted, t.shifted_by
                for n in sorted({0, min(1, t.token_limit), min(5, t.token_limit), t.token_limit}):
                    want = base.verify_cost(n + x) - base.verify_cost(x) + base.verify_cost(0)
                    if abs(t.verify_cost(n) - want) > 1e-9 * max(1.0, abs(want)):
                        raise Mismatch(f"shifted({x}).verify_cost({n}) = {t.verify_cost(n)!r}, want {want!r}")

        return Case(kind, call, check, what="table, shifted view, JSON round trip")
    if r < 0.75:
        return _table_adversarial(rng)
    return _json_adversarial(rng)


def _table_adversarial(rng) -> Case:
    verify = random_points(rng, 1000)
    kw = dict(verify_ms=verify, draft_ms=0.5, graph_sizes=(), max_tokens=None, metadata=None,
              draft_interpolation="staircase", request_ms=0.0)
    which = pick(rng, list(kw) + ["shifted", "verify_cost", "verify_array", "draft_cost", "fixed_cost",
                                  "profile_points", "roofline"])
    kind, names = "invalid", (which,)
    if which == "verify_ms":
        k = pick(rng, [0, -1, MAX_TOKENS_LIMIT + 1, 2**70, 1.5, "1", True])
        v = pick(rng, NON_REALS + (0.0, -1.0, 1e10, 1e-320, 2.0))
        shapes = [{k: 1.0}, {1: v}, {5: 1.0, 2: 1.0}, {}, [(1, 1.0)], None, "x", {1: 1.0, 2.5: 2.0}]
        i = int(rng.integers(0, len(shapes)))
        kw["verify_ms"] = shapes[i]
        # (compared by identity: v may be a tensor, whose == is elementwise)
        kind = "maybe" if i == 1 and type(v) is float and v == 2.0 else "invalid"
    elif which == "draft_ms":
        kw["draft_ms"] = pick(rng, [-0.1, float("nan"), 1e300, {}, {0: 1.0}, {1: -1.0}, "0", None, [1.0], True, 1e-320])
        kind = "maybe" if kw["draft_ms"] == 1e-320 else "invalid"
    elif which == "graph_sizes":
        kw["graph_sizes"] = pick(rng, [[0], [2, 1], [1, 1], [2**31], "12", 5, [1.0], [True], range(1, 10**9),
                                       np.array([1, 2]), [MAX_TOKENS_LIMIT + 1], [MAX_TOKENS_LIMIT]])
        kind = "maybe" if isinstance(kw["graph_sizes"], np.ndarray) or kw["graph_sizes"] == [MAX_TOKENS_LIMIT] \
            else "invalid"
        if isinstance(kw["graph_sizes"], range):
            kind, names = "invalid", ("graph_sizes",)
    elif which == "max_tokens":
        kw["max_tokens"], kind = int_arg(rng, 1, MAX_TOKENS_LIMIT, heavy=True, none_ok=True)
    elif which == "metadata":
        deep: object = 1
        for _ in range(int(pick(rng, [40, 2000, 100_000]))):
            deep = {"a": deep} if maybe(rng, 0.5) else [deep]
        kw["metadata"] = pick(rng, [{1: "x"}, {"a": float("nan")}, {"a": object()}, {"a": {1, 2}}, [("a", 1)], "m",
                                    {"a": deep}, {"a": b"bytes"}])
    elif which == "draft_interpolation":
        kw["draft_interpolation"] = pick(rng, ["cubic", "", None, 1, ["linear"], np.array(["linear"])])
    elif which == "request_ms":
        kw["request_ms"] = pick(rng, NON_REALS + (-1.0, 1e10))
    else:
        table = CostTable.from_points(**kw) if maybe(rng, 0.5) else \
            CostTable.from_points(**dict(kw, max_tokens=max(verify) + small_int(rng, 100)))
        arg, kind = int_arg(rng, 0, MAX_TOKENS_LIMIT, heavy=True)
        names = {"shifted": ("tokens",), "verify_cost": ("n",), "verify_array": ("max_n", "device"),
                 "draft_cost": ("r",), "fixed_cost": ("r",), "profile_points": ("max_tokens", "graph_sizes", "growth"),
                 "roofline": ("hbm_gbps", "tflops", "weight_bytes", "active_params", "kv_bytes_per_token",
                              "context_len", "overhead_ms", "max_tokens", "verify_ms", "token_counts")}[which]
        if which == "verify_array" and maybe(rng, 0.3):
            dev = pick(rng, ["meta", "foo", "cuda:7", 3, None, torch.device("meta")])
            return Case("maybe" if dev is None else "invalid", lambda: table.verify_array(10, dev), names=names,
                        what=f"verify_array(device={dev!r})")
        if which == "roofline":
            rk = dict(hbm_gbps=4800.0, tflops=990.0, weight_bytes=1.4e10, active_params=7e9, kv_bytes_per_token=1.3e5,
                      context_len=2048)
            key = pick(rng, list(rk) + ["overhead_ms", "max_tokens", "token_counts"])
            rk[key] = pick(rng, NON_REALS + (0, -1, 1e-300, 2**70, [1, 2], 1e30))
            return Case("maybe", lambda: CostTable.roofline(**rk), names=names + (key,), what=f"roofline {key}")
        if which == "profile_points":
            gs = pick(rng, [(), (1, 2, 4), [0], "x"])
            growth = pick(rng, [1.5, 1.0, float("nan"), 1e-9, 1e300, "2"])
            return Case("maybe", lambda: CostTable.profile_points(gs, arg, growth=growth), names=names,
                        what=f"profile_points({gs!r}, {arg!r}, growth={growth!r})")
        fn = getattr(table, which)
        return Case(kind if kind == "invalid" else "maybe", lambda: fn(arg), names=names, what=f"{which}({arg!r})")

    return Case(kind, lambda: CostTable.from_points(**kw), names=names + ("verify_ms",),
                what=f"from_points {which}=" + (type(kw[which]).__name__ if which == "metadata" else
                                                str(kw.get(which))[:60]))


def _json_adversarial(rng) -> Case:
    """Files a user might hand from_json / load_or_profile: truncated, deeply nested, huge numbers, wrong types."""
    good = random_table(rng).to_dict()
    variants = [
        "[" * 100_000 + "]" * 100_000, "{\"format_version\": 3", "", "null", "1e999", "\"x\"", "[]",
        json.dumps({**good, "format_version": 99}), json.dumps({**good, "max_tokens": 2**70}),
        json.dumps({**good, "max_tokens": MAX_TOKENS_LIMIT * 8}), json.dumps({**good, "verify_ms": [[1, 1e999]]}),
        json.dumps({**good, "verify_ms": [[2**80, 1.0]]}), json.dumps({**good, "verify_ms": [[1, "1"]]}),
        json.dumps({**good, "verify_ms": {"1": 1.0}}), json.dumps({**good, "extra": 1}),
        json.dumps({**good, "graph_sizes": list(range(1, 40000, 2))}), json.dumps({**good, "metadata": [1]}),
        json.dumps({**good, "draft_ms": [[1, -1]]}), json.dumps({**good, "request_ms": "0"}),
        json.dumps({**good, "metadata": {"a": "\ud800"}}), "\xff\xfe garbage", json.dumps(good),
    ]
    text = pick(rng, variants)
    kind = "valid" if text == json.dumps(good) else "invalid"

    def call():
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.json")
            with open(path, "w", encoding="utf-8", errors="surrogatepass") as f:
                f.write(text)
            if maybe(rng, 0.2):
                return CostTable.load_or_profile(path, lambda n: None, expect={"nothing": 1}, token_counts=[1, 2],
                                                 reps=1, warmup=0, device="cpu")
            return CostTable.from_json(path)

    # A valid file, or a list of graph sizes that is merely long, loads; load_or_profile reprofiles what it cannot
    # read (that is its contract), so its cases may succeed too.
    return Case("maybe" if kind == "invalid" else kind, call, names=("t.json", "path"), what=f"file {text[:40]!r}")


def verifier_case(rng) -> Case:
    """A few steps of a decode loop through AdaptiveVerifier, with one argument sometimes adversarial; valid steps'
    plans are checked against plan_verification's reference on the same survival and budget."""
    K = int(pick(rng, [1, 3, 8]))
    max_reqs = int(pick(rng, [1, 4, 16]))
    table = random_table(rng)
    mode = pick(rng, ["lagged", "greedy", "global", "all", "off"])
    ctor = dict(max_reqs=max_reqs, max_drafts=K, block_size=int(pick(rng, [1, 16])), mode=mode,
                min_verify=small_int(rng, K) if maybe(rng, 0.3) else 0, verification="onehot")
    bad = None
    if maybe(rng, 0.3):
        bad = pick(rng, ["max_reqs", "max_drafts", "block_size", "min_verify", "prior", "device", "mode", "graph_sizes",
                         "refresh_every", "online_calibration", "verification"])
        ctor[bad] = pick(rng, list(BOUNDARY_INTS[:6]) + list(NON_INTS[:6]) + ["meta", "foo", None, [0], 10**9])
    steps = int(rng.integers(1, 4))
    step_bad = None if bad or not maybe(rng, 0.4) else pick(rng, ["num_reqs", "drafts_host", "extra_tokens",
                                                                  "req_indices", "conf", "drafts", "budget",
                                                                  "padded_tokens", "verify_lens", "num_accepted",
                                                                  "weights"])
    checks = []

    def call():
        v = AdaptiveVerifier(table, **ctor)
        for _ in range(steps):
            R = int(rng.integers(0, min(max_reqs, v.capacity) + 1))
            extra = 0
            if maybe(rng, 0.3) and v.capacity - R > 0:
                extra = int(rng.integers(0, min(v.capacity - R, 50) + 1))
            drafts = ints(rng, 0, K, (R,))
            idx = torch.from_numpy(rng.permutation(max_reqs)[:R].astype(np.int64))
            conf = floats(rng, (R, K), 0.0, 1.0)
            # host priorities for the lagged budget (plan_budget(weights=)), sometimes
            w = rng.uniform(0.1, 4.0, R).tolist() if maybe(rng, 0.3) else None
            a = dict(num_reqs=R, drafts_host=drafts.tolist(), extra_tokens=extra, req_indices=idx.tolist(), weights=w)
            if step_bad == "weights":
                a["weights"] = pick(rng, [[float("nan")] * R, [-1.0] * R, [float("inf")] * R, "w", [1.0] * (R + 1),
                                          [[1.0]], [None] * R])
            elif step_bad in a:
                a[step_bad] = pick(rng, [-1, 2**31, 2**70, 1.5, None, "x", [2**70] * R, [-1] * R, [[1]], np.array([1.5])])
            budget, padded = v.plan_budget(a["num_reqs"], a["drafts_host"], a["extra_tokens"],
                                           req_indices=a["req_indices"], weights=a["weights"])
            c = conf if step_bad != "conf" else pick(rng, [None, torch.tensor(1.0), conf.double(), conf[:, :0], "c",
                                                         conf.to("meta"), torch.rand(R, K + 1)])
            v.record_confidence(c, req_indices=idx.tolist())
            d = drafts if step_bad != "drafts" else pick(rng, [drafts.long(), drafts[:-1], drafts + K + 1, "d", None])
            b = budget if step_bad != "budget" else pick(rng, [-1, 2**31, 1.5, None, torch.tensor([1]),
                                                               torch.tensor(2**40)])
            pt = None if step_bad != "padded_tokens" else pick(rng, [-5, 2**31, 2**70, 1.5, "p", R - 1])
            plan = v.plan(c, d, budget=b, extra_tokens=extra, padded_tokens=pt)
            if step_bad is None:  # the plan's buffers are the verifier's, rewritten by a later step: copy them
                checks.append((v, conf.clone(), drafts.clone(), budget, padded, extra,
                               (plan.verify_lens.clone(), plan.query_start_loc.clone(), plan.token_req.shape[0])))
            accepted = ints(rng, 0, K, (R,))
            vl = plan.verify_lens
            if step_bad == "verify_lens":
                vl = pick(rng, [[1] * R, vl[:0], vl.float(), torch.tensor(1), vl.to("meta")])
            na = accepted if step_bad != "num_accepted" else pick(rng, [accepted.tolist(), accepted.float(), None])
            v.observe(vl, na)
        v.metrics()
        return v

    def check(_):
        for v, conf, drafts, budget, padded, extra, (verify_lens, query_start_loc, t_pad) in checks:
            R = conf.shape[0]
            if budget > padded - R - extra and padded >= R + extra:
                raise Mismatch(f"plan_budget: budget {budget} does not fit padded {padded} with R={R}, extra={extra}")
            s = ref.prefix_survival(conf, drafts)
            tbl = v.cost_table.shifted(extra) if extra and R else v.cost_table
            kw = dict(min_verify=v.min_verify, num_tokens_padded=t_pad, capacity=v.capacity - extra)
            if v.mode in ("greedy", "global"):
                want = ref.plan_verification(s, drafts, tbl, mode=v.mode, **kw)
            else:
                want = ref.plan_verification(s, drafts, tbl, mode="fixed", budget=budget, **kw)
            same("verify_lens", verify_lens, want.verify_lens)
            same("query_start_loc", query_start_loc, want.query_start_loc)

    names = (bad,) if bad else ((step_bad,) if step_bad else ())
    if step_bad == "weights":
        names += ("num_reqs",)
    if step_bad in ("conf", "drafts"):
        names += ("conf", "drafts", "survival_out")
    if step_bad in ("num_reqs", "drafts_host", "extra_tokens", "req_indices", "budget", "padded_tokens"):
        names += ("num_reqs", "drafts_host", "extra_tokens", "req_indices", "capacity", "budget", "padded_tokens",
                  "num_tokens_padded")
    if bad == "min_verify":
        names += ("max_drafts",)
    kind = "valid" if not bad and not step_bad else "maybe"
    return Case(kind, call, check if kind == "valid" else None, names=names,
                what=f"{mode}, {steps} steps, bad={bad or step_bad}")


def margin_estimator_case(rng) -> Case:
    K = int(pick(rng, [1, 2, 8]))
    kw = dict(num_positions=K, refit_every=int(pick(rng, [1, 3])), min_samples=int(pick(rng, [1, 5])),
              buffer_rows=int(pick(rng, [4, 64])))
    bad = pick(rng, [None, None, "num_positions", "refit_every", "min_samples", "buffer_rows", "l2", "max_margin",
                     "device", "margin", "verify_lens", "num_accepted"])
    if bad in ("num_positions", "refit_every", "min_samples", "buffer_rows"):
        kw[bad] = pick(rng, [0, -1, 2**40, 1.5, True, "3", None])
    elif bad in ("l2", "max_margin"):
        kw[bad] = pick(rng, NON_REALS + (0.0, -1.0))
    elif bad == "device":
        kw["device"] = pick(rng, ["meta", "foo", 7, None])

    def call():
        est = MarginEstimator(**kw)
        for _ in range(int(rng.integers(1, 5))):
            R = small_int(rng, 10)
            m = floats(rng, (R, K), -5, 40)
            if maybe(rng, 0.3):
                m[m > 30] = float(pick(rng, [float("nan"), float("inf")]))
            v, a = ints(rng, 0, K, (R,)), ints(rng, 0, K, (R,))
            if bad == "margin":
                m = pick(rng, [m.int(), m[None], m.to("meta"), "m", torch.rand(R, K + 1)])
            if bad == "verify_lens":
                v = pick(rng, [v.float(), v[:-1], [1] * R, None])
            if bad == "num_accepted":
                a = pick(rng, [a.float(), a[None], "a"])
            conf = est.predict(m)
            if not isinstance(conf, torch.Tensor) or conf.shape != m.shape:
                raise Mismatch("predict returned the wrong shape")
            est.observe(m, v, a)
        return est

    names = (bad,) if bad else ()
    return Case("maybe" if bad else "valid", call, names=names, what=f"MarginEstimator bad={bad}")


def calibration_case(rng) -> Case:
    N, K = small_int(rng, 80), int(pick(rng, [1, 3, 5]))
    logits = floats(rng, (N, K), -4, 4, torch.float64)
    accepted = ints(rng, 0, K, (N,), torch.int64)
    verified = torch.maximum(accepted, ints(rng, 0, K, (N,), torch.int64))
    which = pick(rng, ["fit_sts", "report", "ece", "auc", "online", "temps", "grid"])
    bad = maybe(rng, 0.5)
    names = ()

    if which == "fit_sts":
        args = [logits, accepted, verified]
        kw = dict(min_rows=int(pick(rng, [1, 5])))
        if bad:
            i = int(rng.integers(0, 3))
            args[i] = pick(rng, [args[i].float()[:-1], args[i][None], "x", None, args[i] + 99, -args[i] - 1,
                                 torch.full_like(args[i], float("nan"), dtype=torch.float64)])
            names = ("logits", "accepted", "verified")
        names = names + ("min_rows",)  # too few rows for a position is fit_sts's documented error
        bad = True  # (so a valid draw may be "maybe": random rows can leave a position without enough data)
        call = lambda: fit_sts(*args, **kw)  # noqa: E731
    elif which == "report":
        kw = dict(is_logits=True, num_bins=int(pick(rng, [1, 10])))
        if bad:
            key = pick(rng, ["num_bins", "is_logits", "temperatures"])
            kw[key] = pick(rng, [0, 2**40, 1.5, "x", None, [0.0] * K, [float("nan")] * K, [1.0] * (K + 1)])
            names = (key,)
        call = lambda: calibration_report(logits, accepted, verified, **kw)  # noqa: E731
    elif which == "ece":
        p, y = torch.rand(N, dtype=torch.float64), torch.randint(0, 2, (N,))
        nb = int(pick(rng, [1, 15]))
        if bad:
            p, y, nb = pick(rng, [(p * 2, y, nb), (p, y + 2, nb), (p, y, 0), (p, y, 2**40), (p[:-1], y, nb),
                                  ("p", y, nb), (p, y, 1.5)])
            names = ("pred", "outcome", "num_bins")
        call = lambda: expected_calibration_error(p, y, nb)  # noqa: E731
    elif which == "auc":
        p, y = torch.rand(N, dtype=torch.float64), torch.randint(0, 2, (N,))
        if bad:
            p = pick(rng, [p * float("nan"), p[:-1], "p", p[None]])
            names = ("pred", "outcome")
        call = lambda: auc(p, y)  # noqa: E731
    elif which == "online":
        kw = dict(refresh_every=1)
        if bad:
            key = pick(rng, ["num_positions", "refresh_every", "decay", "min_trials", "grid", "device", "max_windows",
                             "initial", "stats_conf"])
            kw[key] = pick(rng, [0, -1, 2**40, 1.5, float("nan"), "x", None, [0.0], "meta", [1.0] * (K + 3)])
            names = (key, "stats")
        num_positions = kw.pop("num_positions", K)

        def call():
            sts = OnlineSTS(num_positions, **kw)
            stats = AcceptanceStats(K)
            c = torch.rand(N, K)
            stats.update(c, verified.to(torch.int32), accepted.to(torch.int32))
            sts.step(stats)
            return sts
    elif which == "temps":
        temps = floats(rng, (K,), 0.1, 5.0, torch.float64)
        if bad:
            temps = pick(rng, [temps * 0, temps * float("nan"), temps[None], "t", [], [float("inf")] * K])
            names = ("temperatures",)

        def call():
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "temps.json")
                save_temperatures(path, temps, note="fuzz")
                back = load_temperatures(path)
            if not torch.allclose(back.double(), torch.as_tensor(temps, dtype=torch.float64)):
                raise Mismatch("a temperatures round trip changed them")
            return back
    else:
        lo, hi, pts = 0.05, 20.0, 50
        if bad:
            lo, hi, pts = pick(rng, [(0.0, 1.0, 5), (2.0, 1.0, 5), (0.1, float("inf"), 5), (0.1, 1.0, 0),
                                     (0.1, 1.0, 10**9), (0.1, 1.0, 2.5), ("a", 1.0, 5)])
            names = ("grid",)
        call = lambda: default_grid(lo, hi, pts)  # noqa: E731
    return Case("maybe" if bad else "valid", call, names=names, what=f"{which} bad={bad}")


def misc_case(rng) -> Case:
    which = pick(rng, ["allocate", "error_counts", "reset_error_counts", "build_info"])
    if which == "allocate":
        Rp, kr = int_arg(rng, 0, 2**26 - 2, heavy=True) if maybe(rng, 0.5) else (small_int(rng, 50), "valid")
        Tp, kt = int_arg(rng, 0, 2**30, heavy=True) if maybe(rng, 0.5) else (small_int(rng, 500), "valid")
        flags = {k: pick(rng, [True, False, 1, None, "yes"]) if maybe(rng, 0.2) else bool(rng.integers(0, 2))
                 for k in ("positions", "slot_mapping", "input_ids")}
        dev = pick(rng, ["cpu", "cpu", torch.device("cpu"), "meta", "foo", "cuda:3", 0])
        good = kr == "valid" and kt == "valid" and all(isinstance(v, bool) for v in flags.values()) and \
            (dev == "cpu" or dev == torch.device("cpu"))

        def check(plan):
            if plan.verify_lens.shape != (Rp,) or plan.token_req.shape != (Tp,):
                raise Mismatch("allocate: wrong shapes")

        return Case("valid" if good else "maybe", lambda: VerifyPlan.allocate(Rp, Tp, dev, **flags),
                    check if good else None, names=("num_reqs_padded", "num_tokens_padded", "device", "positions",
                                                     "slot_mapping", "input_ids"), what=f"allocate({Rp!r}, {Tp!r})")
    if which in ("error_counts", "reset_error_counts"):
        dev = pick(rng, ["cpu", torch.device("cpu"), "meta", "foo", "cuda:5", 0, None, 1.5, torch.device("meta")])
        fn = getattr(errors, which)
        good = dev == "cpu" or dev == torch.device("cpu")
        return Case("valid" if good else "invalid", lambda: fn(dev), names=("device",), what=f"{which}({dev!r})")
    from .. import build_info, cuda_available

    def check(res):
        info, ok = res
        if not isinstance(info, dict) or not isinstance(ok, bool):
            raise Mismatch("build_info / cuda_available returned the wrong types")

    return Case("valid", lambda: (build_info(), cuda_available()), check, what="build_info")


__all__ = ["calibration_case", "cost_table_case", "margin_estimator_case", "misc_case", "verifier_case"]
