"""One simulated serving run: a policy at a fixed concurrency.

The loop (closed: a finished request is replaced at once, so ``concurrency`` requests are always in the
system, each either prefilling or decoding):

1. Every decoding request drafts (the drafter's step cost is paid), its confidences come from the head of
   :class:`~adaptive_verify.sim.model.Acceptance`, and the policy picks how many drafts it verifies:
   ``none`` 0, ``k<j>`` min(j, drafts). Every adaptive policy runs an :class:`~adaptive_verify.AdaptiveVerifier`
   (CPU tensors, its C++ kernels), with exactly the calls an engine makes each step: ``add_request`` when a
   slot takes a new request, ``plan_budget`` (host), ``record_confidence``, ``plan``, ``observe``. So the
   simulator measures the per-step path an engine runs, the lagged budget included (one implementation, the
   verifier's): ``greedy``/``global`` are its live modes, ``lagged`` its default (the budget from each request's
   confidences of its previous step, the prior 1.0 for a new request, priced at this step, then the live
   survivals decide who verifies); ``slo<ms>`` is lagged with a latency target: ``verifier.max_step_ms`` is set
   each step to the target less the adaptive overhead of that step's R (which the cost table does not hold), so
   no step is charged more than <ms> unless its decodes and prompt chunks alone, verifying nothing, already cost
   more. With priority classes (``workload.priority``) ``plan_budget`` and ``plan`` get each request's weight
   (``weights=``). Draft-tree policies (:mod:`adaptive_verify.sim.tree`: each request drafts an EAGLE-2-shaped
   tree whose top-1 path is the chain above): ``eagle2-<N>`` verifies each request's N best nodes by path
   confidence; ``tree`` and ``tree-lagged`` are the verifier built with ``max_nodes`` in mode "global" (live,
   lossless for trees) and "lagged" (a node count from each slot's last recorded node survivals,
   verifier_tree.py). With a level-by-level drafter (a table with ``draft_levels``, "levels" drafting cost) they
   first ask ``plan_tree_draft`` for the step's depth and beam width and draft only that tree (``full_draft``:
   every level at the full beam, for comparison); tree-lagged then verifies its lagged budget. Tree steps are
   observed (per-depth statistics: plan_tree_draft's calibration). A verified node costs a token; drafting a
   tree costs :func:`~adaptive_verify.sim.tree.tree_draft_ms`; acceptance is the sample-and-match walk down the
   verified nodes.
2. Scheduling within the token capacity (the cost table's ``max_tokens``). Fixed k and none, as vLLM's
   scheduler does: decodes first, in a rotating order, each taking 1 + verified tokens (a decode that no
   longer fits waits this step), then prompt chunks of prefilling requests with what is left, first
   admitted first, at most ``prefill_chunk`` per request. Adaptive: prompt chunks first (within the
   capacity minus one token per decode), then the verifier plans within the capacity they leave, told about
   them as an engine tells it (``extra_tokens``: the verifier prices drafts on the shifted cost curve).
3. Verification: a rejection draw per verified draft, stopping at the first rejection; a request emits
   its accepted drafts plus one token (recovered or bonus), never past its output length. A request
   whose prompt finishes prefilling emits its first token.
4. Time advances by the step's cost: ``draft cost + cost_table.request_ms * R +
   cost_table.verify_cost(decode tokens + prefill tokens)``, plus for adaptive policies the profile's
   ``overhead.cost(R)`` (confidence head, planner, budget copy: :mod:`adaptive_verify.sim.overhead`).

Randomness is common across policies: per-step noise is drawn with fixed shapes [concurrency, K] from a
stream keyed by (seed, concurrency), and each request's difficulty and lengths from a stream keyed by its
sequence number, so policies are compared on the same draws (lower-variance differences).

Metrics over the measured steps (after ``warmup`` steps from a staggered start):
- ``tokens_per_s``: output tokens emitted (first tokens included) per second of simulated time;
- ``tpot_ms``: decoding time over decode tokens: every decoding request accrues each step's time,
  scheduled or waiting, so it is the token-weighted mean inter-token latency;
- ``user_tokens_per_s``: 1000 / tpot_ms, what one user sees;
- ``emitted_per_step`` and ``verified_per_step``: per scheduled decode request-step;
- ``mean_step_ms``, ``p99_step_ms`` and ``longest_step_ms``: the step times' mean, 99th percentile (linear
  interpolation) and maximum, what a step-time target (``slo<ms>``) bounds;
- ``head_auc`` and ``head_ece`` (adaptive chain policies; NaN otherwise): the confidence head's AUC and
  expected calibration error on the drafts it was tried on, from the verifier's statistics (``observe``)
  (so head_noise / head_temperature / head_bias can be set to a target quality);
- with priority classes, ``tpot_ms_high`` / ``tpot_ms_low`` and ``tokens_per_s_high`` /
  ``tokens_per_s_low``: the same two metrics over each class's requests (the tokens/s add up to
  ``tokens_per_s``). A request's class is drawn at admission from a stream keyed by its sequence number, so
  every policy serves the same classes.
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ..planner import MAX_TREE_NODES
from ..verifier import AdaptiveVerifier
from .model import Profile
from .tree import TreeModel, accepted_depths, draft_trees, tree_draft_ms

__all__ = ["Policy", "parse_policy", "simulate"]

ADAPTIVE = ("greedy", "lagged", "global")
# Draft-tree policies (sim/tree.py): the planner over tree nodes, live ("tree", mode "global": trees are verified
# one-hot, so it is lossless) or lagged ("tree-lagged"); eagle2-N verifies each request's N best nodes.
TREE_ADAPTIVE = {"tree": "global", "tree-lagged": "lagged"}
# The step's prompt chunks (X tokens) reach the verifier as extra_tokens, which prices drafts on the cost curve
# seen from the step's operating point, CostTable.shifted(X): cost(n + X) - cost(X) + cost(0), within the capacity
# X leaves. A draft is then charged its true marginal time, and the prompt's own time does not enter Theta: in a
# closed loop every output token brings its prompt's work along anyway. (Measured when the simulator could choose:
# greedy over no speculation at c=256 on the default profile was +34% shifted, +25% with X as the planner's
# extra_tokens, +26% with X only shrinking the capacity.)
# slo<ms> when the adaptive overhead alone reaches the target: the planner takes only positive targets, and
# any target below the B_min step's cost gives B_min.
_SMALLEST_TARGET_MS = 1e-9


@dataclass(frozen=True)
class Policy:
    name: str  # "none", "k<j>", "greedy", "lagged", "global", "slo<ms>", "tree", "tree-lagged", "eagle2-<N>"
    kind: str  # "none", "fixed", "adaptive"
    k: int = 0  # fixed: drafts (eagle2-<N>: tree nodes) verified; adaptive: unused
    max_step_ms: Optional[float] = None  # slo<ms>: the step-time target
    tree: bool = False  # drafts a tree (sim/tree.py) instead of a chain

    @property
    def speculates(self) -> bool:
        return self.kind != "none"

    @property
    def mode(self) -> str:
        """The adaptive planning mode: slo<ms> is lagged with a cap; tree is global, tree-lagged lagged."""
        if self.tree:
            return TREE_ADAPTIVE[self.name]
        return "lagged" if self.max_step_ms is not None else self.name


def parse_policy(name: str, num_drafts: int) -> Policy:
    """"none", "k1".."kK", "greedy", "lagged", "global", "slo<ms>" (lagged with a step-time target of <ms>
    milliseconds, e.g. "slo40" or "slo37.5"), or a draft-tree policy: "tree" (the planner's global budget over
    tree nodes on the live step), "tree-lagged" (the budget from each request's previous tree) or "eagle2-<N>"
    (each request's N best nodes by path confidence, 1 <= N <= 63, e.g. "eagle2-16"); ValueError naming the
    policy otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"policy must be a str, got {type(name).__name__}")
    if name == "none":
        return Policy(name, "none")
    if name in ADAPTIVE:
        return Policy(name, "adaptive")
    if name in TREE_ADAPTIVE:
        return Policy(name, "adaptive", tree=True)
    m = re.fullmatch(r"eagle2-([0-9]+)", name)
    if m:
        n = int(m.group(1))
        if not 1 <= n <= MAX_TREE_NODES:
            raise ValueError(f"policy {name!r}: eagle2-<N> needs N in [1, {MAX_TREE_NODES}] (nodes verified per "
                             f"request, the tree planner's limit), got {m.group(1)}")
        return Policy(name, "fixed", n, tree=True)
    m = re.fullmatch(r"k([0-9]+)", name)
    if m and 1 <= int(m.group(1)) <= num_drafts:
        return Policy(name, "fixed", int(m.group(1)))
    m = re.fullmatch(r"slo([0-9]+(?:\.[0-9]*)?)", name)
    if m:
        target = float(m.group(1))
        if not target > 0:
            raise ValueError(f"policy {name!r}: the step-time target (ms) must be > 0, got {m.group(1)}")
        return Policy(name, "adaptive", max_step_ms=target)
    raise ValueError(f"unknown policy {name!r}: expected none, k1..k{num_drafts}, greedy, lagged, global, "
                     f"slo<ms> (e.g. slo40), tree, tree-lagged or eagle2-<N> (N in [1, {MAX_TREE_NODES}], e.g. "
                     "eagle2-16)")


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _logit(p: np.ndarray) -> np.ndarray:
    return np.log(p) - np.log1p(-p)


class _Requests:
    """The requests in the system, one per slot; new ones drawn from their own per-request stream."""

    def __init__(self, profile: Profile, concurrency: int, seed: int, track_joins: bool = False):
        self.profile, self.seed = profile, seed
        c = concurrency
        # With a verifier: slots that took a new request since it was told (add_request); None without one.
        self.joined: Optional[list[int]] = [] if track_joins else None
        self.prefill_left = np.zeros(c, dtype=np.int64)
        self.generated = np.zeros(c, dtype=np.int64)
        self.target = np.zeros(c, dtype=np.int64)
        self.difficulty = np.zeros(c, dtype=np.float64)
        self.admitted = np.zeros(c, dtype=np.int64)  # admission sequence number (prefill order)
        self.high = np.zeros(c, dtype=np.int64)  # priority class: 1 high, 0 low (always 0 without classes)
        self.next_id = 0
        for slot in range(c):
            self._admit(slot, staggered=True)

    def _admit(self, slot: int, staggered: bool = False) -> None:
        w, a = self.profile.workload, self.profile.acceptance
        rng = np.random.default_rng([self.seed, 1, self.next_id])
        prompt = int(rng.integers(w.prompt_len[0], w.prompt_len[1] + 1))
        self.target[slot] = int(rng.integers(w.output_len[0], w.output_len[1] + 1))
        self.difficulty[slot] = rng.normal(0.0, a.request_sigma) if a.request_sigma > 0 else 0.0
        if staggered:  # start mid-flight so the run begins near the steady state
            self.generated[slot] = int(rng.integers(1, self.target[slot]))
            self.prefill_left[slot] = 0
        else:
            self.generated[slot] = 0
            self.prefill_left[slot] = prompt
        self.admitted[slot] = self.next_id
        if w.priority is not None:  # its own stream: the draws above are the same with and without classes
            cls = np.random.default_rng([self.seed, 2, self.next_id])
            self.high[slot] = int(cls.random() < w.priority.fraction)
        if self.joined is not None:
            self.joined.append(slot)
        self.next_id += 1

    def replace_finished(self) -> None:
        for slot in np.flatnonzero(self.generated >= self.target):
            self._admit(int(slot))


def _schedule_prefill(reqs: "_Requests", budget: int, chunk: int) -> tuple[int, list[int]]:
    """Prompt chunks within ``budget`` tokens, first admitted first, at most ``chunk`` per request.
    Returns (tokens scheduled, slots whose prompt finishes this step)."""
    tokens, finished = 0, []
    pre = np.flatnonzero(reqs.prefill_left > 0)
    for slot in pre[np.argsort(reqs.admitted[pre], kind="stable")]:
        if budget <= 0:
            break
        take = int(min(reqs.prefill_left[slot], chunk, budget))
        reqs.prefill_left[slot] -= take
        budget -= take
        tokens += take
        if reqs.prefill_left[slot] == 0:
            finished.append(int(slot))
    return tokens, finished


class _Metrics:
    def __init__(self, classes: bool):
        self.classes = classes
        # per priority class [low, high]: the numerators of tpot_ms and tokens_per_s
        self.class_decode_time_ms = np.zeros(2)
        self.class_decode_tokens = np.zeros(2, dtype=np.int64)
        self.class_tokens = np.zeros(2, dtype=np.int64)
        self.time_ms = 0.0
        self.tokens = 0
        self.decode_time_ms = 0.0  # step time accrued by every decoding request
        self.decode_tokens = 0
        self.decode_request_steps = 0  # scheduled decodes
        self.verified = 0
        self.waiting = 0  # decodes that did not fit the capacity
        self.steps = 0
        self.step_tokens = 0
        self.step_ms: list[float] = []  # every step's time, for the tail a step-time target bounds

    def result(self) -> dict:
        tpot = self.decode_time_ms / self.decode_tokens if self.decode_tokens else float("inf")
        rs = max(self.decode_request_steps, 1)
        out = {
            "tokens_per_s": 1000.0 * self.tokens / self.time_ms if self.time_ms else 0.0,
            "tpot_ms": tpot,
            "user_tokens_per_s": 1000.0 / tpot if tpot > 0 else 0.0,
            "emitted_per_step": self.decode_tokens / rs,
            "verified_per_step": self.verified / rs,
            "mean_step_ms": self.time_ms / max(self.steps, 1),
            "p99_step_ms": float(np.percentile(self.step_ms, 99)) if self.step_ms else 0.0,
            "longest_step_ms": max(self.step_ms, default=0.0),
            "mean_step_tokens": self.step_tokens / max(self.steps, 1),
            "waiting_fraction": self.waiting / max(self.waiting + self.decode_request_steps, 1),
            "steps": self.steps,
            "simulated_s": self.time_ms / 1000.0,
        }
        if self.classes:
            for i, cls in enumerate(("low", "high")):
                tokens = int(self.class_decode_tokens[i])
                out[f"tpot_ms_{cls}"] = float(self.class_decode_time_ms[i] / tokens) if tokens else float("inf")
                out[f"tokens_per_s_{cls}"] = 1000.0 * int(self.class_tokens[i]) / self.time_ms if self.time_ms else 0.0
        return out


def simulate(profile: Profile, policy: Policy, concurrency: int, *, steps: int = 400, warmup: int = 100,
             seed: int = 0, trace: list | None = None, tree: Optional[TreeModel] = None,
             full_draft: bool = False) -> dict:
    """Runs ``warmup + steps`` steps of ``policy`` at ``concurrency`` and returns the metrics dict.

    Drafting (docs/design.md, "Drafting from the budget"): the adaptive chain policies (greedy, lagged, global,
    slo<ms>) draft only the depth ``AdaptiveVerifier.plan_draft`` decides before drafting, and pay the drafter's
    ``cost_table.draft_cost(R, depth)``; the adaptive tree policies (tree, tree-lagged) draft the depth and beam width
    ``AdaptiveVerifier.plan_tree_draft`` decides and pay ``tree_draft_ms`` for that shape. ``full_draft=True`` keeps
    the earlier behaviour for comparison (every request drafts K levels, trees at the full beam, ``plan_budget``
    chooses only the budget). ``depth_per_step`` / ``width_per_step`` in the result: the mean levels drafted and
    beam width per measured step (NaN for policies that do not decide them).

    tree: the draft-tree model of the tree policies (tree, tree-lagged, eagle2-<N>; default ``TreeModel()``:
    top-4, the profile's depth, a pool of 63 nodes; see :mod:`adaptive_verify.sim.tree`); other policies ignore
    it. Tree policies verify nodes: ``verified_per_step`` counts them, and ``head_auc`` / ``head_ece`` are NaN
    (AcceptanceStats counts chain positions).

    trace: if a list, each measured step appends ``(requests, tokens, draft_factor, output_tokens,
    decode_tokens, prefill_tokens)``: its decoding requests R, its forward's token count n, the multiple of
    ``cost_table.draft_cost(R)`` it pays (0 without speculation, 1 for a block drafter, the longest chain's
    fraction of K for a chain drafter), the output tokens it emitted (first tokens included), those of
    them decodes emitted, and the prompt tokens among the n. That prices the step (plus
    ``profile.overhead.cost(R)`` for adaptive policies) and gives every metric's numerator. For ``none`` and fixed
    k nothing in a trace depends on the cost table beyond its max_tokens, so a run can be priced under any
    other table without simulating it again (what :mod:`adaptive_verify.sim.fit` does)."""
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency must be an int >= 1, got {concurrency!r}")
    cap = profile.capacity
    if concurrency > cap:
        raise ValueError(f"concurrency {concurrency} exceeds the cost table's max_tokens {cap}: every decode "
                         "needs at least one token per step")
    ct, acc, K = profile.cost_table, profile.acceptance, profile.drafter.num_drafts
    overhead = profile.overhead
    chain = profile.drafter.kind == "chain"
    mu = _logit(np.asarray(acc.conditional[:K], dtype=np.float64))  # [K] median conditional logits
    if tree is None:
        tree = TreeModel()
    if not isinstance(tree, TreeModel):
        raise TypeError(f"tree must be a TreeModel or None, got {type(tree).__name__}")
    depth_mode = policy.kind == "adaptive" and not policy.tree and not full_draft
    depths: list[int] = []  # plan_draft's depth of every measured step
    D = tree.depth(K) if policy.tree else 0  # the trees' deepest level
    M = tree.pool_size(D) if policy.tree else 0  # nodes per request the planner sees
    reqs = _Requests(profile, concurrency, seed, track_joins=policy.kind == "adaptive")
    # Adaptive trees of a level-by-level drafter decide their shape before drafting (plan_tree_draft).
    shapes = policy.tree and policy.kind == "adaptive" and chain and tree.draft_cost == "levels" and \
        ct.draft_levels is not None and not full_draft
    widths: list[float] = []  # plan_tree_draft's width of every measured step (per-level: the mean over levels)
    verifier = None
    if policy.kind == "adaptive":
        # The engine's per-step path (module docstring); graph sizes only pad, which the simulator does not price.
        verifier = AdaptiveVerifier(ct, max_reqs=concurrency, max_drafts=K, block_size=1, mode=policy.mode,
                                    max_nodes=M if policy.tree else 0, tree_top_k=tree.top_k if shapes else 0,
                                    tree_widths=tree.widths if shapes else "uniform")
        reqs.joined.clear()  # the verifier's slots start at the prior
    noise = np.random.default_rng([seed, 0, concurrency])
    # Tree policies' draws off the main path: their own stream, so the chain's draws (which the main path uses)
    # come in the same order whatever the policy.
    tree_noise = np.random.default_rng([seed, 3, concurrency])
    kt = tree.top_k
    classes = profile.workload.priority is not None
    metrics, measured = _Metrics(classes), None
    stats_since = None
    for step in range(warmup + steps):
        if step == warmup:
            measured = metrics = _Metrics(classes)
            if verifier is not None:  # head_auc / head_ece over the measured steps (the counts keep running: the
                stats_since = verifier.stats.snapshot()  # draft depth reads each position's acceptance from them)
        # Per-step draws, fixed shapes whatever the policy (common random numbers).
        eps = noise.normal(0.0, 1.0, (concurrency, K)) * acc.token_sigma
        head = noise.normal(0.0, 1.0, (concurrency, K)) * acc.head_noise
        uni = noise.random((concurrency, K))
        rot = int(noise.integers(0, concurrency))
        if policy.tree:  # fixed shapes: every tree policy sees the same trees
            eps_t = tree_noise.normal(0.0, 1.0, (concurrency, D, kt)) * acc.token_sigma
            head_t = tree_noise.normal(0.0, 1.0, (concurrency, D, kt, kt)) * acc.head_noise
            uni_t = tree_noise.random((concurrency, D, kt))

        dec = np.flatnonzero(reqs.prefill_left == 0)
        R = dec.size
        remaining = reqs.target[dec] - reqs.generated[dec]  # >= 1
        cap_drafts = policy.k if policy.kind == "fixed" else (K if policy.speculates else 0)
        drafts = np.minimum(cap_drafts, remaining - 1).astype(np.int32)  # never draft past the output
        z = mu[None, :] + reqs.difficulty[dec, None] + eps[dec]  # [R, K] true conditional logits
        draft_factor = 0.0
        if policy.tree:
            depth_lim = np.minimum(D, remaining - 1)  # [R] never draft past the output
            draft_ms = tree_draft_ms(tree, ct, R, int(depth_lim.max()) if R else 0, chain, K)
            if draft_ms:
                draft_factor = draft_ms / ct.draft_cost(R)
        else:
            if policy.speculates and R:
                draft_factor = float(drafts.max() / K) if chain else 1.0
                if chain and ct.draft_levels is not None:  # the table prices each level (CostTable.draft_cost)
                    draft_factor = ct.draft_cost(R, int(drafts.max())) / ct.draft_cost(R) if ct.draft_cost(R) else 0.0
            draft_ms = ct.draft_cost(R) * draft_factor if draft_factor else 0.0

        depth = -1
        verify = np.zeros(R, dtype=np.int64)
        high = reqs.high[dec]  # [R] priority class of each decode (read before finished requests are replaced)
        weights = None
        if verifier is not None:
            # Prompt chunks are scheduled first, within the capacity left after one token per decode (an
            # engine knows its chunked-prefill tokens before it plans; this keeps drafts from starving
            # admissions); the verifier fills at most what remains.
            prefill_tokens, finished_prefill = _schedule_prefill(reqs, cap - R, profile.workload.prefill_chunk)
            if reqs.joined:  # slots that took a new request: the lagged budget's prior for them
                verifier.add_request(reqs.joined)
                reqs.joined.clear()
            if classes and R:
                weights = torch.from_numpy(np.where(high == 1, profile.workload.priority.weight, 1.0)
                                           .astype(np.float32))
            if policy.max_step_ms is not None and R:
                # The planner models fixed_cost(R) + verify_cost(tokens); the adaptive overhead is ours to
                # subtract. A target the overhead alone exceeds leaves no room for any draft: the smallest
                # positive target then gives B_min, as an unreachable target does.
                verifier.max_step_ms = max(policy.max_step_ms - overhead.cost(R), _SMALLEST_TARGET_MS)
        if policy.tree and R:
            width = shape_budget = None
            if shapes:  # the shape and budget before drafting, from earlier steps only
                depth, width, shape_budget, _ = verifier.plan_tree_draft(
                    R, depth_lim, prefill_tokens, req_indices=dec, weights=None if weights is None else weights.numpy())
                depth_lim = np.minimum(depth_lim, depth)
                draft_ms = tree_draft_ms(tree, ct, R, int(depth_lim.max()), chain, K, width=width)
                draft_factor = draft_ms / ct.draft_cost(R) if draft_ms else 0.0
                if measured is not None:
                    depths.append(depth)
                    widths.append(float(np.mean(width)) if isinstance(width, tuple) and width else
                                  float(width) if not isinstance(width, tuple) else 1.0)
            trees = draft_trees(tree, D, mu, reqs.difficulty[dec], z, head[dec], uni[dec], eps_t[dec], head_t[dec],
                                uni_t[dec], depth_lim, acc.head_temperature, acc.head_bias, width=width)
            chunk = prefill_tokens if verifier is not None else 0  # (fixed policies schedule prompts after decodes)
            verify, verified_nodes = _verify_tree(policy, trees, verifier, dec, chunk, weights, shape_budget)
        elif policy.kind == "fixed":
            verify[:] = drafts
        elif verifier is not None and R:
            conf = _sigmoid(z + head[dec]) if acc.head_temperature == 1.0 and acc.head_bias == 0.0 else \
                _sigmoid((z + head[dec]) / acc.head_temperature + acc.head_bias)
            # An engine's step (AdaptiveVerifier's docstring): the draft depth and the budget on the host before
            # the drafts exist (lagged: from each slot's last recorded confidences), the depth drafted, this step's
            # confidences recorded for the next steps, then the plan on the live confidences.
            host_w = None if weights is None else weights.numpy()
            if depth_mode:
                depth, budget, _ = verifier.plan_draft(R, drafts, prefill_tokens, req_indices=dec, weights=host_w)
                drafts = np.minimum(drafts, depth).astype(np.int32)
                draft_ms = ct.draft_cost(R, depth) if chain and ct.draft_levels is not None else \
                    (ct.draft_cost(R) * (float(drafts.max()) / K if chain else 1.0) if depth else 0.0)
                draft_factor = draft_ms / ct.draft_cost(R) if draft_ms else 0.0
                if measured is not None:
                    depths.append(depth)
            else:
                budget, _ = verifier.plan_budget(R, drafts, prefill_tokens, req_indices=dec, weights=host_w)
            Kd = K if depth < 0 else depth  # the columns drafted
            conf_t = torch.from_numpy(conf[:, :Kd].astype(np.float32))  # [R, Kd]
            drafts_t = torch.from_numpy(drafts)  # [R] int32
        if verifier is not None and R and not policy.tree and depth != 0:
            verifier.record_confidence(conf_t, req_indices=dec)
            with warnings.catch_warnings():  # "global" is simulated on purpose, as the upper bound
                if policy.mode == "global":
                    warnings.filterwarnings("ignore", message=r"plan_verification\(mode='global'\)")
                plan = verifier.plan(conf_t, drafts_t, budget=budget, extra_tokens=prefill_tokens, weights=weights)
            verify = plan.verify_lens.numpy()[:R].astype(np.int64)

        # Schedule decodes within the capacity, in a rotating order; the rest wait this step.
        order = np.roll(np.arange(R), -rot) if R else np.arange(0)
        need = 1 + verify[order]
        fits = np.cumsum(need) <= cap
        scheduled = order[fits]
        decode_tokens = int(need[fits].sum())
        metrics.waiting += R - scheduled.size

        if policy.kind != "adaptive":  # vLLM's order: running decodes first, prompt chunks get what is left
            prefill_tokens, finished_prefill = _schedule_prefill(reqs, cap - decode_tokens, profile.workload.prefill_chunk)

        step_ms = draft_ms + ct.request_ms * R + ct.verify_cost(decode_tokens + prefill_tokens)
        if policy.kind == "adaptive":
            step_ms += overhead.cost(R)

        # Rejection draws for the scheduled decodes: accepted = leading run of u < p over the verified.
        emitted_total = 0
        if scheduled.size:
            v = verify[scheduled]
            rows = dec[scheduled]
            if policy.tree:  # sample and match down the verified nodes
                accepted, tree_offsets = accepted_depths(trees, verified_nodes, offsets=True)
                accepted = accepted[scheduled]
            else:
                p = _sigmoid(z[scheduled])
                ok = (uni[rows] < p) & (np.arange(K)[None, :] < v[:, None])
                accepted = np.where(ok.all(axis=1), K, np.argmin(ok, axis=1))  # first failure
                accepted = np.minimum(accepted, v)
            emitted = np.minimum(accepted + 1, remaining[scheduled])
            reqs.generated[rows] += emitted
            emitted_total = int(emitted.sum())
            if classes:
                np.add.at(metrics.class_decode_tokens, reqs.high[rows], emitted)
                np.add.at(metrics.class_tokens, reqs.high[rows], emitted)
            metrics.verified += int(v.sum())
            if verifier is not None and not policy.tree and depth != 0 and (measured is not None or depth_mode):
                # the head's quality, as served, and with the draft depth every step's per-position acceptance
                # (an adaptive plan fits the capacity, so every decode is scheduled: rows back in plan order)
                acc_rows = np.zeros(R, dtype=np.int32)
                acc_rows[scheduled] = accepted
                verifier.observe(plan.verify_lens, torch.from_numpy(acc_rows))
            if shapes:  # per-depth acceptance: plan_tree_draft's calibration
                acc_rows = np.zeros(R, dtype=np.int32)
                acc_rows[scheduled] = accepted
                verifier.observe(torch.from_numpy(verify.astype(np.int32)), torch.from_numpy(acc_rows),
                                 accepted_offsets=torch.from_numpy(tree_offsets))
        for slot in finished_prefill:  # the prefill's last chunk samples the first token
            reqs.generated[slot] = 1
            metrics.class_tokens[reqs.high[slot]] += 1

        if trace is not None and measured is not None:
            trace.append((R, decode_tokens + prefill_tokens, draft_factor, emitted_total + len(finished_prefill),
                          emitted_total, prefill_tokens))
        metrics.steps += 1
        metrics.time_ms += step_ms
        metrics.step_ms.append(step_ms)
        metrics.tokens += emitted_total + len(finished_prefill)
        metrics.decode_time_ms += step_ms * R
        if classes:
            metrics.class_decode_time_ms += step_ms * np.bincount(high, minlength=2)
        metrics.decode_tokens += emitted_total
        metrics.decode_request_steps += int(scheduled.size)
        metrics.step_tokens += decode_tokens + prefill_tokens
        reqs.replace_finished()
    out = (measured or metrics).result()
    report = verifier.stats.report(since=stats_since) if verifier is not None and not policy.tree else None
    out["head_auc"] = float(report["auc_overall"]) if report else float("nan")
    out["head_ece"] = float(report["ece_overall"]) if report else float("nan")
    out["depth_per_step"] = float(np.mean(depths)) if depths else float("nan")
    out["width_per_step"] = float(np.mean(widths)) if widths else float("nan")
    out.update(policy=policy.name, concurrency=concurrency)
    return out


def _verify_tree(policy: Policy, trees, verifier: Optional[AdaptiveVerifier], dec: np.ndarray, extra_tokens: int,
                 weights: Optional[torch.Tensor], budget: Optional[int] = None):
    """(nodes verified per request [R] int64, which [R, M] bool) for a tree policy: eagle2-<N> the N best nodes
    (pool ranks 0..N-1); tree and tree-lagged the verifier's tree step (its mode: "global" or "lagged"), with the
    calls an engine makes."""
    R, M = trees.survival.shape
    if policy.kind == "fixed":
        verify = np.minimum(policy.k, trees.sizes).astype(np.int64)
        return verify, np.arange(M)[None, :] < verify[:, None]
    conf = torch.from_numpy(trees.conf)  # [R, M] conditional per node
    parents = torch.from_numpy(trees.parents)  # [R, M] int32
    sizes = torch.from_numpy(trees.sizes)  # [R] int32
    if budget is None:  # (with a shape, plan_tree_draft gave it)
        budget, _ = verifier.plan_budget(R, trees.sizes, extra_tokens, req_indices=dec, tree=True,
                                         weights=None if weights is None else weights.numpy())
    verifier.record_confidence(conf, req_indices=dec, parents=parents, tree_sizes=sizes)
    plan = verifier.plan(conf, sizes, budget=budget, extra_tokens=extra_tokens, weights=weights, parents=parents)
    verify = plan.verify_lens.numpy()[:R].astype(np.int64)
    node = plan.token_node.numpy()
    req = plan.token_req.numpy()
    real = node >= 0  # anchors and padding carry -1
    verified = np.zeros((R, M), dtype=bool)
    verified[req[real], node[real]] = True
    return verify, verified
