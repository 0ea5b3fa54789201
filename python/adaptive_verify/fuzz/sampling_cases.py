"""Fuzz cases of rejection_sample and sample: drafts, temperatures, seeds and offsets at their edges, the sampling
parameters (top_k, top_p, min_p, some off, some per request) and logprobs, compared with the reference bit for
bit; out-of-range values of each, which the CPU kernel refuses by name. tree_rejection_sample likewise, on random
topological trees, with bad parents, lengths and widths.

Non-finite logits (NaN, +inf, -inf, whole rows of them) and non-finite or negative draft probabilities are part
of the valid class: their results are defined (docs/design.md, "Non-finite logits") and compared bit for bit."""
from __future__ import annotations

import torch

from .. import errors
from .. import reference as ref
from ..sampling import SamplingParams, rejection_sample, sample, tree_rejection_sample
from .core import Case, Mismatch, same
from .guards import Guards
from .values import floats, int_arg, ints, maybe, pick, small_int, sprinkle, tensor_variants

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
NONFINITE = (float("nan"), float("inf"), float("-inf"))


def grouped(rng, kw: dict) -> dict:
    """kw with a random part of its per-request parameters moved into params=SamplingParams(...) (the samplers'
    grouped form, which must give the same tokens), or kw itself."""
    if not maybe(rng, 0.4):
        return kw
    kw = dict(kw)
    moved = {k: kw.pop(k) for k in ("temperature", "top_k", "top_p", "min_p", "seeds") if k in kw and maybe(rng, 0.7)}
    return dict(kw, params=SamplingParams(**moved)) if moved else kw


def _nonfinite_logits(rng, logits: torch.Tensor) -> torch.Tensor:
    """logits with NaN / +inf / -inf sprinkled in (sometimes densely, so whole rows go non-finite)."""
    return sprinkle(rng, logits.float(), float(pick(rng, [0.05, 0.2, 0.6])), NONFINITE).to(logits.dtype)


def _problem(rng):
    R, K, V = small_int(rng, 4), int(pick(rng, [1, 2, 4])), int(pick(rng, [1, 2, 7, 64]))
    q_lens = [small_int(rng, K + 1) for _ in range(R)]
    qsl = [0]
    for q in q_lens:
        qsl.append(qsl[-1] + q)
    T = qsl[-1] + small_int(rng, 2)
    dtype = pick(rng, DTYPES)
    logits = floats(rng, (T, V), -4, 4, dtype)
    drafts = ints(rng, 0, V - 1, (R, K), pick(rng, [torch.int32, torch.int64]))
    temperature = None if maybe(rng, 0.3) else torch.from_numpy(rng.choice([0.0, 0.5, 1.0, 2.0], size=R)).float()
    seeds = ints(rng, -(2**62), 2**62, (R,), torch.int64)
    if maybe(rng, 0.3):
        logits = _nonfinite_logits(rng, logits)
    probs = None
    if maybe(rng, 0.4):
        probs = torch.softmax(floats(rng, (R, K, V), -3, 3), dim=-1)
        if maybe(rng, 0.3):  # not a distribution: entries that are not > 0 count as 0 (design.md)
            probs = sprinkle(rng, probs, 0.15, NONFINITE + (-0.5,))
    return R, K, V, T, q_lens, torch.tensor(qsl, dtype=torch.int32), logits, drafts, temperature, seeds, probs


def _truncation(rng, n: int, V: int) -> dict:
    """top_k / top_p / min_p, each absent or per row with the off value and the edges mixed in."""
    kw = {}
    if maybe(rng, 0.4):
        kw["top_k"] = torch.from_numpy(rng.choice([0, 1, 2, V, V + 3, 2**31 - 1], size=n)).to(torch.int32)
    if maybe(rng, 0.4):
        kw["top_p"] = torch.from_numpy(rng.choice([1.0, 0.9, 0.5, 1e-7, 0.3], size=n)).float()
    if maybe(rng, 0.3):
        kw["min_p"] = torch.from_numpy(rng.choice([0.0, 0.1, 0.5, 1.0], size=n)).float()
    return kw


def _bad_truncation(rng, n: int) -> tuple:
    """One sampling parameter with a value the kernels refuse (CPU) or turn off and count (CUDA)."""
    which = pick(rng, ["top_k", "top_p", "min_p"])
    if which == "top_k":
        t = torch.zeros(n, dtype=torch.int32)
        t[0] = pick(rng, [-1, -(2**31)])
    else:
        t = torch.ones(n) if which == "top_p" else torch.zeros(n)
        bad = [0.0, -0.5, 1.5, float("nan"), float("inf")] if which == "top_p" else [-0.1, 1.01, float("nan")]
        t[0] = pick(rng, bad)
    return which, t


def _judged_bad_ids(qsl, drafts, emitted, V) -> int:
    """Out-of-range draft ids the sampler judged: request r judges drafts j < min(emitted, q_len - 1)."""
    n = 0
    for r in range(drafts.shape[0]):
        q_len = int(qsl[r + 1] - qsl[r])
        for j in range(min(int(emitted[r]), q_len - 1)):
            n += not 0 <= int(drafts[r, j]) < V
    return n


def rejection_case(rng) -> Case:
    R, K, V, T, q_lens, qsl, logits, drafts, temperature, seeds, probs = _problem(rng)
    offset = int(pick(rng, [0, 7, 2**63, 2**64 - 1]))
    kind = "valid"
    if maybe(rng, 0.15) and R:  # documented safe results: out-of-range draft ids
        kind = "safe"
        drafts = drafts.clone()
        drafts[int(rng.integers(0, R)), int(rng.integers(0, K))] = pick(rng, [-1, V, 2**31 - 1, -(2**31)])
    g = Guards()
    lg = g.tensor("target_logits", logits, row_gap=int(pick(rng, [0, 3])))
    q = g.tensor("query_start_loc", qsl)
    d = g.tensor("draft_tokens", drafts)
    pr = g.tensor("draft_probs", probs) if probs is not None else None
    tp = g.tensor("temperature", temperature) if temperature is not None else None
    sd = g.tensor("seeds", seeds)
    trunc = _truncation(rng, R, V)
    logprobs = maybe(rng, 0.3)
    out = None
    if maybe(rng, 0.5):
        out = (g.empty("out[0]", (R, K + 1), torch.int32), g.empty("out[1]", (R,), torch.int32))
        if logprobs:
            out += (g.empty("out[2]", (R, K + 1), torch.float32),)
    kw = dict(draft_probs=pr, temperature=tp, seeds=sd, offset=offset, out=out, logprobs=logprobs,
              **{k: g.tensor(k, v) for k, v in trunc.items()})
    r = rng.random()
    if r < 0.7:
        kw = grouped(rng, kw)
        def check(res):
            want = ref.rejection_sample(logits, qsl, drafts, draft_probs=probs, temperature=temperature,
                                        seeds=seeds, offset=offset, logprobs=logprobs, **trunc)
            if len(res) != len(want):
                raise Mismatch(f"{len(res)} results, want {len(want)}")
            for name, a, b in zip(("output_tokens", "num_emitted", "logprobs"), res, want):
                same(name, a, b)
            want_e = want[1]
            got = errors.error_counts("cpu")
            bad = _judged_bad_ids(qsl, drafts, want_e, V)
            if got["draft_id_out_of_range"] != bad:
                raise Mismatch(f"draft_id_out_of_range: got {got['draft_id_out_of_range']}, want {bad}")
            nan_rows = int(torch.isnan(logits.float()).any(1).sum())
            if not 0 <= got["nan_logits"] <= 2 * nan_rows * V or (nan_rows == 0 and got["nan_logits"]):
                raise Mismatch(f"nan_logits: got {got['nan_logits']} with {nan_rows} NaN rows")

        return Case(kind, lambda: rejection_sample(lg, q, d, **kw), check, guards=g,
                    what=f"R={R} K={K} V={V} probs={probs is not None} {sorted(trunc)} logprobs={logprobs}")
    if r < 0.85:
        which = pick(rng, ["offset", "temperature", "query_start_loc", "cuda_kernel", "truncation", "logprobs"])
        names = (which,)
        if which == "truncation" and R:
            name, t = _bad_truncation(rng, R)
            kw[name], k, names = g.tensor(name + "2", t), "invalid", (name,)
        elif which == "logprobs":
            kw["logprobs"], k = pick(rng, [1, 0, "yes", None, torch.tensor(True)]), "invalid"
        elif which == "offset":
            kw["offset"], k = int_arg(rng, 0, 2**64 - 1)
        elif which == "temperature" and R:
            t = torch.ones(R)
            t[0] = pick(rng, [-1.0, float("nan"), float("-inf")])
            kw["temperature"], k = g.tensor("temperature2", t), "invalid"
        elif which == "query_start_loc" and R:
            s = qsl.clone()
            s[int(rng.integers(1, R + 1))] = pick(rng, [-1, T + 1, 2**31 - 1, int(s[0]) + K + 2])
            q2 = g.tensor("query_start_loc2", s)
            # (the last value can still leave every q_len in [0, K + 1]: then the call is valid)
            bad = not all(0 <= a <= b <= T and b - a <= K + 1 for a, b in zip(s.tolist(), s.tolist()[1:]))
            return Case("invalid" if bad else "maybe", lambda: rejection_sample(lg, q2, d, **kw), guards=g,
                        names=names, what="bad query_start_loc")
        elif which in ("cuda_kernel", "truncation", "temperature", "query_start_loc"):  # (the last three: R = 0)
            kw["cuda_kernel"] = pick(rng, ["v2", "splitv", "", 0])
            k = "maybe" if kw["cuda_kernel"] == "splitv" else "invalid"
            names = ("cuda_kernel", "CUDA_KERNEL")
        return Case(k, lambda: rejection_sample(lg, q, d, **kw), guards=g, names=names, what=f"{which}")
    args = [lg, q, d]
    names = ["target_logits", "query_start_loc", "draft_tokens", "draft_probs", "temperature", "seeds"]
    i = int(rng.integers(0, 6))
    base = args[i] if i < 3 else kw[names[i]]
    if base is None:
        base = torch.ones(R) if names[i] == "temperature" else torch.zeros(R, dtype=torch.int64)
    allowed = {0: DTYPES, 1: (torch.int32,), 2: (torch.int32, torch.int64), 3: (torch.float32,),
               4: (torch.float32,), 5: (torch.int64,)}[i]
    desc, value, kind = pick(rng, tensor_variants(base, allowed_dtypes=allowed))
    if i < 3:
        args[i] = value
    else:
        kw[names[i]] = value
    # (a row more or less also disagrees with the per-request sampling parameters: either may be named)
    return Case(kind, lambda: rejection_sample(*args, **kw), guards=g,
                names=tuple(names) + ("out", "V", "K", "top_k", "top_p", "min_p"),
                what=f"{names[i]}: {desc}")


def sample_case(rng) -> Case:
    N, V = small_int(rng, 6), int(pick(rng, [1, 3, 64]))
    dtype = pick(rng, DTYPES)
    logits = floats(rng, (N, V), -4, 4, dtype)
    if maybe(rng, 0.3):
        logits = _nonfinite_logits(rng, logits)
    temperature = None if maybe(rng, 0.3) else torch.from_numpy(rng.choice([0.0, 0.7, 1.0], size=N)).float()
    seeds = ints(rng, -(2**62), 2**62, (N,), torch.int64)
    offset = int(pick(rng, [0, 3, 2**64 - 1]))
    g = Guards()
    lg = g.tensor("logits", logits, row_gap=int(pick(rng, [0, 2])))
    tp = g.tensor("temperature", temperature) if temperature is not None else None
    sd = g.tensor("seeds", seeds)
    trunc = _truncation(rng, N, V)
    tk = {k: g.tensor(k, v) for k, v in trunc.items()}
    logprobs = maybe(rng, 0.3)
    out = None
    if maybe(rng, 0.5):
        out = g.empty("out", (N,), torch.int32)
        if logprobs:
            out = (out, g.empty("out[1]", (N,), torch.float32))
    r = rng.random()
    if r < 0.7:
        def check(got):
            want = ref.sample(logits, temperature, seeds, offset, logprobs=logprobs, **trunc)
            if logprobs:
                same("tokens", got[0], want[0])
                same("logprobs", got[1], want[1])
            else:
                same("tokens", got, want)

        return Case("valid", lambda: sample(lg, tp, sd, offset, out=out, logprobs=logprobs, **tk),
                    check, guards=g, what=f"N={N} V={V} {dtype} {sorted(trunc)} logprobs={logprobs}")
    if r < 0.8 and N:
        name, t = _bad_truncation(rng, N)
        bad = g.tensor(name + "2", t)
        return Case("invalid", lambda: sample(lg, tp, sd, offset, **{**tk, name: bad}), guards=g, names=(name,),
                    what=f"bad {name}")
    names = ["logits", "temperature", "seeds", "out"]
    i = int(rng.integers(0, 4))
    base = [lg, tp, sd, out[0] if isinstance(out, tuple) else out][i]
    if base is None:
        base = torch.ones(N) if i == 1 else torch.zeros(N, dtype=torch.int32)
    allowed = {0: DTYPES, 1: (torch.float32,), 2: (torch.int64,), 3: (torch.int32,)}[i]
    desc, value, kind = pick(rng, tensor_variants(base, allowed_dtypes=allowed))
    args = [lg, tp, sd, out]
    args[i] = (value, out[1]) if i == 3 and isinstance(out, tuple) else value
    return Case(kind, lambda: sample(args[0], args[1], args[2], offset, out=args[3], logprobs=logprobs, **tk), guards=g,
                names=tuple(names) + ("V", "top_k", "top_p", "min_p"), what=f"{names[i]}: {desc}")


def _tree_problem(rng):
    """R requests of q_len <= W tokens, the anchor first and every other token under an earlier one."""
    R, V, W = small_int(rng, 4), int(pick(rng, [1, 2, 7, 64])), int(pick(rng, [1, 2, 5, 9]))
    qsl, parent = [0], []
    for _ in range(R):
        q_len = small_int(rng, W)
        parent += [-1] * (q_len > 0) + [int(rng.integers(0, i)) for i in range(1, q_len)]
        qsl.append(qsl[-1] + q_len)
    T = qsl[-1] + small_int(rng, 2)
    parent += [-1] * (T - qsl[-1])
    logits = floats(rng, (T, V), -4, 4, pick(rng, DTYPES))
    if maybe(rng, 0.3):
        logits = _nonfinite_logits(rng, logits)
    ids = ints(rng, 0, V - 1, (T,), pick(rng, [torch.int32, torch.int64]))
    temperature = None if maybe(rng, 0.3) else torch.from_numpy(rng.choice([0.0, 0.5, 1.0, 2.0], size=R)).float()
    return R, V, W, T, torch.tensor(qsl, dtype=torch.int32), torch.tensor(parent, dtype=torch.int32), logits, ids, \
        temperature, ints(rng, -(2**62), 2**62, (R,), torch.int64)


def tree_case(rng) -> Case:
    R, V, W, T, qsl, parent, logits, ids, temperature, seeds = _tree_problem(rng)
    offset = int(pick(rng, [0, 7, 2**64 - 1]))
    kind = "valid"
    if maybe(rng, 0.15) and T:  # documented safe results: ids outside [0, V) never match
        kind = "safe"
        ids = ids.clone()
        ids[int(rng.integers(0, T))] = pick(rng, [-1, V, 2**31 - 1, -(2**31)])
    g = Guards()
    lg = g.tensor("target_logits", logits, row_gap=int(pick(rng, [0, 3])))
    q, pa, ii = g.tensor("query_start_loc", qsl), g.tensor("token_parent", parent), g.tensor("input_ids", ids)
    tp = g.tensor("temperature", temperature) if temperature is not None else None
    sd = g.tensor("seeds", seeds)
    lp = kind == "valid" and maybe(rng, 0.3)  # logprobs (compared exactly: the same arithmetic)
    out = None
    if maybe(rng, 0.5):
        out = (g.empty("out[0]", (R, W), torch.int32), g.empty("out[1]", (R,), torch.int32),
               g.empty("out[2]", (R, W), torch.int32)) + ((g.empty("out[3]", (R, W), torch.float32),) if lp else ())
    kw = dict(temperature=tp, seeds=sd, offset=offset, out=out, logprobs=lp)
    r = rng.random()
    if r < 0.7:
        def check(res):
            want = ref.tree_rejection_sample(logits, qsl, parent, ids, W, temperature=temperature, seeds=seeds,
                                             offset=offset, logprobs=lp)
            if len(res) != len(want):
                raise Mismatch(f"{len(res)} outputs, want {len(want)}")
            for name, got_t, want_t in zip(("output_tokens", "num_emitted", "accepted_offsets", "logprobs"), res,
                                           want):
                same(name, got_t, want_t)
            got = errors.error_counts("cpu")
            starts = set(qsl.tolist()[:-1])  # each request's anchor: its id is not read
            bad = sum(not 0 <= int(ids[t]) < V for t in range(int(qsl[-1])) if t not in starts)
            if got["draft_id_out_of_range"] != bad:
                raise Mismatch(f"draft_id_out_of_range: got {got['draft_id_out_of_range']}, want {bad}")
            nan_rows = int(torch.isnan(logits.float()).any(1).sum())
            if not 0 <= got["nan_logits"] <= 2 * nan_rows * V or (nan_rows == 0 and got["nan_logits"]):
                raise Mismatch(f"nan_logits: got {got['nan_logits']} with {nan_rows} NaN rows")

        return Case(kind, lambda: tree_rejection_sample(lg, q, pa, ii, W, **kw), check, guards=g,
                    what=f"R={R} W={W} V={V}")
    if r < 0.85:
        which = pick(rng, ["token_parent", "max_query_len", "query_start_loc"])
        if which == "token_parent" and R and int(qsl[-1]) > 1:
            p2 = parent.clone()
            t = int(rng.integers(0, int(qsl[-1])))
            off = t - int(qsl[int(torch.searchsorted(qsl, t, right=True)) - 1])
            p2[t] = pick(rng, [-1, off, off + 3, 2**31 - 1, -(2**31)])
            pa2 = g.tensor("token_parent2", p2)
            # an anchor's entry is not read: changing it leaves the call valid
            return Case("maybe" if off == 0 else "invalid", lambda: tree_rejection_sample(lg, q, pa2, ii, W, **kw),
                        guards=g, names=("token_parent",), what="bad token_parent")
        if which == "query_start_loc" and R:
            s = qsl.clone()
            s[int(rng.integers(1, R + 1))] = pick(rng, [-1, T + 1, 2**31 - 1, int(s[0]) + W + 1])
            bad = not all(0 <= a <= b <= T and b - a <= W for a, b in zip(s.tolist(), s.tolist()[1:]))
            q2 = g.tensor("query_start_loc2", s)
            # a q_len that grew still has valid parents only where it kept its own tokens: either outcome is fine
            return Case("maybe", lambda: tree_rejection_sample(lg, q2, pa, ii, W, **kw), guards=g,
                        names=("query_start_loc", "token_parent"), what=f"query_start_loc (bad={bad})")
        value, k = int_arg(rng, 1, 64)
        return Case("maybe" if k == "maybe" else "invalid",
                    lambda: tree_rejection_sample(lg, q, pa, ii, value, **{**kw, "out": None}), guards=g,
                    names=("max_query_len", "query_start_loc"), what=f"max_query_len={value!r}")
    args = [lg, q, pa, ii]
    names = ["target_logits", "query_start_loc", "token_parent", "input_ids", "temperature", "seeds"]
    i = int(rng.integers(0, 6))
    base = args[i] if i < 4 else kw[names[i]]
    if base is None:
        base = torch.ones(R)
    allowed = {0: DTYPES, 1: (torch.int32,), 2: (torch.int32,), 3: (torch.int32, torch.int64), 4: (torch.float32,),
               5: (torch.int64,)}[i]
    desc, value, kind = pick(rng, tensor_variants(base, allowed_dtypes=allowed))
    if i < 4:
        args[i] = value
    else:
        kw[names[i]] = value
    return Case(kind, lambda: tree_rejection_sample(*args, W, **kw), guards=g,
                names=tuple(names) + ("out", "max_query_len"), what=f"{names[i]}: {desc}")


__all__ = ["rejection_case", "sample_case", "tree_case"]
