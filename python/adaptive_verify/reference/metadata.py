"""Oracle of adaptive_verify.flashinfer_plan, written from FlashInfer's documentation of its paged KV layout and
custom masks (docs/tutorials/kv_layout.rst; BatchPrefillWithPagedKVCacheWrapper.plan), with numpy's packbits."""
from __future__ import annotations

import numpy as np
import torch


def flashinfer_plan(query_start_loc, seq_lens, block_table, page_size, *, tree_mask=None, capacity=None):
    """The FlashInfer arguments of a verification batch, as a dict of CPU tensors.

    Request r has q_len = qsl[r + 1] - qsl[r] query tokens over kv_len = seq_lens[r] keys in ceil(kv_len /
    page_size) pages, the first entries of its block_table row. paged_kv_indptr counts pages, paged_kv_indices lists
    them request after request (then zeros up to R x max_pages), paged_kv_last_page_len is how full the last one is
    (1 .. page_size; 0 without pages). With tree_mask, request r's custom mask is its [q_len, kv_len] boolean matrix
    (query i sees every context key, kv_len - q_len of them, and block key k when k <= i and bit k of its mask is
    set), flattened row-major, packed with numpy.packbits(bitorder="little") and so padded to whole bytes;
    mask_indptr holds the byte offsets; packed_custom_mask is zero-padded to `capacity` bytes when given.
    """
    qsl = query_start_loc.cpu().numpy().astype(np.int64)
    kv = seq_lens.cpu().numpy().astype(np.int64)
    table = block_table.cpu().numpy()
    R, max_pages = table.shape
    pages = (kv + page_size - 1) // page_size
    indptr = np.concatenate([[0], np.cumsum(pages)])
    indices = np.zeros(R * max_pages, dtype=np.int32)
    for r in range(R):
        indices[indptr[r]:indptr[r + 1]] = table[r, :pages[r]]
    last = np.where(pages > 0, kv - (pages - 1) * page_size, 0)
    out = dict(qo_indptr=query_start_loc.cpu(), paged_kv_indptr=torch.tensor(indptr, dtype=torch.int32),
               paged_kv_indices=torch.from_numpy(indices), paged_kv_last_page_len=torch.tensor(last, dtype=torch.int32))
    if tree_mask is not None:
        masks = tree_mask.cpu().numpy().astype(np.int64)
        packed, mask_indptr = [], [0]
        for r in range(R):
            q_len, kv_len = int(qsl[r + 1] - qsl[r]), int(kv[r])
            context = kv_len - q_len
            m = np.zeros((q_len, kv_len), dtype=bool)
            m[:, :context] = True
            for i in range(q_len):
                bits = int(masks[qsl[r] + i]) & ((1 << 64) - 1)
                for k in range(i + 1):
                    m[i, context + k] = (bits >> k) & 1 == 1
            packed.append(np.packbits(m.reshape(-1), bitorder="little"))
            mask_indptr.append(mask_indptr[-1] + packed[-1].size)
        flat = np.concatenate(packed) if packed else np.zeros(0, dtype=np.uint8)
        if capacity is not None:
            flat = np.concatenate([flat, np.zeros(max(capacity, 1) - flat.size, dtype=np.uint8)])
        out["packed_custom_mask"] = torch.from_numpy(flat)
        out["mask_indptr"] = torch.tensor(mask_indptr, dtype=torch.int32)
    return out
