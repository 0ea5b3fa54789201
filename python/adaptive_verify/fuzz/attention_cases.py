"""Fuzz cases of verify_attention and write_kv: small paged problems with poisoned caches (NaN in every slot no
request may read, block-table entries past a request's needs far out of range), the tolerance of
tests/test_attention.py, and adversarial lengths and block ids (documented as ValueError on CPU)."""
from __future__ import annotations

import numpy as np
import torch

from .. import reference as ref
from ..attention import verify_attention, write_kv
from .core import Case, Mismatch, close, counts, same
from .guards import Guards
from .values import int_arg, maybe, pick, real_arg, small_int, tensor_variants

FAR = 2**30  # a block id no cache has: reading it would be gigabytes out of bounds


def _ulp(dtype: torch.dtype, magnitude: float) -> float:
    eps = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[dtype]
    return eps * max(magnitude, 2.0**-14)


class Paged:
    """A paged batch: requests of q_len tokens over seq_len positions, pages from a shuffled pool."""

    def __init__(self, rng):
        self.dtype = pick(rng, [torch.bfloat16, torch.float16])
        self.D = int(pick(rng, [64, 64, 128, 256]))
        self.bs = int(pick(rng, [16, 16, 32, 64, 256]))
        self.Hkv = int(pick(rng, [1, 2]))
        self.Hq = self.Hkv * int(pick(rng, [1, 2, 4, 16]))
        self.R = small_int(rng, 4)
        self.mql = int(pick(rng, [1, 2, 5, 33, 64]))
        self.q_lens = [small_int(rng, self.mql) for _ in range(self.R)]
        self.seq_lens = [q + small_int(rng, 90) for q in self.q_lens]
        need = [-(-s // self.bs) for s in self.seq_lens]
        self.max_blocks = max(need + [1]) + small_int(rng, 2)
        self.num_blocks = sum(need) + 1 + small_int(rng, 3)
        pool = torch.randperm(self.num_blocks, generator=torch.Generator().manual_seed(int(rng.integers(2**31))))
        self.block_table = torch.full((self.R, self.max_blocks), FAR, dtype=torch.int32)
        shape = (self.num_blocks, self.bs, self.Hkv, self.D)
        self.k_cache = torch.full(shape, float("nan"), dtype=self.dtype)
        self.v_cache = torch.full(shape, float("nan"), dtype=self.dtype)
        used = 0
        for r in range(self.R):
            pages = pool[used:used + need[r]]
            used += need[r]
            self.block_table[r, :need[r]] = pages.to(torch.int32)
            pos = torch.arange(self.seq_lens[r])
            kv = torch.from_numpy(rng.standard_normal((2, self.seq_lens[r], self.Hkv, self.D))).to(self.dtype)
            self.k_cache[pages[pos // self.bs], pos % self.bs] = kv[0]
            self.v_cache[pages[pos // self.bs], pos % self.bs] = kv[1]
        qsl = [0]
        for q in self.q_lens:
            qsl.append(qsl[-1] + q)
        self.T = qsl[-1] + small_int(rng, 2)  # padding tokens past query_start_loc[R]
        self.qsl = torch.tensor(qsl, dtype=torch.int32)
        self.q = torch.from_numpy(rng.standard_normal((self.T, self.Hq, self.D))).to(self.dtype)
        self.q[qsl[-1]:] = float("nan")  # padding rows are never read
        self.seq = torch.tensor(self.seq_lens, dtype=torch.int32)
        self.k_scale = self.v_scale = None
        if maybe(rng, 0.3):  # an fp8 cache (NaN poison stays NaN), scales per tensor or per KV head
            self.quantise(rng)

    def quantise(self, rng):
        def one_scale():
            form = pick(rng, ["none", "float", "one", "head"])
            if form == "none":
                return None
            values = torch.from_numpy(rng.uniform(0.002, 0.05, size=self.Hkv)).float()
            return {"float": float(values[0]), "one": values[:1], "head": values}[form]

        self.k_scale, self.v_scale = one_scale(), one_scale()
        flat = (-1, self.Hkv, self.D)
        for name, scale in (("k_cache", self.k_scale), ("v_cache", self.v_scale)):
            cache = getattr(self, name)
            big = cache.float() * (1.0 if scale is None else 30 * float(torch.as_tensor(scale).max()))
            setattr(self, name, ref.quantize_fp8(big.reshape(flat), scale).reshape(cache.shape))

    def args(self):
        return (self.q, self.k_cache, self.v_cache, self.block_table, self.seq, self.qsl, self.mql)

    def random_tree_mask(self, rng) -> torch.Tensor:
        """[T] int64 draft-tree masks: per request a random topological tree (each token's ancestors and itself),
        or arbitrary bits (bits above a token's offset are ignored, and a token may see nothing: zeros)."""
        masks = torch.from_numpy(rng.integers(-2**63, 2**63, size=self.T, dtype=np.int64))  # padding: never read
        for r in range(self.R):
            begin = int(self.qsl[r])
            if maybe(rng, 0.3):
                continue  # arbitrary bits for this request
            rows = []
            for j in range(self.q_lens[r]):
                parent = int(rng.integers(0, j)) if j else -1
                m = (rows[parent] if parent >= 0 else 0) | 1 << j
                rows.append(m - (1 << 64) if m >= 1 << 63 else m)
            masks[begin:begin + self.q_lens[r]] = torch.tensor(rows, dtype=torch.int64)
        return masks


def _check(p: Paged, got, lse, scale, tree_mask=None, variants=None):
    kw = dict(scale=scale, return_lse=True, tree_mask=tree_mask, k_scale=p.k_scale, v_scale=p.v_scale,
              **(variants or {}))
    ref64, lse64 = ref.verify_attention(p.q.double(), p.k_cache.double(), p.v_cache.double(), p.block_table, p.seq,
                                        p.qsl, p.mql, **kw)
    ref32, lse32 = ref.verify_attention(*p.args(), dtype=torch.float32, **kw)
    check_requests(got, lse, (ref64, lse64), (ref32, lse32), p.qsl, p.q_lens, p.dtype)


def check_requests(got, lse, ref64, ref32, qsl, q_lens, dtype) -> None:
    """Each request's output and lse against the float64 reference (out, lse), within twice the float32 reference's
    error plus one output ulp (lse: 1e-4 plus twice its float32 error); padding exactly 0 and -inf; no NaN."""
    (ref64, lse64), (ref32, lse32) = ref64, ref32
    ref32 = ref32.to(dtype).double()
    end = int(qsl[-1])
    same("padding out", got[end:], torch.zeros_like(got[end:]))
    same("padding lse", lse[end:], torch.full_like(lse[end:], float("-inf")))
    for r in range(len(q_lens)):
        rows = slice(int(qsl[r]), int(qsl[r + 1]))
        if q_lens[r] == 0:
            continue
        want = ref64[rows]
        ref_err = (ref32[rows] - want).abs().max().item()
        close(f"out of request {r}", got[rows], want, 2 * ref_err + _ulp(dtype, want.abs().max().item()))
        seen = torch.isfinite(lse64[rows])  # a tree token that sees no position has lse -inf (checked exactly)
        lse_ref_err = (lse32[rows][seen].double() - lse64[rows][seen].double()).abs().max().item() if seen.any() else 0
        close(f"lse of request {r}", lse[rows], lse64[rows], 1e-4 + 2 * lse_ref_err)
    if bool(torch.isnan(got).any()):
        raise Mismatch("NaN in the output (an unwritten element or a poisoned read)")


def attention_case(rng) -> Case:
    p = Paged(rng)
    g = Guards()
    q = g.tensor("q", p.q, row_gap=int(pick(rng, [0, 0, 16])))
    k_cache, v_cache = g.tensor("k_cache", p.k_cache), g.tensor("v_cache", p.v_cache)
    bt = g.tensor("block_table", p.block_table, row_gap=int(pick(rng, [0, 3])))
    seq, qsl = g.tensor("seq_lens", p.seq), g.tensor("query_start_loc", p.qsl)
    out = g.empty("out", (p.T, p.Hq, p.D), p.dtype) if maybe(rng, 0.6) else None
    scale = pick(rng, [None, None, 0.1, -0.05, 1.0])
    kw = dict(scale=scale, out=out, return_lse=True, k_scale=p.k_scale, v_scale=p.v_scale)
    for name in ("k_scale", "v_scale"):
        if isinstance(kw[name], torch.Tensor):
            kw[name] = g.tensor(name, kw[name])
    if maybe(rng, 0.3):
        kw["max_seq_len"] = max(p.seq_lens + [1]) + small_int(rng, 3)
    mask = p.random_tree_mask(rng) if maybe(rng, 0.4) else None
    if mask is not None:
        kw["tree_mask"] = g.tensor("tree_mask", mask)
    variants = {}  # model variants: sinks, a sliding window, soft-capping (each composable)
    if maybe(rng, 0.3):
        variants["sinks"] = torch.from_numpy(rng.standard_normal(p.Hq) * 3 + 2).float()
    if maybe(rng, 0.3):
        variants["window_left"] = int(pick(rng, [0, 1, 5, 40, 100]))
    if maybe(rng, 0.2):
        variants["softcap"] = float(pick(rng, [1.0, 20.0, 50.0]))
    kw.update(variants)
    if "sinks" in kw:
        kw["sinks"] = g.tensor("sinks", kw["sinks"])
    args = [q, k_cache, v_cache, bt, seq, qsl, p.mql]
    r = rng.random()
    if r < 0.5:
        def check(res):
            got, lse = res
            if out is not None and got.data_ptr() != out.data_ptr():
                raise Mismatch("out= was not the returned tensor")
            _check(p, got, lse, scale, mask, variants)
            counts({})

        return Case("valid", lambda: verify_attention(*args, **kw), check, guards=g,
                    what=f"R={p.R} Hq={p.Hq} Hkv={p.Hkv} D={p.D} bs={p.bs} mql={p.mql} tree={mask is not None} "
                         f"kv={str(p.k_cache.dtype)[6:]} variants={sorted(variants)}")
    names = ()
    kind = "invalid"
    if r < 0.65 and p.R:  # lengths and block ids the CPU kernel checks (documented ValueErrors)
        which = pick(rng, ["seq_lens", "query_start_loc", "block_table", "max_seq_len"])
        i = int(rng.integers(0, p.R))
        if which == "seq_lens":
            s = p.seq.clone()
            s[i] = pick(rng, [p.q_lens[i] - 1, -1, 2**31 - 1, p.max_blocks * p.bs + 1])
            args[4] = g.tensor("seq_lens2", s)
            kind = "invalid" if p.q_lens[i] > 0 else "maybe"  # a q_len 0 row is padding: never read
            names = ("seq_lens", "block_table")
        elif which == "query_start_loc":
            s = p.qsl.clone()
            s[i + 1] = pick(rng, [-1, p.T + 1, 2**31 - 1, int(s[i]) + p.mql + 1])
            args[5] = g.tensor("query_start_loc2", s)
            kind, names = "maybe", ("query_start_loc", "seq_lens")
        elif which == "block_table" and p.seq_lens[i] > 0:
            b = p.block_table.clone()
            at = int(rng.integers(0, -(-p.seq_lens[i] // p.bs)))
            b[i, at] = pick(rng, [-1, p.num_blocks, FAR, -(2**31)])
            args[3] = g.tensor("block_table2", b)
            kind = "invalid" if p.q_lens[i] > 0 else "maybe"
            window = kw.get("window_left", -1)
            if window >= 0 and (at + 1) * p.bs <= p.seq_lens[i] - p.q_lens[i] - window:
                kind = "maybe"  # a page wholly below every token's window is never read (documented)
            names = ("block_table",)
        else:
            kw["max_seq_len"] = max(p.seq_lens) - 1 if max(p.seq_lens) > 1 else 0
            kind, names = "maybe", ("max_seq_len", "block_table", "seq_lens")
        return Case(kind, lambda: verify_attention(*args, **kw), guards=g, names=names, what=f"bad {which}")
    if r < 0.8:
        which = pick(rng, ["scale", "max_query_len", "max_seq_len", "cuda_kernel", "return_lse", "k_scale", "sinks",
                           "window_left", "softcap"])
        if which in ("sinks", "window_left", "softcap"):
            kw[which] = {"sinks": [torch.zeros(p.Hq + 1), torch.full((p.Hq,), float("nan")), torch.zeros(p.Hq).double(),
                                   [0.0] * p.Hq],
                         "window_left": [-2, 2**31, 1.5, True, "3"],
                         "softcap": [-1.0, float("inf"), float("nan"), "1", 1e39]}[which][int(rng.integers(0, 4))]
            kind = "invalid"
        elif which == "k_scale":  # any scale with a 16-bit cache; a bad float or tensor with an fp8 one
            kw["k_scale"] = pick(rng, [real_arg(rng), torch.tensor([-1.0] * p.Hkv), torch.ones(p.Hkv + 1),
                                       torch.ones(p.Hkv, dtype=torch.float64), 0.0, float("nan")])
            kind = "maybe" if kw["k_scale"] is None else "invalid"
        elif which == "scale":
            kw["scale"] = real_arg(rng)
            kind = "maybe" if kw["scale"] is None else "invalid"
        elif which == "max_query_len":
            args[6], kind = int_arg(rng, 1, 64)
        elif which == "max_seq_len":
            # A host bound on int32 lengths: any int >= 1 is a bound (only the block table's width is ever used).
            kw["max_seq_len"], kind = int_arg(rng, 1, 2**200)
        elif which == "cuda_kernel":
            kw["cuda_kernel"] = pick(rng, ["mma2", "", 1, None, "rowwise", "mma"])
            kind = "maybe" if kw["cuda_kernel"] in (None, "rowwise", "mma") else "invalid"
        else:
            kw["return_lse"] = pick(rng, [1, "yes", None, 0])
            kind = "maybe"
        value = kw.get(which, args[6] if which == "max_query_len" else None)
        return Case(kind, lambda: verify_attention(*args, **kw), guards=g, names=(which, "query_start_loc", "sinks"),
                    what=f"{which}={value!r}"[:80])
    names_by_index = ["q", "k_cache", "v_cache", "block_table", "seq_lens", "query_start_loc"]
    i = int(rng.integers(0, 6))
    allowed = (p.dtype,) if i == 0 else (p.k_cache.dtype,) if i < 3 else (torch.int32,)
    desc, value, kind = pick(rng, tensor_variants(args[i], allowed_dtypes=allowed))
    args[i] = value
    return Case(kind, lambda: verify_attention(*args, **kw), guards=g,
                names=tuple(names_by_index) + ("out", "Hq", "head dim", "block_size", "max_query_len", "tree_mask",
                                               "k_scale", "v_scale"),
                what=f"{names_by_index[i]}: {desc}")


def write_kv_case(rng) -> Case:
    dtype = pick(rng, [torch.bfloat16, torch.float16, torch.float32])
    T, Hkv, D = small_int(rng, 20), int(pick(rng, [1, 2, 3])), int(pick(rng, [1, 8, 64]))
    nb, bs = int(pick(rng, [1, 3, 8])), int(pick(rng, [1, 4, 16]))
    g = Guards()
    k = torch.from_numpy(rng.standard_normal((T, Hkv, D))).to(dtype)
    v = torch.from_numpy(rng.standard_normal((T, Hkv, D))).to(dtype)
    n_slots = nb * bs
    slots = torch.randperm(n_slots, generator=torch.Generator().manual_seed(int(rng.integers(2**31))))[:T]
    slots = torch.cat([slots, torch.full((T - slots.numel(),), -1)]).to(torch.int64)
    if T and maybe(rng, 0.3):
        slots[int(rng.integers(0, T))] = -1
    # an fp8 cache quantises bf16 / fp16 k and v (values up to well past the saturation point, scaled)
    fp8 = dtype != torch.float32 and maybe(rng, 0.3)
    cache = torch.full((nb, bs, Hkv, D), float("nan"), dtype=torch.float8_e4m3fn if fp8 else dtype)
    kw = {}
    if fp8:
        k, v = (k.float() * 100).to(dtype), (v.float() * 0.01).to(dtype)
        kw["k_scale"] = pick(rng, [None, 0.3, torch.tensor([0.07]), torch.rand(Hkv) + 0.01])
        kw["v_scale"] = pick(rng, [None, 0.001, torch.rand(Hkv) * 0.01 + 1e-4])
    kg, vg = g.tensor("k", k, row_gap=int(pick(rng, [0, 5]))), g.tensor("v", v)
    kc, vc = g.tensor("k_cache", cache), g.tensor("v_cache", cache.clone())
    sg = g.tensor("slot_mapping", slots)
    args = [kg, vg, kc, vc, sg]
    r = rng.random()
    if r < 0.5:
        def check(_):
            want_k, want_v = ref.write_kv(k, v, cache, cache.clone(), slots, **kw)
            bits = (lambda t: t.view(torch.uint8)) if fp8 else (lambda t: t)  # noqa: E731  (NaN poison compares)
            same("k_cache", bits(kc), bits(want_k))
            same("v_cache", bits(vc), bits(want_v))
            counts({})

        return Case("valid", lambda: write_kv(*args, **kw), check, guards=g,
                    what=f"T={T} Hkv={Hkv} D={D} nb={nb} bs={bs} fp8={fp8}")
    if r < 0.7 and T:
        bad = slots.clone()
        bad[int(rng.integers(0, T))] = pick(rng, [-2, n_slots, 2**31, 2**32 + 1, -(2**63), 2**63 - 1])
        args[4] = g.tensor("slot_mapping2", bad)
        return Case("invalid", lambda: write_kv(*args, **kw), guards=g, names=("slot_mapping",),
                    what="slot out of range")
    names = ["k", "v", "k_cache", "v_cache", "slot_mapping"]
    i = int(rng.integers(0, 5))
    allowed = (dtype,) if i < 2 else (cache.dtype,) if i < 4 else (torch.int64,)
    desc, value, kind = pick(rng, tensor_variants(args[i], allowed_dtypes=allowed))
    args[i] = value
    return Case(kind, lambda: write_kv(*args, **kw), guards=g, names=tuple(names) + ("k_scale", "v_scale"),
                what=f"{names[i]}: {desc}")


__all__ = ["attention_case", "check_requests", "write_kv_case"]
