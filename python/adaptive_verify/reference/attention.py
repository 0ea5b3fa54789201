"""Verification attention and KV-write references (float64)."""
from __future__ import annotations

import torch

# ----------------------------------------------------------------------------------------------------
# verification attention and KV writes (docs/design.md, "Verification attention")
# ----------------------------------------------------------------------------------------------------


def _head_scale(scale, num_kv_heads, dtype):
    """A k_scale / v_scale (None, float, [] / [1] / [Hkv] tensor) as a `dtype` tensor broadcasting over [..., Hkv, D]."""
    if scale is None:
        return torch.ones((), dtype=dtype)
    s = torch.as_tensor(scale).cpu().to(dtype)
    return s.reshape(num_kv_heads, 1) if s.numel() == num_kv_heads and s.dim() == 1 else s.reshape(())


def _requests(block_table, seq_lens, query_start_loc, block_size):
    """Each request with query tokens: (begin, end) of its tokens, and the block id and KV position of each of its
    seq_lens[r] positions."""
    qsl = query_start_loc.cpu().long()
    for r in range(block_table.shape[0]):
        begin, end = int(qsl[r]), int(qsl[r + 1])
        if end - begin <= 0:
            continue
        pos = torch.arange(int(seq_lens[r]))
        yield begin, end, block_table[r].cpu().long()[pos // block_size], pos


def _visible(q_len, kv_len, masks, window_left=-1):
    """[q_len, kv_len] bool: query offset i sees the context and block offsets k <= i (with a tree's masks [q_len]
    int64, only those whose bit k is set); with a window W >= 0, only keys whose position is >= its own - W.
    Positions: a context key's is its index; a block token's is context_len + its depth, the count of set mask bits
    at offsets up to its own (of the querying token's mask: its ancestors), minus one; without a mask, its offset."""
    context_len = kv_len - q_len
    i = torch.arange(q_len)[:, None]  # query offsets [q_len, 1]
    block_pos = torch.arange(kv_len)[None, :] - context_len  # offset in the verified block [1, kv_len]
    visible = block_pos <= i  # the context and the causal part of the block
    if masks is not None:
        bit_set = (masks.cpu().long()[:, None] >> block_pos.clamp(0, 63)) & 1 == 1
        visible = visible & ((block_pos < 0) | bit_set)
    if window_left >= 0:
        if masks is None:
            bits = torch.ones(q_len, 64, dtype=torch.long)
        else:
            bits = (masks.cpu().long()[:, None] >> torch.arange(64)[None, :]) & 1  # [q_len, 64]
        depth = bits.cumsum(dim=1) - 1  # depth[i, k]: the depth of offset k on token i's path
        # [q_len] each token's position (depth 0 for a mask without its own bit: not a tree)
        own = context_len + depth[torch.arange(q_len), torch.arange(q_len)].clamp(min=0)
        key = torch.where(block_pos < 0, block_pos + context_len,
                          context_len + depth.gather(1, block_pos.clamp(0, 63).expand(q_len, -1)))
        visible = visible & (key >= own[:, None] - window_left)
    return visible


def verify_attention(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, max_query_len, *, scale=None,
                     return_lse=False, dtype=torch.float64, tree_mask=None, k_scale=None, v_scale=None, sinks=None,
                     window_left=-1, softcap=0.0):
    """Readable oracle of adaptive_verify.verify_attention, computed in `dtype` (float64 by default).

    q [T, Hq, D]; k_cache, v_cache [num_blocks, block_size, Hkv, D]; block_table [R, max_blocks];
    seq_lens [R] (KV length including this step's tokens); query_start_loc [R + 1]. Query token i of
    request r attends to KV positions 0 .. seq_lens[r] - q_len[r] + i. With tree_mask [T] int64 (draft
    trees), it attends to its context 0 .. context_len - 1 (context_len = seq_lens[r] - q_len[r]) and to
    context_len + k for each k <= i whose bit k of tree_mask[token] is set (higher bits are ignored). A token
    that sees nothing, like the tokens of padding rows (q_len 0) and past query_start_loc[R], gets zeros (and
    lse -inf). Returns out [T, Hq, D] in q's dtype (as float `dtype` when dtype is given explicitly and
    differs) and lse [T, Hq] float32 when asked. An fp8 cache (or any cache) is dequantised first, in `dtype`:
    K = k_cache * k_scale, V = v_cache * v_scale, a scale per tensor or per KV head ([Hkv]).

    Variants: softcap > 0 maps each scaled score s to softcap * tanh(s / softcap); window_left >= 0 hides keys more
    than window_left positions left of the token (_visible); sinks [Hq] add exp(sink) to each head's softmax
    denominator with no value (lse includes it; a token that sees nothing then has lse = sink).
    """
    T, Hq, D = q.shape
    block_size, Hkv = k_cache.shape[1], k_cache.shape[2]
    group = Hq // Hkv
    scale = D ** -0.5 if scale is None else scale
    out = torch.zeros(T, Hq, D, dtype=dtype)
    lse = torch.full((T, Hq), float("-inf"), dtype=torch.float32)
    for begin, end, blocks, pos in _requests(block_table, seq_lens, query_start_loc, block_size):
        q_len, kv_len = end - begin, pos.numel()
        # keys below every token's window are never read (an engine may leave their pages unmapped): zeros here
        lo = 0 if window_left < 0 else max(0, kv_len - q_len - window_left)
        k = torch.zeros(kv_len, Hkv, D, dtype=dtype)  # [kv_len, Hkv, D]
        v = torch.zeros(kv_len, Hkv, D, dtype=dtype)
        k[lo:] = k_cache.cpu()[blocks[lo:], pos[lo:] % block_size].to(dtype) * _head_scale(k_scale, Hkv, dtype)
        v[lo:] = v_cache.cpu()[blocks[lo:], pos[lo:] % block_size].to(dtype) * _head_scale(v_scale, Hkv, dtype)
        k = k.repeat_interleave(group, dim=1)  # [kv_len, Hq, D]: query head h reads KV head h // group
        v = v.repeat_interleave(group, dim=1)
        qr = q[begin:end].cpu().to(dtype)  # [q_len, Hq, D]
        scores = torch.einsum("ihd,phd->hip", qr, k) * scale  # [Hq, q_len, kv_len]
        if softcap > 0:
            scores = softcap * torch.tanh(scores / softcap)
        context_len = kv_len - q_len
        visible = _visible(q_len, kv_len, None if tree_mask is None else tree_mask[begin:end], window_left)
        scores = scores.masked_fill(~visible[None], float("-inf"))
        # a key no token of the request sees (below every window) may hold anything: its V must not reach 0 * NaN
        v = torch.where(visible.any(dim=0)[:, None, None], v, 0.0)
        if sinks is None:
            seen = visible.any(dim=1)  # [q_len]: a token that sees nothing gets zeros and lse -inf
            probs = torch.where(seen[None, :, None], torch.softmax(scores, dim=-1), 0.0)  # [Hq, q_len, kv_len]
            req_lse = torch.logsumexp(scores, dim=-1)  # [Hq, q_len]
        else:  # the sink is one more term of each head's denominator
            sink = sinks.cpu().to(dtype)[:, None, None].expand(Hq, q_len, 1)
            req_lse = torch.logsumexp(torch.cat([scores, sink], dim=-1), dim=-1)
            probs = torch.exp(scores - req_lse[..., None])
        # In the block each token multiplies only the V rows it sees (a hidden row's V is zeroed, so a NaN there
        # never reaches it as 0 * NaN); context rows are seen by some token, or zeroed above.
        out_ctx = torch.einsum("hip,phd->ihd", probs[..., :context_len], v[:context_len])
        v_block = torch.where(visible[:, context_len:, None, None], v[None, context_len:], 0.0)  # [i, j, Hq, D]
        out_block = torch.einsum("hij,ijhd->ihd", probs[..., context_len:], v_block)
        out[begin:end] = out_ctx + out_block
        lse[begin:end] = req_lse.transpose(0, 1).float()
    out = out.to(q.dtype) if dtype == torch.float64 else out
    return (out, lse) if return_lse else out


def quantize_fp8(x, scale):
    """x [T, Hkv, D] into float8_e4m3fn: x / scale in float32 (scale per tensor or per KV head), clamped to the
    largest finite value 448 (torch's conversion would make larger values NaN; NaN stays NaN), rounded to nearest
    even by torch's conversion."""
    scaled = x.float() / _head_scale(scale, x.shape[1], torch.float32)
    return scaled.clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


def write_kv(k, v, k_cache, v_cache, slot_mapping, *, k_scale=None, v_scale=None):
    """Oracle of adaptive_verify.write_kv on copies: token t's K/V go to slot slot_mapping[t]
    (block slot // block_size, offset slot % block_size); slot -1 is skipped; an fp8 cache receives
    quantize_fp8(k, k_scale) (and v's). Returns (k_cache, v_cache)."""
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    if k_cache.dtype == torch.float8_e4m3fn:
        k, v = quantize_fp8(k, k_scale), quantize_fp8(v, v_scale)
    block_size = k_cache.shape[1]
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        k_cache[slot // block_size, slot % block_size] = k[t]
        v_cache[slot // block_size, slot % block_size] = v[t]
    return k_cache, v_cache


def verify_attention_mla(q, kv_cache, block_table, seq_lens, query_start_loc, max_query_len, *, scale,
                         kv_scale=None, return_lse=False, dtype=torch.float64, tree_mask=None):
    """Readable oracle of adaptive_verify.verify_attention_mla (multi-head latent attention, absorbed form), in
    `dtype`.

    q [T, H, 576]; kv_cache [num_blocks, block_size, 576] latent rows (512 latent values then 64 RoPE values; an fp8
    cache is dequantised by kv_scale, one float). Head h of query token i of request r scores every visible position p
    with scale * q[i, h] . row[p] over all 576 values and takes the softmax-weighted sum of the rows' first 512
    values. Visibility, padding and lse as verify_attention. Returns out [T, H, 512] (q's dtype, or float `dtype`
    when given explicitly and different) and lse [T, H] float32 when asked.
    """
    T, H, _ = q.shape
    block_size, dv = kv_cache.shape[1], 512
    out = torch.zeros(T, H, dv, dtype=dtype)
    lse = torch.full((T, H), float("-inf"), dtype=torch.float32)
    kv_scale = 1.0 if kv_scale is None else float(torch.as_tensor(kv_scale).reshape(()))
    for begin, end, blocks, pos in _requests(block_table, seq_lens, query_start_loc, block_size):
        q_len, kv_len = end - begin, pos.numel()
        rows = kv_cache.cpu()[blocks, pos % block_size].to(dtype) * kv_scale  # [kv_len, 576]
        scores = torch.einsum("ihd,pd->hip", q[begin:end].cpu().to(dtype), rows) * scale  # [H, q_len, kv_len]
        visible = _visible(q_len, kv_len, None if tree_mask is None else tree_mask[begin:end])  # [q_len, kv_len]
        scores = scores.masked_fill(~visible[None], float("-inf"))
        seen = visible.any(dim=1)
        probs = torch.where(seen[None, :, None], torch.softmax(scores, dim=-1), 0.0)
        # the value is the latent part of the same rows; a hidden block row's is zeroed (0 * NaN never reaches a row)
        values = torch.where(visible[:, :, None], rows[None, :, :dv], 0.0)  # [q_len, kv_len, 512]
        out[begin:end] = torch.einsum("hip,ipd->ihd", probs, values)
        lse[begin:end] = torch.logsumexp(scores, dim=-1).transpose(0, 1).float()
    out = out.to(q.dtype) if dtype == torch.float64 else out
    return (out, lse) if return_lse else out
