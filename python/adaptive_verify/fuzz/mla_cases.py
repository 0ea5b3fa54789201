"""Fuzz cases of verify_attention_mla and write_kv_mla: small paged latent caches (NaN in every slot no request may
read, block-table entries past a request's needs far out of range), bf16/fp16 or fp8 with a scale, tree masks, the
tolerance of tests/test_attention_mla.py, and bad arguments (documented ValueError / TypeError naming them)."""
from __future__ import annotations

import torch

from .. import reference as ref
from ..attention_mla import verify_attention_mla, write_kv_mla
from .attention_cases import check_requests
from .core import Case, counts, same
from .guards import Guards
from .values import maybe, pick, real_arg, small_int, tensor_variants

FAR = 2**30
D, DV = 576, 512


class Latent:
    """A paged MLA batch: R requests of q_len tokens over seq_len positions of one [blocks, bs, 576] cache."""

    def __init__(self, rng):
        self.dtype = pick(rng, [torch.bfloat16, torch.float16])
        self.H = int(pick(rng, [1, 3, 16, 33]))
        self.bs = int(pick(rng, [16, 32, 64]))
        self.R = small_int(rng, 3)
        self.mql = int(pick(rng, [1, 2, 5, 17]))
        self.q_lens = [small_int(rng, self.mql) for _ in range(self.R)]
        self.seq_lens = [q + small_int(rng, 70) for q in self.q_lens]
        need = [-(-s // self.bs) for s in self.seq_lens]
        self.num_blocks = sum(need) + 1 + small_int(rng, 2)
        pool = torch.from_numpy(rng.permutation(self.num_blocks))
        self.block_table = torch.full((self.R, max(need + [1]) + small_int(rng, 2)), FAR, dtype=torch.int32)
        self.fp8 = fp8 = maybe(rng, 0.3)
        self.kv_scale = pick(rng, [None, 0.03, torch.tensor([0.01])]) if fp8 else None
        cache = torch.full((self.num_blocks, self.bs, D), float("nan"))
        used = 0
        for r in range(self.R):
            pages = pool[used:used + need[r]]
            used += need[r]
            self.block_table[r, :need[r]] = pages.to(torch.int32)
            pos = torch.arange(self.seq_lens[r])
            cache[pages[pos // self.bs], pos % self.bs] = torch.from_numpy(
                rng.standard_normal((self.seq_lens[r], D))).float()
        if fp8:
            s = 1.0 if self.kv_scale is None else float(torch.as_tensor(self.kv_scale))
            self.kv_cache = ref.quantize_fp8((cache * 30 * s)[:, :, None, :], self.kv_scale)[:, :, 0, :].contiguous()
        else:
            self.kv_cache = cache.to(self.dtype)
        qsl = [0]
        for q in self.q_lens:
            qsl.append(qsl[-1] + q)
        self.T = qsl[-1] + small_int(rng, 2)
        self.qsl = torch.tensor(qsl, dtype=torch.int32)
        self.q = torch.from_numpy(rng.standard_normal((self.T, self.H, D))).to(self.dtype)
        self.q[qsl[-1]:] = float("nan")
        self.seq = torch.tensor(self.seq_lens, dtype=torch.int32)
        self.mask = None
        if maybe(rng, 0.4):
            masks = []
            for q_len in self.q_lens:
                rows = []
                for j in range(q_len):
                    m = (rows[int(rng.integers(0, j))] if j else 0) | 1 << j
                    rows.append(m)
                masks += rows
            self.mask = torch.tensor(masks + [0] * (self.T - len(masks)), dtype=torch.int64)

    def check(self, got, lse, scale):
        kw = dict(scale=scale, kv_scale=self.kv_scale, return_lse=True, tree_mask=self.mask)
        ref64, lse64 = ref.verify_attention_mla(self.q.double(), self.kv_cache.double(), self.block_table, self.seq,
                                                self.qsl, self.mql, **kw)
        ref32, lse32 = ref.verify_attention_mla(self.q, self.kv_cache, self.block_table, self.seq, self.qsl, self.mql,
                                                dtype=torch.float32, **kw)
        check_requests(got, lse, (ref64, lse64), (ref32, lse32), self.qsl, self.q_lens, self.dtype)


def mla_case(rng) -> Case:
    p = Latent(rng)
    g = Guards()
    q = g.tensor("q", p.q, row_gap=int(pick(rng, [0, 0, 8])))
    kv = g.tensor("kv_cache", p.kv_cache)
    bt = g.tensor("block_table", p.block_table)
    seq, qsl = g.tensor("seq_lens", p.seq), g.tensor("query_start_loc", p.qsl)
    scale = float(pick(rng, [0.04, 0.07, -0.02]))
    kw = dict(scale=scale, kv_scale=p.kv_scale, return_lse=True,
              tree_mask=None if p.mask is None else g.tensor("tree_mask", p.mask))
    if maybe(rng, 0.5):
        kw["out"] = g.empty("out", (p.T, p.H, DV), p.dtype)
    args = [q, kv, bt, seq, qsl, p.mql]
    what = f"R={p.R} H={p.H} bs={p.bs} mql={p.mql} fp8={p.fp8} tree={p.mask is not None}"
    r = rng.random()
    if r < 0.55:
        def check(res):
            p.check(res[0], res[1], scale)
            counts({})

        return Case("valid", lambda: verify_attention_mla(*args, **kw), check, guards=g, what=what)
    if r < 0.7:
        which = pick(rng, ["scale", "kv_scale", "max_query_len"])
        if which == "scale":
            kw["scale"] = real_arg(rng)
        elif which == "kv_scale":
            kw["kv_scale"] = pick(rng, [real_arg(rng), 0.0, -1.0, torch.ones(2), torch.ones(1, dtype=torch.float64)])
        else:
            args[5] = pick(rng, [0, 65, -1, 2.0, None])
        kind = "maybe" if (which == "kv_scale" and kw["kv_scale"] is None) else "invalid"
        return Case(kind, lambda: verify_attention_mla(*args, **kw), guards=g,
                    names=(which, "scale", "kv_scale", "max_query_len"), what=f"bad {which}")
    names = ["q", "kv_cache", "block_table", "seq_lens", "query_start_loc"]
    i = int(rng.integers(0, 5))
    allowed = (p.dtype,) if i == 0 else (p.kv_cache.dtype,) if i == 1 else (torch.int32,)
    desc, value, kind = pick(rng, tensor_variants(args[i], allowed_dtypes=allowed))
    args[i] = value
    return Case(kind, lambda: verify_attention_mla(*args, **kw), guards=g,
                names=tuple(names) + ("out", "head", "MLA", "tree_mask", "kv_scale", "max_query_len"),
                what=f"{names[i]}: {desc}")


def write_mla_case(rng) -> Case:
    dtype = pick(rng, [torch.bfloat16, torch.float16])
    fp8 = maybe(rng, 0.4)
    T, nb, bs = small_int(rng, 12), int(pick(rng, [1, 3])), int(pick(rng, [16, 32]))
    kv_c = torch.from_numpy(rng.standard_normal((T, DV)) * (50 if fp8 else 1)).to(dtype)
    k_pe = torch.from_numpy(rng.standard_normal((T, D - DV))).to(dtype)
    slots = torch.from_numpy(rng.permutation(nb * bs)[:T]).to(torch.int64)
    if T and maybe(rng, 0.3):
        slots[int(rng.integers(0, T))] = -1
    cache = torch.full((nb, bs, D), float("nan"), dtype=dtype)
    scale = pick(rng, [None, 0.2, torch.tensor([0.05])]) if fp8 else None
    if fp8:
        cache = cache.to(torch.float8_e4m3fn)
    g = Guards()
    args = [g.tensor("kv_c", kv_c), g.tensor("k_pe", k_pe), g.tensor("kv_cache", cache),
            g.tensor("slot_mapping", slots)]
    if rng.random() < 0.6:
        def check(_):
            full = torch.cat([kv_c, k_pe], dim=1)[:, None, :]
            cache4, _ = ref.write_kv(full, full, cache.unsqueeze(2), cache.unsqueeze(2), slots,
                                     k_scale=scale, v_scale=scale)
            raw = lambda t: t.view(torch.uint8) if fp8 else t  # noqa: E731
            same("kv_cache", raw(args[2]), raw(cache4[:, :, 0]))
            counts({})

        return Case("valid", lambda: write_kv_mla(*args, kv_scale=scale), check, guards=g, what=f"T={T} fp8={fp8}")
    names = ["kv_c", "k_pe", "kv_cache", "slot_mapping"]
    i = int(rng.integers(0, 4))
    allowed = (dtype,) if i < 2 else (cache.dtype,) if i == 2 else (torch.int64,)
    desc, value, kind = pick(rng, tensor_variants(args[i], allowed_dtypes=allowed))
    args[i] = value
    return Case(kind, lambda: write_kv_mla(*args, kv_scale=scale), guards=g, names=tuple(names) + ("kv_scale",),
                what=f"{names[i]}: {desc}")





__all__ = ["mla_case", "write_mla_case"]
