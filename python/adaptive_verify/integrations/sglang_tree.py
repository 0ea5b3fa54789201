"""SGLang adapter, EAGLE draft trees (``speculative_eagle_topk > 1``); :mod:`.sglang` re-exports everything here.

SGLang's tree layout (``sglang/srt/speculative/eagle_utils.py``, ``sglang/kernels/ops/speculative/spec_tree.py``):
every request owns a block of ``n = draft_token_num`` verify tokens, index 0 its verified token (our anchor), then
``n - 1`` drafts in increasing order of their index in the draft loop's score list, so a parent precedes its
children. The tree is given three ways:

- the draft loop's outputs (``organize_draft_results``): ``top_scores_index`` [bs, n - 1] (sorted score-list
  indices of the drafts), ``parent_list`` [bs, 1 + (spec_steps - 1) * topk] (``parent_list[s // topk]`` is the
  score-list index of the parent of score-list entry s; ``s // topk == 0``: a child of the verified token);
- the verify pointers (``EagleVerifyInput.retrieve_*``, [bs, n] int64): ``retrieve_next_token[i]`` the first
  (lowest-index) child of token i, ``retrieve_next_sibling[i]`` the next higher-index child of i's parent, -1 for
  none; ``retrieve_index[i] = b * n + i`` (the token's row of the verify forward);
- ``custom_mask``, one of ``TreeMaskMode``: FULL_MASK (0, "full": per request n rows of ``seq_len + n`` bools, the
  context columns True then one column per block token), QLEN_ONLY (1, "qlen": [bs, n, n] bool) and
  QLEN_ONLY_BITPACKING (2, "bitpacked": [bs * n] uint8/uint16/uint32, bit k of a token's word set iff it attends
  to block token k, little-endian). Token i attends to itself, its ancestors and token 0.

A draft whose parent was not selected (SGLang's CUDA builder prints "invalid eagle tree") gets no pointer, so
SGLang's verify never reaches it; the conversions here leave such nodes (and their subtrees) out, so a request can
have fewer than n - 1 nodes. Our layout is docs/design.md "Draft trees": nodes 0..tree_sizes[r]-1 in SGLang's order
(node_index maps them back), parents -1 for a child of the anchor.

The functions return tensors on their inputs' device and never import SGLang. ``validate=True`` checks the
structure (one host sync); pass False inside a CUDA graph. Errors are ValueErrors naming the argument.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch

from . import _check_int, _check_tensor, _num_reqs, _plan_field, _relative_starts

__all__ = ["SGLangTree", "tree_from_sglang", "tree_from_eagle_draft", "tree_from_sglang_mask", "mask_bits_from_sglang",
           "tree_to_sglang", "tree_mask_to_sglang", "tree_verify_input", "tree_verify_output"]

#: Most tokens of a request's block: the anchor plus MAX_TREE_NODES (63) nodes, one 64-bit mask word.
MAX_BLOCK = 64
_MODES = {0: "full", 1: "qlen", 2: "bitpacked", "full": "full", "qlen": "qlen", "bitpacked": "bitpacked"}


class SGLangTree(NamedTuple):
    """A batch of SGLang trees in our layout (plan_tree_verification's inputs)."""

    anchor_tokens: torch.Tensor  # [R] int32, block token 0
    parents: torch.Tensor  # [R, N] int32, N = n - 1; -1 past tree_sizes too
    tree_sizes: torch.Tensor  # [R] int32, the nodes SGLang's verify can reach
    draft_tokens: torch.Tensor  # [R, N] int32, -1 past tree_sizes
    node_index: torch.Tensor  # [R, N] int64, SGLang's block index (1..n-1) of node j, -1 past tree_sizes


def _mode(mode) -> str:
    key = int(mode) if isinstance(mode, int) else mode  # SGLang's TreeMaskMode is an IntEnum
    if key not in _MODES:
        raise ValueError(f"mask_mode must be 'full', 'qlen', 'bitpacked' or TreeMaskMode 0/1/2, got {mode!r}")
    return _MODES[key]


def _fail(ok: torch.Tensor, msg: str) -> None:
    if not bool(ok.all()):
        raise ValueError(msg)


def _unpack(bits: torch.Tensor, W: int) -> torch.Tensor:
    """[..., W] bool: bit k of each int64 word."""
    k = torch.arange(W, dtype=torch.int64, device=bits.device)
    return ((bits.unsqueeze(-1) >> k) & 1).bool()


def _pack(m: torch.Tensor) -> torch.Tensor:
    """[...] int64 from [..., W] bool, W <= 64 (bit 63 makes the word negative, as in plan.tree_mask)."""
    out = torch.zeros(m.shape[:-1], dtype=torch.int64, device=m.device)
    for k in range(m.shape[-1]):
        out |= m[..., k].to(torch.int64) << k
    return out


def _doublings(n: int) -> int:
    return max(1, math.ceil(math.log2(max(n, 2))))


def _tree_from_block_parents(parent: torch.Tensor, tokens: torch.Tensor) -> SGLangTree:
    """parent [R, n] int64: block index of each token's parent (entry 0 unread), -1 for none (unlinked).
    Keeps the drafts linked to token 0 through their ancestors, in block order."""
    R, n = parent.shape
    N, dev = n - 1, parent.device
    sink = torch.full((R, 1), n, dtype=torch.int64, device=dev)
    anc = torch.cat([torch.where(parent < 0, n, parent), sink], 1)
    anc[:, 0] = 0
    for _ in range(_doublings(n) + 1):  # pointer doubling: every ancestor chain ends at 0 (reached) or the sink
        anc = anc.gather(1, anc)
    reach = anc[:, 1:n] == 0  # [R, N]
    ours = torch.cumsum(reach, 1) - 1  # our index of block token c + 1
    dest = torch.where(reach, ours, N)  # unreachable drafts go to a dropped column
    ours_blk = torch.cat([torch.full((R, 1), -1, dtype=torch.int64, device=dev), ours], 1)  # block 0 -> -1
    par = ours_blk.gather(1, parent[:, 1:].clamp(min=0))

    def place(values):
        return torch.full((R, N + 1), -1, dtype=torch.int64, device=dev).scatter_(1, dest, values)[:, :N]

    cols = torch.arange(1, n, dtype=torch.int64, device=dev).expand(R, N)
    return SGLangTree(anchor_tokens=tokens[:, 0].to(torch.int32), parents=place(par).to(torch.int32),
                      tree_sizes=reach.sum(1).to(torch.int32), draft_tokens=place(tokens[:, 1:]).to(torch.int32),
                      node_index=place(cols))


def _block_tokens(draft_token: torch.Tensor, R: int, n: int) -> torch.Tensor:
    _check_tensor("draft_token", draft_token)
    if draft_token.dim() == 2 and draft_token.shape[1] == n and draft_token.shape[0] >= R:
        return draft_token[:R].to(torch.int64)
    if draft_token.dim() == 1 and draft_token.shape[0] >= R * n:
        return draft_token[: R * n].reshape(R, n).to(torch.int64)
    raise ValueError(f"draft_token must be [>= num_reqs * n] = [>= {R * n}] or [>= {R}, {n}] (n = draft_token_num), "
                     f"got shape {tuple(draft_token.shape)}")


def tree_from_sglang(draft_token: torch.Tensor, retrieve_next_token: torch.Tensor,
                     retrieve_next_sibling: torch.Tensor, num_reqs: Optional[int] = None, *,
                     validate: bool = True) -> SGLangTree:
    """Our tree from SGLang's verify pointers (``EagleVerifyInput``: draft_token, retrieve_next_token,
    retrieve_next_sibling, as build_tree_kernel_efficient writes them).

    draft_token: [bs * n] (or [bs, n]), each block's verified token then its drafts. retrieve_next_token,
    retrieve_next_sibling: [bs, n] int, n = draft_token_num in [1, 64]. num_reqs: the first rows to convert
    (default bs; later rows are a CUDA graph's padding). validate checks every pointer lies in [-1, n), points to a
    higher index, and that no token is pointed to twice (one host sync). Drafts no pointer chain reaches are left out.
    """
    _check_tensor("retrieve_next_token", retrieve_next_token, ndim=2)
    _check_tensor("retrieve_next_sibling", retrieve_next_sibling, ndim=2)
    if retrieve_next_sibling.shape != retrieve_next_token.shape:
        raise ValueError(f"retrieve_next_sibling must have retrieve_next_token's shape "
                         f"{tuple(retrieve_next_token.shape)}, got {tuple(retrieve_next_sibling.shape)}")
    bs, n = retrieve_next_token.shape
    if not 1 <= n <= MAX_BLOCK:
        raise ValueError(f"retrieve_next_token must have draft_token_num in [1, {MAX_BLOCK}] columns, got {n}")
    R = bs if num_reqs is None else _check_int("num_reqs", num_reqs, lo=0, hi=bs)
    tokens = _block_tokens(draft_token, R, n)
    nt, ns = retrieve_next_token[:R].to(torch.int64), retrieve_next_sibling[:R].to(torch.int64)
    dev = nt.device
    idx = torch.arange(n, dtype=torch.int64, device=dev).expand(R, n)
    if validate:
        for name, p in (("retrieve_next_token", nt), ("retrieve_next_sibling", ns)):
            _fail((p == -1) | ((p > idx) & (p < n)), f"{name}: every entry must be -1 or a higher block index < {n}")
        _fail(ns[:, :1] == -1, "retrieve_next_sibling: the verified token (index 0) has no sibling")
        cnt = torch.zeros(R, n + 1, dtype=torch.int64, device=dev)
        cnt.scatter_add_(1, torch.where(nt >= 0, nt, n), torch.ones_like(nt))
        cnt.scatter_add_(1, torch.where(ns >= 0, ns, n), torch.ones_like(ns))
        _fail(cnt[:, :n] <= 1, "retrieve_next_token / retrieve_next_sibling: a token is pointed to twice")
    first_of = torch.full((R, n + 1), -1, dtype=torch.int64, device=dev).scatter_(1, torch.where(nt >= 0, nt, n), idx)
    prev = torch.full((R, n + 1), -1, dtype=torch.int64, device=dev).scatter_(1, torch.where(ns >= 0, ns, n), idx)
    head = torch.where(prev[:, :n] >= 0, prev[:, :n], idx)  # previous sibling, or itself at a sibling list's head
    for _ in range(_doublings(n) + 1):
        head = head.gather(1, head)
    return _tree_from_block_parents(first_of.gather(1, head), tokens)


def tree_from_eagle_draft(bonus_tokens: torch.Tensor, draft_tokens: torch.Tensor, parent_list: torch.Tensor,
                          top_scores_index: torch.Tensor, topk: int, *, validate: bool = True) -> SGLangTree:
    """Our tree straight from SGLang's draft loop (``organize_draft_results``' parent_list, top_scores_index and
    draft_tokens, before build_tree_kernel_efficient): the same tree its builder links.

    bonus_tokens: [bs] the verified tokens. draft_tokens, top_scores_index: [bs, n - 1] (top_scores_index sorted
    ascending). parent_list: [bs, L] with L = 1 + (spec_steps - 1) * topk (0 columns for spec_steps = 1). topk >= 1.
    """
    k = _check_int("topk", topk, lo=1)
    _check_tensor("bonus_tokens", bonus_tokens, ndim=1)
    _check_tensor("draft_tokens", draft_tokens, ndim=2)
    _check_tensor("top_scores_index", top_scores_index, ndim=2)
    _check_tensor("parent_list", parent_list, ndim=2)
    R, N = top_scores_index.shape
    if N + 1 > MAX_BLOCK:
        raise ValueError(f"top_scores_index must have at most {MAX_BLOCK - 1} columns, got {N}")
    if draft_tokens.shape != (R, N) or bonus_tokens.shape[0] != R or parent_list.shape[0] != R:
        raise ValueError(f"draft_tokens must be top_scores_index's shape {(R, N)}, bonus_tokens [{R}] and parent_list "
                         f"[{R}, L]; got {tuple(draft_tokens.shape)}, {tuple(bonus_tokens.shape)}, "
                         f"{tuple(parent_list.shape)}")
    sel = top_scores_index.to(torch.int64)
    tb = sel // k  # 0: a child of the verified token; else parent_list's entry for the parent
    L = parent_list.shape[1]
    if validate:
        _fail(sel >= 0, "top_scores_index must be >= 0")
        _fail(sel[:, 1:] > sel[:, :-1], "top_scores_index must increase strictly along each row")
        _fail((tb == 0) | (tb < L), f"top_scores_index: s // topk must be 0 or < parent_list.shape[1] = {L}")
    if L:
        pflat = parent_list.to(torch.int64).gather(1, tb.clamp(max=L - 1))
    else:
        pflat = torch.full_like(sel, -1)
    eq = sel[:, None, :] == pflat[:, :, None]  # [R, N, N]: draft pp is draft i's parent
    pos = eq.to(torch.int8).argmax(-1) + 1
    parent = torch.where(tb == 0, 0, torch.where(eq.any(-1), pos, -1))
    if validate:
        own = torch.arange(1, N + 1, dtype=torch.int64, device=sel.device)
        _fail(parent < own, "parent_list: a draft's parent must come before it in top_scores_index")
    block_parent = torch.cat([torch.full((R, 1), -1, dtype=torch.int64, device=sel.device), parent], 1)
    tokens = torch.cat([bonus_tokens.to(torch.int64)[:, None], draft_tokens.to(torch.int64)], 1)
    return _tree_from_block_parents(block_parent, tokens)


def mask_bits_from_sglang(custom_mask: torch.Tensor, draft_token_num: int, num_reqs: int, *, mask_mode="full",
                          seq_lens: Optional[torch.Tensor] = None, validate: bool = True) -> torch.Tensor:
    """SGLang's custom_mask (uniform layout, any TreeMaskMode) as [R, n] int64 words: bit k of token i's word set
    iff token i attends to block token k (plan.tree_mask's convention, in SGLang's block order).

    seq_lens: [R] int, the KV lengths before the step (SGLang's batch.seq_lens): required by "full", whose context
    columns are checked True under validate. "bitpacked": one integer word per token, the dtype SGLang picked
    (uint8 / uint16 / uint32; int64 for n > 32)."""
    n = _check_int("draft_token_num", draft_token_num, lo=1, hi=MAX_BLOCK)
    R = _check_int("num_reqs", num_reqs, lo=0)
    mode = _mode(mask_mode)
    if not isinstance(custom_mask, torch.Tensor) or custom_mask.dim() != 1:
        raise ValueError(f"custom_mask must be a 1-D torch.Tensor, got {getattr(custom_mask, 'shape', custom_mask)}")
    dev = custom_mask.device
    ar = torch.arange(n, dtype=torch.int64, device=dev)
    if mode == "bitpacked":
        nb = custom_mask.element_size()
        if custom_mask.dtype.is_floating_point or custom_mask.dtype == torch.bool or 8 * nb < n:
            raise ValueError(f"custom_mask (bitpacked) must be an integer dtype of >= {n} bits, got {custom_mask.dtype}")
        if custom_mask.shape[0] < R * n:
            raise ValueError(f"custom_mask (bitpacked) must have >= num_reqs * n = {R * n} entries, "
                             f"got {custom_mask.shape[0]}")
        raw = custom_mask[: R * n].contiguous().view(torch.uint8).reshape(R * n, nb).to(torch.int64)
        bits = torch.zeros(R * n, dtype=torch.int64, device=dev)
        for b in range(nb):
            bits |= raw[:, b] << (8 * b)
        return bits.reshape(R, n)
    if custom_mask.dtype != torch.bool:
        raise ValueError(f"custom_mask ({mode}) must be bool, got {custom_mask.dtype}")
    if mode == "qlen":
        if custom_mask.shape[0] < R * n * n:
            raise ValueError(f"custom_mask (qlen) must have >= num_reqs * n * n = {R * n * n} entries, "
                             f"got {custom_mask.shape[0]}")
        return _pack(custom_mask[: R * n * n].reshape(R, n, n))
    _check_tensor("seq_lens", seq_lens, ndim=1)
    if seq_lens.shape[0] < R:
        raise ValueError(f"seq_lens must have >= num_reqs = {R} entries, got {seq_lens.shape[0]}")
    sl = seq_lens[:R].to(device=dev, dtype=torch.int64)
    base = n * n * torch.arange(R, dtype=torch.int64, device=dev) + n * (torch.cumsum(sl, 0) - sl)  # [R]
    row = base[:, None] + (sl[:, None] + n) * ar  # [R, n] each row's first (context) column
    if validate:
        need = R * n * n + n * int(sl.sum())
        if custom_mask.shape[0] < need:
            raise ValueError(f"custom_mask (full) must have >= {need} entries for these seq_lens, "
                             f"got {custom_mask.shape[0]}")
        for r in range(R):  # the context columns: every token sees the whole context
            c = int(sl[r])
            rows = custom_mask[int(base[r]): int(base[r]) + n * (c + n)].reshape(n, c + n)
            _fail(rows[:, :c], f"custom_mask (full): request {r}'s context columns must be True")
    return _pack(custom_mask[(row + sl[:, None])[..., None] + ar])


def tree_from_sglang_mask(draft_token: torch.Tensor, custom_mask: torch.Tensor, draft_token_num: int,
                          num_reqs: int, *, mask_mode="full", seq_lens: Optional[torch.Tensor] = None,
                          validate: bool = True) -> SGLangTree:
    """Our tree from SGLang's custom_mask (token i's parent: its highest-index ancestor, as SGLang's
    reconstruct_indices_from_tree_mask reads an NGRAM mask). A mask cannot tell a draft left unlinked by
    EAGLE's builder (its row: token 0 and itself) from a child of token 0: use :func:`tree_from_sglang` there.
    validate checks each row is a tree row: token 0 and itself set, nothing above itself, and its parent's row
    plus itself."""
    n = _check_int("draft_token_num", draft_token_num, lo=1, hi=MAX_BLOCK)
    bits = mask_bits_from_sglang(custom_mask, n, num_reqs, mask_mode=mask_mode, seq_lens=seq_lens, validate=validate)
    tokens = _block_tokens(draft_token, num_reqs, n)
    m = _unpack(bits, n)  # [R, n, n]
    ar = torch.arange(n, dtype=torch.int64, device=bits.device)
    strict = m & (ar[None, :] < ar[:, None])
    parent = torch.where(strict.any(-1), torch.where(strict, ar, -1).amax(-1), -1)
    if validate and num_reqs:
        ok = m[:, ar, ar] & m[:, :, 0] & ~(m & (ar[None, :] > ar[:, None])).any(-1)
        _fail(ok, "custom_mask: every token must attend to token 0 and itself and to no later token")
        want = bits.gather(1, parent.clamp(min=0)) | (1 << ar)
        _fail((want == bits)[:, 1:], "custom_mask: a token's row must be its parent's row plus itself")
    return _tree_from_block_parents(parent, tokens)


# ----------------------------------------------------------------------------------------------------------------
# our trees and plans -> SGLang's fields
# ----------------------------------------------------------------------------------------------------------------


def _pointers(par: torch.Tensor, linked: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's first-child / next-sibling pointers from block parent offsets par [R, W] (-1: none), over the
    linked tokens: the lowest-index child, the next higher-index sibling."""
    W = par.shape[1]
    ar = torch.arange(W, dtype=torch.int64, device=par.device)
    lk = linked & (par >= 0)
    child = lk[:, None, :] & (par[:, None, :] == ar[None, :, None])  # [R, p, c]
    nxt = torch.where(child, ar, W).amin(-1)
    sib = lk[:, None, :] & lk[:, :, None] & (par[:, None, :] == par[:, :, None]) & (ar[None, :] > ar[:, None])
    sib_next = torch.where(sib, ar, W).amin(-1)
    return torch.where(nxt < W, nxt, -1), torch.where(sib_next < W, sib_next, -1)


def _custom_mask(bits: torch.Tensor, q_len: torch.Tensor, ctx: Optional[torch.Tensor], mode: str) -> torch.Tensor:
    """SGLang's custom_mask over blocks of q_len[r] <= W tokens (bits [R, W], row-major tokens)."""
    R, W = bits.shape
    dev = bits.device
    ar = torch.arange(W, dtype=torch.int64, device=dev)
    valid = ar[None, :] < q_len[:, None]
    if mode == "bitpacked":
        nbytes = 1 << math.ceil(math.log2((W + 7) // 8))  # SGLang's choice: 1, 2 or 4 bytes (8 past its 32 tokens)
        dtype = {1: torch.uint8, 2: torch.uint16, 4: torch.uint32, 8: torch.int64}[nbytes]
        words = bits[valid].contiguous()  # [T] tokens in order; little-endian: the low bytes hold the low bits
        return words.view(torch.uint8).reshape(-1, 8)[:, :nbytes].contiguous().view(dtype).reshape(-1)
    m = _unpack(bits, W) & valid[:, :, None] & valid[:, None, :]
    if mode == "qlen":
        return m.reshape(-1)
    if ctx is None:
        raise ValueError("the full mask needs the context lengths (seq_lens / plan made with context_lens)")
    c, q = ctx.to(torch.int64), q_len.to(torch.int64)
    sizes = q * (c + q)
    base = torch.cumsum(sizes, 0) - sizes
    out = torch.ones(int(sizes.sum()), dtype=torch.bool, device=dev)  # one host sync, as SGLang's seq_lens_sum
    pos = base[:, None, None] + (c + q)[:, None, None] * ar[None, :, None] + c[:, None, None] + ar
    keep = valid[:, :, None] & valid[:, None, :]
    out[pos[keep]] = m[keep]
    return out


def tree_to_sglang(anchor_tokens: torch.Tensor, parents: torch.Tensor, tree_sizes: torch.Tensor,
                   draft_tokens: torch.Tensor, *, seq_lens: Optional[torch.Tensor] = None, mask_mode="full") -> dict:
    """Our trees in SGLang's uniform tree layout (what build_tree_kernel_efficient writes), n = N + 1 tokens per
    request: token 0 the anchor, token j + 1 node j. Nodes j >= tree_sizes[r] are unlinked padding (token id 0,
    mask row token 0 and itself, as SGLang's builder leaves an unlinked draft).

    anchor_tokens [R], parents [R, N] int (-1: child of the anchor, parents[r, j] < j), tree_sizes [R],
    draft_tokens [R, N]; seq_lens [R]: KV lengths before the step (needed for positions and the "full" mask).
    Returns draft_token [R * n] int64, positions [R * n] int64 (seq_lens + depth; absent without seq_lens),
    retrieve_index / retrieve_next_token / retrieve_next_sibling [R, n] int64, custom_mask (mask_mode),
    draft_token_num n.
    """
    mode = _mode(mask_mode)
    _check_tensor("parents", parents, ndim=2)
    R, N = parents.shape
    if N + 1 > MAX_BLOCK:
        raise ValueError(f"parents must have at most {MAX_BLOCK - 1} columns, got {N}")
    _check_tensor("tree_sizes", tree_sizes, ndim=1)
    _check_tensor("anchor_tokens", anchor_tokens, ndim=1)
    _check_tensor("draft_tokens", draft_tokens, ndim=2)
    if tree_sizes.shape[0] != R or anchor_tokens.shape[0] != R or draft_tokens.shape[0] != R or \
            draft_tokens.shape[1] < N:
        raise ValueError(f"tree_sizes and anchor_tokens must be [{R}] and draft_tokens [{R}, >= {N}], got "
                         f"{tuple(tree_sizes.shape)}, {tuple(anchor_tokens.shape)}, {tuple(draft_tokens.shape)}")
    dev, n = parents.device, N + 1
    sizes = tree_sizes.to(torch.int64)
    j = torch.arange(N, dtype=torch.int64, device=dev)
    linked = j[None, :] < sizes[:, None]  # [R, N]
    p = parents.to(torch.int64)
    _fail((sizes >= 0) & (sizes <= N), f"tree_sizes must lie in [0, {N}]")
    _fail(~linked | ((p >= -1) & (p < j)), "parents: parents[r, j] must lie in [-1, j) for j < tree_sizes[r]")
    par = torch.cat([torch.full((R, 1), -1, dtype=torch.int64, device=dev), torch.where(linked, p + 1, 0)], 1)
    lk = torch.cat([torch.ones(R, 1, dtype=torch.bool, device=dev), linked], 1)
    # ancestors-or-self by squaring the one-step relation (paths are shorter than 64 steps)
    ar = torch.arange(n, dtype=torch.int64, device=dev)
    step = (par[:, :, None] == ar) | torch.eye(n, dtype=torch.bool, device=dev)
    m = step.float()
    for _ in range(_doublings(n)):
        m = (torch.bmm(m, m) > 0).float()
    m = m > 0
    nxt, sib = _pointers(par, lk)
    tokens = torch.cat([anchor_tokens.to(torch.int64)[:, None],
                        torch.where(linked, draft_tokens[:, :N].to(torch.int64), 0)], 1)
    out = {
        "draft_token": tokens.reshape(-1),
        "retrieve_index": torch.arange(R * n, dtype=torch.int64, device=dev).reshape(R, n),
        "retrieve_next_token": nxt,
        "retrieve_next_sibling": sib,
        "draft_token_num": n,
    }
    ctx = None
    if seq_lens is None and mode == "full":
        raise ValueError("seq_lens is required with mask_mode 'full' (its rows hold the context columns)")
    if seq_lens is not None:
        _check_tensor("seq_lens", seq_lens, ndim=1)
        if seq_lens.shape[0] != R:
            raise ValueError(f"seq_lens must have {R} entries, got {seq_lens.shape[0]}")
        ctx = seq_lens.to(device=dev, dtype=torch.int64)
        out["positions"] = (ctx[:, None] + m.sum(-1) - 1).reshape(-1)
    out["custom_mask"] = _custom_mask(_pack(m), torch.full((R,), n, dtype=torch.int64, device=dev), ctx, mode)
    return out


def varlen_verify_fields(plan, R: int, num_tokens: Optional[int]) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """The verify fields chains (sglang.verify_input) and trees (tree_verify_input) share: draft_token, positions
    [num_tokens] int64, seq_lens (before the step), end_offset (after), qo_indptr, kv_indptr, verify_lens (int32);
    with the plan's 0-based request starts [R + 1] and q_len [R] (int64)."""
    end = _plan_field(plan, "seq_lens", needs="context_lens")[:R].to(torch.int64)
    positions = _plan_field(plan, "positions", needs="context_lens")
    input_ids = _plan_field(plan, "input_ids", needs="anchor_tokens and draft_tokens")
    T = input_ids.shape[0]
    n = T if num_tokens is None else _check_int("num_tokens", num_tokens, lo=0, hi=T)
    starts = _relative_starts(plan, R)  # [R + 1] int64
    q_len = starts[1:] - starts[:-1]
    kv_indptr = torch.zeros(R + 1, dtype=torch.int64, device=starts.device)
    kv_indptr[1:] = torch.cumsum(end, 0)
    fields = {
        "draft_token": input_ids[:n].to(torch.int64),
        "positions": positions[:n].to(torch.int64),
        "seq_lens": (end - q_len).to(torch.int32),
        "end_offset": end.to(torch.int32),
        "qo_indptr": starts.to(torch.int32),
        "kv_indptr": kv_indptr.to(torch.int32),
        "verify_lens": plan.verify_lens[:R].to(torch.int32),
    }
    return fields, starts, q_len


def _plan_blocks(plan, starts: torch.Tensor, q_len: torch.Tensor, W: int, validate: bool):
    """The plan's tokens as [R, W] blocks: (token index [R, W] clamped, valid [R, W])."""
    if validate and q_len.numel() and int(q_len.max()) > W:  # one sync: a q_len above W would drop tokens from the [R, W] fields
        raise ValueError(f"max_query_len must be >= every request's q_len (largest {int(q_len.max())}), got {W}")
    ar = torch.arange(W, dtype=torch.int64, device=starts.device)
    valid = ar[None, :] < q_len[:, None]
    tok = (starts[:-1, None] + ar).clamp(max=max(plan.token_req.shape[0] - 1, 0))  # the buffers are 0-based
    return tok, valid


def tree_verify_input(plan, max_query_len: int, num_reqs: Optional[int] = None, *, mask_mode="full",
                      num_tokens: Optional[int] = None, validate: bool = True) -> dict:
    """SGLang's verify fields for the tokens a TreeVerifyPlan verifies (made with context_lens, anchor_tokens and
    draft_tokens): varlen, request r's rows qo_indptr[r] .. qo_indptr[r + 1] (its anchor, then its verified nodes).

    max_query_len: host int >= every q_len (e.g. the tree's N + 1): the width of the [R, W] fields (validate
        checks it, one host sync; a larger q_len would lose tokens).
    Returns draft_token, positions [num_tokens] int64; seq_lens (before the step), end_offset (after), qo_indptr,
    kv_indptr, verify_lens as :func:`verify_input`; retrieve_index [R, W] int64 (row qo_indptr[r] + offset, -1 past
    q_len), retrieve_next_token / retrieve_next_sibling [R, W] int64 (offsets within the request); custom_mask in
    mask_mode over these blocks: "full" q_len rows of (seq_len + q_len) per request (one host sync for its size),
    "qlen" [R, W, W] flattened (False outside q_len), "bitpacked" one word per verified token;
    tree_topk -1 (SGLang's mark of an irregular tree).
    """
    mode = _mode(mask_mode)
    W = _check_int("max_query_len", max_query_len, lo=1, hi=MAX_BLOCK)
    R = _num_reqs(plan, num_reqs)
    for f in ("tree_mask", "token_parent"):
        _plan_field(plan, f, needs="parents (a TreeVerifyPlan from plan_tree_verification)")
    fields, starts, q_len = varlen_verify_fields(plan, R, num_tokens)
    tok, valid = _plan_blocks(plan, starts, q_len, W, validate)
    par = torch.where(valid, plan.token_parent.to(torch.int64)[tok], -1)
    bits = torch.where(valid, plan.tree_mask[tok], 0)
    nxt, sib = _pointers(par, valid)
    ar = torch.arange(W, dtype=torch.int64, device=starts.device)
    return {
        **fields,
        "retrieve_index": torch.where(valid, starts[:-1, None] + ar, -1),
        "retrieve_next_token": nxt,
        "retrieve_next_sibling": sib,
        "custom_mask": _custom_mask(bits, q_len, fields["seq_lens"].to(torch.int64), mode),
        "tree_topk": -1,
    }


def tree_mask_to_sglang(plan, node_index: torch.Tensor, num_reqs: Optional[int] = None) -> torch.Tensor:
    """plan.tree_mask re-indexed to SGLang's blocks: [T_pad] int64, bit s of token t's word set iff t attends to the
    token at SGLang block index s (0 the anchor, node_index[r, j] node j); 0 for padding. For every verified token
    this is SGLang's own mask row of that token (mask_bits_from_sglang), as the verified nodes are ancestor-closed.
    node_index: [R, N] int64, :class:`SGLangTree`'s; num_reqs defaults to its rows."""
    _check_tensor("node_index", node_index, ndim=2)
    R = _num_reqs(plan, node_index.shape[0] if num_reqs is None else num_reqs)
    if node_index.shape[0] < R:
        raise ValueError(f"node_index must have >= num_reqs = {R} rows, got {node_index.shape[0]}")
    tm = _plan_field(plan, "tree_mask", needs="parents (a TreeVerifyPlan)")
    node = _plan_field(plan, "token_node", needs="parents (a TreeVerifyPlan)").to(torch.int64)
    req = plan.token_req.to(torch.int64)
    T = req.shape[0]
    real = (req >= 0) & (req < R)
    r = req.clamp(0, max(R - 1, 0))
    ni = node_index.to(torch.int64)
    sg = torch.where(real & (node >= 0), ni[r, node.clamp(min=0, max=max(ni.shape[1] - 1, 0))] if ni.numel()
                     else torch.zeros_like(node), 0)  # [T] SGLang block index of each token
    start = _relative_starts(plan, R)[r]  # row of each token's anchor (the plan's buffers are 0-based)
    out = torch.zeros(T, dtype=torch.int64, device=tm.device)
    for k in range(MAX_BLOCK):
        hit = real & (((tm >> k) & 1) == 1)
        out |= torch.where(hit, 1 << sg[(start + k).clamp(max=T - 1)], 0)
    return out


def tree_verify_output(plan, output_tokens: torch.Tensor, num_emitted: torch.Tensor, accepted_offsets: torch.Tensor,
                       num_reqs: Optional[int] = None, *, node_index: Optional[torch.Tensor] = None,
                       host: bool = True) -> dict:
    """SGLang's verify results (eagle_sample's predict, accept_lens, accept_index) from tree_rejection_sample's.

    Returns, on the device without a sync:
        ``accept_lens`` [R] int32: emitted tokens, the bonus included (eagle_sample's accept_lens);
        ``num_correct_drafts`` [R] int32: accepted nodes (accept_lens - 1; commit_tree_kv's num_accepted);
        ``accept_index`` [R, W] int32: verify-forward rows (qo_indptr[r] + offset, 0-based) of the path's tokens,
            the anchor first, -1 past accept_lens;
        ``predict`` [T] int32 over the forward's rows: the token drawn at each path row (0 elsewhere), so
            ``predict[accept_index]`` lists each request's emitted tokens as SGLang reads them;
    with node_index ([R, N] int64, :class:`SGLangTree`'s): ``accept_node`` [R, W] int64, SGLang's block index of
    each path token (0 the anchor), and ``sglang_accept_index`` (r * n + accept_node, n = N + 1): the accept_index
    SGLang's own verify would give on its full [bs, n] layout (-1 padded);
    and with host=True (one sync): ``verified_id`` (the emitted tokens, concatenated) and
    ``accept_length_per_req_cpu`` (accepted drafts per request, a list).
    """
    R = _num_reqs(plan, num_reqs)
    _check_tensor("output_tokens", output_tokens, ndim=2)
    _check_tensor("num_emitted", num_emitted, ndim=1)
    _check_tensor("accepted_offsets", accepted_offsets, ndim=2)
    if output_tokens.shape[0] < R or num_emitted.shape[0] < R or accepted_offsets.shape != output_tokens.shape:
        raise ValueError(f"output_tokens and accepted_offsets must be [>= {R}, W] of one shape and num_emitted "
                         f"[>= {R}], got {tuple(output_tokens.shape)}, {tuple(accepted_offsets.shape)}, "
                         f"{tuple(num_emitted.shape)}")
    starts = _relative_starts(plan, R)
    W = output_tokens.shape[1]
    emitted = num_emitted[:R].to(torch.int64)
    ar = torch.arange(W, dtype=torch.int64, device=starts.device)
    inside = ar[None, :] < emitted[:, None]
    offs = accepted_offsets[:R].to(torch.int64)
    rows = torch.where(inside, starts[:-1, None] + offs, -1)
    T = _plan_field(plan, "token_req").shape[0]
    predict = torch.zeros(T, dtype=torch.int32, device=starts.device)
    predict[rows.clamp(min=0)[inside]] = output_tokens[:R][inside].to(torch.int32)
    out = {
        "accept_lens": emitted.to(torch.int32),
        "num_correct_drafts": (emitted - 1).clamp(min=0).to(torch.int32),
        "accept_index": rows.to(torch.int32),
        "predict": predict,
    }
    if node_index is not None:
        _check_tensor("node_index", node_index, ndim=2)
        if node_index.shape[0] < R:
            raise ValueError(f"node_index must have >= num_reqs = {R} rows, got {node_index.shape[0]}")
        node = _plan_field(plan, "token_node", needs="parents (a TreeVerifyPlan)").to(torch.int64)
        j = node[rows.clamp(min=0, max=T - 1)]  # node of each path token, -1 for the anchor
        ni = node_index[:R].to(torch.int64)
        sg = torch.where(j >= 0, ni.gather(1, j.clamp(min=0, max=max(ni.shape[1] - 1, 0))) if ni.shape[1]
                         else torch.zeros_like(j), 0)
        n = node_index.shape[1] + 1
        out["accept_node"] = torch.where(inside, sg, -1)
        out["sglang_accept_index"] = torch.where(inside, torch.arange(R, device=sg.device)[:, None] * n + sg, -1)
    if host:
        out["verified_id"] = output_tokens[:R][inside].to(torch.int32)
        out["accept_length_per_req_cpu"] = [int(x) for x in out["num_correct_drafts"].tolist()]
    return out
