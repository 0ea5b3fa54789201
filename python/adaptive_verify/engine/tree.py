"""Draft trees for the small engine (docs/design.md, "Draft trees"): the DSpark drafter proposing a tree, EAGLE-2
style, and the verification step over it (plan, tree-masked target forward, sample and match, KV commit).

Drafting (``draft_tree``): the drafter's backbone gives, per depth d = 1..K, a hidden state and logits that do not
depend on the path; only the Markov head reads the parent's token. So every node costs one Markov step:

- depth 1: the anchor's top-k tokens are its children;
- depth d >= 2: the k depth-(d-1) nodes of highest path confidence (survival) are expanded, each into its top-k
  tokens (EAGLE-2's "expand the top-k"), giving k * k nodes per depth;
- then the N nodes of highest survival (ties: shallower first, then drafted first) are kept, which is
  ancestor-closed (a child never survives more than its parent), and laid out breadth first (parents before
  children; nodes past a request's depth limit last, outside its tree size).

A request drafting a chain is the k = 1 tree: the greedy drafts of ``DSparkDrafter.draft`` with parents j - 1,
so a batch may mix chains and trees (``topk`` per request).

Each node's confidence is its CONDITIONAL acceptance probability, what the planner multiplies along the path:
the top child's comes from the calibrated confidence head, exactly as a chain draft's (the head's features are
the parent's Markov embedding and the chosen token's score features); an alternative of rank i >= 2 gets the rest
of the probability, split as the drafter's distribution q splits it: (1 - c_1) * q_i / (1 - q_1). Under one-hot
verification siblings are disjoint events, and this keeps their confidences summing to at most 1 (the head was
trained on greedy drafts only, so it is not asked about tokens it never saw chosen).

Tree size: with k alternatives and depth limit D (min(K, tokens still wanted - 1)), a request has
k + (D - 1) * k * k candidate nodes, so its tree size ``tree_size(k, D, N)`` is known on the host before drafting
(the lagged budget and the CUDA graph are chosen from it).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

import adaptive_verify as av

from .drafter import DSparkDrafter

__all__ = ["draft_tree", "tree_size", "verify_tree_step"]


def level_beam(beam, level: int) -> Optional[int]:
    """The nodes of ``level`` (1-based) expanded into the next: beam itself (None: every node's topk), or per-level
    widths' entry level - 1 (levels past them expand one: AdaptiveVerifier.plan_tree_draft lists depth - 1)."""
    if beam is None:
        return None
    if not isinstance(beam, (tuple, list)):
        return int(beam)  # (an int, numpy's or a 0-d tensor's)
    return int(beam[level - 1]) if level - 1 < len(beam) else 1


def tree_size(topk: int, depth: int, max_nodes: int, beam=None) -> int:
    """Nodes ``draft_tree`` drafts for a request with ``topk`` alternatives, depth limit ``depth`` and a beam of
    ``beam`` nodes expanded per level (None: topk; or per-level widths, entry l - 1 for level l)."""
    if depth <= 0 or topk <= 0:
        return 0
    expanded = sum(topk if b is None else min(b, topk) for b in (level_beam(beam, l) for l in range(1, depth)))
    return min(max_nodes, topk + expanded * topk)


def width(topk_max: int, num_drafts: int, max_nodes: int) -> int:
    """Columns of ``draft_tree``'s outputs: min(N, every node drafted at the largest k and full depth)."""
    return tree_size(topk_max, num_drafts, max_nodes)


@torch.no_grad()
def draft_tree(drafter: DSparkDrafter, h: torch.Tensor, anchor: torch.Tensor, topk: Sequence[int], max_nodes: int,
               max_depth: Sequence[int], beam=None):
    """A draft tree per request (module docstring).

    h: [R, d] target hidden before the anchor; anchor: [R] ids; topk: R host ints >= 1 (1: a chain); max_nodes: N
    in [1, 63]; max_depth: R host ints in [0, K]; beam: the nodes of each depth expanded into the next (None: each
    request's topk; AdaptiveVerifier.plan_tree_draft's width: an int, or per-level widths with
    tree_widths="per_level"), so a request drafts tree_size(topk, depth, N, beam)
    nodes (the Markov steps after depth 1 shrink with it). Returns (tokens [R, W] int32, parents [R, W] int32,
    conf [R, W] float32, tree_sizes [R] int32) with W = min(width(max(topk), K, N), the nodes drafted); entries
    past a request's tree size are tokens 0, parents -1 and conf 0.
    """
    c = drafter.config
    K, V = c.num_drafts, c.vocab
    R = h.shape[0]
    dev = h.device
    if len(topk) != R or len(max_depth) != R:
        raise ValueError(f"topk and max_depth must have R = {R} entries")
    if R and (min(topk) < 1 or max(topk) > V):
        raise ValueError(f"topk values must be in [1, {V}], got {list(topk)}")
    if not 1 <= max_nodes <= av.planner.MAX_TREE_NODES:
        raise ValueError(f"max_nodes must be in [1, {av.planner.MAX_TREE_NODES}], got {max_nodes}")
    kmax = max(topk) if R else 1
    W = width(kmax, K, max_nodes)
    k_t = torch.tensor(list(topk), dtype=torch.int64, device=dev)  # [R]
    depth_t = torch.tensor(list(max_depth), dtype=torch.int64, device=dev)  # [R]
    conf_hidden, bb_logits = drafter.backbone(h, anchor)  # [R, K, H], [R, K, V]
    H = conf_hidden.shape[-1]
    w = drafter.conf_weight
    # The confidence head, split: its hidden part per depth once, its Markov part per frontier node below.
    head_base = conf_hidden @ w[:H] + drafter.conf_bias  # [R, K]
    temps = drafter.conf_temperature
    ranks = torch.arange(kmax, device=dev)
    kk = max(kmax, 2)  # the score features need the top two logits
    fr_tok = anchor.long()[:, None]  # [R, F] the frontier: the nodes expanded at this depth
    fr_surv = torch.ones(R, 1, device=dev)  # its survival, -1 for a node outside the request's tree
    fr_id = torch.full((R, 1), -1, dtype=torch.int64, device=dev)
    toks, pars, confs, survs = [], [], [], []
    per_depth = [kmax]  # nodes drafted at each depth (frontier width x kmax after the first)
    count = 0
    levels = max([1, *max_depth])  # the Markov steps stop at the deepest level any request drafts
    for d in range(1, levels + 1):
        F = fr_tok.shape[1]
        m = drafter.markov_embed(fr_tok)  # [R, F, M]
        logits = bb_logits[:, d - 1, None, :] + drafter.markov_out(m)  # [R, F, V]
        top_v, top_i = logits.topk(kk, dim=-1)  # [R, F, kk]
        lse = torch.logsumexp(logits, dim=-1, keepdim=True)  # [R, F, 1]
        # score features of the top child, as DSparkDrafter.score_features: log-prob and top-1 minus top-2 margin
        feats = torch.cat([m, top_v[..., :1] - lse, top_v[..., :1] - top_v[..., 1:2]], dim=-1)  # [R, F, Q]
        top1 = torch.sigmoid((head_base[:, d - 1, None] + feats @ w[H:]) / temps[d - 1])  # [R, F]
        q = torch.exp(top_v[..., :kmax] - lse)  # [R, F, kmax] the drafter's probabilities
        rest = (1.0 - top1)[..., None] * q / (1.0 - q[..., :1]).clamp_min(1e-12)
        cconf = torch.where(ranks == 0, top1[..., None], rest).clamp(0.0, 1.0)  # [R, F, kmax]
        ok = (fr_surv >= 0)[..., None] & (ranks < k_t[:, None, None]) & (d <= depth_t)[:, None, None]
        n = F * kmax
        surv = torch.where(ok, fr_surv[..., None] * cconf, torch.full_like(cconf, -1.0)).reshape(R, n)
        toks.append(top_i[..., :kmax].reshape(R, n))
        pars.append(fr_id[..., None].expand(R, F, kmax).reshape(R, n))
        confs.append(cconf.reshape(R, n))
        survs.append(surv)
        # The next frontier: this depth's best nodes (valid first, then survival, then drafted first); a request
        # expands only its first min(topk[r], beam) of them.
        bd = level_beam(beam, d)
        b_t = k_t if bd is None else k_t.clamp(max=bd)  # [R] nodes expanded at this depth
        fw = kmax if bd is None else min(kmax, bd)  # frontier width
        if d < levels:
            per_depth.append(fw * kmax)
        order = surv.sort(dim=1, descending=True, stable=True).indices[:, :fw]  # [R, fw]
        fr_tok = toks[-1].gather(1, order)
        fr_surv = torch.where(ranks[None, :fw] < b_t[:, None], surv.gather(1, order),
                              torch.full_like(order, -1.0, dtype=surv.dtype))
        fr_id = order + count
        count += n
    tok, par, cf, key = (torch.cat(x, dim=1) for x in (toks, pars, confs, survs))  # [R, M]; key: -1 if invalid
    ok = key >= 0
    dp = torch.repeat_interleave(torch.arange(1, levels + 1, device=dev), torch.tensor(per_depth, device=dev))  # [M]
    dp = dp.expand(R, -1)
    M = tok.shape[1]
    W = min(W, M)  # (a narrow beam drafts fewer nodes than the widest tree: the caller pads)
    sel = key.sort(dim=1, descending=True, stable=True).indices[:, :W]  # [R, W] best W, ancestor-closed
    sel_ok, sel_depth = ok.gather(1, sel), dp.gather(1, sel)
    # Breadth first: valid nodes by depth, then rank; the rest last.
    layout = (~sel_ok).long() * (K + 2) * (W + 1) + sel_depth * (W + 1) + torch.arange(W, device=dev)
    final = sel.gather(1, layout.argsort(dim=1))  # [R, W] node ids in layout order
    inv = torch.full((R, M), -1, dtype=torch.int64, device=dev)
    inv.scatter_(1, final, torch.arange(W, device=dev).expand(R, W))
    fpar = par.gather(1, final)
    parents = torch.where(fpar >= 0, inv.gather(1, fpar.clamp(min=0)), torch.full_like(fpar, -1))
    fok = ok.gather(1, final)
    sizes = fok.sum(1).to(torch.int32)
    tokens = torch.where(fok, tok.gather(1, final), torch.zeros_like(fpar)).to(torch.int32)
    parents = torch.where(fok, parents, torch.full_like(parents, -1)).to(torch.int32)
    conf = torch.where(fok, cf.gather(1, final), torch.zeros(R, W, device=dev)).contiguous()
    return tokens.contiguous(), parents.contiguous(), conf, sizes


def verify_tree_step(target, verifier, kv, W, padded, budget, conf, sizes, ctx, bt, anchors, tokens, parents, temps,
                     seeds, trim: bool = False):
    """Plan, tree-masked target forward on the padded varlen batch, sample and match, KV commit: the tree step a
    CUDA graph captures. Returns (plan, hidden, output_tokens, num_emitted, accepted_offsets, num_accepted).

    trim (eager steps): run the forward on the graph size of the plan's real token count, read back with one
    sync, instead of plan_budget's padded size. The live modes ("greedy", "global") only know B <= B_max on the
    host, so their padded size is B_max's (a tree's every node); a captured graph must keep it, an eager step need
    not. In the host-budget modes the two sizes are equal."""
    plan = verifier.plan(conf, sizes, ctx, bt, anchors, tokens, budget, padded_tokens=padded, parents=parents)
    n = min(verifier.padded_tokens(int(plan.num_tokens)), padded) if trim else padded
    logits, hidden = target.forward_paged(plan.input_ids[:n], plan.positions[:n], kv, bt, plan.seq_lens,
                                          plan.query_start_loc, plan.slot_mapping[:n], W, tree_mask=plan.tree_mask[:n])
    out_tokens, num_emitted, offsets = av.tree_rejection_sample(logits, plan.query_start_loc, plan.token_parent[:n],
                                                                plan.input_ids[:n], W, temperature=temps, seeds=seeds)
    num_accepted = (num_emitted - 1).clamp(min=0)
    kv.commit_tree(bt, ctx, offsets, num_accepted)  # the accepted path to context_len + depth
    return plan, hidden, out_tokens, num_emitted, offsets, num_accepted
