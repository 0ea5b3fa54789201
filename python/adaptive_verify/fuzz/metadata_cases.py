"""Fuzz cases of flashinfer_plan: random batches (padding rows, trees or none, page sizes from 1) against the oracle
written from FlashInfer's documentation, exactly; bad lengths and arguments rejected naming them."""
from __future__ import annotations

import torch

from .. import reference as ref
from .core import Case, counts, same
from .guards import Guards
from .values import maybe, pick, small_int, tensor_variants


def flashinfer_plan_case(rng) -> Case:
    from ..attention_metadata import flashinfer_plan
    R, page = small_int(rng, 5), int(pick(rng, [1, 4, 16, 64]))
    mql = int(pick(rng, [1, 3, 9]))
    q_lens = [small_int(rng, mql) for _ in range(R)]
    seq = [q + small_int(rng, 3 * page + 4) for q in q_lens]
    qsl = torch.tensor([0] + torch.tensor(q_lens, dtype=torch.int64).cumsum(0).tolist(), dtype=torch.int32)
    max_pages = max([-(-s // page) for s in seq] + [0]) + small_int(rng, 2)
    table = torch.from_numpy(rng.permutation(max(R * max_pages, 1))[:R * max_pages]).to(torch.int32).view(R, max_pages)
    tree = maybe(rng, 0.6)
    masks = None
    if tree:
        rows = []
        for n in q_lens:
            anc = []
            for i in range(n):
                anc.append((anc[int(rng.integers(0, i))] if i else 0) | 1 << i)
            rows += anc
        masks = torch.tensor(rows, dtype=torch.int64)
    g = Guards()
    args = [g.tensor("query_start_loc", qsl), g.tensor("seq_lens", torch.tensor(seq, dtype=torch.int32)),
            g.tensor("block_table", table), page]
    kw = dict(tree_mask=None if masks is None else g.tensor("tree_mask", masks), max_query_len=mql)
    if rng.random() < 0.6:
        def check(got):
            cap = got["packed_custom_mask"].numel() if tree else None
            want = ref.flashinfer_plan(qsl, args[1], table, page, tree_mask=masks, capacity=cap)
            for k in want:
                same(k, got[k], want[k])
            counts({})

        return Case("valid", lambda: flashinfer_plan(*args, **kw), check, guards=g,
                    what=f"R={R} page={page} mql={mql} tree={tree}")
    which = int(rng.integers(0, 4))
    if which == 3:
        args[3] = pick(rng, [0, -1, 2.0, None, True])
        return Case("invalid", lambda: flashinfer_plan(*args, **kw), guards=g, names=("page_size",),
                    what=f"page_size={args[3]!r}")
    names = ["query_start_loc", "seq_lens", "block_table"]
    desc, value, kind = pick(rng, tensor_variants(args[which], allowed_dtypes=(torch.int32,)))
    args[which] = value
    return Case(kind, lambda: flashinfer_plan(*args, **kw), guards=g,
                names=tuple(names) + ("max_query_len", "tree_mask", "block table"), what=f"{names[which]}: {desc}")


__all__ = ["flashinfer_plan_case"]
