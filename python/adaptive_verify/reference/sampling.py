"""Sampling references: bit-exact oracles of csrc/include/adaptive_verify/sampling/math.h (rejection sampling,
tree sampling, plain sampling, the sampling parameters and logprobs)."""
from __future__ import annotations

import torch

# ----------------------------------------------------------------------------------------------------
# sampling area: bit-exact oracles of csrc/include/adaptive_verify/sampling/math.h
#
# Every float operation below is one torch op on float32 tensors, so each rounds once to float32, in
# the header's order (no fused multiply-add, no wider intermediate). Integers are int64 tensors masked
# to 32 bits. Terms: a draft is *accepted* or *rejected*; the token emitted at the first rejection is
# the *recovered* token; the token emitted after L accepted drafts is the *bonus* token.
# ----------------------------------------------------------------------------------------------------

_M32 = 0xFFFFFFFF
_LANES = 256  # kLanes: partial sums of the canonical softmax summation
_ACCEPT, _RACE, _SAMPLE = 0, 1, 2  # Philox streams


def _c(v: float) -> torch.Tensor:
    """A float32 constant (the header's `f` literals round the same way)."""
    return torch.tensor(v, dtype=torch.float32)


def _fadd(a, b):
    return torch.add(a, b)


def _fsub(a, b):
    return torch.sub(a, b)


def _fmul(a, b):
    return torch.mul(a, b)


def _fdiv(a, b):
    return torch.div(a, b)


def _mulhilo(a: torch.Tensor, b: int):
    """(hi, lo) 32-bit words of a * b for uint32 values in int64 `a`, without overflowing int64."""
    x = a * (b & 0xFFFF)  # < 2^48
    t = a * (b >> 16) + (x >> 16)  # a * b == t * 2^16 + (x & 0xffff), t < 2^49
    return t >> 16, ((t & 0xFFFF) << 16) | (x & 0xFFFF)


def philox(c0, c1, c2, c3, k0, k1) -> torch.Tensor:
    """Philox4x32-10 of (counter, key), each an int or int64 tensor (broadcast; low 32 bits used).

    Returns int64 [..., 4] holding the four uint32 output words.
    """
    c0, c1, c2, c3, k0, k1 = torch.broadcast_tensors(*(torch.as_tensor(v, dtype=torch.int64) & _M32
                                                       for v in (c0, c1, c2, c3, k0, k1)))
    for _ in range(10):
        hi0, lo0 = _mulhilo(c0, 0xD2511F53)
        hi1, lo1 = _mulhilo(c2, 0xCD9E8D57)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + 0x9E3779B9) & _M32, (k1 + 0xBB67AE85) & _M32
    return torch.stack([c0, c1, c2, c3], dim=-1)


def to_uniform(bits: torch.Tensor) -> torch.Tensor:
    """23 random bits k to float32 (k + 0.5) * 2^-23 with the header's two float32 operations (exact:
    u lies in [2^-24, 1 - 2^-24])."""
    return _fmul(_fadd((bits >> 9).to(torch.float32), _c(0.5)), _c(1.1920928955078125e-07))


def _int64(v) -> torch.Tensor:
    """An int (any 64-bit pattern, e.g. an offset >= 2^63) or int64 tensor as an int64 tensor."""
    if not isinstance(v, torch.Tensor):
        v = int(v) & (2**64 - 1)
        v = v - 2**64 if v >= 2**63 else v
    return torch.as_tensor(v, dtype=torch.int64)


def uniforms(seed, offset, j: int, stream: int, index) -> torch.Tensor:
    """Uniform number `index` (int64 tensor) of (seed, offset, position j, stream): word index & 3 of the
    Philox block keyed by seed with counter (index >> 2, j << 8 | stream, offset lo, offset hi)."""
    seed, offset = _int64(seed), _int64(offset)
    index = torch.as_tensor(index, dtype=torch.int64)
    words = philox(index >> 2, (j << 8) | stream, offset, offset >> 32, seed, seed >> 32)
    return to_uniform(words.gather(-1, (index & 3).unsqueeze(-1)).squeeze(-1))


def _bits_float(bits: torch.Tensor) -> torch.Tensor:
    return bits.to(torch.int32).view(torch.float32)  # bits < 2^31 here


def av_log(x: torch.Tensor) -> torch.Tensor:
    """The header's av_log: natural log of positive normal float32 values."""
    bits = x.to(torch.float32).contiguous().view(torch.int32).to(torch.int64) & _M32
    e = ((bits >> 23) & 0xFF) - 127
    m = _bits_float((bits & 0x007FFFFF) | 0x3F800000)
    big = m > _c(1.41421356)
    m = torch.where(big, _fmul(m, _c(0.5)), m)
    e = torch.where(big, e + 1, e)
    s = _fdiv(_fsub(m, _c(1.0)), _fadd(m, _c(1.0)))
    s2 = _fmul(s, s)
    poly = _c(0.11111111)
    for coef in (0.14285715, 0.2, 0.33333334):
        poly = _fadd(_fmul(poly, s2), _c(coef))
    t = _fadd(s, _fmul(_fmul(s, s2), poly))
    log_m = _fadd(t, t)
    ef = e.to(torch.float32)  # exact
    return _fadd(_fmul(ef, _c(0.693145751953125)), _fadd(_fmul(ef, _c(1.42860677e-06)), log_m))


def av_exp(x: torch.Tensor) -> torch.Tensor:
    """The header's av_exp: e^x for x <= 0; 0 below -103 and for NaN."""
    x = x.to(torch.float32)
    valid = x > -103.0
    x = torch.where(valid, x, _c(0.0))
    kf = torch.floor(_fadd(_fmul(x, _c(1.44269504)), _c(0.5)))
    r = _fsub(_fsub(x, _fmul(kf, _c(0.693145751953125))), _fmul(kf, _c(1.42860677e-06)))
    p = _c(1.98412698e-04)
    for coef in (1.38888889e-03, 8.33333377e-03, 4.16666679e-02, 0.166666672, 0.5, 1.0, 1.0):
        p = _fadd(_fmul(p, r), _c(coef))
    k = kf.to(torch.int64).clamp(max=0)
    normal = _fmul(p, _bits_float((k.clamp(min=-126) + 127) << 23))
    tiny = _fmul(_fmul(p, _bits_float((k.clamp(min=-191) + 127 + 64) << 23)), _bits_float(torch.tensor(0x1F800000)))
    return torch.where(valid, torch.where(k >= -126, normal, tiny), _c(0.0))


def canonical_sum(terms: torch.Tensor) -> torch.Tensor:
    """Sum of float32 [V] in the kernels' order: 256 lanes, lane l adding v = l, l + 256, ... in turn,
    then the pairwise tree lane[l] += lane[l + s], s = 128 .. 1. Zero padding is exact."""
    V = terms.numel()
    padded = torch.zeros(max(1, -(-V // _LANES)) * _LANES, dtype=torch.float32)
    padded[:V] = terms
    rows = padded.view(-1, _LANES)
    part = rows[0].clone()
    for row in rows[1:]:
        part = _fadd(part, row)
    s = _LANES // 2
    while s >= 1:
        part = _fadd(part[:s], part[s:2 * s])
        s //= 2
    return part[0]


def _argmax(x: torch.Tensor) -> int:
    """First maximum (smallest id), NaN treated as -inf; 0 when nothing beats -inf."""
    return int(torch.argmax(torch.where(torch.isnan(x), _c(float("-inf")), x)))


_FLT_MIN = 1.17549435e-38  # min_p below the smallest normal float is off


def kept_tokens(z: torch.Tensor, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> torch.Tensor:
    """bool [V]: the tokens a row keeps under min-p, then top-k, then top-p (vLLM's order), z = logits / T.

    Read by sorting: rank the tokens by z descending, then id ascending (a stable sort of the descending z); NaN
    is never kept. min-p keeps z_v >= max z + av_log(min_p); top-k the first k of what is left; top-p the
    first tokens of that up to and including the one where the cumulative mass reaches top_p * M, masses
    floor(av_exp(z_v - max z) * 2^32) and M their sum (M = 0: top-p keeps everything)."""
    V = z.numel()
    # Out-of-range values turn their filter off (what the CUDA kernel does; the CPU path rejects them).
    top_k = top_k if top_k > 0 else 0
    top_p = top_p if 0.0 < top_p <= 1.0 else 1.0
    min_p = min_p if 0.0 <= min_p <= 1.0 else 0.0
    valid = ~torch.isnan(z)
    if not bool(valid.any()):
        return valid
    m = z[valid].max()
    if not bool(m > float("-inf")):
        return valid
    keep = valid.clone()
    if min_p >= _FLT_MIN:
        keep &= z >= _fadd(m, av_log(torch.tensor(min_p, dtype=torch.float32)))
    zz = torch.where(z == 0, _c(0.0), z)  # -0 ranks as +0
    order = torch.sort(torch.where(valid, zz, _c(float("-inf"))), descending=True, stable=True).indices
    ranked = order[keep[order]]
    if 0 < top_k < V:
        ranked = ranked[:top_k]
    if top_p < 1.0:
        mass = (av_exp(_fsub(z[ranked], m)) * 4294967296.0).to(torch.int64)  # exact scale, truncated
        total = int(mass.sum())
        if total > 0:
            target = float(top_p) * float(total)  # one double rounding, as the kernels
            before = torch.cumsum(mass, 0) - mass
            take = before.to(torch.float64) < target
            take[0] = True
            ranked = ranked[take]
    out = torch.zeros(V, dtype=torch.bool)
    out[ranked] = True
    return out


def limit_logits(z: torch.Tensor) -> torch.Tensor:
    """Scaled logits float32 [V] under the non-finite rule (docs/design.md, "Non-finite logits").

    softmax(z) is undefined when some z_v is +inf; its limit as those logits grow is uniform over them. A row
    with a +inf logit is therefore replaced by that limit's logits: +inf -> 0, every other number -> -inf, NaN
    kept (it never wins). A row without +inf is returned unchanged. Every decision and logprob below reads
    logits through this function."""
    inf = float("inf")
    if not bool((z == inf).any()):
        return z
    return torch.where(z == inf, _c(0.0), torch.where(torch.isnan(z), _c(float("nan")), _c(-inf)))


def _race(z: torch.Tensor, seed, offset, j: int, stream: int, keep=None) -> int:
    """Gumbel-max sample of softmax(z) over the kept tokens: argmax_v z_v - av_log(E_v), E_v = -av_log(u_v)."""
    E = -av_log(uniforms(seed, offset, j, stream, torch.arange(z.numel())))
    score = _fsub(z, av_log(E))
    if keep is not None:
        score = torch.where(keep, score, _c(float("-inf")))
    return _argmax(score)


def token_logprob(z: torch.Tensor, tok: int) -> float:
    """log softmax(z)[tok], untruncated: (z_tok - max z) - av_log(canonical sum of av_exp(z_v - max z))."""
    valid = ~torch.isnan(z)
    if not bool(valid.any()):
        return float("-inf")
    m = z[valid].max()
    if not bool(m > float("-inf")):
        return float("-inf")
    e = torch.where(valid, av_exp(_fsub(z, m)), _c(0.0))
    return float(_fsub(_fsub(z[tok], m), av_log(canonical_sum(e))))


def _judge_with_probs(z, q, x, seed, offset, j, keep=None):
    """(accepted, recovered token) for draft x ~ q judged by logits z / T (float32 [V]), the target restricted to
    the kept tokens."""
    V = z.numel()
    m = torch.where(torch.isnan(z), _c(float("-inf")), z).max()
    if not bool(m > float("-inf")):  # no number in the row (z holds limit logits: never +inf): emit id 0
        return False, 0
    if keep is None:
        keep = ~torch.isnan(z)
    e = torch.where(keep, av_exp(_fsub(z, m)), _c(0.0))
    p = _fdiv(e, canonical_sum(e))
    if 0 <= x < V and float(q[x]) > 0.0:  # q(x) == 0 (or not a probability) rejects
        u = uniforms(seed, offset, j, _ACCEPT, torch.tensor(0))
        if bool(_fmul(u, q[x]) < p[x]):
            return True, x
    d = _fsub(p, torch.where(q > 0, q, _c(0.0)))  # q not > 0 (negative, NaN) counts as 0
    w = torch.where(d > 0, d, _c(0.0))  # max(p - q, 0)
    if not bool((w > 0).any()):
        w = p
    E = -av_log(uniforms(seed, offset, j, _RACE, torch.arange(V)))
    return False, _argmax(_fdiv(w, E))


def _seeds_or_fresh(seeds, temperature, n, device):
    """Unseeded requests (seeds None) draw independent streams: one int64 seed each from torch's default
    generator of the tensors' device, drawn only when some request samples (temperature given)."""
    if seeds is not None:
        return seeds.cpu().long()
    if temperature is None:
        return torch.zeros(n, dtype=torch.int64)
    return torch.randint(-2**63, 2**63 - 1, (n,), dtype=torch.int64, device=device).cpu()


def _param(values, r, default):
    return default if values is None else values[r]


def rejection_sample(target_logits, query_start_loc, draft_tokens, *, draft_probs=None, temperature=None,
                     seeds=None, offset=0, top_k=None, top_p=None, min_p=None, logprobs=False):
    """Reference of adaptive_verify.rejection_sample (same arguments, ``out`` excepted).

    Request r judges its L[r] = q_len[r] - 1 drafts with rows query_start_loc[r] + j (q_len 0: padding,
    nothing emitted). Greedy (T = 0): accept iff the draft is the argmax. Without draft_probs: one race
    per row over the kept tokens (:func:`kept_tokens`), accept iff it picks the draft, else emit its winner.
    With draft_probs: p is softmax(z) restricted to the kept tokens; accept iff u * q(x) < p(x) (x in [0, V)
    and q(x) > 0), else emit the residual race argmax max(p - q, 0) / E. Bonus after L accepted drafts:
    argmax or race of row L. Every row is read through :func:`limit_logits` (a row with +inf logits samples
    uniformly among them); a row with no number above -inf emits id 0 (greedy, race and residual alike).
    Returns (output_tokens [R, K + 1] int32 padded with -1, num_emitted [R] int32[, logprobs [R, K + 1]
    float32: :func:`token_logprob` of each emitted token at T (1 when greedy), -inf past num_emitted]).
    """
    R, K = draft_tokens.shape
    logits = target_logits.detach().cpu().to(torch.float32)
    qsl = query_start_loc.cpu().long().tolist()
    drafts = draft_tokens.cpu().long()
    probs = None if draft_probs is None else draft_probs.detach().cpu().to(torch.float32)
    temps = torch.zeros(R) if temperature is None else temperature.cpu().to(torch.float32)
    ks = None if top_k is None else top_k.cpu().tolist()
    ps = None if top_p is None else top_p.cpu().to(torch.float32).tolist()
    mps = None if min_p is None else min_p.cpu().to(torch.float32).tolist()
    seeds = _seeds_or_fresh(seeds, temperature, R, target_logits.device)
    offset = int(offset)
    out = torch.full((R, K + 1), -1, dtype=torch.int32)
    emitted = torch.zeros(R, dtype=torch.int32)
    lps = torch.full((R, K + 1), float("-inf"), dtype=torch.float32)
    for r in range(R):
        q_len = qsl[r + 1] - qsl[r]
        if q_len == 0:
            continue
        T, seed = temps[r], seeds[r]
        trunc = (_param(ks, r, 0), _param(ps, r, 1.0), _param(mps, r, 0.0))
        n = 0
        for j in range(q_len):
            row = logits[qsl[r] + j]
            bonus = j == q_len - 1
            x = None if bonus else int(drafts[r, j])
            z = limit_logits(row if float(T) == 0.0 else _fdiv(row, T))  # greedy: the raw logits
            if float(T) == 0.0:
                y = _argmax(z)
                accepted = y == x
            else:
                keep = kept_tokens(z, *trunc)
                if bonus or probs is None:
                    y = _race(z, seed, offset, j, _RACE, keep)
                    accepted = y == x
                else:
                    accepted, y = _judge_with_probs(z, probs[r, j], x, seed, offset, j, keep)
            out[r, n] = y
            lps[r, n] = token_logprob(z, y)
            n += 1
            if not accepted:
                break
        emitted[r] = n
    dev = target_logits.device
    if logprobs:
        return out.to(dev), emitted.to(dev), lps.to(dev)
    return out.to(dev), emitted.to(dev)


def tree_rejection_sample(target_logits, query_start_loc, token_parent, input_ids, max_query_len, *,
                          temperature=None, seeds=None, offset=0, top_k=None, top_p=None, min_p=None, logprobs=False):
    """Reference of adaptive_verify.tree_rejection_sample (same arguments, ``out`` excepted), for valid trees.

    From request r's anchor (offset 0): y = argmax (T = 0) or a race over the kept tokens of the current token's
    row at position = its depth; go to the child (token_parent == current offset) whose input id is y, else emit y
    and stop. Returns (output_tokens [R, W] int32, num_emitted [R] int32, accepted_offsets [R, W] int32), -1 padded,
    W = max_query_len[, logprobs [R, W] float32: :func:`token_logprob` of each emitted token at T (1 when greedy),
    -inf past num_emitted]."""
    R, W = query_start_loc.numel() - 1, max_query_len
    logits = target_logits.detach().cpu().to(torch.float32)
    qsl = query_start_loc.cpu().long().tolist()
    parent, ids = token_parent.cpu().long(), input_ids.cpu().long()
    temps = torch.zeros(R) if temperature is None else temperature.cpu().to(torch.float32)
    ks = None if top_k is None else top_k.cpu().tolist()
    ps = None if top_p is None else top_p.cpu().to(torch.float32).tolist()
    mps = None if min_p is None else min_p.cpu().to(torch.float32).tolist()
    seeds = _seeds_or_fresh(seeds, temperature, R, target_logits.device)
    out = torch.full((R, W), -1, dtype=torch.int32)
    emitted = torch.zeros(R, dtype=torch.int32)
    path = torch.full((R, W), -1, dtype=torch.int32)
    lps = torch.full((R, W), float("-inf"), dtype=torch.float32)
    for r in range(R):
        begin, q_len = qsl[r], qsl[r + 1] - qsl[r]
        cur, depth = 0, 0
        while q_len > 0:
            row = logits[begin + cur]
            z = limit_logits(row if float(temps[r]) == 0.0 else _fdiv(row, temps[r]))
            if float(temps[r]) == 0.0:
                y = _argmax(z)
            else:
                keep = kept_tokens(z, _param(ks, r, 0), _param(ps, r, 1.0), _param(mps, r, 0.0))
                y = _race(z, seeds[r], int(offset), depth, _RACE, keep)
            out[r, depth], path[r, depth] = y, cur
            lps[r, depth] = token_logprob(z, y)
            depth += 1
            kids = [i for i in range(1, q_len) if int(parent[begin + i]) == cur and int(ids[begin + i]) == y]
            if not kids:
                break
            cur = kids[0]
        emitted[r] = depth
    dev = target_logits.device
    if logprobs:
        return out.to(dev), emitted.to(dev), path.to(dev), lps.to(dev)
    return out.to(dev), emitted.to(dev), path.to(dev)


def sample(logits, temperature=None, seeds=None, offset=0, *, top_k=None, top_p=None, min_p=None, logprobs=False):
    """Reference of adaptive_verify.sample: argmax (T = 0) or a race over the kept tokens on stream 2,
    position 0, per row; with ``logprobs`` also each token's :func:`token_logprob`."""
    N = logits.shape[0]
    x = logits.detach().cpu().to(torch.float32)
    temps = torch.zeros(N) if temperature is None else temperature.cpu().to(torch.float32)
    ks = None if top_k is None else top_k.cpu().tolist()
    ps = None if top_p is None else top_p.cpu().to(torch.float32).tolist()
    mps = None if min_p is None else min_p.cpu().to(torch.float32).tolist()
    seeds = _seeds_or_fresh(seeds, temperature, N, logits.device)
    out = torch.empty(N, dtype=torch.int32)
    lps = torch.empty(N, dtype=torch.float32)
    for n in range(N):
        T = temps[n]
        z = limit_logits(x[n] if float(T) == 0.0 else _fdiv(x[n], T))
        if float(T) == 0.0:
            out[n] = _argmax(z)
            lps[n] = token_logprob(z, int(out[n]))
        else:
            keep = kept_tokens(z, _param(ks, n, 0), _param(ps, n, 1.0), _param(mps, n, 0.0))
            out[n] = _race(z, seeds[n], int(offset), 0, _SAMPLE, keep)
            lps[n] = token_logprob(z, int(out[n]))
    if logprobs:
        return out.to(logits.device), lps.to(logits.device)
    return out.to(logits.device)
