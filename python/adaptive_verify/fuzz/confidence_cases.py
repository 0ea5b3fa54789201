"""Fuzz cases of the confidence area: confidence, confidence_from_logits, draft_margin, AcceptanceStats.update."""
from __future__ import annotations

import torch

from .. import reference as ref
from ..confidence import confidence, confidence_from_logits, draft_margin
from ..stats import AcceptanceStats
from .core import Case, close, counts, same
from .guards import Guards
from .values import NON_REALS, floats, ints, maybe, pick, small_int, sprinkle, tensor_variants

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _tolerance(fn, args, kwargs):
    """(float64 reference, 8x the fp32 computation's error + 2e-6): the kernel's order differs, not its precision
    (the rule of tests/test_confidence.py)."""
    want = fn(*args, **kwargs)
    if not want.numel():
        return want, 2e-6
    fp32 = fn(*args, **kwargs, dtype=torch.float32).double()
    return want, 8 * (fp32 - want).abs().max().item() + 2e-6


def confidence_case(rng) -> Case:
    R, K = small_int(rng, 12), int(pick(rng, [1, 3, 8, 32]))
    H, Q = int(pick(rng, [1, 8, 64, 129])), int(pick(rng, [0, 0, 4, 17]))
    dtype = pick(rng, DTYPES)
    g = Guards()
    hidden = g.tensor("hidden", floats(rng, (R, K, H), -2, 2, dtype), row_gap=int(pick(rng, [0, 0, 7])))
    markov = g.tensor("markov", floats(rng, (R, K, Q), -2, 2, dtype)) if Q else None
    weight = g.tensor("weight", floats(rng, (H + Q,), -1, 1) / (H + Q) ** 0.5)
    bias = pick(rng, [None, 0.37, -3.0, torch.tensor(0.5), 1e30])
    temperature = pick(rng, [None, floats(rng, (K,), 0.25, 2.0), [float(x) for x in rng.uniform(0.5, 2, K)]])
    survival = maybe(rng, 0.5)
    out = g.empty("out", (R, K), torch.float32) if maybe(rng, 0.5) else None
    kw = dict(bias=bias, markov=markov, temperature=temperature, survival=survival)
    r = rng.random()
    if r < 0.55:
        if isinstance(temperature, torch.Tensor):
            kw["temperature"] = g.tensor("temperature", temperature)

        def check(got):
            rkw = dict(kw, temperature=None if temperature is None else torch.as_tensor(temperature))
            want, tol = _tolerance(ref.confidence, (hidden, weight), rkw)
            close("conf", got, want, tol)
            if out is not None and got.data_ptr() != out.data_ptr():
                raise AssertionError("out= was not returned")
            counts({})

        return Case("valid", lambda: confidence(hidden, weight, out=out, **kw), check, guards=g,
                    what=f"R={R} K={K} H={H} Q={Q} {dtype}")
    if r < 0.7:  # NaN / inf hidden states: no documented result, but no crash and no stray write
        hidden2 = g.tensor("hidden2", sprinkle(rng, hidden.float(), 0.2, (float("nan"), float("inf"))).to(dtype))
        return Case("maybe", lambda: confidence(hidden2, weight, out=out, **kw), guards=g, names=("hidden",),
                    what="non-finite hidden")
    if r < 0.8:  # a bias or temperature that is not a finite float32
        if maybe(rng, 0.5):
            kw["bias"] = pick(rng, [v for v in NON_REALS if v is not None] + [float("nan")])  # None: the default
            name = "bias"
        else:
            kw["temperature"] = pick(rng, [[0.0] * K, [-1.0] * K, [float("nan")] * K, [1.0] * (K + 1), "x", 3,
                                          torch.ones(K, dtype=torch.int32), [1e39] * K])
            name = "temperature"
        return Case("invalid", lambda: confidence(hidden, weight, out=out, **kw), guards=g, names=(name,),
                    what=f"{name}={kw[name]!r}"[:80])
    name = pick(rng, ["hidden", "weight", "markov", "out"])
    base = {"hidden": hidden, "weight": weight, "markov": markov, "out": out}.get(name)
    if base is None:
        base = g.empty("out", (R, K), torch.float32)
    allowed = DTYPES if name in ("hidden", "markov", "weight") else (torch.float32,)
    desc, value, kind = pick(rng, tensor_variants(base, allowed_dtypes=allowed))
    args = dict(hidden=hidden, weight=weight, out=out)
    kw2 = dict(kw)
    if name in args:
        args[name] = value
    else:
        kw2[name] = value
    return Case(kind, lambda: confidence(args["hidden"], args["weight"], out=args["out"], **kw2), guards=g,
                names=("hidden", "weight", "markov", "out", "K", "R"), what=f"{name}: {desc}")


def from_logits_case(rng) -> Case:
    R, K = small_int(rng, 20), int(pick(rng, [1, 2, 8, 32]))
    dtype = pick(rng, DTYPES)
    g = Guards()
    logits = g.tensor("logits", floats(rng, (R, K), -30, 30, dtype), row_gap=int(pick(rng, [0, 3])))
    temperature = pick(rng, [None, floats(rng, (K,), 0.1, 3.0)])
    survival = maybe(rng, 0.5)
    out = g.empty("out", (R, K), torch.float32) if maybe(rng, 0.5) else None
    if rng.random() < 0.6:
        def check(got):
            want, tol = _tolerance(ref.confidence_from_logits, (logits,), dict(temperature=temperature,
                                                                                survival=survival))
            close("conf", got, want, tol)
            counts({})

        return Case("valid", lambda: confidence_from_logits(logits, temperature, survival=survival, out=out), check,
                    guards=g, what=f"R={R} K={K} {dtype}")
    name = pick(rng, ["logits", "temperature", "out"])
    if name == "temperature":
        value = pick(rng, [[0.0] * K, torch.full((K,), float("nan")), torch.ones(K + 1), "t", torch.ones(K, 1)])
        return Case("invalid", lambda: confidence_from_logits(logits, value, out=out), guards=g,
                    names=("temperature",), what=f"temperature={value!r}"[:80])
    base = logits if name == "logits" else (out if out is not None else g.empty("out", (R, K), torch.float32))
    desc, value, kind = pick(rng, tensor_variants(base, allowed_dtypes=DTYPES if name == "logits" else (torch.float32,)))
    args = dict(logits=logits, out=out)
    args[name] = value
    return Case(kind, lambda: confidence_from_logits(args["logits"], temperature, out=args["out"]), guards=g,
                names=("logits", "out", "K", "R"), what=f"{name}: {desc}")


def margin_case(rng) -> Case:
    R, K, V = small_int(rng, 6), int(pick(rng, [1, 3, 8])), int(pick(rng, [1, 2, 5, 64, 257]))
    dtype = pick(rng, DTYPES)
    g = Guards()
    x = floats(rng, (R, K, V), -5, 5, dtype)
    nan = maybe(rng, 0.4)
    if nan:
        x = sprinkle(rng, x.float(), 0.1, (float("nan"), float("inf"), float("-inf"))).to(dtype)
        if R and maybe(rng, 0.3):
            x[0, 0] = float("nan")
    logits = g.tensor("draft_logits", x, row_gap=int(pick(rng, [0, 2])))
    out = g.empty("out", (R, K), torch.float32) if maybe(rng, 0.5) else None
    if rng.random() < 0.7:
        def check(got):
            same("margin", got, ref.draft_margin(x))
            counts({"nan_logits": int(torch.isnan(x.float()).sum())})

        return Case("safe" if nan else "valid", lambda: draft_margin(logits, out=out), check, guards=g,
                    what=f"R={R} K={K} V={V} {dtype}")
    name = pick(rng, ["draft_logits", "out"])
    base = logits if name == "draft_logits" else (out if out is not None else g.empty("out", (R, K), torch.float32))
    desc, value, kind = pick(rng, tensor_variants(base, allowed_dtypes=DTYPES if name != "out" else (torch.float32,)))
    args = dict(draft_logits=logits, out=out)
    args[name] = value
    return Case(kind, lambda: draft_margin(args["draft_logits"], out=args["out"]), guards=g,
                names=("draft_logits", "out"),
                what=f"{name}: {desc}")


def stats_case(rng) -> Case:
    P, B = int(pick(rng, [1, 4, 8, 32])), int(pick(rng, [1, 2, 16, 100]))
    R, K = small_int(rng, 30), int(rng.integers(1, P + 1))
    g = Guards()
    conf = floats(rng, (R, K), -0.2, 1.2)
    nan = maybe(rng, 0.3)
    if nan:
        conf = sprinkle(rng, conf, 0.15, (float("nan"), float("inf"), float("-inf"), 1.0, 0.0))
    c = g.tensor("conf", conf, row_gap=int(pick(rng, [0, 1])))
    v = ints(rng, -2, K + 2, (R,), pick(rng, [torch.int32, torch.int64]))
    a = ints(rng, -2, K + 2, (R,), pick(rng, [torch.int32, torch.int64]))
    vg, ag = g.tensor("verify_lens", v), g.tensor("num_accepted", a)
    r = rng.random()
    if r < 0.15:  # rows placed at positions (draft trees' nodes at their depths)
        stats = AcceptanceStats(P, B)
        pos = ints(rng, -1, P + 1, (R,), torch.int32)
        pg = g.tensor("positions", pos)
        n = torch.minimum(torch.minimum(v.long(), a.long() + 1), torch.tensor(K)).clamp(min=0)  # [R] trials per row
        bad = bool(((n > 0) & ((pos.long() < 0) | (pos.long() + n > P))).any())

        def call():
            stats.update(c, vg, ag, positions=pg)
            return stats

        if bad:
            return Case("invalid", call, guards=g, names=("positions",), what=f"positions P={P} R={R} K={K}")

        def check(st):
            t, s, cs = ref.stats_update(conf, v, a, P, B, positions=pos)
            same("trials", st.trials, t)
            same("survivals", st.survivals, s)
            close("conf_sum", st.conf_sum, cs, 1e-6)
            same("totals", st.totals, torch.zeros(2, dtype=torch.int64))

        return Case("safe" if nan else "valid", call, check, guards=g, what=f"positions P={P} B={B} R={R} K={K}")
    if r < 0.6:
        stats = AcceptanceStats(P, B)

        def call():
            stats.update(c, vg, ag)
            return stats

        def check(st):
            t, s, cs = ref.stats_update(conf, v, a, P, B)
            same("trials", st.trials, t)
            same("survivals", st.survivals, s)
            close("conf_sum", st.conf_sum, cs, 1e-6)
            j = torch.arange(K)[None, :]
            trial = (j < v.long()[:, None]) & (j <= a.long()[:, None])
            counts({"nan_confidence": int((torch.isnan(conf) & trial).sum())})

        return Case("safe" if nan else "valid", call, check, guards=g, what=f"P={P} B={B} R={R} K={K}")
    if r < 0.8:
        name = pick(rng, ["num_positions", "num_bins", "device"])
        value = pick(rng, [0, -1, 2**31, 2**40, 1.0, True, "x", None, 10**30, "meta", "cuda:9", "foo", torch.device("meta")])
        kw = {"num_positions": P, "num_bins": B, name: value}
        valid_int = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 2**31
        kind = "maybe" if name != "device" and valid_int else "invalid"
        return Case(kind, lambda: AcceptanceStats(**kw), names=(name,), what=f"{name}={value!r}")
    stats = AcceptanceStats(P, B)
    name = pick(rng, ["conf", "verify_lens", "num_accepted"])
    base = {"conf": c, "verify_lens": vg, "num_accepted": ag}[name]
    desc, value, kind = pick(rng, tensor_variants(base, allowed_dtypes=(torch.float32,) if name == "conf" else
                                                  (torch.int32, torch.int64)))
    args = dict(conf=c, verify_lens=vg, num_accepted=ag)
    args[name] = value
    return Case(kind, lambda: stats.update(args["conf"], args["verify_lens"], args["num_accepted"]), guards=g,
                names=("conf", "verify_lens", "num_accepted"), what=f"{name}: {desc}")


__all__ = ["confidence_case", "from_logits_case", "margin_case", "stats_case"]
