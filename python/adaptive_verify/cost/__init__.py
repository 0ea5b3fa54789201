"""Step cost table: what one speculative-decoding step costs, in milliseconds.

The planner (docs/design.md, "Planner") picks a verification budget B by maximising
``Theta(B) = (R + P(B)) / step_cost(R, R + B)``. This package supplies the denominator:

    step_cost(r, n) = fixed_cost(r) + verify_cost(n),    fixed_cost(r) = draft_cost(r) + request_ms * r

- ``r``: requests in the step (the drafter runs once per request, whatever is verified).
- ``request_ms``: optional per-request work of a step that is neither the drafter nor the verify forward
  (sampling, scheduling, host bookkeeping); 0 unless given. The planner's Theta takes ``fixed_cost(R)`` as
  its fixed term, since a fixed term left out biases the ratio towards verifying less.
- ``n``: total query tokens of the target's verification forward (anchors + verified drafts + extra tokens).

Where things are: ``curve.py`` the curve maths (float64, torch-free), ``table.py`` :class:`CostTable`,
``checks.py`` its argument checks and size bounds (MAX_TOKENS_LIMIT, MAX_MS), ``levels.py`` the drafter's cost
per level (``draft_cost(r, levels)``, ``tree_draft_cost`` for trees), ``serialize.py`` the JSON form,
``profile.py`` the measurement loop and the bodies of ``CostTable.profile`` / ``load_or_profile``,
``roofline.py`` the datasheet model.

Terms, as engines use them:

- *graph sizes*: the token counts at which the engine captured CUDA graphs. A batch of n tokens with
  n <= the largest graph size is padded up to the smallest graph size >= n and replayed, so it costs
  exactly what that graph size costs. The cost is a staircase, not a line.
- *eager region*: n above the largest graph size runs without a graph. Its cost is usually higher than
  the last graph step (the "graph/eager cliff"): launch overhead comes back.
- *max_tokens*: the engine's token capacity (``max_num_batched_tokens``); no step runs more.

Shape of the verify curve (decisions written out where the design is silent):

1. Measured points are made monotone by a running max over increasing n (the *envelope*): a dip
   (tile effects, noise) would make extra tokens look free and the planner would chase it.
2. Envelope cost at a graph size g: linear interpolation over the envelope points with n <= largest graph
   size (the *graph-region points*). Flat below the first; past the last graph-region point, linear
   extrapolation from the last two graph-region points (flat if there is only one). If no point was
   measured in the graph region at all, every graph size costs the first measured point.
3. n <= largest graph size (including n = 0): cost(n) = envelope cost at the smallest graph size >= n.
4. n > largest graph size: linear interpolation between the eager points (measured n > largest graph
   size), never across the cliff: between the largest graph size and the first eager point the cost is
   the first eager point's. Past the last eager point: linear extrapolation through the last two
   measured points, which are both eager points when there are two, else the last graph-region point and
   the single eager point (across the cliff: a steep but honest slope; a flat tail would make every token
   past the last point look free). Flat only when there is a single measured point in all. With no eager
   point, the graph-region points are extrapolated linearly.
5. No graph sizes: plain linear interpolation over all points, flat below the first (so n = 0 costs what
   the first point costs), linear extrapolation past the last.
6. The result is monotone non-decreasing in n and strictly positive. Every piece above is non-decreasing
   on its own; the one place the pieces can step down is the cliff, when an extrapolated last graph size
   costs more than the first eager point. A running max closes that: for n > largest graph size,
   cost(n) = max(eager(n), cost(largest graph size)).

The drafter curve (``draft_ms`` as a dict over request counts) uses the same running-max envelope. Between
measured request counts it is a staircase by default (r requests cost what the next measured count >= r
costs: drafters replay padded CUDA graphs, and vLLM prices them so), or linear with
``draft_interpolation="linear"``; flat below the first point (r = 0 included), linear extrapolation from
the last two points above the last. A float ``draft_ms`` is a constant drafter cost. A level-by-level drafter
(``draft_levels`` = L, EAGLE or multi-step MTP) drafting D < L levels pays ``draft_ms(r) - (L - D) * level(r)``
(``draft_level_ms``, or a uniform L-th of the draft), nothing at D = 0; a block drafter pays ``draft_ms(r)`` for any
D >= 1 (docs/design.md, "Drafting from the budget").

Floating point: costs are float64; the dense arrays handed to kernels are the scalar path's own values
rounded once to float32, so ``verify_array(N)[n] == float32(verify_cost(n))`` holds exactly. Each
interpolated value is clamped into its segment's end points, so rounding can never make the curve step
down at a measured point.

Prefill in the same step: ``CostTable.shifted(x)`` is the curve seen from x prompt tokens, an O(1) view
(an engine calls it every step with a new x); see its docstring for why it beats ``extra_tokens=x``.
"""
from .levels import tree_draft_cost
from .table import FORMAT_VERSION, MAX_TOKENS_LIMIT, CostTable

__all__ = ["CostTable", "FORMAT_VERSION", "MAX_TOKENS_LIMIT", "tree_draft_cost"]
