"""A batched speculative-decoding loop over the tiny target and drafter, driven by AdaptiveVerifier.

Each decode step, for the R active requests (continuous batching: finished requests leave, waiting
prompts are prefilled and join)::

    depth, budget <- verifier.plan_draft(R, drafts)           host, from earlier steps (modes lagged, greedy;
                                                              "all": budget <- plan_budget, depth K)
    drafts, conf <- drafter(h, anchor, levels=depth)          depth greedy drafts and their confidences
    verifier.record_confidence(conf)                          [R, depth] (depth 0: no columns)
    plan <- verifier.plan(conf, drafts, ctx, blocks, ...)     allocation + varlen metadata
    logits, hidden <- target.forward_paged(plan ...)          write_kv + verify_attention per layer
    tokens, emitted <- rejection_sample(logits, ...)          lossless
    verifier.observe(plan.verify_lens, emitted - 1)

Draft trees (``tree_topk``, or modes "tree" and "tree-fixed"; engine/tree.py): the drafter proposes a tree per
request (k alternatives per node, the best ``tree_nodes`` nodes by path confidence), and the step becomes::

    budget <- verifier.plan_budget(R, tree_sizes, tree=True)  host: a node count
    tokens, parents, conf <- draft_tree(drafter, h, anchor)   conf: each node's conditional acceptance
    verifier.record_confidence(conf, parents=, tree_sizes=)
    plan <- verifier.plan(conf, tree_sizes, ..., parents=)    TreeVerifyPlan
    logits, hidden <- target.forward_paged(..., tree_mask)    positions context + depth
    tokens, emitted, offsets <- tree_rejection_sample(...)    sample and match: lossless in every mode
    commit_tree_kv(offsets, emitted - 1)                      the accepted path to context + depth
    verifier.observe(plan.verify_lens, emitted - 1, accepted_offsets=offsets)

Randomness (temperature > 0): request i's tokens come from Philox keyed by a per-request seed mixed with
the number of tokens it has generated so far (``offset`` stays 0), so a request's draws do not depend on
which step or batch it is in. Prefill runs in chunks of up to 16 tokens (verify_attention's q_len bound).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

import numpy as np
import torch

import adaptive_verify as av

from ..cost import CostTable
from ..planner import MAX_TREE_NODES
from ..verifier import AdaptiveVerifier
from ..verifier_tree import TREE_WIDTHS
from .drafter import DSparkDrafter
from .model import PagedKV, TinyTarget
from .tree import draft_tree, tree_size, verify_tree_step, width

__all__ = ["generate", "GenerationResult", "default_cost_table", "profile_cost_table", "MODES", "TREE_MODES"]

#: generate()'s modes. "tree": trees with the live global budget (lossless: trees are verified one-hot);
#: "tree-fixed": EAGLE-2 style, every drafted node (the best tree_nodes per request) verified, no global budget.
MODES = ("off", "all", "lagged", "greedy", "global", "tree", "tree-fixed")
TREE_MODES = {"tree": "global", "tree-fixed": "all"}
#: draft_tree's cost of one level after the first, whatever the beam (a Markov step per frontier node, batched;
#: the backbone, paid once, is the first level's): 0.15-0.2 ms measured on the 2-core CI machine, 2026-12-06, one
#: thread, R = 1..16, beams 1 and 3 (the first level 0.9-1.9 ms). The tree modes' default table prices levels so.
TREE_LEVEL_MS = 0.12
#: k of modes "tree" and "tree-fixed" when tree_topk is not given.
DEFAULT_TREE_TOPK = 3

_PREFILL_CHUNK = 16
_SEED_MIX = 0x9E3779B97F4A7C15


def _step_seed(seed: int, generated: int) -> int:
    """A per-(request, progress) seed in [0, 2^63): the request's draws never depend on the batch."""
    return ((seed * 0x100000001B3) ^ (generated * _SEED_MIX)) & 0x7FFFFFFFFFFFFFFF


@dataclass
class _Request:
    index: int
    prompt: list
    max_new: int
    seed: int
    blocks: list = field(default_factory=list)
    ctx: int = 0  # KV positions written and valid
    anchor: int = 0  # last emitted token, not yet in the KV cache
    h: Optional[torch.Tensor] = None  # [d] target hidden at the position that predicted the anchor
    out: list = field(default_factory=list)

    @property
    def remaining(self) -> int:
        return self.max_new - len(self.out)


class _Tally:
    """The per-step bookkeeping the chain loop and the tree loop share: each request's new tokens, KV length,
    anchor and drafter state, and the per-request-step figures."""

    def __init__(self):
        self.steps = self.req_steps = self.emitted = self.verified = self.accepted = self.drafted = 0

    def advance(self, active: list, emitted: list, toks: list, verified: list, hidden: torch.Tensor, rows: list,
                finish) -> list:
        """One step's outputs: request i emitted emitted[i] tokens (its accepted drafts or path, then one more),
        toks[i] [>= emitted[i]], verified[i] drafts or nodes; rows[i] is the hidden row of its last accepted token
        (it produced the new anchor). finish(r) retires a request that is done; returns those still running."""
        self.steps += 1
        still = []
        for i, r in enumerate(active):
            a = emitted[i] - 1  # accepted drafts (a chain) or the accepted depth (a tree)
            new = toks[i][:emitted[i]][: r.remaining]
            r.out.extend(new)
            self.req_steps += 1
            self.emitted += len(new)
            self.verified += verified[i]
            self.accepted += a
            r.ctx += 1 + a  # the anchor and the accepted tokens now have valid KV (a tree's moved by commit_tree_kv)
            r.anchor = new[-1]
            r.h = hidden[rows[i]]
            if r.remaining == 0:
                finish(r)
            else:
                still.append(r)
        return still

    def result(self, label: str, start: float, done: dict, verifier, graphs, **extra) -> "GenerationResult":
        wall = time.perf_counter() - start
        tokens = [done[i] for i in range(len(done))]
        total = sum(len(t) for t in tokens)
        n = max(self.req_steps, 1)
        figures = {
            "mode": label, "steps": self.steps, "wall_s": wall, "tokens": total,
            "tokens_per_s": total / wall if wall else 0.0, "emitted_per_step": self.emitted / n,
            "verified_per_step": self.verified / n, "accepted_per_step": self.accepted / n,
            "drafted_per_step": self.drafted / n,
            "verifier": verifier.metrics(), "graph_captures": graphs.captures if graphs else 0,
            "graph_replays": graphs.replays if graphs else 0, **extra,
        }
        texts = [bytes(t).decode("utf-8", errors="replace") for t in tokens]
        return GenerationResult(tokens=tokens, texts=texts, figures=figures)


@dataclass
class GenerationResult:
    """tokens: generated byte ids per prompt (in prompt order); texts: the same decoded as UTF-8 (errors
    replaced); figures: steps, wall_s, tokens_per_s, emitted_per_step, drafted_per_step and verified_per_step (per
    decode request-step; drafted: drafts, or a tree's nodes), accepted_per_step, and the verifier's metrics(); with
    draft trees also tree_topk, tree_nodes and moved_paths (request-steps whose accepted path was not the tree's first branch, so commit_tree_kv moved its
    K/V); verified and accepted then count nodes and the accepted depth."""

    tokens: list
    texts: list
    figures: dict


def default_cost_table(max_tokens: int = 512, draft_levels: Optional[int] = None,
                       draft_level_ms: Optional[float] = None) -> CostTable:
    """The tiny target's step costs on one CPU thread, measured 2026-11-29 on the 2-core CI machine with
    :func:`profile_cost_table` (another job busy on the other core; 64 cached positions per request).
    Run ``profile_cost_table`` on your machine for planning that matches it. draft_levels: the drafter's K, for
    the draft depth (the drafter's forward over D positions priced as D / K of the full draft: uniform levels)."""
    # Graph sizes: the loop pads every verification step to one (the forward runs the padded count, so
    # its cost is the padded one, and with cuda_graphs=True a handful of graphs serve every step).
    return CostTable.from_points({1: 2.68, 8: 4.23, 32: 8.32, 64: 13.8, 128: 25.8, 256: 49.8},
                                 draft_ms={1: 0.84, 4: 1.10, 16: 2.39}, max_tokens=max_tokens,
                                 graph_sizes=[1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512],
                                 metadata={"source": "adaptive_verify.engine.generate.profile_cost_table, 1 thread"},
                                 draft_levels=draft_levels, draft_level_ms=draft_level_ms)


def _verify_step(target, verifier, kv, K, padded, budget, conf, drafts, ctx, bt, anchors, draft_tokens, temps, seeds):
    """Plan, target forward on the padded varlen batch, rejection sampling: the part a CUDA graph captures."""
    plan = verifier.plan(conf, drafts, ctx, bt, anchors, draft_tokens, budget, padded_tokens=padded)
    logits, hidden = target.forward_paged(plan.input_ids, plan.positions, kv, bt, plan.seq_lens,
                                          plan.query_start_loc, plan.slot_mapping, 1 + K)
    out_tokens, num_emitted = av.rejection_sample(logits, plan.query_start_loc, draft_tokens, temperature=temps,
                                                  seeds=seeds)
    return plan, hidden, out_tokens, num_emitted


class _StepGraphs:
    """One captured CUDA graph of _verify_step per (requests, padded tokens), replayed with fresh inputs
    copied into its static tensors (the budget too, as a 0-d device tensor)."""

    def __init__(self, target, verifier, kv, K, step_fn=None):
        self.target, self.verifier, self.kv, self.K = target, verifier, kv, K
        self.step_fn = step_fn or _verify_step  # verify_tree_step for trees (K is then the query width 1 + N)
        self.graphs: dict = {}
        self.captures = self.replays = 0

    def run(self, R, padded, budget, inputs):
        key = (R, padded)
        if key not in self.graphs:
            static = [t.clone() for t in inputs]
            budget_t = torch.tensor(budget, dtype=torch.int32, device=inputs[0].device)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # warm up (allocations, memos) outside the capture
                self.step_fn(self.target, self.verifier, self.kv, self.K, padded, budget_t, *static)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outs = self.step_fn(self.target, self.verifier, self.kv, self.K, padded, budget_t, *static)
            self.graphs[key] = (graph, static, budget_t, outs)
            self.captures += 1
        graph, static, budget_t, outs = self.graphs[key]
        for dst, src in zip(static, inputs):
            dst.copy_(src)
        budget_t.fill_(budget)
        graph.replay()
        self.replays += 1
        self.verifier.last_plan = outs[0]  # observe() must read this key's expected tokens
        return outs


def _admit(target, kv, req: _Request, max_blocks: int, temp_value: float, device) -> None:
    """Allocates the request's blocks, prefills its prompt in chunks and samples its first token (the anchor)."""
    req.blocks = kv.allocate(max_blocks)
    bt = torch.tensor([req.blocks], dtype=torch.int32, device=device)
    L = len(req.prompt)
    for s in range(0, L, _PREFILL_CHUNK):  # chunked prefill of one request
        e = min(s + _PREFILL_CHUNK, L)
        ids = torch.tensor(req.prompt[s:e], dtype=torch.int32, device=device)
        pos = torch.arange(s, e, dtype=torch.int32, device=device)
        logits, hidden = target.forward_paged(
            ids, pos, kv, bt, torch.tensor([e], dtype=torch.int32, device=device),
            torch.tensor([0, e - s], dtype=torch.int32, device=device), kv.slots(req.blocks, pos), e - s)
    req.ctx = L
    seeds = torch.tensor([_step_seed(req.seed, 0)], dtype=torch.int64, device=device)
    first = av.sample(logits[-1:], torch.tensor([temp_value], device=device), seeds)
    req.anchor = int(first[0])
    req.out.append(req.anchor)
    req.h = hidden[-1]



def _encode(p: Union[str, bytes, Sequence[int]]) -> list:
    if isinstance(p, str):
        p = p.encode("utf-8")
    out = list(p)
    if not out:
        raise ValueError("prompts must not be empty")
    if any(not 0 <= t < 256 for t in out):
        raise ValueError("prompt token ids must be bytes (0..255)")
    return out


@torch.no_grad()
def generate(target: TinyTarget, drafter: Optional[DSparkDrafter], prompts: Sequence, *, mode: str = "lagged",
             max_new_tokens: int = 64, concurrency: int = 4, temperature: float = 0.0, seed: int = 0,
             cost_table: Optional[CostTable] = None, block_size: int = 16,
             verifier: Optional[AdaptiveVerifier] = None, cuda_graphs: bool = False,
             tree_topk: Union[int, Sequence[int], None] = None, tree_nodes: int = 24,
             tree_widths: str = "uniform") -> GenerationResult:
    """Generates ``max_new_tokens`` bytes for every prompt, ``concurrency`` requests at a time.

    mode: "off" (plain decoding, no drafter), "all" (verify every draft: fixed k = K), "lagged" or
    "greedy" (adaptive); with trees also "global" (the live argmax, lossless for trees); "tree" (trees, "global")
    and "tree-fixed" (trees, "all": EAGLE-2's best tree_nodes nodes per request, no global budget).
    temperature: 0 = greedy, else sampling at that temperature (lossless in every mode). seed: request i uses
    seed + i. The KV cache is sized for ``concurrency`` requests.
    tree_topk: draft trees with k alternatives per node (an int, or one per prompt: 1 drafts that request's chain,
    so a batch mixes chains and trees); default DEFAULT_TREE_TOPK in modes "tree"/"tree-fixed", else chains.
    tree_nodes: N, the most nodes per tree (1..63). tree_widths: the beams of the modes that shape their trees (the
    adaptive tree modes with one k for the batch), "uniform" or "per_level" (AdaptiveVerifier's tree_widths); other
    modes draft whole trees or chains and ignore it.
    """
    if not isinstance(tree_widths, str) or tree_widths not in TREE_WIDTHS:
        raise ValueError(f"tree_widths must be 'uniform' or 'per_level', got {tree_widths!r:.60}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency must be an int >= 1, got {concurrency!r}")
    if not temperature >= 0.0:
        raise ValueError(f"temperature must be >= 0, got {temperature!r}")
    if mode in TREE_MODES and tree_topk is None:
        tree_topk = DEFAULT_TREE_TOPK
    if tree_topk is not None:
        return _generate_trees(target, drafter, prompts, mode=TREE_MODES.get(mode, mode), label=mode,
                               max_new_tokens=max_new_tokens, concurrency=concurrency, temperature=temperature,
                               seed=seed, cost_table=cost_table, block_size=block_size, verifier=verifier,
                               cuda_graphs=cuda_graphs, tree_topk=tree_topk, tree_nodes=tree_nodes,
                               tree_widths=tree_widths)
    if mode not in ("off", "all", "lagged", "greedy"):
        raise ValueError(f"mode {mode!r} needs draft trees (tree_topk); chains take off, all, lagged or greedy")
    if mode != "off" and drafter is None:
        raise ValueError("a drafter is required unless mode='off'")
    encoded = [_encode(p) for p in prompts]
    device = next(target.parameters()).device
    K = drafter.config.num_drafts if drafter is not None else 1
    cfg = target.config
    per_request = max(len(p) for p in encoded) + max_new_tokens + K + 2
    max_blocks = -(-per_request // block_size)
    kv = PagedKV.for_model(cfg, num_blocks=concurrency * max_blocks, block_size=block_size, device=device)
    cost_table = cost_table or default_cost_table(draft_levels=K)
    if verifier is None:
        verifier = AdaptiveVerifier(cost_table, max_reqs=concurrency, max_drafts=K, block_size=block_size,
                                    mode="off" if mode == "off" else mode, device=device)

    if cuda_graphs and device.type != "cuda":
        raise ValueError("cuda_graphs=True needs the models on a CUDA device")
    graphs = _StepGraphs(target, verifier, kv, K) if cuda_graphs else None
    waiting = [_Request(i, p, max_new_tokens, seed + i) for i, p in enumerate(encoded)]
    waiting.reverse()  # pop() takes prompts in order
    active: list[_Request] = []
    done: dict[int, list] = {}
    tally = _Tally()
    start = time.perf_counter()
    temp_value = float(temperature)

    def admit(req: _Request) -> None:
        _admit(target, kv, req, max_blocks, temp_value, device)

    def finish(r: _Request) -> None:
        kv.free(r.blocks)
        done[r.index] = r.out

    while waiting or active:
        while waiting and len(active) < concurrency:
            req = waiting.pop()
            admit(req)
            if req.remaining == 0:
                finish(req)
            else:
                active.append(req)
        if not active:
            continue
        R = len(active)
        drafts_host = np.array([min(K, r.remaining - 1) for r in active], dtype=np.int64) if mode != "off" \
            else np.zeros(R, dtype=np.int64)
        if mode in ("lagged", "greedy"):  # the draft depth with the budget, before drafting
            depth, budget, padded = verifier.plan_draft(R, drafts_host)
            drafts_host = np.minimum(drafts_host, depth)
        else:
            depth = K if mode == "all" else 0
            budget, padded = verifier.plan_budget(R, drafts_host)
        h = torch.stack([r.h for r in active])  # [R, d]
        anchors = torch.tensor([r.anchor for r in active], dtype=torch.int32, device=device)  # [R]
        # The verify step's inputs keep their [R, K] shapes (a CUDA graph per (R, padded size)): positions past the
        # depth are zeros that the drafts (at most the depth) keep out of the plan.
        draft_tokens = torch.zeros(R, K, dtype=torch.int32, device=device)
        conf = torch.zeros(R, K, dtype=torch.float32, device=device)
        if depth:
            draft_tokens[:, :depth], conf_hidden, markov = drafter.draft(h, anchors, levels=depth)  # [R, depth] ...
            conf[:, :depth] = drafter.confidence(conf_hidden, markov)  # [R, depth] float32
        verifier.record_confidence(conf[:, :depth])  # what this step drafted (maybe nothing), for the next steps
        tally.drafted += int(drafts_host.sum())
        drafts = torch.from_numpy(drafts_host.astype(np.int32)).to(device)
        ctx = torch.tensor([r.ctx for r in active], dtype=torch.int32, device=device)
        bt = torch.tensor([r.blocks for r in active], dtype=torch.int32, device=device)  # [R, max_blocks]
        temps = torch.full((R,), temp_value, dtype=torch.float32, device=device)
        seeds = torch.tensor([_step_seed(r.seed, len(r.out)) for r in active], dtype=torch.int64, device=device)
        # The forward always runs on the padded token count plan_budget chose (padding tokens have slot -1
        # and no request), so an eager step and a replayed CUDA graph do the same arithmetic.
        inputs = (conf, drafts, ctx, bt, anchors, draft_tokens, temps, seeds)
        if graphs is None:
            plan, hidden, out_tokens, num_emitted = _verify_step(target, verifier, kv, K, padded, budget, *inputs)
        else:
            plan, hidden, out_tokens, num_emitted = graphs.run(R, padded, budget, inputs)
        verifier.observe(plan.verify_lens, num_emitted - 1)
        qsl = plan.query_start_loc.tolist()
        emitted = num_emitted.tolist()
        active = tally.advance(active, emitted, out_tokens.tolist(), plan.verify_lens.tolist(), hidden,
                               [qsl[i] + e - 1 for i, e in enumerate(emitted)], finish)
    return tally.result(mode, start, done, verifier, graphs)


def _generate_trees(target, drafter, prompts, *, mode, label, max_new_tokens, concurrency, temperature, seed,
                    cost_table, block_size, verifier, cuda_graphs, tree_topk, tree_nodes,
                    tree_widths="uniform") -> GenerationResult:
    """generate() with draft trees (engine/tree.py): mode is the verifier's ("all", "lagged", "greedy", "global")."""
    if mode not in ("all", "lagged", "greedy", "global"):
        raise ValueError(f"draft trees take modes all, lagged, greedy, global, tree or tree-fixed, got {label!r}")
    if drafter is None:
        raise ValueError("a drafter is required unless mode='off'")
    if isinstance(tree_nodes, bool) or not isinstance(tree_nodes, int) or not 1 <= tree_nodes <= MAX_TREE_NODES:
        raise ValueError(f"tree_nodes must be an int in [1, {MAX_TREE_NODES}], got {tree_nodes!r}")
    encoded = [_encode(p) for p in prompts]
    topks = [tree_topk] * len(encoded) if isinstance(tree_topk, int) else list(tree_topk)
    if len(topks) != len(encoded) or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in topks):
        raise ValueError(f"tree_topk must be an int >= 1 or one int >= 1 per prompt, got {tree_topk!r}")
    device = next(target.parameters()).device
    K = drafter.config.num_drafts
    W = 1 + width(max(topks), K, tree_nodes)  # query width: the anchor and the widest tree
    per_request = max(len(p) for p in encoded) + max_new_tokens + W + 1
    max_blocks = -(-per_request // block_size)
    kv = PagedKV.for_model(target.config, num_blocks=concurrency * max_blocks, block_size=block_size, device=device)
    # The tree's shape with its budget (plan_tree_draft): adaptive modes, one k for the batch, a drafter priced per
    # level. Else every request drafts its whole tree (tree_size at its depth limit) and plan_budget sizes the budget.
    shaped = mode in ("lagged", "greedy", "global") and len(set(topks)) == 1 and topks[0] > 1
    cost_table = cost_table or (default_cost_table(draft_levels=K, draft_level_ms=TREE_LEVEL_MS) if shaped
                                else default_cost_table())
    shaped = shaped and cost_table.draft_levels is not None
    if verifier is None:
        verifier = AdaptiveVerifier(cost_table, max_reqs=concurrency, max_drafts=K, block_size=block_size, mode=mode,
                                    device=device, max_nodes=W - 1, tree_top_k=topks[0] if shaped else 0,
                                    tree_widths=tree_widths if shaped else "uniform")
    if cuda_graphs and device.type != "cuda":
        raise ValueError("cuda_graphs=True needs the models on a CUDA device")
    graphs = _StepGraphs(target, verifier, kv, W, verify_tree_step) if cuda_graphs else None
    waiting = [_Request(i, p, max_new_tokens, seed + i) for i, p in enumerate(encoded)]
    waiting.reverse()
    active: list[_Request] = []
    done: dict[int, list] = {}
    free_slots = list(range(concurrency))  # persistent verifier slots: the lagged budget's request identity
    slot_of: dict[int, int] = {}
    tally, moved = _Tally(), 0
    start = time.perf_counter()
    temp_value = float(temperature)

    def finish(r: _Request) -> None:
        kv.free(r.blocks)
        free_slots.append(slot_of.pop(r.index))
        free_slots.sort()
        done[r.index] = r.out

    while waiting or active:
        while waiting and len(active) < concurrency:
            req = waiting.pop()
            slot_of[req.index] = free_slots.pop(0)
            verifier.add_request(slot_of[req.index])
            _admit(target, kv, req, max_blocks, temp_value, device)
            if req.remaining == 0:
                finish(req)
            else:
                active.append(req)
        if not active:
            continue
        R = len(active)
        depth = [min(K, r.remaining - 1) for r in active]
        ks = [topks[r.index] for r in active]
        slots = np.array([slot_of[r.index] for r in active], dtype=np.int64)
        beam = None
        if shaped:  # depth, beam width and budget before drafting, from earlier steps
            d_step, beam, budget, padded = verifier.plan_tree_draft(R, depth, req_indices=slots)
            depth = [min(d, d_step) for d in depth]
        sizes_host = np.array([tree_size(k, d, W - 1, beam) for k, d in zip(ks, depth)], dtype=np.int64)
        if not shaped:
            budget, padded = verifier.plan_budget(R, sizes_host, tree=True, req_indices=slots)
        tally.drafted += int(sizes_host.sum())
        h = torch.stack([r.h for r in active])  # [R, d]
        anchors = torch.tensor([r.anchor for r in active], dtype=torch.int32, device=device)  # [R]
        tokens, parents, conf, _ = draft_tree(drafter, h, anchors, ks, W - 1, depth, beam)  # [R, n] each
        if tokens.shape[1] < W - 1:  # a step whose widest k is below the run's: pad to the verifier's width
            pad = W - 1 - tokens.shape[1]
            tokens = torch.nn.functional.pad(tokens, (0, pad))
            parents = torch.nn.functional.pad(parents, (0, pad), value=-1)
            conf = torch.nn.functional.pad(conf, (0, pad))
        sizes = torch.from_numpy(sizes_host.astype(np.int32)).to(device)
        verifier.record_confidence(conf, parents=parents, tree_sizes=sizes)
        ctx = torch.tensor([r.ctx for r in active], dtype=torch.int32, device=device)
        bt = torch.tensor([r.blocks for r in active], dtype=torch.int32, device=device)  # [R, max_blocks]
        temps = torch.full((R,), temp_value, dtype=torch.float32, device=device)
        seeds = torch.tensor([_step_seed(r.seed, len(r.out)) for r in active], dtype=torch.int64, device=device)
        inputs = (conf, sizes, ctx, bt, anchors, tokens, parents, temps, seeds)
        if graphs is None:
            plan, hidden, out_tokens, num_emitted, offsets, num_acc = verify_tree_step(
                target, verifier, kv, W, padded, budget, *inputs, trim=True)
        else:
            plan, hidden, out_tokens, num_emitted, offsets, num_acc = graphs.run(R, padded, budget, inputs)
        verifier.observe(plan.verify_lens, num_acc, accepted_offsets=offsets)
        qsl = plan.query_start_loc.tolist()
        emitted = num_emitted.tolist()
        offs = offsets.tolist()
        last = [offs[i][e - 1] for i, e in enumerate(emitted)]  # offset of each accepted path's last token
        moved += sum(o != e - 1 for o, e in zip(last, emitted))  # paths off the first branch: commit_tree_kv moved them
        active = tally.advance(active, emitted, out_tokens.tolist(), plan.verify_lens.tolist(), hidden,
                               [q + o for q, o in zip(qsl, last)], finish)
    return tally.result(label, start, done, verifier, graphs, tree_topk=tree_topk, tree_nodes=W - 1,
                        moved_paths=moved)


@torch.no_grad()
def profile_cost_table(target: TinyTarget, drafter: Optional[DSparkDrafter] = None, *, context: int = 64,
                       token_counts: Sequence[int] = (1, 8, 32, 64, 128, 256), max_tokens: int = 512,
                       reps: int = 5) -> CostTable:
    """Measures a CostTable of this target (and drafter) on its device with ``CostTable.profile``: a step
    at n tokens is n // 7 requests (one anchor and six drafts each, the rest in one more request) over
    ``context`` cached positions each; the drafter step at r requests drafts for r requests."""
    device = next(target.parameters()).device
    block_size = 16
    per = 7

    def setup(n):
        R = -(-n // per)
        blocks = -(-(context + per) // block_size)
        kv = PagedKV.for_model(target.config, num_blocks=R * blocks, block_size=block_size, device=device)
        bt = torch.arange(R * blocks, dtype=torch.int32, device=device).reshape(R, blocks)
        q = [min(per, n - r * per) for r in range(R)]
        qsl = torch.tensor([0] + list(np.cumsum(q)), dtype=torch.int32, device=device)
        pos = torch.cat([torch.arange(context, context + k, dtype=torch.int32) for k in q]).to(device)
        seq = torch.tensor([context + k for k in q], dtype=torch.int32, device=device)
        req = torch.repeat_interleave(torch.arange(R), torch.tensor(q)).to(device)
        slots = (bt[req, pos.long() // block_size].long() * block_size + pos.long() % block_size)
        ids = torch.randint(0, 256, (n,), dtype=torch.int32, device=device)
        return lambda: target.forward_paged(ids, pos, kv, bt, seq, qsl, slots, per)

    steps = {n: setup(n) for n in token_counts}

    def draft_step(r):
        h = torch.randn(r, target.config.d_model, device=device)
        a = torch.randint(0, 256, (r,), device=device)
        tokens, ch, mk = drafter.draft(h, a)
        return drafter.confidence(ch, mk)

    return CostTable.profile(lambda n: steps[n](), token_counts, draft_fn=draft_step if drafter is not None else None,
                             request_counts=(1, 4, 16) if drafter is not None else None, reps=reps,
                             max_tokens=max_tokens, metadata={"model": "adaptive_verify.engine.TinyTarget"})
